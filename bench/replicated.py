"""The `replicated` workload (docs/cluster.md "Replicated queues"): the durable pipe (a
confirming producer, a consumer acking every message) through one durable broker, then
through the leader of a shard replicated on three nodes (phpmq.testing's LocalCluster on
127.0.0.1-3), in the same run; then what a kill -9 of the leader costs: the time to the
first confirmed send after it, over several kills.
"""

from __future__ import annotations

import signal
import statistics
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from ..client import Client, ClientError
from ..testing import LocalCluster
from .pipe import QUEUE, run_broker_pipe, run_pipe_through

#: Replicated durable throughput against single-node durable (issue #30's target).
TARGET_RATIO = 0.5
#: From the leader's kill -9 to the first confirmed send on its queue.
TARGET_FAILOVER_S = 5.0


def run_replicated_benchmark(
    messages: int = 100_000, size: int = 100, window: int = 100, kills: int = 5
) -> dict[str, Any]:
    console = Console(width=max(Console().width, 110))
    console.print(
        f"replicated: 1 confirming producer -> 1 queue -> 1 consumer acking each message;"
        f" {messages:,} messages of {size} bytes, window {window}; a single durable broker,"
        " then the queue's shard on 3 nodes (replicas = 3, loopback), same run"
    )
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="phpmq-bench-") as data_dir:
        runs["single node, durable"] = run_broker_pipe(messages, size, window, data_dir, True)
    with (
        tempfile.TemporaryDirectory(prefix="phpmq-bench-") as directory,
        LocalCluster(directory, flags=("--log-level", "WARNING")) as cluster,
    ):
        shard = cluster.map.owner(QUEUE).name
        leader = cluster.wait_for_leaders(at_home=True)[shard]
        runs["3 replicas, durable"] = run_pipe_through(
            leader.address, messages, size, window, confirm=True
        )
        failovers = _failovers(cluster, shard, kills)
    _print(console, runs, failovers)
    return {"runs": runs, "failover_s": failovers}


def _failovers(cluster: LocalCluster, shard: str, kills: int) -> list[float]:
    """Seconds from each kill -9 of the shard's leader to the first send confirmed through a
    node that did not lose it."""
    queue = cluster.queue_of(shard, 1)
    times = []
    for kill in range(kills):
        leader = cluster.wait_for_leaders()[shard]
        entry = next(name for name in cluster.names if name != leader.node)
        with Client(cluster.address(entry), confirm_timeout=1.0) as client:
            client.send(queue, b"warm-up", confirm=True)
            cluster.signal(leader, signal.SIGKILL)
            killed_at = time.monotonic()
            while True:
                try:
                    client.send(queue, b"after %d" % kill, confirm=True, key=f"k{kill}")
                    break
                except ClientError:
                    time.sleep(0.05)
            times.append(time.monotonic() - killed_at)
    return times


def _print(console: Console, runs: dict[str, dict[str, Any]], failovers: list[float]) -> None:
    table = Table()
    for column in ("workload", "msgs/s", "confirm p50", "confirm p99", "deliver p99"):
        table.add_column(column, justify="right")
    for name, run in runs.items():
        table.add_row(
            name,
            f"{run['msgs_per_s']:,.0f}",
            f"{run['confirm_p50_ms']:.2f} ms",
            f"{run['confirm_p99_ms']:.2f} ms",
            f"{run['p99_ms']:.2f} ms",
        )
    console.print(table)
    single = runs["single node, durable"]["msgs_per_s"]
    replicated = runs["3 replicas, durable"]["msgs_per_s"]
    console.print(
        f"3 replicas: {replicated / single:.2f}x single-node durable"
        f" (target ≥ {TARGET_RATIO}x)"
    )
    if failovers:
        console.print(
            f"failover, kill -9 of the leader to the first confirmed send, {len(failovers)}"
            f" kills: median {statistics.median(failovers):.2f} s, max {max(failovers):.2f} s"
            f" (target ≤ {TARGET_FAILOVER_S:.0f} s)"
        )
