"""The `events` workload: publish-to-delivery through event routing.

A broker holds 10,000 bindings (1,000 of them patterns) on 1,000 queues; every published event
matches exactly 10 of them, which one consumer consumes (acking every copy). One producer
publishes `order.<n>.paid` events in frames of 256, staying at most MAX_LEAD copies ahead of
the consumer so that latency measures the path, not a backlog. Figures: routed copies a
second and p50/p99 publish-to-delivery latency, beside the plain pipe's p99 measured in the
same run (target: the same p99 ± 1 ms, and ≥ 50,000 routed copies a second).
"""

from __future__ import annotations

import struct
import time
from array import array
from typing import Any

import zmq
from rich.console import Console
from rich.table import Table

from .. import protocol as p
from ..testing import BrokerProcess
from .pipe import MAX_LEAD, _run, run_broker_pipe

TARGET_COPIES_PER_S = 50_000
TARGET_P99_DELTA_MS = 1.0
#: Event names the producer cycles through: each matches the same 10 queues.
DISTINCT_EVENTS = 100
MATCHING = [f"match-{i}" for i in range(10)]
#: Five matching queues are bound by exact names (one per event), five by one pattern each.
MATCHING_PATTERNS = ["order.*.paid", "order.#", "#.paid", "*.*.paid", "order.*.*"]
FILLER_QUEUES = 1_000 - len(MATCHING)
BATCH = 256


def bindings() -> dict[str, list[str]]:
    """Queue -> patterns: 10,000 bindings in all, 1,000 of them with wildcards."""
    plan: dict[str, list[str]] = {}
    for index, queue in enumerate(MATCHING[:5]):
        plan[queue] = [f"order.{n}.paid" for n in range(DISTINCT_EVENTS)][index::5]
    for queue, pattern in zip(MATCHING[5:], MATCHING_PATTERNS, strict=True):
        plan[queue] = [pattern]
    exact = sum(len(patterns) for patterns in plan.values()) - len(MATCHING_PATTERNS)
    patterns_left = 1_000 - len(MATCHING_PATTERNS)
    exact_left = 9_000 - exact
    for index in range(FILLER_QUEUES):
        queue = f"filler-{index}"
        wild = [f"noise.{index}.*"] if index < patterns_left else []
        count = exact_left // FILLER_QUEUES + (index < exact_left % FILLER_QUEUES)
        plan[queue] = wild + [f"noise.{index}.e{j}" for j in range(count)]
    return plan


def _bind_all(address: str, plan: dict[str, list[str]]) -> int:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    try:
        for queue, patterns in plan.items():
            sock.send(
                p.encode(p.Admin({"command": "queue-bind", "queue": queue, "patterns": patterns}))
            )
            if not sock.poll(10_000):
                raise RuntimeError("the broker did not answer a queue-bind")
            [reply], _ = p.decode_frame(sock.recv())
            if "error" in reply.options:
                raise RuntimeError(f"queue-bind refused: {reply.options['error']}")
        return sum(len(patterns) for patterns in plan.values())
    finally:
        sock.close()


def _publisher(address: str, copies: int, size: int, consumed: Any, _: Any = None) -> None:
    pad = b"x" * max(0, size - 8)
    pack = struct.Struct("<q").pack
    clock = time.monotonic_ns
    events = [f"order.{n}.paid" for n in range(DISTINCT_EVENTS)]
    fan_out = len(MATCHING)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 5_000
    sock.connect(address)
    sent = 0
    total = copies // fan_out
    while sent < total:
        while sent * fan_out - consumed.value > MAX_LEAD:
            time.sleep(0.0002)
        count = min(BATCH, total - sent)
        sock.send(
            p.encode_all(
                [
                    p.Publish(events[(sent + i) % DISTINCT_EVENTS], pack(clock()) + pad)
                    for i in range(count)
                ]
            )
        )
        sent += count
    sock.close()


def _subscriber(address: str, copies: int, window: int, consumed: Any, out: Any) -> None:
    latencies = array("q")
    clock = time.monotonic_ns
    unpack = struct.Struct("<q").unpack_from
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 1_000
    sock.connect(address)
    sock.send(p.encode_all([p.Hello({}), *[p.Consume(queue, window) for queue in MATCHING]]))
    packets = {queue: p.queue_packet(queue) for queue in MATCHING}
    start = None
    while len(latencies) < copies and sock.poll(30_000):
        decoded, _ = p.decode_frame(sock.recv())
        acks = []
        for message in decoded:
            if type(message) is not p.Dispatch:
                continue
            if start is None:
                start = clock()
            latencies.append(clock() - unpack(message.content)[0])
            acks.append(p.encode_ack(packets[message.queue], message.message_id))
        consumed.value = len(latencies)
        if acks:
            sock.send(b"".join(acks))
    sock.close()
    out.put((len(latencies), clock() - (start or clock()), latencies.tobytes()))


def run_events_benchmark(messages: int = 200_000, size: int = 100, window: int = 100) -> dict:
    """Routed copies through the broker (`messages` copies in all) and the plain pipe's
    figures for the same number of messages, in one run."""
    console = Console()
    plan = bindings()
    with BrokerProcess("--log-level", "WARNING") as broker:
        started = time.perf_counter()
        total = _bind_all(broker.address, plan)
        bind_s = time.perf_counter() - started
        patterns = sum(1 for ps in plan.values() for x in ps if "*" in x or "#" in x)
        console.print(
            f"events: {total:,} bindings ({patterns:,} patterns) on {len(plan):,} queues,"
            f" bound in {bind_s:.1f} s; 1 producer publishes {messages // len(MATCHING):,}"
            f" events of {size} bytes, each matching {len(MATCHING)} queues; 1 consumer acks"
            f" {messages:,} copies (window {window} per queue), loopback"
        )
        events = _run(
            broker.address, _subscriber, messages, size, window, producer_target=_publisher
        )
    pipe = run_broker_pipe(messages, size, window)
    table = Table()
    for column in ("workload", "received", "msgs/s", "p50 ms", "p99 ms"):
        table.add_column(column, justify="right")
    for name, r in (("events (routed copies)", events), ("pipe (plain sends)", pipe)):
        table.add_row(
            name,
            f"{r['received']:,}",
            f"{r['msgs_per_s']:,.0f}",
            f"{r['p50_ms']:.2f}",
            f"{r['p99_ms']:.2f}",
        )
    console.print(table)
    delta = events["p99_ms"] - pipe["p99_ms"]
    console.print(
        f"routed copies: {events['msgs_per_s']:,.0f}/s (target ≥ {TARGET_COPIES_PER_S:,});"
        f" p99 {events['p99_ms']:.2f} ms vs pipe {pipe['p99_ms']:.2f} ms:"
        f" {delta:+.2f} ms (target within ±{TARGET_P99_DELTA_MS:.0f} ms)"
    )
    return {"events": events, "pipe": pipe, "p99_delta_ms": delta}
