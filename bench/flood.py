"""The `flood` workload: is the broker fair and bounded when producers overload it?

A broker with a small queue limit; N flooders, each a raw DEALER that never reads, send frames
of 256 fire-and-forget 001s (100-byte contents) into one queue as fast as the socket takes
them. Once the queue is full, and every later send refused (the flood issue 27's finding 10
is about), a calm pair starts and moves 2,000 msg/s through another queue, with a sequence
number and a monotonic time in each content; its figures count from a second after its first
message went through:

- `stock` (the default): what the stock PHP client and most ZeroMQ tools do, one message per
  frame in the stock protocol (no HELLO, no tags): a raw DEALER producer sending each 001 in a
  frame of its own on a fixed schedule (the time in the content is when the message was due,
  so a producer held up by the broker counts its wait), and a raw DEALER consumer acking each
  003 in a frame of its own;
- `client`: a paced `Client` producer (`send_many` of what is due every 5 ms) and a
  `Client.consume` consumer acking each message.

The broker's RSS is sampled every 0.2 s and a `stats` request, from a new connection as
`phpmq stats` makes one, is timed about once a second.

Printed: how long the queue took to fill, broker RSS before and at its peak, the calm pair's
latency (of the messages sent during the flood: the target's; and over the whole run, the
settling second included) and its sent, received, duplicate and missing counts, the slowest
`stats` answer, and the broker's own counters at the end. Targets (issues 15 and 27): peak
RSS ≤ 512 MB, calm p99 ≤ 50 ms; each figure's ratio to its target is printed beside it.
Nothing is asserted.
"""

from __future__ import annotations

import multiprocessing as mp
import struct
import threading
import time
from array import array
from typing import Any

import zmq
from rich.console import Console
from rich.table import Table

from .. import protocol as p
from ..client import Client, ClientError, PartialSend
from ..protocol import admin_commands as cmd
from ..testing import BrokerProcess
from .measure import MB, RssSampler, SeenSequence, mb, ms, percentiles, verdict

FLOOD_QUEUE = "flood"
CALM_QUEUE = "calm"
FRAME_MESSAGES = 256
CONTENT_BYTES = 100
CALM_RATE = 2_000
#: How often the calm producer sends what is due (seconds).
CALM_TICK_S = 0.005
#: How often the stock calm producer looks at its schedule: each due message is a frame.
STOCK_TICK_S = 0.0005
CALM_WINDOW = 100
#: The calm pairs: `stock` (one message per frame, raw DEALERs) and `client` (phpmq.Client).
CALM_PAIRS = ("stock", "client")
TARGET_PEAK_RSS = 512 * MB
TARGET_CALM_P99_MS = 50.0
#: A flood is stopped early when the broker's RSS passes this, to keep the machine usable.
RSS_SAFETY_LIMIT = 6 * 1024 * MB
#: After the flood, how long the calm consumer waits for what is still on its way.
DRAIN_TIMEOUT_S = 60.0
STATS_EVERY_S = 1.0
STATS_TIMEOUT_S = 60.0
_STAMP = struct.Struct("<qq")  # sequence number, monotonic send time (ns)


def _flooder(address: str, stop: Any, frames_out: Any) -> None:
    """Send one pre-encoded frame of FRAME_MESSAGES sends again and again until `stop`;
    never read. Puts the count of frames the socket took."""
    packet = p.queue_packet(FLOOD_QUEUE)
    content = b"f" * CONTENT_BYTES
    frame = b"".join(p.encode_send(packet, content, 0) for _ in range(FRAME_MESSAGES))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    frames = 0
    while not stop.is_set():
        try:
            sock.send(frame, zmq.NOBLOCK)
            frames += 1
        except zmq.Again:
            sock.poll(50, zmq.POLLOUT)
    sock.close()
    frames_out.put(frames)


def _calm_producer(address: str, stop: Any, produced: Any, done: Any, out: Any) -> None:
    """CALM_RATE messages a second into CALM_QUEUE until `stop`, in small batches on a
    schedule; `produced` counts those the socket took."""
    pad = b"c" * (CONTENT_BYTES - _STAMP.size)
    clock = time.monotonic_ns
    pack = _STAMP.pack
    failures: list[str] = []
    events: list[str] = []
    seq = 0
    with Client(
        address, name="bench-calm-producer", on_event=lambda event, _: events.append(event)
    ) as client:
        start = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - start) * CALM_RATE) - seq
            if due > 0:
                first = seq
                seq += due
                try:
                    client.send_many(
                        CALM_QUEUE, (pack(n, clock()) + pad for n in range(first, first + due))
                    )
                    produced.value += due
                except PartialSend as exc:
                    produced.value += exc.sent
                    failures.append(str(exc))
                except ClientError as exc:
                    failures.append(str(exc))
            time.sleep(CALM_TICK_S)
        done.set()
        out.put((seq, failures[:5], len(failures), events))


class _Arrivals:
    """What a calm consumer saw: each first delivery's latency and send time, duplicates and
    redeliveries; `finished` says when to stop (everything produced arrived, or the drain
    timed out)."""

    def __init__(self) -> None:
        self.latencies = array("q")
        self.sent_at = array("q")
        self.seen = SeenSequence()
        self.redelivered = 0
        self._done_at: float | None = None

    def arrived(self, content: bytes, delivery_count: int, now: int) -> None:
        seq, sent_at = _STAMP.unpack_from(content)
        if self.seen.first_time(seq):
            self.latencies.append(now - sent_at)
            self.sent_at.append(sent_at)
        if delivery_count > 1:
            self.redelivered += 1

    def finished(self, produced: Any, done: Any) -> bool:
        if not done.is_set():
            return False
        self._done_at = self._done_at or time.monotonic()
        return (
            len(self.latencies) >= produced.value
            or time.monotonic() - self._done_at > DRAIN_TIMEOUT_S
        )

    def result(self, events: list[str]) -> tuple[bytes, bytes, int, int, list[str]]:
        return (
            self.latencies.tobytes(),
            self.sent_at.tobytes(),
            self.seen.duplicates,
            self.redelivered,
            events,
        )


def _calm_consumer(address: str, produced: Any, done: Any, moving: Any, out: Any) -> None:
    """Consume CALM_QUEUE acking each message until every produced message arrived (or
    DRAIN_TIMEOUT_S after the producer stopped); puts latencies and counts."""
    arrivals = _Arrivals()
    clock = time.monotonic_ns
    events: list[str] = []
    with Client(
        address, name="bench-calm-consumer", on_event=lambda event, _: events.append(event)
    ) as client:
        client.subscribe(CALM_QUEUE, window=CALM_WINDOW)
        while not arrivals.finished(produced, done):
            message = client.receive(timeout=0.2)
            if message is not None:
                arrivals.arrived(message.content, message.delivery_count, clock())
                message.ack()
                moving.set()
        client.flush()
    out.put(arrivals.result(events))


def _stock_producer(address: str, stop: Any, produced: Any, done: Any, out: Any) -> None:
    """CALM_RATE messages a second into CALM_QUEUE until `stop`, each a stock 001 in a frame of
    its own (blocking sends, as the stock client's); the time in each is when it was due."""
    packet = p.queue_packet(CALM_QUEUE)
    pad = b"c" * (CONTENT_BYTES - _STAMP.size)
    pack = _STAMP.pack
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    start_ns = time.monotonic_ns()
    seq = 0
    while not stop.is_set():
        due = (time.monotonic_ns() - start_ns) * CALM_RATE // 1_000_000_000
        while seq < due:
            sent_at = start_ns + seq * 1_000_000_000 // CALM_RATE
            sock.send(p.encode_send(packet, pack(seq, sent_at) + pad, None))
            seq += 1
            produced.value = seq
        time.sleep(STOCK_TICK_S)
    # What the socket still queues (a broker slowed by the flood reads the pair late) goes
    # out before this process ends: closed with no linger, it was dropped and counted missing.
    sock.close(linger=int(DRAIN_TIMEOUT_S * 1000))
    zmq.Context.instance().term()
    done.set()
    out.put((seq, [], 0, []))


def _stock_consumer(address: str, produced: Any, done: Any, moving: Any, out: Any) -> None:
    """A stock consumer of CALM_QUEUE (window CALM_WINDOW) acking each 003 in a frame of its
    own, until every produced message arrived (or DRAIN_TIMEOUT_S after the producer stopped)."""
    packet = p.queue_packet(CALM_QUEUE)
    arrivals = _Arrivals()
    clock = time.monotonic_ns
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    sock.send(p.encode(p.Consume(CALM_QUEUE, CALM_WINDOW)))
    while not arrivals.finished(produced, done):
        if sock.poll(200, zmq.POLLIN):
            messages, _ = p.decode_frame(sock.recv())
            now = clock()
            for message in messages:
                if isinstance(message, p.Dispatch):
                    arrivals.arrived(message.content, message.delivery_count or 1, now)
                    sock.send(p.encode_ack(packet, message.message_id))
                    moving.set()
    sock.close()
    out.put(arrivals.result([]))


def _wait_until_full(address: str, queue_limit: int) -> None:
    """Until FLOOD_QUEUE holds `queue_limit` messages (or STATS_TIMEOUT_S passed)."""
    deadline = time.monotonic() + STATS_TIMEOUT_S
    with Client(address, name="bench-fill-watch", close_timeout=1) as client:
        while time.monotonic() < deadline:
            queues = client.admin(cmd.STATS, timeout=STATS_TIMEOUT_S)["queues"]
            if queues.get(FLOOD_QUEUE, {}).get("ready", 0) >= queue_limit:
                return
            time.sleep(0.02)


def _sent_between(latencies: array, sent_ats: array, start_ns: int, end_ns: int) -> array:
    """The latencies of the messages sent from `start_ns` to `end_ns`."""
    return array(
        "q",
        (
            latency
            for latency, sent_at in zip(latencies, sent_ats, strict=True)
            if start_ns <= sent_at < end_ns
        ),
    )


class _StatsProbe:
    """Times a `stats` request from a new connection (connect and answer, as `phpmq stats`
    would see it, not the goodbye) about every STATS_EVERY_S seconds."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.durations: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stats probe", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(STATS_EVERY_S):
            try:
                start = time.monotonic()  # connecting counts, as for `phpmq stats`
                with Client(self.address, name="bench-stats", close_timeout=1) as client:
                    client.admin(cmd.STATS, timeout=STATS_TIMEOUT_S)
                    self.durations.append(time.monotonic() - start)
            except ClientError:
                self.failures += 1

    def __enter__(self) -> _StatsProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(STATS_TIMEOUT_S + 5)


def run_flood_benchmark(
    seconds: float = 20.0, flooders: int = 2, queue_limit: int = 100_000, calm: str = "stock"
) -> dict[str, Any]:
    console = Console(width=max(Console().width, 110))
    how = (
        "one message per frame, stock protocol, raw DEALERs"
        if calm == "stock"
        else "phpmq.Client, a few messages per frame"
    )
    console.print(
        f"flood: {flooders} raw DEALERs that never read send frames of {FRAME_MESSAGES}"
        f" fire-and-forget {CONTENT_BYTES}-byte messages into '{FLOOD_QUEUE}'"
        f" (--max-queue-length {queue_limit:,}) for {seconds:g} s, while a calm pair ({how})"
        f" moves {CALM_RATE:,} msg/s through '{CALM_QUEUE}' (window {CALM_WINDOW}, acking)"
    )
    if calm not in CALM_PAIRS:
        raise ValueError(f"calm pair {calm!r}: one of {', '.join(CALM_PAIRS)}")
    consume, produce = (
        (_stock_consumer, _stock_producer) if calm == "stock" else (_calm_consumer, _calm_producer)
    )
    ctx = mp.get_context("spawn")
    stop, done, moving = ctx.Event(), ctx.Event(), ctx.Event()
    produced = ctx.Value("q", 0, lock=False)
    frames_out, producer_out, consumer_out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    with BrokerProcess("--log-level", "WARNING", "--max-queue-length", str(queue_limit)) as broker:
        pid = broker.process.pid
        with RssSampler(pid, 0.2) as rss:
            rss_before = rss.sample()
            consumer = ctx.Process(
                target=consume, args=(broker.address, produced, done, moving, consumer_out)
            )
            producer = ctx.Process(
                target=produce, args=(broker.address, stop, produced, done, producer_out)
            )
            floods = [
                ctx.Process(target=_flooder, args=(broker.address, stop, frames_out))
                for _ in range(flooders)
            ]
            # Issue 27's flood goes into a full queue: the flooders fill it before the calm
            # pair starts, which then settles for a second before the figures count.
            fill_started = time.monotonic()
            for flood in floods:
                flood.start()
            _wait_until_full(broker.address, queue_limit)
            fill_seconds = time.monotonic() - fill_started
            consumer.start()
            producer.start()
            moving.wait(STATS_TIMEOUT_S)  # the first calm message went through
            time.sleep(1.0)
            flood_started = time.monotonic()
            flood_started_ns = time.monotonic_ns()
            stopped_early = False
            with _StatsProbe(broker.address) as probe:
                deadline = flood_started + seconds
                while time.monotonic() < deadline:
                    time.sleep(0.1)
                    if (rss.last or 0) > RSS_SAFETY_LIMIT:
                        stopped_early = True
                        break
                flood_seconds = time.monotonic() - flood_started
                flood_ended_ns = time.monotonic_ns()
                stop.set()
            frames = sum(frames_out.get(timeout=30) for _ in floods)
            for flood in floods:
                flood.join(10)
            attempted, failures, failure_count, producer_events = producer_out.get(timeout=60)
            raw, raw_sent_at, duplicates, redelivered, consumer_events = consumer_out.get(
                timeout=DRAIN_TIMEOUT_S + 60
            )
            producer.join(10)
            consumer.join(10)
            with Client(broker.address, name="bench-stats", close_timeout=1) as client:
                stats = client.admin(cmd.STATS, timeout=STATS_TIMEOUT_S)
            rss_end = rss.sample()
    latencies = array("q", raw)
    sent_ats = array("q", raw_sent_at)
    # The target is for the flood into the full queue, the pair settled.
    during = _sent_between(latencies, sent_ats, flood_started_ns, flood_ended_ns)
    figures = {
        "rss_before": rss_before,
        "rss_peak": rss.peak,
        "rss_end": rss_end,
        "flood_seconds": flood_seconds,
        "stopped_early": stopped_early,
        "flood_messages": frames * FRAME_MESSAGES,
        "sent": produced.value,
        "attempted": attempted,
        "send_failures": failure_count,
        "received": len(latencies),
        "duplicates": duplicates,
        "redelivered_seen": redelivered,
        "missing": produced.value - len(latencies),
        "stats_max_s": max(probe.durations, default=None),
        "stats_answers": len(probe.durations),
        "stats_failures": probe.failures,
        "events": producer_events + consumer_events,
        "calm": calm,
        **percentiles(during, 0.5, 0.99),
        "p99_whole_run": percentiles(latencies, 0.99)["p99"],
        "fill_seconds": fill_seconds,
        "stats": stats,
    }
    _print_flood(console, figures, failures)
    return figures


def _print_flood(console: Console, f: dict[str, Any], failures: list[str]) -> None:
    table = Table(title=f"flood: figures against targets ({f['calm']} calm pair)")
    table.add_column("figure")
    for column in ("value", "target", "ratio", ""):
        table.add_column(column, justify="right")
    table.add_row("broker RSS before", mb(f["rss_before"]), "", "", "")
    table.add_row(
        "broker RSS peak", mb(f["rss_peak"]), f"≤ {mb(TARGET_PEAK_RSS)}",
        _ratio(f["rss_peak"], TARGET_PEAK_RSS), verdict(f["rss_peak"], TARGET_PEAK_RSS),
    )  # fmt: skip
    table.add_row("broker RSS at the end", mb(f["rss_end"]), "", "", "")
    table.add_row("calm p50", ms(f["p50"]), "", "", "sent during the flood")
    table.add_row(
        "calm p99", ms(f["p99"]), f"≤ {TARGET_CALM_P99_MS:g} ms",
        _ratio(f["p99"], TARGET_CALM_P99_MS), verdict(f["p99"], TARGET_CALM_P99_MS),
    )  # fmt: skip
    table.add_row("calm max", ms(f["max"]), "", "", "")
    table.add_row("calm p99, whole run", ms(f["p99_whole_run"]), "", "", "with the settling")
    stats_max = f["stats_max_s"]
    table.add_row(
        "slowest stats answer",
        "-" if stats_max is None else f"{stats_max * 1000:,.0f} ms",
        "",
        "",
        f"{f['stats_answers']} answered, {f['stats_failures']} not",
    )
    console.print(table)
    early = " (stopped early: RSS over the safety limit)" if f["stopped_early"] else ""
    console.print(
        f"flood: the queue filled in {f['fill_seconds']:.2f} s; {f['flood_messages']:,} messages"
        f" in {f['flood_seconds']:.1f} s taken by the flooders' sockets{early}"
    )
    events: dict[str, int] = {}
    for event in f["events"]:
        events[event] = events.get(event, 0) + 1
    console.print(
        f"calm pair: sent {f['sent']:,} (of {f['attempted']:,} due; {f['send_failures']} send"
        f" failures), received {f['received']:,}, duplicates {f['duplicates']:,}, missing"
        f" {f['missing']:,}, redeliveries seen {f['redelivered_seen']:,}; client events:"
        f" {', '.join(f'{k} {v}' for k, v in events.items()) or 'none'}"
    )
    for failure in failures:
        console.print(f"  send failure: {failure}")
    _print_broker_stats(console, f["stats"])


def _ratio(value: float | None, target: float) -> str:
    """A figure as a multiple of its target (≤ 1.00 meets it)."""
    return "-" if value is None else f"{value / target:.2f}"


def _print_broker_stats(console: Console, stats: dict[str, Any]) -> None:
    counters = stats.get("counters", {})
    console.print(
        "broker counters at the end: "
        + ", ".join(f"{name} {value:,}" for name, value in counters.items())
    )
    server = stats.get("server") or {}
    console.print(
        "broker server stats: "
        + (", ".join(f"{name} {value}" for name, value in server.items()) or "none reported")
    )
    for name, queue in stats.get("queues", {}).items():
        shown = {key: value for key, value in queue.items() if key != "settings"}
        console.print(f"queue {name}: " + ", ".join(f"{k} {v}" for k, v in shown.items()))


if __name__ == "__main__":
    run_flood_benchmark()
