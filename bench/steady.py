"""The `steady` workload: one producer and one consumer at a fixed rate for minutes, in memory
and then durable mode (`--data-dir`), to find stalls and memory that creeps.

The producer is paced: about every millisecond it sends, with `send_many` (fire-and-forget, to
keep the rate), the messages that are due by then, each 100 bytes with a sequence number and
the monotonic send time. The consumer (window 100) acks each message. Printed per mode:
p50/p99/p99.9/max latency, messages, the achieved rate, and a row every ~10 s with the
messages received, the latency and the broker's RSS in that interval.

Target (issue 15): durable p99.9 ≤ 10 ms at 10,000 msg/s. Nothing is asserted.
"""

from __future__ import annotations

import bisect
import multiprocessing as mp
import struct
import tempfile
import time
from array import array
from typing import Any

from rich.console import Console
from rich.table import Table

from ..client import Client
from ..testing import BrokerProcess
from .measure import MB, RssSampler, SeenSequence, data_dir_bytes, mb, percentiles, verdict

QUEUE = "bench-steady"
CONTENT_BYTES = 100
WINDOW = 100
TICK_S = 0.001
TARGET_DURABLE_P999_MS = 10.0
#: After the producer stops, how long the consumer waits for what is still on its way.
DRAIN_TIMEOUT_S = 30.0
_STAMP = struct.Struct("<qq")  # sequence number, monotonic send time (ns)


def _producer(address: str, rate: int, seconds: float, started: Any, produced: Any) -> None:
    pad = b"s" * (CONTENT_BYTES - _STAMP.size)
    clock = time.monotonic_ns
    pack = _STAMP.pack
    sleep = time.sleep
    with Client(address, name="bench-steady-producer", send_timeout=30) as client:
        start = time.monotonic()
        started.value = int(start * 1e9)
        end = start + seconds
        sent = 0
        while (now := time.monotonic()) < end:
            due = int((now - start) * rate) - sent
            if due > 0:
                client.send_many(QUEUE, (pack(n, clock()) + pad for n in range(sent, sent + due)))
                sent += due
                produced.value = sent
            sleep(TICK_S)


def _consumer(address: str, produced: Any, done: Any, out: Any) -> None:
    latencies = array("q")
    arrivals = array("q")
    clock = time.monotonic_ns
    unpack = _STAMP.unpack_from
    seen = SeenSequence()
    done_at = None
    with Client(address, name="bench-steady-consumer") as client:
        client.subscribe(QUEUE, window=WINDOW)
        while True:
            message = client.receive(timeout=0.2)
            if message is not None:
                now = clock()
                seq, sent_at = unpack(message.content)
                if seen.first_time(seq):
                    latencies.append(now - sent_at)
                    arrivals.append(now)
                message.ack()
            if done.is_set():
                done_at = done_at or time.monotonic()
                if len(latencies) >= produced.value:
                    break
                if time.monotonic() - done_at > DRAIN_TIMEOUT_S:
                    break
        client.flush()
    out.put((latencies.tobytes(), arrivals.tobytes(), seen.duplicates))


def _run_mode(rate: int, seconds: float, data_dir: str | None, row_s: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    started = ctx.Value("q", 0, lock=False)
    produced = ctx.Value("q", 0, lock=False)
    done = ctx.Event()
    out = ctx.Queue()
    with (
        BrokerProcess("--log-level", "WARNING", data_dir=data_dir) as broker,
        RssSampler(broker.process.pid, 0.5) as rss,
    ):
        consumer = ctx.Process(target=_consumer, args=(broker.address, produced, done, out))
        producer = ctx.Process(
            target=_producer, args=(broker.address, rate, seconds, started, produced)
        )
        consumer.start()
        time.sleep(0.3)
        producer.start()
        producer.join(seconds + 120)
        done.set()
        raw, raw_arrivals, duplicates = out.get(timeout=DRAIN_TIMEOUT_S + 60)
        consumer.join(10)
        stats = broker.stats()
        file_size = data_dir_bytes(data_dir) if data_dir else None
    latencies = array("q", raw)
    arrivals = array("q", raw_arrivals)
    start_s = started.value / 1e9
    offset = start_s - rss.started  # producer start on the sampler's clock
    rows = []
    row = 0
    while row * row_s < seconds:
        low, high = start_s + row * row_s, start_s + (row + 1) * row_s
        if row * row_s + row_s >= seconds:
            high = float("inf")  # the last row takes the tail after the producer stopped
        # arrivals only grow: an interval is one slice
        first = bisect.bisect_left(arrivals, low * 1e9)
        picked = latencies[first : bisect.bisect_left(arrivals, high * 1e9)]
        samples = rss.between(offset + row * row_s, offset + (row + 1) * row_s)
        rows.append(
            {
                "from_s": row * row_s,
                "messages": len(picked),
                "rss": max(samples, default=None),
                **percentiles(picked, 0.99),
            }
        )
        row += 1
    elapsed = (arrivals[-1] / 1e9 - start_s) if arrivals else 0.0
    return {
        "produced": produced.value,
        "received": len(latencies),
        "duplicates": duplicates,
        "rate_sent": produced.value / seconds,
        "rate_received": len(latencies) / elapsed if elapsed else 0.0,
        "rss_low": rss.low,
        "rss_peak": rss.peak,
        "rows": rows,
        "storage": stats.get("storage", {}),
        "counters": stats.get("counters", {}),
        "file_size": file_size,
        **percentiles(latencies, 0.5, 0.99, 0.999),
    }


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def run_steady_benchmark(rate: int = 10_000, seconds: float = 120.0) -> dict[str, Any]:
    console = Console(width=max(Console().width, 110))
    row_s = min(10.0, max(1.0, seconds / 6))
    console.print(
        f"steady: 1 paced producer ({rate:,} msg/s, fire-and-forget, batches every"
        f" {TICK_S * 1000:g} ms) -> 1 queue -> 1 consumer (window {WINDOW}, acking) for"
        f" {seconds:g} s, in memory and then durable (--data-dir)"
    )
    results = {}
    for mode in ("memory", "durable"):
        with tempfile.TemporaryDirectory(prefix="phpmq-bench-steady-") as data_dir:
            results[mode] = _run_mode(rate, seconds, data_dir if mode == "durable" else None, row_s)
    summary = Table(title=f"steady: {rate:,} msg/s for {seconds:g} s")
    summary.add_column("mode")
    columns = ("sent", "received", "msgs/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms")
    for column in (*columns, "broker RSS MB", "p99.9 target"):
        summary.add_column(column, justify="right")
    for mode, r in results.items():
        summary.add_row(
            mode,
            f"{r['produced']:,}",
            f"{r['received']:,}",
            f"{r['rate_received']:,.0f}",
            *(_number(r[key]) for key in ("p50", "p99", "p99.9", "max")),
            f"{_number(r['rss_low'] and r['rss_low'] / MB)}"
            f" - {_number(r['rss_peak'] and r['rss_peak'] / MB)}",
            f"≤ {TARGET_DURABLE_P999_MS:g}: {verdict(r['p99.9'], TARGET_DURABLE_P999_MS)}"
            if mode == "durable"
            else "",
        )
    console.print(summary)
    for mode, r in results.items():
        table = Table(title=f"steady, {mode}: every {row_s:g} s")
        for column in ("from", "received", "msgs/s", "p99 ms", "max ms", "broker RSS"):
            table.add_column(column, justify="right")
        for row in r["rows"]:
            table.add_row(
                f"{row['from_s']:g} s",
                f"{row['messages']:,}",
                f"{row['messages'] / min(row_s, seconds - row['from_s']):,.0f}",
                _number(row["p99"]),
                _number(row["max"]),
                mb(row["rss"]),
            )
        console.print(table)
        extra = f", {r['duplicates']:,} duplicates" if r["duplicates"] else ""
        counters = r["counters"]
        console.print(
            f"{mode}: sent {r['rate_sent']:,.0f} msg/s; missing"
            f" {r['produced'] - r['received']:,}{extra}; broker redelivered"
            f" {counters.get('redelivered', 0):,}, peers_expired"
            f" {counters.get('peers_expired', 0):,}, errors {counters.get('errors', 0):,}"
        )
        if mode == "durable":
            storage = ", ".join(f"{k} {v}" for k, v in r["storage"].items())
            console.print(f"durable storage at the end: {storage}; store {mb(r['file_size'])}")
    return results


if __name__ == "__main__":
    run_steady_benchmark()
