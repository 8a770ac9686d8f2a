"""The `rpc` workload: requests through a real broker to a pool of 4 `phpmq workers` running a
trivial handler (bench/noop.py `echo`), each answered with a reply (docs/protocol.md §6.6).

Two runs: 1 request in flight (the blocking Client, one request after the other), then 64 in
flight (one AsyncClient, 64 tasks gathered, each sending its next request as soon as its
reply came). Each prints round trips a second and p50/p99 of the round trip, beside the pipe
workload's msgs/s (bench/pipe.py) measured in the same run. Figures are printed, never
asserted.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from array import array
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from ..client import AsyncClient, Client
from ..testing import BrokerProcess
from .measure import percentiles
from .pipe import run_broker_pipe

QUEUE = "bench-rpc"
PROCESSES = 4
PREFETCH = 16
IN_FLIGHT = 64
TARGET_P50_MS = 0.5
TARGET_PIPE_SHARE = 0.50
#: Requests before measuring: the pool's workers are all consuming, the paths warm.
WARMUP = 500


def _start_pool(address: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "phpmq",
            "workers",
            "phpmq.bench.noop:echo",
            "--broker",
            address,
            "-q",
            QUEUE,
            "-p",
            str(PROCESSES),
            "--prefetch",
            str(PREFETCH),
            "--summary-seconds",
            "600",
        ],
        stderr=log,
    )


def _one_in_flight(address: str, requests: int, content: bytes) -> dict[str, Any]:
    """Round trips one after the other with the blocking client."""
    latencies = array("q")
    with Client(address, name="bench-rpc-sync") as client:
        client.request(QUEUE, content, 30)  # the pool answers: it is up
        for _ in range(WARMUP):
            client.request(QUEUE, content)
        started = time.perf_counter_ns()
        for _ in range(requests):
            sent = time.perf_counter_ns()
            client.request(QUEUE, content)
            latencies.append(time.perf_counter_ns() - sent)
        elapsed = time.perf_counter_ns() - started
    return _figures(requests, elapsed, latencies)


async def _many_in_flight(address: str, requests: int, content: bytes) -> dict[str, Any]:
    """`IN_FLIGHT` tasks on one AsyncClient, each with one request in flight at a time."""
    latencies = array("q")
    async with AsyncClient(address, name="bench-rpc-async") as client:
        await asyncio.gather(*(client.request(QUEUE, content) for _ in range(WARMUP)))
        each = max(1, requests // IN_FLIGHT)

        async def task() -> None:
            for _ in range(each):
                sent = time.perf_counter_ns()
                await client.request(QUEUE, content, 30)
                latencies.append(time.perf_counter_ns() - sent)

        started = time.perf_counter_ns()
        await asyncio.gather(*(task() for _ in range(IN_FLIGHT)))
        elapsed = time.perf_counter_ns() - started
    return _figures(each * IN_FLIGHT, elapsed, latencies)


def _figures(requests: int, elapsed_ns: int, latencies: array) -> dict[str, Any]:
    points = percentiles(latencies, 0.5, 0.99)
    return {
        "requests": requests,
        "per_s": requests / (elapsed_ns / 1e9),
        "p50_ms": points["p50"],
        "p99_ms": points["p99"],
    }


def _rpc_runs(sequential: int, concurrent: int, size: int) -> dict[str, dict[str, Any]]:
    content = b"x" * size
    with (
        BrokerProcess("--log-level", "WARNING") as broker,
        tempfile.TemporaryFile() as log,
    ):
        pool = _start_pool(broker.address, log)
        try:
            one = _one_in_flight(broker.address, sequential, content)
            many = asyncio.run(_many_in_flight(broker.address, concurrent, content))
        except Exception:
            log.seek(0)
            print(log.read().decode(errors="replace")[-2000:], file=sys.stderr)
            raise
        finally:
            pool.send_signal(signal.SIGTERM)
            pool.wait(30)
    return {"1 in flight (Client)": one, f"{IN_FLIGHT} in flight (AsyncClient)": many}


def run_rpc_benchmark(
    sequential: int = 5_000, concurrent: int = 50_000, size: int = 100, pipe_messages: int = 200_000
) -> dict[str, Any]:
    console = Console()
    console.print(
        f"rpc: requests of {size} bytes to {PROCESSES} worker processes (`phpmq workers`,"
        f" prefetch {PREFETCH}) answering with the content; {sequential:,} with 1 in flight,"
        f" {concurrent:,} with {IN_FLIGHT} in flight; beside the pipe ({pipe_messages:,}"
        " messages); loopback"
    )
    runs = _rpc_runs(sequential, concurrent, size)
    pipe = run_broker_pipe(pipe_messages, size, 100)
    table = Table()
    for column in ("workload", "round trips", "per second", "p50 ms", "p99 ms"):
        table.add_column(column, justify="right")
    for name, r in runs.items():
        table.add_row(
            name,
            f"{r['requests']:,}",
            f"{r['per_s']:,.0f}",
            f"{r['p50_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
        )
    table.add_row("pipe (msgs/s)", f"{pipe['received']:,}", f"{pipe['msgs_per_s']:,.0f}", "-", "-")
    console.print(table)
    one, many = runs.values()
    share = many["per_s"] / pipe["msgs_per_s"] if pipe["msgs_per_s"] else 0.0
    console.print(
        f"1 in flight: p50 {one['p50_ms']:.3f} ms (target ≤ {TARGET_P50_MS} ms);"
        f" {IN_FLIGHT} in flight: {many['per_s']:,.0f} round trips/s, {share:.0%} of the"
        f" pipe's {pipe['msgs_per_s']:,.0f} msgs/s (target ≥ {TARGET_PIPE_SHARE:.0%})"
    )
    return {"runs": runs, "pipe": pipe, "pipe_share": share}


if __name__ == "__main__":
    run_rpc_benchmark()
