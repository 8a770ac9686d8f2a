"""The durable store: the core's journal (broker/journal.py) written to SQLite in WAL mode,
one transaction and one fsync per loop turn (group commit), and read back at start.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec

from .journal import (
    BACK,
    CLEAR,
    DEAD,
    DELAY,
    DELETE_QUEUE,
    DROP,
    FLY,
    KEY,
    PURGE,
    PUT,
    UNDEAD,
    UNKEY,
)

log = logging.getLogger("phpmq.broker")

DB_NAME = "phpmq.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    seq INTEGER NOT NULL,
    content BLOB NOT NULL,
    headers BLOB NOT NULL,
    expires_wall REAL NOT NULL,
    deliveries INTEGER NOT NULL,
    in_flight INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_position ON messages (queue, seq);
CREATE TABLE IF NOT EXISTS dead_letters (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    id TEXT NOT NULL,
    content BLOB NOT NULL,
    reason TEXT NOT NULL,
    deliveries INTEGER NOT NULL,
    dead_at REAL NOT NULL,
    headers BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS keys (
    queue TEXT NOT NULL,
    key TEXT NOT NULL,
    id TEXT NOT NULL,
    expires_wall REAL NOT NULL,
    PRIMARY KEY (queue, key)
);
CREATE INDEX IF NOT EXISTS keys_by_expiry ON keys (expires_wall);
"""

_STATEMENTS = {
    PUT: "INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
    FLY: "UPDATE messages SET in_flight = 1"
    " WHERE queue = ? AND seq BETWEEN ? AND ? AND in_flight = 0",
    BACK: "UPDATE messages SET seq = ?2, expires_wall = ?3, deliveries = ?4, in_flight = 0"
    " WHERE id = ?1",
    DELAY: "UPDATE messages SET seq = ?2, expires_wall = ?3, deliveries = ?4, in_flight = 2"
    " WHERE id = ?1",
    DROP: "DELETE FROM messages WHERE id = ?",
    UNDEAD: "DELETE FROM dead_letters WHERE queue = ? AND id = ?",
    PURGE: "DELETE FROM dead_letters WHERE queue = ?",
    CLEAR: "DELETE FROM messages WHERE queue = ? AND in_flight = 0",
    KEY: "INSERT OR REPLACE INTO keys VALUES (?, ?, ?, ?)",
    UNKEY: "DELETE FROM keys WHERE expires_wall <= ?",
}


class StoredMessage(msgspec.Struct, frozen=True, array_like=True):
    id: bytes
    queue: str
    seq: int
    content: bytes
    headers: bytes
    expires_wall: float
    deliveries: int
    #: 0 ready, 1 in flight (comes back with one more delivery), 2 delayed (counted).
    in_flight: int


class StoredDeadLetter(msgspec.Struct, frozen=True, array_like=True):
    queue: str
    id: bytes
    content: bytes
    reason: str
    deliveries: int
    dead_at: float
    headers: bytes


class StoredKey(msgspec.Struct, frozen=True, array_like=True):
    queue: str
    key: str
    id: bytes
    expires_wall: float


def _runs(operations: Iterable[tuple]) -> Iterator[tuple[str, list[tuple]]]:
    """Consecutive operations of one kind, as (kind, their arguments): one executemany each
    keeps the order that matters (an insert before its update) and the per-row cost low."""
    kind = None
    rows: list[tuple] = []
    for operation in operations:
        if operation[0] != kind:
            if rows:
                yield kind, rows  # type: ignore[misc]
            kind, rows = operation[0], []
        rows.append(operation[1:])
    if rows:
        yield kind, rows  # type: ignore[misc]


class StorageError(Exception):
    """The store could not write (disk full, I/O error): nothing of the turn was committed."""


class DurableStore:
    def __init__(self, data_dir: str | Path) -> None:
        self.directory = Path(data_dir)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.path = self.directory / DB_NAME
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: the WAL is fsynced at every commit, so a commit is on disk when it returns.
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._ids_as_blobs()
        except (OSError, sqlite3.Error) as exc:
            raise StorageError(f"cannot open the data directory {data_dir}: {exc}") from None
        self.commits = 0
        self.last_commit_ms = 0.0
        self.started = time.monotonic()

    def _ids_as_blobs(self) -> None:
        """Message IDs are bytes in the broker and BLOBs here; a store written when they were
        str holds TEXT, which would never equal a BLOB: convert it once, at open."""
        with self._db:
            for table in ("messages", "dead_letters", "keys"):
                self._db.execute(
                    f"UPDATE {table} SET id = CAST(id AS BLOB) WHERE typeof(id) = 'text'"
                )

    # ------------------------------------------------------------------ reading

    def load(self) -> tuple[list[StoredMessage], list[StoredDeadLetter]]:
        """Every message in queue order, and every dead letter oldest first."""
        messages = [
            StoredMessage(*row)
            for row in self._db.execute(
                "SELECT id, queue, seq, content, headers, expires_wall, deliveries, in_flight"
                " FROM messages ORDER BY queue, seq"
            )
        ]
        dead = [
            StoredDeadLetter(*row)
            for row in self._db.execute(
                "SELECT queue, id, content, reason, deliveries, dead_at, headers"
                " FROM dead_letters ORDER BY position"
            )
        ]
        return messages, dead

    def load_keys(self) -> list[StoredKey]:
        """Every idempotency key on disk (some may have expired while the broker was down)."""
        return [
            StoredKey(*row)
            for row in self._db.execute("SELECT queue, key, id, expires_wall FROM keys")
        ]

    # ------------------------------------------------------------------ writing

    def commit(self, operations: Iterable[tuple]) -> None:
        """Apply a turn's operations in one transaction and fsync it.

        Raises:
            StorageError: nothing was written (the transaction was rolled back).
        """
        started = time.perf_counter()
        db = self._db
        try:
            db.execute("BEGIN")
            for kind, rows in _runs(operations):
                if kind in (DEAD, DELETE_QUEUE):
                    for row in rows:
                        self._apply(db, (kind, *row))
                else:
                    db.executemany(_STATEMENTS[kind], rows)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):  # a failed rollback leaves it to SQLite
                if db.in_transaction:
                    db.execute("ROLLBACK")
            raise StorageError(str(exc)) from None
        self.commits += 1
        self.last_commit_ms = (time.perf_counter() - started) * 1000

    @staticmethod
    def _apply(db: sqlite3.Connection, operation: tuple) -> None:
        kind = operation[0]
        if kind == DEAD:
            db.execute("DELETE FROM messages WHERE id = ?", (operation[2],))
            db.execute(
                "INSERT INTO dead_letters (queue, id, content, reason, deliveries, dead_at,"
                " headers) VALUES (?, ?, ?, ?, ?, ?, ?)",
                operation[1:],
            )
        elif kind == DELETE_QUEUE:
            db.execute("DELETE FROM messages WHERE queue = ?", operation[1:])
            db.execute("DELETE FROM dead_letters WHERE queue = ?", operation[1:])
        else:
            db.execute(_STATEMENTS[kind], operation[1:])

    # ------------------------------------------------------------------ reporting

    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += Path(f"{self.path}{suffix}").stat().st_size
        return total

    def stats(self) -> dict[str, float | int | str]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {
            "data_dir": str(self.directory),
            "size_bytes": self.size_bytes(),
            "commits": self.commits,
            "fsyncs_per_s": round(self.commits / elapsed, 1),
            "last_commit_ms": round(self.last_commit_ms, 3),
        }

    def close(self) -> None:
        self._db.close()
