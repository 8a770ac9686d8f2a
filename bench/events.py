"""The `events` workload: publish-to-delivery through event routing.

A broker holds 10,000 bindings (1,000 of them patterns) on 1,000 queues; every published event
matches exactly 10 of them, which one consumer consumes (acking every copy). One producer
publishes `order.<n>.paid` events in frames of up to 256. Beside it, on the same bindings, the
pipe: plain sends to one queue. Each runs twice: as fast as it goes (at most MAX_LEAD copies
ahead of the consumer: copies a second) and paced at PACED_RATE copies a second, under both
ceilings, so that p99 is the path's and not a backlog's. Targets: ≥ 50,000 routed copies a
second, and the paced p99 of events within 1 ms of the pipe's. Nothing is asserted.
"""

from __future__ import annotations

import struct
import time
from array import array
from functools import partial
from typing import Any

import zmq
from rich.console import Console

from .. import protocol as p
from ..protocol import admin_commands as cmd
from ..testing import BrokerProcess
from .pipe import MAX_LEAD, _run, runs_table

TARGET_COPIES_PER_S = 50_000
TARGET_P99_DELTA_MS = 1.0
#: Event names the producer cycles through: each matches the same 10 queues.
DISTINCT_EVENTS = 100
MATCHING = [f"match-{i}" for i in range(10)]
#: Five matching queues are bound by every event's exact name, five by one pattern each.
MATCHING_PATTERNS = ["order.*.paid", "order.#", "#.paid", "*.*.paid", "order.*.*"]
FILLER_QUEUES = 1_000 - len(MATCHING)
BATCH = 256
PLAIN_QUEUE = "plain"
#: Copies a second in the paced runs: well under both ceilings, so latency is the path's.
PACED_RATE = 20_000


def bindings() -> dict[str, list[str]]:
    """Queue -> patterns: 10,000 bindings in all, 1,000 of them with wildcards."""
    plan: dict[str, list[str]] = {}
    for queue in MATCHING[:5]:
        plan[queue] = [f"order.{n}.paid" for n in range(DISTINCT_EVENTS)]
    for queue, pattern in zip(MATCHING[5:], MATCHING_PATTERNS, strict=True):
        plan[queue] = [pattern]
    exact = sum(len(patterns) for patterns in plan.values()) - len(MATCHING_PATTERNS)
    patterns_left = 1_000 - len(MATCHING_PATTERNS)
    exact_left = 9_000 - exact
    for index in range(FILLER_QUEUES):
        queue = f"filler-{index}"
        wild = [f"noise.{index}.*", f"noise.{index}.#"][
            : 1 + (index < patterns_left - FILLER_QUEUES)
        ]
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
                p.encode(p.Admin({"command": cmd.QUEUE_BIND, "queue": queue, "patterns": patterns}))
            )
            if not sock.poll(10_000):
                raise RuntimeError("the broker did not answer a queue-bind")
            [reply], _ = p.decode_frame(sock.recv())
            if "error" in reply.options:
                raise RuntimeError(f"queue-bind refused: {reply.options['error']}")
        return sum(len(patterns) for patterns in plan.values())
    finally:
        sock.close()


def _producer(
    address: str,
    copies: int,
    size: int,
    consumed: Any,
    _: Any = None,
    *,
    plain: bool = False,
    rate: int = 0,
) -> None:
    """Publishes `order.<n>.paid` events (`plain`: sends to PLAIN_QUEUE) until `copies`
    deliveries are due: at `rate` copies a second, or (0) as fast as the lead allows."""
    pad = b"x" * max(0, size - 8)
    pack = struct.Struct("<q").pack
    clock = time.monotonic_ns
    events = [f"order.{n}.paid" for n in range(DISTINCT_EVENTS)]
    fan_out = 1 if plain else len(MATCHING)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 5_000
    sock.connect(address)
    sent = 0
    total = copies // fan_out
    start = time.monotonic()
    while sent < total:
        if rate:
            due = min(total, int((time.monotonic() - start) * rate / fan_out)) - sent
            if due <= 0:
                time.sleep(0.0005)
                continue
            count = min(due, BATCH)
        else:
            while sent * fan_out - consumed.value > MAX_LEAD:
                time.sleep(0.0002)
            count = min(BATCH, total - sent)
        if plain:
            batch = [p.Send(PLAIN_QUEUE, pack(clock()) + pad, 0) for _ in range(count)]
        else:
            batch = [
                p.Publish(events[(sent + i) % DISTINCT_EVENTS], pack(clock()) + pad)
                for i in range(count)
            ]
        sock.send(p.encode_all(batch))  # type: ignore[arg-type]
        sent += count
    sock.close()


def _subscriber(
    address: str,
    copies: int,
    window: int,
    consumed: Any,
    out: Any,
    *,
    queues: tuple[str, ...] = tuple(MATCHING),
) -> None:
    latencies = array("q")
    clock = time.monotonic_ns
    unpack = struct.Struct("<q").unpack_from
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 1_000
    sock.connect(address)
    sock.send(p.encode_all([p.Hello({}), *[p.Consume(queue, window) for queue in queues]]))
    packets = {queue: p.queue_packet(queue) for queue in queues}
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


def _broker_run(copies: int, size: int, window: int, plain: bool, rate: int) -> dict:
    """One run on a fresh broker holding the bindings."""
    with BrokerProcess("--log-level", "WARNING") as broker:
        _bind_all(broker.address, bindings())
        queues = (PLAIN_QUEUE,) if plain else tuple(MATCHING)
        return _run(
            broker.address,
            partial(_subscriber, queues=queues),
            copies,
            size,
            window,
            producer_target=partial(_producer, plain=plain, rate=rate),
        )


def run_events_benchmark(
    messages: int = 200_000, size: int = 100, window: int = 100, rate: int = PACED_RATE
) -> dict:
    """`messages` copies through event routing and the same number of plain sends, each as
    fast as they go and then paced at `rate` a second (latency of the path, not of a
    backlog), in one run."""
    console = Console()
    plan = bindings()
    patterns = sum(1 for ps in plan.values() for x in ps if "*" in x or "#" in x)
    console.print(
        f"events: {sum(map(len, plan.values())):,} bindings ({patterns:,} patterns) on"
        f" {len(plan):,} queues; 1 producer publishes {messages // len(MATCHING):,} events of"
        f" {size} bytes, each matching {len(MATCHING)} queues; 1 consumer acks {messages:,}"
        f" copies (window {window} per queue). Beside it the pipe: {messages:,} plain sends"
        f" to one queue. Each as fast as it goes, then paced at {rate:,} copies/s; loopback"
    )
    runs = {
        "events, full speed": _broker_run(messages, size, window, False, 0),
        "pipe, full speed": _broker_run(messages, size, window, True, 0),
        f"events, {rate:,}/s": _broker_run(messages, size, window, False, rate),
        f"pipe, {rate:,}/s": _broker_run(messages, size, window, True, rate),
    }
    console.print(runs_table("workload", runs))
    copies_per_s = runs["events, full speed"]["msgs_per_s"]
    delta = runs[f"events, {rate:,}/s"]["p99_ms"] - runs[f"pipe, {rate:,}/s"]["p99_ms"]
    console.print(
        f"routed copies: {copies_per_s:,.0f}/s (target ≥ {TARGET_COPIES_PER_S:,}),"
        f" {copies_per_s / runs['pipe, full speed']['msgs_per_s']:.0%} of the pipe's msgs/s;"
        f" paced p99 {delta:+.2f} ms against the pipe's (target within"
        f" ±{TARGET_P99_DELTA_MS:.0f} ms). At full speed latency is mostly the"
        f" {MAX_LEAD:,}-message lead waiting in line."
    )
    return {"runs": runs, "p99_delta_ms": delta}
