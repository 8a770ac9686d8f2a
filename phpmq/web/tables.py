"""What the pages show, from the watch's `stats` answers: the queue table (sorted, filtered),
the overview's figures, rate graphs as SVG points. Pure: no I/O, no clock of its own."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..monitor import QueueRow, Sort, sorted_rows

#: The queue table's columns, in order: (title, QueueLine attribute), as phpmq.monitor's.
QUEUE_TABLE_COLUMNS = (
    ("queue", "name"),
    ("shard", "shard"),
    ("ready", "ready"),
    ("in flight", "in_flight"),
    ("delayed", "delayed"),
    ("consumers", "consumers"),
    ("dead letters", "dead_letters"),
    ("in/s", "in_rate"),
    ("out/s", "out_rate"),
    ("oldest (s)", "oldest_age"),
)
DEFAULT_SORT = "name"
GRAPH_WIDTH = 300
GRAPH_HEIGHT = 60


@dataclass(frozen=True)
class QueueLine:
    name: str
    #: The shard that owns it ("" on a broker that is not sharded).
    shard: str
    ready: int
    in_flight: int
    delayed: int
    consumers: int
    dead_letters: int
    #: Messages per second in and out (None until two answers were compared).
    in_rate: float | None
    out_rate: float | None
    #: Seconds since the oldest ready message was sent (None: the queue has none).
    oldest_age: float | None


def queue_lines(
    stats: dict[str, Any], rows: Iterable[QueueRow], wall_now: float
) -> list[QueueLine]:
    """One line per queue of `stats`, with the rates of the monitor's rows."""
    rates = {row.name: row for row in rows}
    lines = []
    for name, figures in stats["queues"].items():
        row = rates.get(name)
        oldest = figures.get("oldest_sent_at")
        lines.append(
            QueueLine(
                name=name,
                shard=figures.get("shard", ""),
                ready=figures["ready"],
                in_flight=figures["in_flight"],
                delayed=figures["delayed"],
                consumers=figures["consumers"],
                dead_letters=figures["dead_letters"],
                in_rate=row.in_rate if row else None,
                out_rate=row.out_rate if row else None,
                oldest_age=max(0.0, wall_now - oldest) if oldest is not None else None,
            )
        )
    return lines


def table_order(
    lines: list[QueueLine], column: str, descending: bool, name_filter: str
) -> list[QueueLine]:
    """The lines whose name holds `name_filter` (any case), sorted by `column` (a name of
    QUEUE_TABLE_COLUMNS; an unknown one sorts by name), lines without a figure last."""
    attributes = [attribute for _, attribute in QUEUE_TABLE_COLUMNS]
    index = attributes.index(column) if column in attributes else 0
    wanted = name_filter.strip().casefold()
    kept = [line for line in lines if wanted in line.name.casefold()]
    return sorted_rows(kept, QUEUE_TABLE_COLUMNS, Sort(index, descending))


@dataclass(frozen=True)
class Graph:
    """Two lines (in and out per second) as SVG polyline points, scaled to the peak."""

    in_points: str
    out_points: str
    peak: float
    width: int = GRAPH_WIDTH
    height: int = GRAPH_HEIGHT


def rate_graph(samples: Iterable[tuple[float | None, float | None]], slots: int) -> Graph:
    """`samples` (in, out per second, oldest first; None: unknown, drawn as 0) drawn right
    to left from the newest, `slots` samples across the width."""
    kept = list(samples)[-slots:]
    peak = max((value or 0.0 for sample in kept for value in sample), default=0.0)
    scale = (GRAPH_HEIGHT - 2) / peak if peak > 0 else 0.0
    step = GRAPH_WIDTH / max(1, slots - 1)
    start = GRAPH_WIDTH - step * (len(kept) - 1)

    def points(which: int) -> str:
        return " ".join(
            f"{start + i * step:.1f},{GRAPH_HEIGHT - 1 - (sample[which] or 0.0) * scale:.1f}"
            for i, sample in enumerate(kept)
        )

    return Graph(points(0), points(1), peak)


def overview_figures(stats: dict[str, Any]) -> dict[str, Any]:
    """The overview's facts that are not rates: memory against its limit, refusals by code,
    paused producers, the loop's and the store's latency."""
    memory = stats["memory"]
    limit = memory.get("limit_bytes") or 0
    server = stats.get("server", {})
    storage = stats.get("storage", {})
    return {
        "held_bytes": memory["held_bytes"],
        "limit_bytes": limit,
        "memory_percent": 100.0 * memory["held_bytes"] / limit if limit else None,
        "alarm": memory["alarm"],
        "paused_producers": memory["paused_producers"],
        "refusals": stats.get("refusals", {}),
        "longest_turn_ms": server.get("longest_turn_ms"),
        "longest_turn_recent_ms": server.get("longest_turn_recent_ms"),
        "turn_budget_ms": server.get("turn_budget_ms"),
        "storage_mode": storage.get("mode", "durable" if "data_dir" in storage else "memory"),
        "last_commit_ms": storage.get("last_commit_ms"),
        "fsyncs_per_s": storage.get("fsyncs_per_s"),
        #: The shard's cluster section, its plain figures (forwarding, links) only.
        "cluster": {
            key: value
            for key, value in stats.get("cluster", {}).items()
            if value is None or isinstance(value, int | float | str)
        },
    }
