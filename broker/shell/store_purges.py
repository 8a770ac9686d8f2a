"""Purged and deleted queues in the durable store: marked at once, their rows deleted a slice
per commit (docs/durability.md, "Purging a big queue").

Deleting 200,000 rows in the turn of a `queue-purge` took the loop about 0.3 s, with every
other client's confirms waiting. So CLEAR and DELETE_QUEUE write a marker: the queue and the
range of positions (`seq`) the core had handed out when it purged. Every message of that
queue placed before the purge has its position in the range; every one placed after it gets
one outside (new ones at the tail count up, requeues to the head count down). A purge marks
the range's ready rows (`in_flight = 0`); a delete marks every row of the range and the
queue's dead letters up to the last written.

What keeps a marked row from coming back:
- a row in flight at the purge stays (it is not purged), and it comes back ready only at a
  new position, outside the range (BACK after `Queues.place`);
- FLY and LEASE_TAKEN, which mark a range of positions dispatched or leased, skip the
  marked ranges (`outside_marked`): a turn may dispatch a requeue from before the range and
  a send from after it together;
- recovery puts a message that was in flight back at its own position, which a marker
  still waiting would then take: it journals SETTLE first, which finishes every marker
  (`finish_all`) on every replica, whatever its slices have done; and the tables recovery
  reads are finished too (at an open, or in the copy a replica's promotion reads);
- positions are never handed out again inside a marked range, even by a replica that
  finished its markers and was elected later while another replica still has them waiting:
  every range ever marked is folded into `purged_seqs`, which recovery restores.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

#: Rows deleted per commit at most: about 1 ms of SQLite (4 ms for 2,000 measured; message
#: IDs begin with their time, so a slice's rows share index pages). With 1,000 another
#: client's confirmed send waited up to 16-24 ms during a purge of 200,000, with 500 8-15.
SLICE_ROWS = 500

SCHEMA = """
CREATE TABLE IF NOT EXISTS purges (
    queue TEXT NOT NULL,
    lo INTEGER NOT NULL,
    hi INTEGER NOT NULL,
    every_row INTEGER NOT NULL,
    dead_upto INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS purged_seqs (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    lo INTEGER NOT NULL,
    hi INTEGER NOT NULL
);
"""

_EXTEND = (
    "INSERT INTO purged_seqs VALUES (1, ?1, ?2) ON CONFLICT (id) DO UPDATE"
    " SET lo = min(lo, excluded.lo), hi = max(hi, excluded.hi)"
)


def mark_cleared(db: sqlite3.Connection, queue: str, lo: int, hi: int) -> None:
    """A purge: the queue's ready rows placed in [lo, hi] go, a slice at a time."""
    db.execute("INSERT INTO purges VALUES (?, ?, ?, 0, 0)", (queue, lo, hi))
    db.execute(_EXTEND, (lo, hi))


def mark_deleted(db: sqlite3.Connection, queue: str, lo: int, hi: int) -> None:
    """A deleted queue: its settings and bindings go now (a few rows), its messages placed
    in [lo, hi] and its dead letters a slice at a time."""
    for table in ("bindings", "queue_settings"):
        db.execute(f"DELETE FROM {table} WHERE queue = ?", (queue,))
    (dead_upto,) = db.execute("SELECT coalesce(max(position), 0) FROM dead_letters").fetchone()
    db.execute("INSERT INTO purges VALUES (?, ?, ?, 1, ?)", (queue, lo, hi, dead_upto))
    db.execute(_EXTEND, (lo, hi))


def marked(db: sqlite3.Connection) -> dict[str, list[tuple[int, int]]]:
    """The ranges waiting, by queue (almost always none: a query of an empty table)."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for queue, lo, hi in db.execute("SELECT queue, lo, hi FROM purges"):
        ranges.setdefault(queue, []).append((lo, hi))
    return ranges


def outside_marked(ranges: list[tuple[int, int]], lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """[lo, hi] without the marked `ranges`: the pieces left, in order."""
    for start, end in sorted(ranges):
        if end < lo or start > hi:
            continue
        if start > lo:
            yield lo, start - 1
        lo = end + 1
        if lo > hi:
            return
    yield lo, hi


def delete_slice(db: sqlite3.Connection, limit: int | None = None) -> bool:
    """Inside the open transaction: delete up to `limit` (SLICE_ROWS) marked rows of the
    oldest marker, and the marker once none are left. Whether markers remain."""
    limit = SLICE_ROWS if limit is None else limit
    row = db.execute(
        "SELECT rowid, queue, lo, hi, every_row, dead_upto FROM purges ORDER BY rowid LIMIT 1"
    ).fetchone()
    if row is None:
        return False
    marker, queue, lo, hi, every_row, dead_upto = row
    ready_only = "" if every_row else " AND in_flight = 0"
    rows = db.execute(
        "SELECT rowid, seq FROM messages"
        f" WHERE queue = ? AND seq BETWEEN ? AND ?{ready_only} ORDER BY seq LIMIT ?",
        (queue, lo, hi, limit),
    ).fetchall()
    db.executemany("DELETE FROM messages WHERE rowid = ?", [row[:1] for row in rows])
    deleted = len(rows)
    if deleted == limit:  # the next slice starts after these: rows in flight are passed once
        db.execute("UPDATE purges SET lo = ? WHERE rowid = ?", (rows[-1][1] + 1, marker))
    if every_row and deleted < limit:
        deleted += db.execute(
            "DELETE FROM dead_letters WHERE position IN (SELECT position FROM dead_letters"
            " WHERE queue = ? AND position <= ? LIMIT ?)",
            (queue, dead_upto, limit - deleted),
        ).rowcount
    if deleted < limit:
        db.execute("DELETE FROM purges WHERE rowid = ?", (marker,))
        return db.execute("SELECT 1 FROM purges LIMIT 1").fetchone() is not None
    return True


def has_marks(db: sqlite3.Connection) -> bool:
    """Whether markers wait (a store from before them has no table for them)."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'purges'").fetchone() is None:
        return False
    return db.execute("SELECT 1 FROM purges LIMIT 1").fetchone() is not None


def finish_all(db: sqlite3.Connection) -> None:
    """Inside the open transaction: every marker's rows deleted, and the markers."""
    while delete_slice(db, limit=1 << 62):
        pass


def purged_seqs(db: sqlite3.Connection) -> tuple[int, int] | None:
    """The lowest and highest position any marker ever covered (None: no purge yet)."""
    row = db.execute("SELECT lo, hi FROM purged_seqs").fetchone()
    return None if row is None else (row[0], row[1])
