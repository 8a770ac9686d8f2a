"""Prometheus metrics (`--metrics-bind`, docs/metrics.md): prometheus-client's own HTTP server
thread serves `/metrics`, built from a snapshot the loop publishes.

The loop never waits for a scrape and the scrape thread never reads live core state. A scrape
whose snapshot is older than `REFRESH_S` raises a flag and waits (at most `WAIT_S`); the loop
sees the flag after its turn, builds the `stats` admin answer and swaps a new `Snapshot` in
(one reference assignment, atomic under the GIL), then wakes the scrape. So the loop pays for
a snapshot (about 1 ms per 1,000 queues) once per scrape interval at most, and nothing while
nobody scrapes. The loop also counts its turn and commit durations into plain bucket lists
(`Buckets`), copied into the snapshot with the rest.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..config import metrics_address, metrics_bind_text

log = logging.getLogger("phpmq.metrics")

#: A scrape is served a snapshot up to this old (seconds); an older one is rebuilt first.
REFRESH_S = 1.0
#: How long a scrape waits for the loop's new snapshot before it serves the old one (the
#: loop turns at least every 250 ms unless a turn is stuck: `phpmq_metrics_snapshot_age_seconds`
#: then shows it).
WAIT_S = 2.0
#: Upper bounds (seconds) of the loop-turn and commit histograms.
TURN_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
COMMIT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

#: Per-queue gauges: metric name suffix, `stats` key, help.
QUEUE_GAUGES = (
    ("messages_ready", "ready", "Messages waiting for a consumer."),
    ("messages_in_flight", "in_flight", "Messages dispatched and not yet settled."),
    ("messages_delayed", "delayed", "Messages delayed (a delayed send or requeue)."),
    ("dead_letters", "dead_letters", "Dead letters kept in the queue's store."),
    ("consumers", "consumers", "Consumer windows open on the queue."),
    ("messages_leased", "leased", "Messages held by batch leases."),
)
#: Per-queue counters: metric name (before _total), `stats` totals key, help.
QUEUE_COUNTERS = (
    ("messages_published", "published", "Messages put into the queue."),
    ("messages_delivered", "delivered", "Dispatches (redeliveries included)."),
    ("messages_acked", "acked", "Messages acked."),
    ("messages_requeued", "requeued", "Messages requeued by their consumer."),
    ("messages_expired", "expired", "Messages whose TTL ran out while ready."),
    ("messages_dead_lettered", "dead_lettered", "Messages dead-lettered (expired included)."),
)


class Buckets:
    """A histogram the loop fills: plain counts per bucket, no lock (one writer)."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def copy(self) -> Buckets:
        copied = Buckets(self.bounds)
        copied.counts = self.counts.copy()
        copied.count, copied.total = self.count, self.total
        return copied

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus' form: (upper bound, observations at or below it), "+Inf" last."""
        running, rows = 0, []
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            rows.append((repr(float(bound)), running))
        rows.append(("+Inf", self.count))
        return rows


class Snapshot:
    """What one scrape reports: a `stats` answer and the loop's histograms, as of `taken`."""

    __slots__ = ("commits", "stats", "taken", "turns")

    def __init__(self, stats: dict[str, Any], turns: Buckets, commits: Buckets) -> None:
        self.stats = stats
        self.turns = turns
        self.commits = commits
        self.taken = time.monotonic()


class MetricsExporter:
    """Owned by the server loop: `turn_took` and `commit_took` each time, `close` at exit."""

    def __init__(self, bind: str, stats: Callable[[], dict[str, Any]], shard: str = "") -> None:
        self._stats = stats
        self._turns = Buckets(TURN_BUCKETS_S)
        self._commits = Buckets(COMMIT_BUCKETS_S)
        self.snapshot = Snapshot(stats(), self._turns.copy(), self._commits.copy())
        #: Set by a scrape that wants a newer snapshot; read by the loop after each turn.
        self.wanted = False
        self._refreshed = threading.Event()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(self, shard))
        self.registry.register(ProcessCollector(registry=None))
        host, port = metrics_address(bind)
        # Raises OSError when the address is taken: the server turns it into a BrokerError.
        self._server, self._thread = start_http_server(port, host or "0.0.0.0", self.registry)
        self.port = self._server.server_port
        #: Where /metrics really is, as `metrics_bind` is written (port 0 resolved).
        self.address = metrics_bind_text(host, self.port)
        log.info("Prometheus metrics on http://%s:%d/metrics", host or "0.0.0.0", self.port)
        if not is_loopback(host):
            log.warning(
                "the metrics endpoint has no authentication: firewall port %d to your Prometheus",
                self.port,
            )

    def turn_took(self, seconds: float) -> None:
        """In the loop, after each turn: count it, and build a snapshot if a scrape waits."""
        self._turns.observe(seconds)
        if self.wanted:
            self.wanted = False
            self.snapshot = Snapshot(self._stats(), self._turns.copy(), self._commits.copy())
            self._refreshed.set()

    def commit_took(self, seconds: float) -> None:
        self._commits.observe(seconds)

    def current(self) -> Snapshot:
        """In the scrape thread: a snapshot at most REFRESH_S old, unless the loop does not
        make one within WAIT_S."""
        snapshot = self.snapshot
        if time.monotonic() - snapshot.taken < REFRESH_S:
            return snapshot
        self._refreshed.clear()
        self.wanted = True
        self._refreshed.wait(WAIT_S)
        return self.snapshot

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


#: Durable mode: the store's disk figures (docs/durability.md, "Disk space"), as
#: (metric, help, key of `stats`' storage section).
STORAGE_GAUGES = (
    ("phpmq_disk_free_bytes", "Free bytes on the data directory's volume.", "disk_free_bytes"),
    ("phpmq_disk_total_bytes", "Size of the data directory's volume.", "disk_total_bytes"),
    ("phpmq_disk_min_free_bytes", "min_free_disk in bytes (0: none).", "min_free_disk_bytes"),
    ("phpmq_disk_low", "1 while sends are refused for disk space.", "disk_low"),
    ("phpmq_storage_reserve_bytes", "The reserve file's bytes held.", "reserve_bytes"),
    (
        "phpmq_storage_unwritten_operations",
        "Operations the store could not write yet.",
        "unwritten_operations",
    ),
    ("phpmq_storage_read_only", "1 while the store could not be opened for writing.", "read_only"),
    ("phpmq_storage_wal_limit_bytes", "The WAL's budget.", "wal_limit_bytes"),
    ("phpmq_storage_turn_log_on", "1 while turns go to the turn log first.", "turn_log_on"),
    (
        "phpmq_storage_purges_waiting",
        "1 while a purged or deleted queue's rows are still being deleted, a slice a commit.",
        "purges_waiting",
    ),
    (
        "phpmq_storage_turn_log_bytes",
        "Encoded bytes of the turns logged and not yet folded into the tables.",
        "turn_log_bytes",
    ),
)
STORAGE_COUNTERS = (
    ("phpmq_storage_checkpoints", "WAL checkpoints run.", "checkpoints"),
    ("phpmq_storage_checkpoint_errors", "WAL checkpoints that failed.", "checkpoint_errors"),
    ("phpmq_storage_write_errors", "Commits that failed (disk full, I/O error).", "write_errors"),
    ("phpmq_storage_reserve_releases", "Times the reserve was given up.", "reserve_releases"),
    ("phpmq_storage_turns_logged", "Turns written to the turn log.", "turns_logged"),
    (
        "phpmq_storage_puts_never_written",
        "Messages the turn log never wrote to the tables: acked or dead-lettered before"
        " their turn was folded.",
        "puts_never_written",
    ),
)


class SnapshotCollector(Collector):
    """Turns the current snapshot into metric families; runs in the scrape thread."""

    def __init__(self, exporter: MetricsExporter, shard: str) -> None:
        self._exporter = exporter
        self._shard = [shard] if shard else []
        self._shard_label = ["shard"] if shard else []

    def collect(self) -> Iterator[Metric]:
        snapshot = self._exporter.current()  # one read: the loop may swap it later
        stats = snapshot.stats
        yield from self._queues(stats["queues"])
        yield from self._broker(stats, snapshot)
        yield from self._histograms(snapshot, durable="commits" in stats["storage"])
        yield from self._storage(stats["storage"])

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=self._shard_label)
        family.add_metric(self._shard, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=self._shard_label)
        family.add_metric(self._shard, value)
        return family

    def _queues(self, queues: dict[str, Any]) -> Iterator[Metric]:
        labels = ["queue", *self._shard_label]
        for suffix, key, doc in QUEUE_GAUGES:
            gauge = GaugeMetricFamily(f"phpmq_queue_{suffix}", doc, labels=labels)
            for name, queue in queues.items():
                gauge.add_metric([name, *self._shard], queue[key])
            yield gauge
        for suffix, key, doc in QUEUE_COUNTERS:
            counter = CounterMetricFamily(f"phpmq_queue_{suffix}", doc, labels=labels)
            for name, queue in queues.items():
                counter.add_metric([name, *self._shard], queue["totals"][key])
            yield counter
        refused = CounterMetricFamily(
            "phpmq_queue_sends_refused", "Sends refused (queue full, memory).", labels=labels
        )
        for name, queue in queues.items():
            refused.add_metric([name, *self._shard], queue["refused"])
        yield refused

    def _broker(self, stats: dict[str, Any], snapshot: Snapshot) -> Iterator[Metric]:
        memory = stats["memory"]
        yield self._gauge("phpmq_peers", "Connected peers.", stats["peers"])
        yield self._gauge("phpmq_queues", "Queues.", len(stats["queues"]))
        yield self._gauge(
            "phpmq_memory_held_bytes", "Bytes the held messages take.", memory["held_bytes"]
        )
        yield self._gauge(
            "phpmq_memory_limit_bytes", "max_memory (0: none).", memory["limit_bytes"]
        )
        yield self._gauge(
            "phpmq_memory_alarm", "1 while sends are refused for memory.", int(memory["alarm"])
        )
        rss = resident_bytes()
        if rss is not None:
            yield self._gauge("phpmq_process_resident_memory_bytes", "The broker's RSS.", rss)
        yield self._gauge(
            "phpmq_uptime_seconds", "Since the broker started.", stats["uptime_seconds"]
        )
        yield self._gauge("phpmq_draining", "1 while stopping.", int(stats["draining"]))
        yield self._gauge(
            "phpmq_metrics_snapshot_age_seconds",
            "How old the figures of this scrape are.",
            time.monotonic() - snapshot.taken,
        )
        for name, value in stats["counters"].items():
            yield self._counter(f"phpmq_{name}", f"The broker's `{name}` counter.", value)
        refusals = CounterMetricFamily(
            "phpmq_refusals",
            "Refusals (ERROR codes) sent or logged.",
            labels=["code", *self._shard_label],
        )
        for code, count in stats["refusals"].items():
            refusals.add_metric([code, *self._shard], count)
        yield refusals

    def _histograms(self, snapshot: Snapshot, durable: bool) -> Iterator[Metric]:
        pairs = [
            ("phpmq_loop_turn_duration_seconds", "Loop turns (after the poll).", snapshot.turns)
        ]
        if durable:
            pairs.append(
                (
                    "phpmq_journal_commit_duration_seconds",
                    "Journal commits (one transaction and fsync).",
                    snapshot.commits,
                )
            )
        for name, doc, buckets in pairs:
            family = HistogramMetricFamily(name, doc, labels=self._shard_label)
            family.add_metric(self._shard, buckets.cumulative(), buckets.total)
            yield family

    def _storage(self, storage: dict[str, Any]) -> Iterator[Metric]:
        if "commits" not in storage:
            return
        yield self._counter("phpmq_journal_commits", "Journal commits.", storage["commits"])
        yield self._gauge(
            "phpmq_storage_size_bytes", "The store's database file.", storage["size_bytes"]
        )
        yield self._gauge(
            "phpmq_storage_wal_bytes", "The store's write-ahead log.", storage["wal_bytes"]
        )
        for name, doc, key in STORAGE_GAUGES:
            yield self._gauge(name, doc, int(storage[key]))
        for name, doc, key in STORAGE_COUNTERS:
            yield self._counter(name, doc, storage[key])


def is_loopback(host: str) -> bool:
    return host == "localhost" or host == "::1" or host.startswith("127.")


def resident_bytes() -> int | None:
    """This process's resident set size (Linux), or None where /proc does not say."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
