"""The `pool` workload: a queue pre-filled with N messages drained by `phpmq workers` running a
no-op handler with 1, 2 and 4 processes; msgs/s from the first ack to the empty queue."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

from ..client import Client
from ..protocol import admin_commands as cmd
from ..testing import BrokerProcess

QUEUE = "bench-pool"
RUN_TIMEOUT_S = 300


def _drain_rate(address: str, processes: int, messages: int, prefetch: int) -> float:
    with Client(address, name="bench-pool-producer") as producer:
        producer.send_many(QUEUE, (b"x" * 100 for _ in range(messages)))
    with (
        Client(address, name="bench-pool-watch") as watch,
        tempfile.TemporaryFile() as log,
    ):
        acked_before = watch.admin(cmd.STATS)["counters"]["acked"]
        pool = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "phpmq",
                "workers",
                "phpmq.bench.noop:handle",
                "--broker",
                address,
                "-q",
                QUEUE,
                "-p",
                str(processes),
                "--prefetch",
                str(prefetch),
                "--summary-seconds",
                "60",
            ],
            stderr=log,
        )
        try:
            start = None
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while time.monotonic() < deadline:
                if pool.poll() is not None:
                    log.seek(0)
                    output = log.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"the pool exited with status {pool.returncode}:\n{output}")
                stats = watch.admin(cmd.STATS)
                acked = stats["counters"]["acked"] - acked_before
                if start is None and acked:
                    start, acked_at_start = time.monotonic(), acked
                if acked >= messages:
                    return (messages - acked_at_start) / (time.monotonic() - start)
                time.sleep(0.005)
            raise RuntimeError("the pool did not drain the queue in time")
        finally:
            pool.send_signal(signal.SIGTERM)
            pool.wait(30)


def run_pool_benchmark(messages: int = 20_000, prefetch: int = 10) -> dict[int, float]:
    results: dict[int, float] = {}
    with BrokerProcess("--log-level", "WARNING") as broker:
        for processes in (1, 2, 4):
            results[processes] = _drain_rate(broker.address, processes, messages, prefetch)
    table = Table(title=f"pool: no-op handler, {messages:,} messages, prefetch {prefetch}")
    for column in ("processes", "msgs/s", "vs 1 process"):
        table.add_column(column, justify="right")
    for processes, rate in results.items():
        table.add_row(str(processes), f"{rate:,.0f}", f"{rate / results[1]:.2f}x")
    Console().print(table)
    return results


if __name__ == "__main__":
    run_pool_benchmark()
