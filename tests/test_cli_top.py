"""`phpmq top` in a real terminal (tmux) against a real broker with known queues and peers:
the rows appear, rates follow the traffic, a key changes the sort, q quits with status 0."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness import BrokerProcess, read_until, wait_until

#: How long a test waits for the screen to show something, and how often it looks.
SCREEN_WAIT = (15.0, 0.2)


@pytest.fixture
def tmux() -> Iterator[Callable[..., list[str]]]:
    """Runs tmux commands in a server of the test's own (its own socket), killed after."""
    if shutil.which("tmux") is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("tmux is missing: `make test` installs it in CI", pytrace=False)
        pytest.skip("tmux is not installed (apt-get install tmux)")
    socket = f"phpmq-top-{uuid.uuid4().hex[:8]}"
    # A COLUMNS from the test's environment would fix rich's width, not the pane's.
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}

    def run(*args: str) -> list[str]:
        done = subprocess.run(
            ["tmux", "-L", socket, *args], capture_output=True, text=True, check=True, env=environ
        )
        return done.stdout.splitlines()

    try:
        yield run
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def cells(screen: list[str], first: str) -> list[str]:
    """The cells of the table row whose first cell is `first` ([] if none is shown)."""
    for line in screen:
        parts = [part.strip() for part in line.split("│")]
        if len(parts) > 2 and parts[1] == first:
            return parts[1:-1]
    return []



def test_top_shows_the_queues_and_peers_sorts_on_a_key_and_quits_on_q(
    tmp_path: Path, tmux: Callable[..., list[str]]
) -> None:
    status_file = tmp_path / "status"
    with BrokerProcess(tmp_path / "broker.log") as broker:
        with broker.client() as producer:
            producer.send_many("orders", [b"o"] * 3)
            producer.send("emails", b"e", confirm=True)
        with broker.client(name="mailer-7") as consumer:
            held = next(iter(consumer.consume("emails", window=5, timeout=5)))
            command = (
                f"{shlex.quote(sys.executable)} -m phpmq top --broker {broker.address};"
                f" echo $? > {shlex.quote(str(status_file))}; sleep 30"
            )
            tmux("new-session", "-d", "-x", "160", "-y", "40", command)

            def capture() -> list[str]:
                return tmux("capture-pane", "-p")

            screen = read_until(capture, lambda s: bool(cells(s, "mailer-7")), *SCREEN_WAIT)
            text = "\n".join(screen)
            # queue, in/s, out/s, acked/s, ready, in flight, consumers, dead letters
            assert cells(screen, "orders")[4:] == ["3", "0", "0", "0"], text
            assert cells(screen, "emails")[4:] == ["0", "1", "1", "0"], text
            # peer, kind, transport, windows, held, refused, last heard
            assert cells(screen, "mailer-7")[1:7] == [
                "client",
                "router",
                "127.0.0.1",
                "1",
                "1",
                "0",
            ], text
            assert "in/s ▼" in text, text

            with broker.client() as producer:  # a rate appears from the next answer on
                producer.send_many("orders", [b"o"] * 20)
            screen = read_until(capture, lambda s: cells(s, "orders")[4:5] == ["23"], *SCREEN_WAIT)
            in_rate = cells(screen, "orders")[1]
            assert in_rate not in ("-", "0.0") and float(in_rate) > 0, "\n".join(screen)

            tmux("send-keys", "s")  # sort by out/s
            screen = read_until(capture, lambda s: "out/s ▼" in "\n".join(s), *SCREEN_WAIT)
            assert "out/s ▼" in "\n".join(screen)
            tmux("send-keys", "q")
            wait_until(status_file.exists, 10, 0.1)
            assert status_file.read_text().strip() == "0"
            held.ack()
