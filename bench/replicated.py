"""The `replicated` workload (docs/cluster.md "Replicated queues"): the durable pipe (a
confirming producer, a consumer acking every message) through one durable broker, then
through the leader of a shard replicated on three nodes (phpmq.testing's LocalCluster on
127.0.0.1-3), in the same run, with the CPU each broker process spent per message; how fast
a follower that was paused catches up on a backlog; and what a kill -9 of the leader costs:
the time to the first confirmed send after it, over several kills.
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
from ..testing import BrokerProcess, LocalCluster
from .pipe import QUEUE, run_pipe_through
from .shard_cpu import cpu_seconds

#: Messages of the backlog a paused follower catches up on.
CATCH_UP_MESSAGES = 20_000

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
    with (
        tempfile.TemporaryDirectory(prefix="phpmq-bench-") as data_dir,
        BrokerProcess("--log-level", "WARNING", data_dir=data_dir) as broker,
    ):
        runs["single node, durable"] = _measured(
            broker.address, {"broker": broker.process.pid}, messages, size, window
        )
    with (
        tempfile.TemporaryDirectory(prefix="phpmq-bench-") as directory,
        LocalCluster(directory, flags=("--log-level", "WARNING")) as cluster,
    ):
        shard = cluster.map.owner(QUEUE).name
        cluster.wait_for_leaders(at_home=True)
        time.sleep(1.0)  # a leader that handed leadership home exits: let it come back
        leader = cluster.wait_settled(shard)
        followers = [r for r in cluster.replica_sets[shard] if r != leader]
        pids = {"leader": cluster.pid(leader)}
        pids.update({f"follower {i}": cluster.pid(r) for i, r in enumerate(followers, 1)})
        runs["3 replicas, durable"] = _measured(leader.address, pids, messages, size, window)
        catch_up = _catch_up(cluster, leader, followers[0])
        failovers = _failovers(cluster, shard, kills)
    _print(console, runs, catch_up, failovers)
    return {"runs": runs, "catch_up_msgs_per_s": catch_up, "failover_s": failovers}


def _measured(
    address: str, pids: dict[str, int], messages: int, size: int, window: int
) -> dict[str, Any]:
    """The confirmed pipe through `address`, with each process's CPU per message (µs)."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    run = run_pipe_through(address, messages, size, window, confirm=True)
    run["cpu_us"] = {
        name: (cpu_seconds(pid) - before[name]) / messages * 1e6 for name, pid in pids.items()
    }
    return run


def _catch_up(cluster: LocalCluster, leader: Any, follower: Any) -> float:
    """Messages a second a follower paused through a backlog of CATCH_UP_MESSAGES takes in
    once it runs again (until it has applied every committed entry), counted from its first
    applied entry: a follower paused past the connection timeout (3 s) first reconnects,
    which is not catching up."""
    queue = cluster.queue_of(leader.shard, 2)
    cluster.signal(follower, signal.SIGSTOP)
    try:
        before = _applied(cluster, leader)  # where the follower was, near enough
        with Client(leader.address, send_timeout=30, confirm_timeout=30) as client:
            client.send_many(queue, [b"x" * 100] * CATCH_UP_MESSAGES, confirm=True)
        target = (cluster.replication(leader) or {}).get("commit_index") or 0
    finally:
        cluster.signal(follower, signal.SIGCONT)
    paused = _applied(cluster, follower)
    while (moved := _applied(cluster, follower)) == paused:
        time.sleep(0.01)
    started, applied = time.monotonic(), moved
    while applied < target:
        time.sleep(0.02)
        applied = _applied(cluster, follower)
    share = (target - moved) / max(1, target - min(paused, before))  # of the backlog's entries
    return CATCH_UP_MESSAGES * share / max(time.monotonic() - started, 1e-3)


def _applied(cluster: LocalCluster, replica: Any) -> int:
    return int((cluster.replication(replica) or {}).get("applied_index") or 0)


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


def _print(
    console: Console, runs: dict[str, dict[str, Any]], catch_up: float, failovers: list[float]
) -> None:
    table = Table()
    columns = ("workload", "msgs/s", "confirm p50", "confirm p99", "deliver p99", "CPU/msg")
    for column in columns:
        table.add_column(column, justify="right")
    for name, run in runs.items():
        cpu = ", ".join(f"{who} {us:.1f} µs" for who, us in run["cpu_us"].items())
        table.add_row(
            name,
            f"{run['msgs_per_s']:,.0f}",
            f"{run['confirm_p50_ms']:.2f} ms",
            f"{run['confirm_p99_ms']:.2f} ms",
            f"{run['p99_ms']:.2f} ms",
            cpu,
        )
    console.print(table)
    single_cpu = runs["single node, durable"]["cpu_us"]["broker"]
    leader_cpu = runs["3 replicas, durable"]["cpu_us"]["leader"]
    console.print(
        f"what the followers cost the leader: {leader_cpu - single_cpu:+.1f} µs of CPU per"
        f" message ({leader_cpu:.1f} against {single_cpu:.1f} alone)"
    )
    console.print(
        f"catch-up: a follower paused through a backlog of {CATCH_UP_MESSAGES:,} messages"
        f" takes them in at {catch_up:,.0f} msgs/s"
    )
    single = runs["single node, durable"]["msgs_per_s"]
    replicated = runs["3 replicas, durable"]["msgs_per_s"]
    console.print(
        f"3 replicas: {replicated / single:.2f}x single-node durable (target ≥ {TARGET_RATIO}x)"
    )
    if failovers:
        console.print(
            f"failover, kill -9 of the leader to the first confirmed send, {len(failovers)}"
            f" kills: median {statistics.median(failovers):.2f} s, max {max(failovers):.2f} s"
            f" (target ≤ {TARGET_FAILOVER_S:.0f} s)"
        )
