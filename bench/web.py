"""The `web` workload: what `phpmq web` costs the broker. The pipe (bench/pipe.py) through a
broker without, then with, a console attached (`phpmq web --interval 0.5`) and a viewer
re-reading the benched queue's page every 0.5 s (a `queue-peek` and a `dlq-list` on the
broker each time), alternated for `rounds` rounds; msgs/s and p50/p99 of each run and the
medians, with the load average each run started at. Figures are printed, never asserted.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from rich.console import Console

from ..testing import BrokerProcess, free_port
from .pipe import QUEUE, run_pipe_through, runs_table

#: Seconds between the console's stats requests, and between the viewer's page reads.
POLL_S = 0.5


@contextmanager
def _console(address: str) -> Iterator[str]:
    """`phpmq web` for the broker at `address`, answering; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "phpmq", "web", "--broker", address,
               "--bind", f"127.0.0.1:{port}", "--interval", str(POLL_S)]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for(url, process)
            yield url
        finally:
            process.terminate()
            process.wait(10)


def _wait_for(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and process.poll() is None:
        try:
            urllib.request.urlopen(f"{url}/static/console.css", timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("phpmq web did not start (is the web extra installed?)")


def _view(url: str, stop: threading.Event) -> None:
    while not stop.wait(POLL_S):
        with suppress(OSError):
            urllib.request.urlopen(f"{url}/queue?name={QUEUE}", timeout=5).close()


def _run_once(attached: bool, messages: int, size: int, window: int) -> dict:
    with BrokerProcess("--log-level", "WARNING") as broker:
        if not attached:
            return {**run_pipe_through(broker.address, messages, size, window), "load": _load()}
        with _console(broker.address) as url:
            stop = threading.Event()
            viewer = threading.Thread(target=_view, args=(url, stop), daemon=True)
            viewer.start()
            time.sleep(1.0)  # a few polls before the pipe starts
            try:
                load = _load()
                return {**run_pipe_through(broker.address, messages, size, window), "load": load}
            finally:
                stop.set()
                viewer.join()


def _load() -> float:
    return os.getloadavg()[0]


def run_web_benchmark(messages: int, size: int, window: int, rounds: int = 3) -> dict:
    runs: dict[str, dict] = {}
    for round_ in range(1, rounds + 1):
        for attached in (False, True):
            name = f"round {round_}, {'with' if attached else 'without'} console"
            runs[name] = _run_once(attached, messages, size, window)
    console = Console()
    console.print(runs_table("web workload", runs))
    medians = {
        attached: statistics.median(
            run["msgs_per_s"] for name, run in runs.items() if name.endswith(attached)
        )
        for attached in ("with console", "without console")
    }
    loads = [run["load"] for run in runs.values()]
    console.print(
        f"median msgs/s: without the console {medians['without console']:,.0f}, with it"
        f" {medians['with console']:,.0f}; load average {min(loads):.2f}-{max(loads):.2f}"
        f" on {os.cpu_count()} cores"
    )
    return {"runs": runs, "medians": medians}
