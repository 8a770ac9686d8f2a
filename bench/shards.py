"""The `shards` workload: throughput over many queues with 1 shard and with N, in one run.

For each shard count a sharded broker (`phpmq broker --shards n`) starts on loopback, each
shard pinned to its own core when there are enough cores. Per shard one producer process
sends to the queues that shard owns (the cluster map from the HELLO answer says which) and
one consumer process consumes and acks them, for a fixed time. Printed: messages a second in
all, each shard's CPU (from /proc), the CPU a message costs a shard, the ratio of N shards to
one, and a model of what N free cores would give from that cost. Nothing is asserted.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from ..client import Client
from ..protocol import admin_commands as cmd
from ..testing import BrokerProcess, free_ports
from .forwarding import run_forwarding
from .shard_cpu import cpu_seconds, shard_pids

BATCH = 256
#: Messages a producer may be ahead of its consumer.
MAX_LEAD = 5_000
TARGET_SCALING = 0.8
#: A forwarded message's shard CPU against a direct one's (issue #32).
TARGET_FORWARD_COST = 1.3


def _producer(address: str, queues: list[str], seconds: float, size: int, consumed: Any) -> None:
    body = b"x" * size
    sent = 0
    with Client(address, name="bench-shards-producer", send_timeout=30) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            while sent - consumed.value > MAX_LEAD and time.monotonic() < end:
                time.sleep(0.0002)
            client.send_many(queues[(sent // BATCH) % len(queues)], [body] * BATCH)
            sent += BATCH


def _consumer(address: str, queues: list[str], seconds: float, consumed: Any, out: Any) -> None:
    received = 0
    with Client(address, name="bench-shards-consumer") as client:
        for queue in queues:
            client.subscribe(queue, 100)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            message = client.receive(timeout=0.1)
            if message is None:
                continue
            message.ack()
            received += 1
            if received % 256 == 0:
                consumed.value = received
        client.flush()
    out.put(received)


def run_shards(shards: int, queues: int, seconds: float, size: int) -> dict[str, Any]:
    """One sharded broker under load; its figures."""
    address = free_ports(shards)
    flags = ("--log-level", "INFO", "--shards", str(shards))
    with BrokerProcess(*flags, address=address) as broker:
        with Client(address) as probe:
            probe.admin(cmd.STATS)
            mapping = probe.cluster_map
        names = [f"bench-{index}" for index in range(queues)]
        owned: dict[str, list[str]] = {}
        for name in names:
            owner = mapping.owner(name).address if mapping else address
            owned.setdefault(owner, []).append(name)
        pids = shard_pids(broker, shards)
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) >= shards > 1:
            for pid, core in zip(pids, cores, strict=False):
                os.sched_setaffinity(pid, {core})
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        processes = []
        for owner, owner_queues in owned.items():
            consumed = ctx.Value("q", 0, lock=False)
            processes.append(
                ctx.Process(target=_consumer, args=(owner, owner_queues, seconds, consumed, out))
            )
            processes.append(
                ctx.Process(target=_producer, args=(owner, owner_queues, seconds, size, consumed))
            )
        cpu_before = [cpu_seconds(pid) for pid in pids]
        started = time.monotonic()
        for process in processes:
            process.start()
        received = sum(out.get(timeout=seconds + 60) for _ in owned)
        elapsed = time.monotonic() - started
        cpu = [cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before, strict=True)]
        for process in processes:
            process.join(30)
    rate = received / elapsed
    return {
        "shards": shards,
        "received": received,
        "msgs_per_s": rate,
        "cpu_percent": [100 * c / elapsed for c in cpu],
        "us_per_message": 1e6 * sum(cpu) / received if received else 0.0,
        "queues_per_shard": sorted(len(q) for q in owned.values()),
    }


def run_shards_benchmark(shards: int = 2, queues: int = 16, seconds: float = 10.0) -> dict:
    console = Console()
    cores = len(os.sched_getaffinity(0))
    console.print(
        f"shards: {queues} queues, per shard one producer and one consumer process (acking"
        f" each message), {seconds:.0f} s per run, 100-byte messages; 1 shard, then {shards}"
        f" (each pinned to its own core when there are enough: {cores} cores here)"
    )
    runs = [run_shards(1, queues, seconds, 100), run_shards(shards, queues, seconds, 100)]
    table = Table()
    for column in ("shards", "queues per shard", "msgs/s", "shard CPU %", "CPU µs/msg"):
        table.add_column(column, justify="right")
    for r in runs:
        table.add_row(
            str(r["shards"]),
            "/".join(map(str, r["queues_per_shard"])),
            f"{r['msgs_per_s']:,.0f}",
            " ".join(f"{c:.0f}" for c in r["cpu_percent"]),
            f"{r['us_per_message']:.1f}",
        )
    console.print(table)
    one, many = runs
    ratio = many["msgs_per_s"] / one["msgs_per_s"] if one["msgs_per_s"] else 0.0
    model = 1e6 / one["us_per_message"] if one["us_per_message"] else 0.0
    console.print(
        f"{shards} shards / 1 shard: {ratio:.2f}x (target ≥ {TARGET_SCALING * shards:.1f}x on"
        f" free cores). Model: a shard spends {one['us_per_message']:.1f} µs of CPU per"
        f" message, so each free core adds up to {model:,.0f} msgs/s; N cores for the shards"
        f" (and more for the clients) give about N x {model:,.0f}. Here {cores} cores carry"
        f" the shards and all {2 * shards} client processes."
    )
    forwarding = run_forwarding(seconds)
    direct, forwarded = forwarding["direct"], forwarding["forwarded"]
    console.print(
        f"forwarding (2 shards, stock-protocol producer and consumer on queues of local/1):"
        f" direct {direct['msgs_per_s']:,.0f} msgs/s at {direct['us_per_message']:.1f} µs of"
        f" shard CPU per message; through local/0 {forwarded['msgs_per_s']:,.0f} msgs/s at"
        f" {forwarded['us_per_message']:.1f} µs (local/0, which forwards,"
        f" {forwarded['us_per_message_by_shard'][0]:.1f} µs; local/1"
        f" {forwarded['us_per_message_by_shard'][1]:.1f} µs, {direct['us_per_message']:.1f}"
        f" direct): a forwarded message costs {forwarding['cost_ratio']:.2f}x a direct one"
        f" (target ≤ {TARGET_FORWARD_COST})."
    )
    return {
        "runs": runs,
        "ratio": ratio,
        "model_msgs_per_core": model,
        "forwarding": forwarding,
    }
