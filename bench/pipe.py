"""The `pipe` workload: 1 producer -> 1 queue -> 1 consumer acking every message, over
loopback, against (a) a real broker process and (b) a bare pyzmq relay that forwards the same
frames with no broker logic: the ceiling. Every run uses the same producer (the Client's
send_many); the producer keeps at most MAX_LEAD messages ahead of the consumer so latency
measures the path, not a backlog. The broker/relay ratio compares runs with the same raw
consumer too (it decodes each frame and acks its messages in one frame), so that it measures
the broker; the Client's consumer and the asyncio client (AsyncClient on both ends) have rows
of their own.

Latency is measured per message from the producer's encode to the consumer's receipt, with
the system-wide monotonic clock embedded in the content.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import struct
import sys
import time
from array import array
from typing import Any

import zmq
from rich.console import Console
from rich.table import Table

from .. import protocol as p
from ..client import AsyncClient, Client, Unconfirmed
from ..client.batches import BATCH_MESSAGES
from ..protocol.constants import DEFAULT_MAX_CONTENT_BYTES
from ..testing import BrokerProcess, free_port
from .shard_cpu import cpu_seconds

QUEUE = "bench"
#: Messages the producer may be ahead of the consumer.
MAX_LEAD = 5_000
#: What the raw consumer acks a relayed send with (the relay drops acks unread).
_DUMMY_ID = b"d7e7f68761d34838494b233148b5486c"
#: Seconds any one run may take before it is abandoned.
RUN_TIMEOUT = 300
TARGET_MSGS_PER_S = 50_000
#: The broker against the relay, same producer and raw consumer (issue #32).
TARGET_RATIO = 0.75
#: The durable pipe with confirms after fsync against the same relay (issue #32).
TARGET_DURABLE_RATIO = 0.40
#: The asyncio client's pipe against the sync client's, through the same broker.
TARGET_ASYNC_RATIO = 0.80


def _producer(
    address: str,
    messages: int,
    size: int,
    consumed: Any,
    confirms: Any = None,
    heartbeat_ms: int = 1000,
) -> None:
    """Sends `messages`; with a `confirms` queue, as confirmed sends, and puts there the
    confirm latencies (send to confirm, ns) and the count of sends not confirmed.
    `heartbeat_ms` 0: no heartbeats agreed (the relay answers HELLO only, and sends none)."""
    pad = b"x" * max(0, size - 8)
    clock = time.monotonic_ns
    pack = struct.Struct("<q").pack
    sent_at = array("q")
    latencies = array("q")

    def contents() -> Any:
        for sent in range(messages):
            if sent % 256 == 0:
                while sent - consumed.value > MAX_LEAD:
                    time.sleep(0.0002)
            now = clock()
            sent_at.append(now)
            yield pack(now) + pad

    def confirmed(index: int, message_id: str) -> None:
        latencies.append(clock() - sent_at[index])

    with Client(
        address, name="bench-producer", send_timeout=30, heartbeat_ms=heartbeat_ms
    ) as client:
        if confirms is None:
            client.send_many(QUEUE, contents())
            return
        try:
            client.send_many(QUEUE, contents(), confirm=True, on_confirm=confirmed)
            failed = 0
        except Unconfirmed as exc:
            failed = len(exc.ids) - sum(i is not None for i in exc.ids)
        confirms.put((latencies.tobytes(), failed))


def _consume_broker(address: str, messages: int, window: int, consumed: Any, out: Any) -> None:
    latencies = array("q")
    clock = time.monotonic_ns
    unpack = struct.Struct("<q").unpack_from
    start = None
    with Client(address, name="bench-consumer") as client:
        for message in client.consume(QUEUE, window=window, timeout=30):
            if start is None:
                start = clock()
            latencies.append(clock() - unpack(message.content)[0])
            message.ack()
            if len(latencies) % 256 == 0:
                consumed.value = len(latencies)
            if len(latencies) >= messages:
                break
        client.flush()
    out.put((len(latencies), clock() - (start or clock()), latencies.tobytes()))


def _async_producer(address: str, messages: int, size: int, consumed: Any, _: Any = None) -> None:
    """`_producer`'s work on the AsyncClient: frames of BATCH_MESSAGES, as send_many packs."""
    asyncio.run(_produce_async(address, messages, size, consumed))


async def _produce_async(address: str, messages: int, size: int, consumed: Any) -> None:
    pad = b"x" * max(0, size - 8)
    clock = time.monotonic_ns
    pack = struct.Struct("<q").pack
    async with AsyncClient(address, name="bench-producer", send_timeout=30) as client:
        for first in range(0, messages, BATCH_MESSAGES):
            while first - consumed.value > MAX_LEAD:
                await asyncio.sleep(0.0002)
            count = min(BATCH_MESSAGES, messages - first)
            await client.send_many(QUEUE, [pack(clock()) + pad for _ in range(count)])


def _consume_async(address: str, messages: int, window: int, consumed: Any, out: Any) -> None:
    """`_consume_broker`'s work on the AsyncClient."""
    out.put(asyncio.run(_consume_async_run(address, messages, window, consumed)))


async def _consume_async_run(
    address: str, messages: int, window: int, consumed: Any
) -> tuple[int, int, bytes]:
    latencies = array("q")
    clock = time.monotonic_ns
    unpack = struct.Struct("<q").unpack_from
    start = None
    async with AsyncClient(address, name="bench-consumer") as client:
        async for message in client.consume(QUEUE, window=window, timeout=30):
            if start is None:
                start = clock()
            latencies.append(clock() - unpack(message.content)[0])
            await message.ack()
            if len(latencies) % 256 == 0:
                consumed.value = len(latencies)
            if len(latencies) >= messages:
                break
        await client.flush()
    return len(latencies), clock() - (start or clock()), latencies.tobytes()


def _consume_raw(address: str, messages: int, window: int, consumed: Any, out: Any) -> None:
    """The consumer's work by hand: decode each frame, ack its messages in one frame (the
    relay drops the acks; a broker takes them)."""
    latencies = array("q")
    clock = time.monotonic_ns
    unpack = struct.Struct("<q").unpack_from
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 1000
    sock.connect(address)
    sock.send(p.encode(p.Consume(QUEUE, window)))
    packet = p.queue_packet(QUEUE)
    start = None
    while len(latencies) < messages and sock.poll(30_000):
        frame = sock.recv()
        if start is None:
            start = clock()
        decoded, _ = p.decode_frame(frame)
        acks = []
        for message in decoded:
            if type(message) is not p.Send and type(message) is not p.Dispatch:
                continue  # the producer's HELLO
            latencies.append(clock() - unpack(message.content)[0])
            # The relay passes sends on as they came: without an ID, the ack is a dummy.
            message_id = message.message_id if type(message) is p.Dispatch else _DUMMY_ID
            acks.append(p.encode_ack(packet, message_id))
        consumed.value = len(latencies)
        if acks:
            sock.send(b"".join(acks))
    sock.close()
    out.put((len(latencies), clock() - (start or clock()), latencies.tobytes()))


def _relay_producer(
    address: str, messages: int, size: int, consumed: Any, confirms: Any = None
) -> None:
    _producer(address, messages, size, consumed, confirms, heartbeat_ms=0)


def _relay(port: int, ready: Any) -> None:
    """Forward producer frames to the consumer unchanged; drop the consumer's acks."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.linger = 0
    sock.bind(f"tcp://127.0.0.1:{port}")
    ready.set()
    consumer = None
    pending: list[bytes] = []
    # The client waits for a HELLO answer (up to its confirm_timeout) before its first send
    # decides where queues live: the relay answers as an unsharded broker would.
    greeting = p.encode(p.Hello({"max_content_bytes": DEFAULT_MAX_CONTENT_BYTES}))
    while True:
        peer, frame = sock.recv_multipart()
        if frame.startswith(b"H01101"):
            sock.send_multipart((peer, greeting))
            if all(type(m) is p.Hello for m in p.decode_frame(frame)[0]):
                continue
        if frame.startswith(b"H0100202"):
            consumer = peer
            for held in pending:
                sock.send_multipart((consumer, held))
            pending.clear()
        elif frame.startswith(b"H01004"):
            continue
        elif frame.startswith(b"H01103"):  # a client's goodbye: answer it as the broker would
            sock.send_multipart((peer, p.encode(p.Kbai())))
        elif consumer is None:
            pending.append(frame)
        else:
            sock.send_multipart((consumer, frame))


def _run(
    address: str,
    consumer_target: Any,
    messages: int,
    size: int,
    window: int,
    confirm: bool = False,
    producer_target: Any = _producer,
    middle_pid: int | None = None,
) -> dict:
    """One run; with `middle_pid` (the broker's or the relay's process), the CPU it spent per
    message received: steadier than msgs/s on a shared machine."""
    ctx = mp.get_context("spawn")
    cpu_before = cpu_seconds(middle_pid) if middle_pid is not None else 0.0
    consumed = ctx.Value("q", 0, lock=False)
    out = ctx.Queue()
    confirms = ctx.Queue() if confirm else None
    consumer = ctx.Process(target=consumer_target, args=(address, messages, window, consumed, out))
    producer = ctx.Process(
        target=producer_target, args=(address, messages, size, consumed, confirms)
    )
    consumer.start()
    time.sleep(0.3)
    producer.start()
    received, elapsed_ns, raw = out.get(timeout=RUN_TIMEOUT)
    result = {
        "received": received,
        "msgs_per_s": received / (elapsed_ns / 1e9) if elapsed_ns else 0.0,
        **_percentiles(raw, ""),
    }
    if middle_pid is not None and received:
        result["middle_us"] = (cpu_seconds(middle_pid) - cpu_before) / received * 1e6
    if confirms is not None:
        raw_confirms, result["unconfirmed"] = confirms.get(timeout=RUN_TIMEOUT)
        result.update(_percentiles(raw_confirms, "confirm_"))
        result["confirmed"] = len(raw_confirms) // 8
    producer.join(RUN_TIMEOUT)
    consumer.join(RUN_TIMEOUT)
    return result


def runs_table(first_column: str, runs: dict[str, dict]) -> Table:
    """Messages received, msgs/s and p50/p99 of each run, one row per run."""
    table = Table()
    for column in (first_column, "received", "msgs/s", "p50 ms", "p99 ms", "CPU µs/msg"):
        table.add_column(column, justify="right")
    for name, r in runs.items():
        table.add_row(
            name,
            f"{r['received']:,}",
            f"{r['msgs_per_s']:,.0f}",
            f"{r['p50_ms']:.2f}",
            f"{r['p99_ms']:.2f}",
            f"{r['middle_us']:.1f}" if "middle_us" in r else "-",
        )
    return table


def _percentiles(raw: bytes, prefix: str) -> dict[str, float]:
    latencies = sorted(array("q", raw))
    if not latencies:
        raise RuntimeError(f"no {prefix or 'receive '}latencies: nothing arrived")
    return {
        f"{prefix}p50_ms": latencies[len(latencies) // 2] / 1e6,
        f"{prefix}p99_ms": latencies[int(len(latencies) * 0.99)] / 1e6,
    }


def run_pipe_through(
    address: str,
    messages: int,
    size: int,
    window: int,
    confirm: bool = False,
    raw_consumer: bool = False,
    middle_pid: int | None = None,
) -> dict:
    """The pipe through the broker at `address` (the web workload attaches a console first);
    `raw_consumer`: the relay's consumer instead of the Client's; `middle_pid`: the broker's
    process, whose CPU per message is measured."""
    consumer = _consume_raw if raw_consumer else _consume_broker
    return _run(address, consumer, messages, size, window, confirm, middle_pid=middle_pid)


def run_broker_pipe(
    messages: int,
    size: int,
    window: int,
    data_dir: str | None = None,
    confirm: bool = False,
    raw_consumer: bool = False,
) -> dict:
    """The pipe through a real broker process; with `data_dir`, a durable one; with
    `confirm`, the producer waits for publisher confirms (pipelined)."""
    with BrokerProcess("--log-level", "WARNING", data_dir=data_dir) as broker:
        result = run_pipe_through(
            broker.address, messages, size, window, confirm, raw_consumer, broker.process.pid
        )
        if data_dir:
            result["storage"] = broker.stats()["storage"]
        return result


TARGET_DURABLE_MSGS_PER_S = 20_000


def run_durable_pipe(messages: int = 200_000, size: int = 100, window: int = 100) -> dict:
    """The `durable` workload: the pipe with --data-dir and a confirming producer (pipelined,
    each confirm sent after the fsync of the turn that took the message); the same pipe
    without confirms and in memory, measured in the same run, for comparison."""
    import tempfile

    console = Console(width=max(Console().width, 110))
    console.print(
        f"durable: 1 confirming producer -> 1 queue (--data-dir, fsync per loop turn) ->"
        f" 1 raw consumer acking each frame's messages; {messages:,} messages of {size} bytes,"
        f" window {window}, loopback"
    )
    runs = {}
    for name, durable, confirm in (
        ("durable + confirms", True, True),
        ("durable, no confirms", True, False),
        ("in memory + confirms", False, True),
    ):
        with tempfile.TemporaryDirectory(prefix="phpmq-bench-") as data_dir:
            runs[name] = run_broker_pipe(
                messages, size, window, data_dir if durable else None, confirm, raw_consumer=True
            )
    relay = run_relay_pipe(messages, size, window)
    table = Table()
    columns = ("workload", "msgs/s", "broker CPU µs/msg", "fsyncs/s", "commit ms")
    for column in (*columns, "never written", "confirm p50", "confirm p99", "deliver p99"):
        table.add_column(column, justify="right")
    for name, r in runs.items():
        storage = r.get("storage", {})
        table.add_row(
            name,
            f"{r['msgs_per_s']:,.0f}",
            f"{r['middle_us']:.1f}" if "middle_us" in r else "-",
            f"{storage['fsyncs_per_s']:,.0f}" if storage else "-",
            f"{storage['last_commit_ms']:.2f}" if storage else "-",
            # Messages the turn log acked before they reached the tables (docs/durability.md).
            f"{storage['puts_never_written'] / r['received']:.0%}" if storage else "-",
            f"{r['confirm_p50_ms']:.2f} ms" if "confirm_p50_ms" in r else "-",
            f"{r['confirm_p99_ms']:.2f} ms" if "confirm_p99_ms" in r else "-",
            f"{r['p99_ms']:.2f} ms",
        )
    console.print(table)
    main = runs["durable + confirms"]
    rate = main["msgs_per_s"]
    console.print(
        f"durable + confirms: {rate:,.0f} msgs/s (target ≥ {TARGET_DURABLE_MSGS_PER_S:,}),"
        f" {main['confirmed']:,} confirmed, {main['unconfirmed']} not;"
        f" {rate / runs['durable, no confirms']['msgs_per_s']:.0%} of durable without"
        f" confirms, {rate / runs['in memory + confirms']['msgs_per_s']:.0%} of in memory"
        f" with confirms; {rate / relay['msgs_per_s']:.0%} of the bare relay's"
        f" {relay['msgs_per_s']:,.0f} msgs/s (target ≥ {TARGET_DURABLE_RATIO:.0%})"
    )
    console.print(
        f"confirm latency counts from the send call: with up to {MAX_LEAD:,} messages in"
        f" flight it is mostly queueing ({MAX_LEAD:,} / {rate:,.0f} msgs/s ="
        f" {MAX_LEAD / rate * 1000:.0f} ms), the commit itself takes"
        f" {main['storage']['last_commit_ms']:.2f} ms"
    )
    return runs


def run_async_client_pipe(messages: int, size: int, window: int) -> dict:
    """The broker pipe with the AsyncClient as producer and consumer."""
    with BrokerProcess("--log-level", "WARNING") as broker:
        return _run(
            broker.address,
            _consume_async,
            messages,
            size,
            window,
            producer_target=_async_producer,
            middle_pid=broker.process.pid,
        )


def run_relay_pipe(messages: int, size: int, window: int) -> dict:
    port = free_port()
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    relay = ctx.Process(target=_relay, args=(port, ready), daemon=True)
    relay.start()
    ready.wait(20)
    try:
        # Without heartbeats: a client would take the silent relay for a lost broker every
        # interval x liveness and reconnect, and the ceiling would measure that.
        return _run(
            f"tcp://127.0.0.1:{port}",
            _consume_raw,
            messages,
            size,
            window,
            producer_target=_relay_producer,
            middle_pid=relay.pid,
        )
    finally:
        relay.terminate()
        relay.join(5)


def run_pipe_benchmark(messages: int = 200_000, size: int = 100, window: int = 100) -> dict:
    console = Console()
    console.print(
        f"pipe: 1 producer -> 1 queue -> 1 consumer acking each message; {messages:,} messages"
        f" of {size} bytes, window {window}, loopback"
    )
    raw = run_broker_pipe(messages, size, window, raw_consumer=True)
    broker = run_broker_pipe(messages, size, window)
    async_client = run_async_client_pipe(messages, size, window)
    relay = run_relay_pipe(messages, size, window)
    runs = {
        "broker, raw consumer": raw,
        "broker, Client consumer": broker,
        "broker, asyncio client": async_client,
        "bare pyzmq relay, raw consumer (ceiling)": relay,
    }
    console.print(runs_table("path", runs))
    ratio = raw["msgs_per_s"] / relay["msgs_per_s"] if relay["msgs_per_s"] else 0.0
    console.print(
        "CPU µs/msg: the broker's process (the relay's, for the relay) per message received;"
        " the producer and consumer encode and decode with the same codec on every path, so the"
        " relay's ceiling rises with each codec gain and this column shows the broker's own."
    )
    console.print(
        f"broker/relay ratio (raw consumer on both): {ratio:.0%} (target ≥ {TARGET_RATIO:.0%});"
        f" broker with the Client's consumer {broker['msgs_per_s']:,.0f} msgs/s"
        f" (target ≥ {TARGET_MSGS_PER_S:,})"
    )
    async_ratio = async_client["msgs_per_s"] / broker["msgs_per_s"] if broker["msgs_per_s"] else 0.0
    console.print(
        f"asyncio/sync client ratio: {async_ratio:.0%} (target ≥ {TARGET_ASYNC_RATIO:.0%});"
        f" asyncio client {async_client['msgs_per_s']:,.0f} msgs/s"
    )
    return {
        "broker": broker,
        "broker_raw": raw,
        "async_client": async_client,
        "relay": relay,
        "ratio": ratio,
        "async_ratio": async_ratio,
    }


if __name__ == "__main__":
    run_pipe_benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
