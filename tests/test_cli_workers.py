"""`phpmq workers` run as the installed script finds a handler module in the directory it
was started from, in the supervisor and in its spawned workers."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from harness import BrokerProcess, wait_until

HANDLER_MODULE = """
import pathlib

def handle(message):
    pathlib.Path("handled.txt").write_bytes(message.content)
"""


def test_workers_find_a_module_in_the_current_directory(
    tmp_path: Path, broker: BrokerProcess
) -> None:
    script = Path(sys.executable).with_name("phpmq")
    assert script.exists(), f"the phpmq script is not installed next to {sys.executable}"
    (tmp_path / "shop_tasks.py").write_text(HANDLER_MODULE)
    pool = subprocess.Popen(
        [str(script), "workers", "shop_tasks:handle", "-q", "orders", "--broker", broker.address],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with broker.client() as client:
            client.send("orders", b"order 17", confirm=True)
        handled = tmp_path / "handled.txt"

        def written() -> bool:
            # The handler's write_bytes creates the file before it writes the content.
            return handled.exists() and handled.stat().st_size > 0

        wait_until(lambda: written() or pool.poll() is not None, 20, 0.1)
        assert written(), f"no worker handled the message; pool status {pool.poll()}"
        assert handled.read_bytes() == b"order 17"
    finally:
        pool.send_signal(signal.SIGTERM)
        try:
            pool.wait(15)
        except subprocess.TimeoutExpired:
            pool.kill()
            pool.wait(5)
