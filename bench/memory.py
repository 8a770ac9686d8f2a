"""The `memory` workload: what queued messages cost the broker, in RAM and on disk.

Memory mode: `count` 100-byte messages are queued with `send_many` (fire-and-forget) into a
broker without a queue limit; once `stats` shows them all ready, the broker's RSS is read and
compared with its RSS before. Durable mode (`--data-dir` in a temporary directory): the same
with confirmed sends, then the size of the store (phpmq.sqlite3 and its -wal and -shm files)
is recorded, a consumer drains the queue (window 1000, acking all), and the store's size is
watched until it has not changed for STABLE_S seconds (at most `watch_seconds`).

Targets (issue 15): ≤ 300 MB RSS for 1M queued messages in memory mode (for another count, the
same budget per message over the RSS before); the store after the drain ≤ 10 % of its peak.
Nothing is asserted.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from ..client import Client
from ..protocol import admin_commands as cmd
from ..testing import BrokerProcess
from .measure import MB, RssSampler, data_dir_bytes, mb, verdict

QUEUE = "bench-memory"
CONTENT_BYTES = 100
#: The issue's target scales with the count: 300 MB for 1M messages.
TARGET_RSS_PER_MILLION = 300 * MB
TARGET_AFTER_DRAIN_RATIO = 0.10
LOAD_TIMEOUT_S = 600.0
#: The store's size counts as settled when it has not changed for this long.
STABLE_S = 10.0


def _contents(count: int) -> Any:
    for index in range(count):
        yield b"%0*d" % (CONTENT_BYTES, index)


def _wait_ready(client: Client, count: int, sizes: list[int], data_dir: str | None) -> float:
    """Wait until the queue holds `count` ready messages; the seconds it took. Samples the
    store's size meanwhile into `sizes`."""
    start = time.monotonic()
    while time.monotonic() - start < LOAD_TIMEOUT_S:
        if data_dir:
            sizes.append(data_dir_bytes(data_dir))
        queue = client.admin(cmd.STATS, timeout=60)["queues"].get(QUEUE, {})
        if queue.get("ready", 0) >= count:
            return time.monotonic() - start
        time.sleep(0.2)
    raise RuntimeError(f"the broker did not report {count:,} ready messages in time")


def _memory_mode(count: int) -> dict[str, Any]:
    with BrokerProcess("--log-level", "WARNING", "--max-queue-length", "0") as broker:
        with RssSampler(broker.process.pid, 0.2) as rss:
            before = rss.sample()
            start = time.monotonic()
            with Client(broker.address, name="bench-memory", send_timeout=60) as client:
                client.send_many(QUEUE, _contents(count))
                _wait_ready(client, count, [], None)
            load_s = time.monotonic() - start
            time.sleep(0.5)
            loaded = rss.sample()
        return {"before": before, "loaded": loaded, "peak": rss.peak, "load_s": load_s}


def _durable_mode(count: int, watch_seconds: float) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="phpmq-bench-memory-") as data_dir,
        BrokerProcess(
            "--log-level", "WARNING", "--max-queue-length", "0", data_dir=data_dir
        ) as broker,
        RssSampler(broker.process.pid, 0.2) as rss,
    ):
        before = rss.sample()
        sizes: list[int] = []
        start = time.monotonic()
        with Client(broker.address, name="bench-memory", send_timeout=60) as client:
            ids = client.send_many(QUEUE, _contents(count), confirm=True)
            _wait_ready(client, count, sizes, data_dir)
        load_s = time.monotonic() - start
        loaded = rss.sample()
        sizes.append(data_dir_bytes(data_dir))
        file_peak = max(sizes)
        drained = 0
        start = time.monotonic()
        with Client(broker.address, name="bench-memory-drain") as client:
            for message in client.consume(QUEUE, window=1000, timeout=30):
                message.ack()
                drained += 1
                if drained % 10_000 == 0:
                    file_peak = max(file_peak, data_dir_bytes(data_dir))
                if drained >= count:
                    break
            client.flush()
        drain_s = time.monotonic() - start
        # The last acks are in once the broker reports the queue empty.
        with Client(broker.address, name="bench-memory") as client:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                queue = client.admin(cmd.STATS, timeout=60)["queues"].get(QUEUE, {})
                if not queue.get("ready") and not queue.get("in_flight"):
                    break
                time.sleep(0.2)
        size = data_dir_bytes(data_dir)
        file_peak = max(file_peak, size)
        watch_start = changed_at = time.monotonic()
        while time.monotonic() - watch_start < watch_seconds:
            time.sleep(0.5)
            now_size = data_dir_bytes(data_dir)
            if now_size != size:
                size, changed_at = now_size, time.monotonic()
            elif time.monotonic() - changed_at >= STABLE_S:
                break
        settled = time.monotonic() - changed_at >= min(STABLE_S, watch_seconds)
        return {
            "before": before,
            "loaded": loaded,
            "peak": rss.peak,
            "load_s": load_s,
            "confirmed": sum(i is not None for i in ids),
            "drained": drained,
            "drain_s": drain_s,
            "file_peak": file_peak,
            "file_after": size,
            "file_settled": settled,
            "file_watched_s": time.monotonic() - watch_start,
            "file_last_change_s": changed_at - watch_start,
        }


def run_memory_benchmark(count: int = 1_000_000, watch_seconds: float = 60.0) -> dict[str, Any]:
    console = Console(width=max(Console().width, 110))
    console.print(
        f"memory: {count:,} queued messages of {CONTENT_BYTES} bytes (--max-queue-length 0), in"
        " memory (fire-and-forget) and durable (--data-dir, confirmed), then the durable queue"
        " drained (window 1000, acking)"
    )
    memory = _memory_mode(count)
    durable = _durable_mode(count, watch_seconds)
    # 300 MB at 1M messages; for another count the same budget per message over the
    # broker's RSS before: before + (300 MB - before) x count / 1M.
    before = memory["before"] or 0
    target_rss = before + (TARGET_RSS_PER_MILLION - before) * count / 1_000_000
    table = Table(title="memory: RSS for queued messages")
    table.add_column("mode")
    for column in ("RSS before", "RSS queued", "RSS peak", "bytes/msg", "load", "target", ""):
        table.add_column(column, justify="right")
    for name, r in (("memory", memory), ("durable", durable)):
        grown = (r["loaded"] or 0) - (r["before"] or 0)
        table.add_row(
            name,
            mb(r["before"]),
            mb(r["loaded"]),
            mb(r["peak"]),
            f"{grown / count:,.0f}" if r["loaded"] else "-",
            f"{r['load_s']:.1f} s ({count / r['load_s']:,.0f}/s)",
            f"≤ {mb(target_rss)}" if name == "memory" else "",
            verdict(r["loaded"], target_rss) if name == "memory" else "",
        )
    console.print(table)
    ratio = durable["file_after"] / durable["file_peak"] if durable["file_peak"] else 0.0
    files = Table(title="memory: the durable store (phpmq.sqlite3 + -wal + -shm)")
    files.add_column("figure")
    for column in ("value", "target", ""):
        files.add_column(column, justify="right")
    files.add_row("peak, all queued", mb(durable["file_peak"]), "", "")
    settled = (
        f"unchanged from {durable['file_last_change_s']:.1f} s to"
        f" {durable['file_watched_s']:.1f} s after the drain"
        if durable["file_settled"]
        else f"still changing after {durable['file_watched_s']:.0f} s"
    )
    files.add_row("after the drain", mb(durable["file_after"]), "", settled)
    files.add_row(
        "after / peak",
        f"{ratio:.1%}",
        f"≤ {TARGET_AFTER_DRAIN_RATIO:.0%}",
        verdict(ratio, TARGET_AFTER_DRAIN_RATIO),
    )
    console.print(files)
    console.print(
        f"durable: {durable['confirmed']:,} of {count:,} confirmed; drained {durable['drained']:,}"
        f" in {durable['drain_s']:.1f} s ({durable['drained'] / durable['drain_s']:,.0f}/s)"
    )
    return {"memory": memory, "durable": durable, "file_ratio": ratio}


if __name__ == "__main__":
    run_memory_benchmark()
