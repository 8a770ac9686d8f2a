"""What `phpmq top` shows, without a terminal: rows of queues and peers from two `stats`
answers (rates from the difference of their counters), sorted by a column the user picks.

Pure: no I/O, no clock. `phpmq.cli.top` asks the broker, feeds each answer here with the time
it was taken, and draws what comes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

Row = TypeVar("Row")

#: Figures of each shard's stats that add up to the cluster's.
SUMMED = ("peers", "bindings")

#: The queue table's columns, in order: (title, QueueRow attribute).
QUEUE_COLUMNS = (
    ("queue", "name"),
    ("in/s", "in_rate"),
    ("out/s", "out_rate"),
    ("acked/s", "acked_rate"),
    ("ready", "ready"),
    ("in flight", "in_flight"),
    ("consumers", "consumers"),
    ("dead letters", "dead_letters"),
)
#: The peer table's columns, in order: (title, PeerRow attribute).
PEER_COLUMNS = (
    ("peer", "name"),
    ("kind", "kind"),
    ("transport", "transport"),
    ("address", "address"),
    ("windows", "windows"),
    ("held", "held"),
    ("refused", "refused"),
    ("last heard s", "silent_seconds"),
)


@dataclass(frozen=True)
class QueueRow:
    name: str
    #: Messages per second put into the queue, dispatched from it, and acked (None: no
    #: earlier answer to compare with yet, or its counters started over).
    in_rate: float | None
    out_rate: float | None
    acked_rate: float | None
    ready: int
    in_flight: int
    consumers: int
    dead_letters: int


@dataclass(frozen=True)
class PeerRow:
    #: The peer's HELLO name, or its id where it gave none.
    name: str
    #: Its HELLO role (worker, producer, ...) or "stock" for a peer that never said HELLO.
    kind: str
    transport: str
    #: Where it connects from (and its CURVE key's name, if any): "" if unknown.
    address: str
    windows: int
    held: int
    refused: int
    silent_seconds: float


@dataclass
class Sort:
    """A table's sort: which column (index into its columns) and which way."""

    column: int
    descending: bool = True

    def next_column(self, columns: int) -> None:
        self.column = (self.column + 1) % columns

    def reverse(self) -> None:
        self.descending = not self.descending


@dataclass(frozen=True)
class View:
    queues: list[QueueRow]
    peers: list[PeerRow]
    #: Seconds between the two answers the rates come from (None: first answer).
    interval: float | None


@dataclass
class Monitor:
    """Feed it each `stats` answer (`update`) and the user's keys (`press`)."""

    queue_sort: Sort = field(default_factory=lambda: Sort(column=1))  # in/s, highest first
    peer_sort: Sort = field(
        default_factory=lambda: Sort(
            column=_column(PEER_COLUMNS, "silent_seconds"), descending=False
        )
    )
    _previous: tuple[float, dict[str, Any]] | None = None
    _interval: float | None = None
    _queues: list[QueueRow] = field(default_factory=list)
    _peers: list[PeerRow] = field(default_factory=list)

    def update(self, stats: dict[str, Any], at: float) -> View:
        """The rows for this answer, taken at `at` (seconds, any monotonic clock)."""
        previous = self._previous
        self._previous = (at, stats)
        self._interval = at - previous[0] if previous is not None and at > previous[0] else None
        before = previous[1]["queues"] if previous is not None else {}
        self._queues = [
            queue_row(name, figures, before.get(name), self._interval)
            for name, figures in stats["queues"].items()
        ]
        self._peers = [peer_row(client) for client in stats.get("clients", [])]
        return self.view()

    def view(self) -> View:
        """The last answer's rows in the current sort (again after a key changed it)."""
        return View(
            sorted_rows(self._queues, QUEUE_COLUMNS, self.queue_sort),
            sorted_rows(self._peers, PEER_COLUMNS, self.peer_sort),
            self._interval,
        )

    def press(self, key: str) -> bool:
        """A key the user pressed: `s` next queue column, `r` reverse the queues, `p` next
        peer column, `o` reverse the peers. False for `q` (quit)."""
        if key in ("q", "Q"):
            return False
        if key == "s":
            self.queue_sort.next_column(len(QUEUE_COLUMNS))
        elif key == "r":
            self.queue_sort.reverse()
        elif key == "p":
            self.peer_sort.next_column(len(PEER_COLUMNS))
        elif key == "o":
            self.peer_sort.reverse()
        return True


def rate(now: int, before: int | None, interval: float | None) -> float | None:
    """Per second between two readings of a counter; None without an earlier reading or
    when the counter went back (the queue was deleted and made again, or the broker
    restarted)."""
    if before is None or interval is None or now < before:
        return None
    return (now - before) / interval


def queue_row(
    name: str, figures: dict[str, Any], before: dict[str, Any] | None, interval: float | None
) -> QueueRow:
    totals = figures.get("totals", {})
    earlier = before.get("totals", {}) if before is not None else {}

    def per_second(key: str) -> float | None:
        return rate(totals.get(key, 0), earlier.get(key), interval)

    return QueueRow(
        name=name,
        in_rate=per_second("published"),
        out_rate=per_second("delivered"),
        acked_rate=per_second("acked"),
        ready=figures["ready"],
        in_flight=figures["in_flight"],
        consumers=figures["consumers"],
        dead_letters=figures["dead_letters"],
    )


def peer_row(client: dict[str, Any]) -> PeerRow:
    return PeerRow(
        name=client["name"] or client["id"],
        kind=client["role"] or ("hello" if client["hello"] else "stock"),
        transport=client["transport"],
        address=_address(client),
        windows=client["windows"],
        held=client["held"],
        refused=client["refused"],
        silent_seconds=client["silent_seconds"],
    )


def sorted_rows(rows: list[Row], columns: tuple[tuple[str, str], ...], sort: Sort) -> list[Row]:
    """Rows by the sort's column; rows without a figure (None) last either way, ties by
    the first column (the name) so that the order does not flicker."""
    attribute = columns[sort.column][1]
    name = columns[0][1]
    by_name = sorted(rows, key=lambda row: getattr(row, name))
    known = [row for row in by_name if getattr(row, attribute) is not None]
    unknown = [row for row in by_name if getattr(row, attribute) is None]
    known.sort(key=lambda row: getattr(row, attribute), reverse=sort.descending)
    return known + unknown


def _address(client: dict[str, Any]) -> str:
    address = client.get("address") or ""
    key = client.get("key")
    return f"{key}@{address}" if key else address


def _column(columns: tuple[tuple[str, str], ...], attribute: str) -> int:
    return [name for _, name in columns].index(attribute)


def merged_stats(
    answers: dict[str, dict[str, Any]],
    addresses: dict[str, str],
    unreachable: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Every shard's `stats` answer as one broker's: queues and clients of all (each queue
    with its `shard`), counters and memory summed, `shards` listing each shard's address,
    peers, queues and uptime, and each shard in `unreachable` with why it did not answer
    (`phpmq stats`, `phpmq top` and the web console show it)."""
    first = next(iter(answers.values()))
    merged: dict[str, Any] = {**first, "queues": {}, "clients": [], "pools": {}, "bridges": {}}
    merged["counters"] = dict.fromkeys(first["counters"], 0)
    merged["memory"] = {**first["memory"], "held_bytes": 0, "paused_producers": 0}
    for name in SUMMED:
        merged[name] = 0
    merged["shards"] = {}
    for shard, answer in answers.items():
        for queue, figures in answer["queues"].items():
            merged["queues"][queue] = {**figures, "shard": shard}
        merged["clients"] += answer["clients"]
        merged["pools"].update(answer["pools"])
        merged["bridges"].update(answer["bridges"])
        for counter, value in answer["counters"].items():
            merged["counters"][counter] = merged["counters"].get(counter, 0) + value
        merged["memory"]["held_bytes"] += answer["memory"]["held_bytes"]
        merged["memory"]["paused_producers"] += answer["memory"]["paused_producers"]
        merged["memory"]["alarm"] = merged["memory"]["alarm"] or answer["memory"]["alarm"]
        for name in SUMMED:
            merged[name] += answer[name]
        merged["shards"][shard] = {
            "address": addresses[shard],
            "peers": answer["peers"],
            "queues": len(answer["queues"]),
            "uptime_seconds": answer["uptime_seconds"],
        }
    for shard, why in (unreachable or {}).items():
        merged["shards"][shard] = {"address": addresses[shard], "unreachable": why}
    merged["queues"] = dict(sorted(merged["queues"].items()))
    return merged
