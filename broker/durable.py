"""The durable store: the core's journal (broker/journal.py) written to SQLite in WAL mode,
one transaction and one fsync per loop turn (group commit), and read back at start.

Nothing here may stall the loop (docs/durability.md): the loop's connection never runs
SQLite's auto-checkpoint (`wal_autocheckpoint=0`); a background thread with its own connection
copies the WAL into the database (PASSIVE checkpoints, which never take the writer's lock) once
it has grown, then lets the loop copy the last few frames itself before its next transaction,
so that the WAL starts over; and it empties the WAL when the broker is idle. Space comes back
as queues drain: the database is in `auto_vacuum=INCREMENTAL` mode and the loop gives free
pages back in bounded slices (`incremental_vacuum(N)`), inside the turn's own transaction when
it has one, else in idle turns.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec

from .checkpoints import Checkpointer
from .data_lock import DataDirInUse, DataDirLock
from .disk import WAL_LIMIT_CHECKPOINTS, Reserve, checkpoint_bytes, free_and_total
from .journal import (
    BACK,
    BIND,
    CLEAR,
    DEAD,
    DELAY,
    DELETE_QUEUE,
    DROP,
    FLY,
    KEY,
    LEASE_DONE,
    LEASE_TAKEN,
    PURGE,
    PUT,
    RAN,
    SCHEDULE,
    UNBIND,
    UNDEAD,
    UNKEY,
    UNSCHEDULE,
    UNUSED,
)

log = logging.getLogger("phpmq.broker")

DB_NAME = "phpmq.sqlite3"
#: A store that could not be opened for writing (a full disk) tries again this often.
REOPEN_S = 1.0
#: Free pages kept for reuse; above this the loop gives them back to the file system...
RECLAIM_FREE_PAGES = 256
#: ...at most this many per turn: a slice of about a millisecond (~7.5 us a page, measured).
RECLAIM_SLICE_PAGES = 128

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    seq INTEGER NOT NULL,
    content BLOB NOT NULL,
    headers BLOB NOT NULL,
    expires_wall REAL NOT NULL,
    deliveries INTEGER NOT NULL,
    in_flight INTEGER NOT NULL,
    event BLOB NOT NULL DEFAULT x'',
    reply_to TEXT,
    correlation TEXT,
    visible_wall REAL NOT NULL DEFAULT 0,
    message_key BLOB NOT NULL DEFAULT x'',
    lease TEXT
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
    headers BLOB NOT NULL,
    message_key BLOB NOT NULL DEFAULT x''
);
CREATE TABLE IF NOT EXISTS keys (
    queue TEXT NOT NULL,
    key TEXT NOT NULL,
    id TEXT NOT NULL,
    expires_wall REAL NOT NULL,
    PRIMARY KEY (queue, key)
);
CREATE INDEX IF NOT EXISTS keys_by_expiry ON keys (expires_wall);
CREATE TABLE IF NOT EXISTS bindings (
    queue TEXT NOT NULL,
    pattern TEXT NOT NULL,
    PRIMARY KEY (queue, pattern)
);
CREATE TABLE IF NOT EXISTS queue_settings (
    queue TEXT PRIMARY KEY,
    unused_ms INTEGER
);
CREATE TABLE IF NOT EXISTS schedules (
    name TEXT PRIMARY KEY,
    spec BLOB NOT NULL,
    last_run REAL,
    runs INTEGER NOT NULL DEFAULT 0
);
"""

_STATEMENTS = {
    PUT: "INSERT OR REPLACE INTO messages (id, queue, seq, content, headers, expires_wall,"
    " deliveries, in_flight, event, reply_to, correlation, visible_wall, message_key)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?)",
    FLY: "UPDATE messages SET in_flight = 1"
    " WHERE queue = ? AND seq BETWEEN ? AND ? AND in_flight = 0",
    BACK: "UPDATE messages SET seq = ?2, expires_wall = ?3, deliveries = ?4, in_flight = 0,"
    " lease = NULL WHERE id = ?1",
    LEASE_TAKEN: "UPDATE messages SET in_flight = 3, lease = ?"
    " WHERE queue = ? AND seq BETWEEN ? AND ? AND in_flight = 0",
    LEASE_DONE: "DELETE FROM messages WHERE queue = ? AND lease = ?",
    DELAY: "UPDATE messages SET seq = ?2, expires_wall = ?3, deliveries = ?4, in_flight = 2"
    " WHERE id = ?1",
    DROP: "DELETE FROM messages WHERE id = ?",
    UNDEAD: "DELETE FROM dead_letters WHERE queue = ? AND id = ?",
    PURGE: "DELETE FROM dead_letters WHERE queue = ?",
    CLEAR: "DELETE FROM messages WHERE queue = ? AND in_flight = 0",
    KEY: "INSERT OR REPLACE INTO keys VALUES (?, ?, ?, ?)",
    UNKEY: "DELETE FROM keys WHERE expires_wall <= ?",
    BIND: "INSERT OR IGNORE INTO bindings VALUES (?, ?)",
    UNBIND: "DELETE FROM bindings WHERE queue = ? AND pattern = ?",
    UNUSED: "INSERT OR REPLACE INTO queue_settings VALUES (?, ?)",
    SCHEDULE: "INSERT OR REPLACE INTO schedules (name, spec, last_run, runs)"
    " VALUES (?, ?, NULL, 0)",
    UNSCHEDULE: "DELETE FROM schedules WHERE name = ?",
    RAN: "UPDATE schedules SET last_run = ?2, runs = ?3 WHERE name = ?1",
}


#: Columns of `messages` added since the first stores were written, in table order.
_ADDED_COLUMNS = (
    ("event", "BLOB NOT NULL DEFAULT x''"),
    ("reply_to", "TEXT"),
    ("correlation", "TEXT"),
    ("visible_wall", "REAL NOT NULL DEFAULT 0"),
    ("message_key", "BLOB NOT NULL DEFAULT x''"),
    ("lease", "TEXT"),
)
#: The same for `dead_letters`.
_ADDED_DEAD_COLUMNS = (("message_key", "BLOB NOT NULL DEFAULT x''"),)


class StoredMessage(msgspec.Struct, frozen=True, array_like=True):
    id: bytes
    queue: str
    seq: int
    content: bytes
    headers: bytes
    expires_wall: float
    deliveries: int
    #: 0 ready, 1 in flight (comes back with one more delivery), 2 delayed (counted), 3 in
    #: the batch lease `lease`.
    in_flight: int
    #: The event of a published copy (b"": a send).
    event: bytes = b""
    #: A request's reply route and correlation id (None: not a request).
    reply_to: str | None = None
    correlation: str | None = None
    #: A delayed send: wall-clock time it becomes visible (0: at once).
    visible_wall: float = 0.0
    message_key: bytes = b""
    lease: str | None = None


class StoredDeadLetter(msgspec.Struct, frozen=True, array_like=True):
    queue: str
    id: bytes
    content: bytes
    reason: str
    deliveries: int
    dead_at: float
    headers: bytes
    message_key: bytes = b""


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
        lock: DataDirLock | None = None
        self._db: sqlite3.Connection | None = None
        #: While read_with runs: a copy of the store in memory, which the readers read.
        self._copy: sqlite3.Connection | None = None
        #: Read-only (a full disk): why the store could not be opened for writing, when it
        #: is tried next, and the database file opened as immutable, to read what it holds.
        self.unopened: str | None = None
        self._open_at = 0.0
        self._immutable: sqlite3.Connection | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock = DataDirLock(self.directory)
            self.path = self.directory / DB_NAME
            #: The WAL's budget, from the size of the volume (broker/disk.py): checkpointed
            #: past the first, never (much) past the second.
            self.checkpoint_bytes = checkpoint_bytes(free_and_total(self.directory)[1])
            self.wal_limit_bytes = WAL_LIMIT_CHECKPOINTS * self.checkpoint_bytes
            #: Room kept for a store that cannot write for want of space (StoreKeeper).
            self.reserve = Reserve(self.directory, self.checkpoint_bytes)
            self._open_or_read()
        except DataDirInUse as exc:
            raise StorageError(str(exc)) from None
        except (OSError, sqlite3.Error) as exc:
            if lock is not None:
                lock.release()
            raise StorageError(f"cannot open the data directory {data_dir}: {exc}") from None
        self._lock: DataDirLock | None = lock
        self.commits = 0
        self.last_commit_ms = 0.0
        self.longest_commit_ms = 0.0
        self.started = time.monotonic()
        #: Set by the checkpoint thread once it copied nearly all of a big WAL: the next
        #: commit first copies the rest itself, so that its write starts the WAL over.
        self.hand_off = False
        self.hand_offs = 0
        self.longest_hand_off_ms = 0.0
        #: Pages given back to the file system, the slices that did it and the last's cost.
        self.pages_reclaimed = 0
        self.reclaims = 0
        self.last_reclaim_ms = 0.0
        self._checkpointer = Checkpointer(self)
        if self._db is not None:
            self._checkpointer.start()

    def _open_or_read(self) -> None:
        """Open the store for writing; on a full disk, again with the reserve's room; if
        that fails too, only read it (a start on a full disk, served read-only until
        `try_open` succeeds)."""
        try:
            self._open()
            return
        except sqlite3.Error as exc:
            problem = exc
        if self.reserve.release(keep_last=False):
            try:
                self._open()  # with the room the reserve gave
                return
            except sqlite3.Error as exc:
                problem = exc
        self._read_only(problem)

    def _read_only(self, problem: sqlite3.Error) -> None:
        """Read the database file as it is, without the WAL index SQLite could not create
        (a full disk). Only sound when no WAL holds frames the file lacks: a clean stop
        leaves none; after a crash SQLite's own files exist and the open does not fail so.

        Raises:
            sqlite3.Error: `problem`, when it cannot be done.
        """
        if self.wal_bytes() or not self.path.exists():
            raise problem
        self._immutable = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?immutable=1", uri=True, check_same_thread=False
        )
        self._reader = self._immutable
        self.free_pages = 0
        self.unopened = str(problem)
        self._open_at = time.monotonic() + REOPEN_S
        log.warning(
            "cannot open the store for writing (%s): serving what it holds, refusing sends,"
            " until it can",
            problem,
        )

    @property
    def read_only(self) -> bool:
        return self._db is None

    def try_open(self) -> bool:
        """Read-only: open the store for writing, at most every REOPEN_S; whether it is."""
        if self._db is not None:
            return True
        now = time.monotonic()
        if now < self._open_at:
            return False
        self._open_at = now + REOPEN_S
        try:
            self._open()
        except sqlite3.Error as exc:
            self.unopened = str(exc)
            self._reader = self._copy or self._immutable  # type: ignore[assignment]
            return False
        if self._immutable is not None:
            self._immutable.close()
            self._immutable = None
        self.unopened = None
        if self._copy is not None:
            self._reader = self._copy
        self._checkpointer.start()
        log.warning("the store is open for writing again")
        return True

    def _open(self) -> None:
        self._db = db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._reader = db
        try:
            # Only takes effect before the first table exists (a new store); an old store is
            # converted below.
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            db.execute("PRAGMA journal_mode=WAL")
            # FULL: the WAL is fsynced at every commit, so a commit is on disk when it returns.
            db.execute("PRAGMA synchronous=FULL")
            # The loop never checkpoints (a checkpoint inside a COMMIT stalls the turn): the
            # checkpoint thread does. The WAL file shrinks back to this size when it restarts:
            # one that starts over then overwrites blocks it already has, and the loop's
            # fsyncs need not record a growing file. Idle, the WAL is emptied anyway.
            db.execute("PRAGMA wal_autocheckpoint=0")
            db.execute(f"PRAGMA journal_size_limit={self.wal_limit_bytes}")
            db.executescript(_SCHEMA)
            self._ids_as_blobs(db)
            self._add_columns(db)
            # Only leased rows are in it: a lease's commit finds them without a queue scan.
            db.execute(
                "CREATE INDEX IF NOT EXISTS messages_by_lease ON messages (queue, lease)"
                " WHERE lease IS NOT NULL"
            )
            self._incremental_vacuum_on(db)
            self.free_pages = db.execute("PRAGMA freelist_count").fetchone()[0]
        except sqlite3.Error:
            db.close()
            self._db = None
            raise

    def _incremental_vacuum_on(self, db: sqlite3.Connection) -> None:
        """A store written before auto_vacuum was set never gives space back: rebuild it once
        in INCREMENTAL mode (VACUUM rewrites the whole file: seconds for a big store)."""
        if db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
            return
        started = time.monotonic()
        size = self.size_bytes()
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        db.execute("VACUUM")
        log.info(
            "converted the store to incremental vacuum (space is given back as queues drain):"
            " %d bytes before, %d after, in %.0f ms",
            size,
            self.size_bytes(),
            (time.monotonic() - started) * 1000,
        )

    @property
    def reclaimable(self) -> bool:
        """Whether free pages wait to be given back (the server then polls briefly and calls
        reclaim() in turns that write nothing)."""
        return self.free_pages > RECLAIM_FREE_PAGES

    def _add_columns(self, db: sqlite3.Connection) -> None:
        """A store written before events, requests or delayed sends lacks their columns: add
        them (empty: a plain send)."""
        for table, added in (("messages", _ADDED_COLUMNS), ("dead_letters", _ADDED_DEAD_COLUMNS)):
            columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            for name, declaration in added:
                if name not in columns:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")

    def _ids_as_blobs(self, db: sqlite3.Connection) -> None:
        """Message IDs are bytes in the broker and BLOBs here; a store written when they were
        str holds TEXT, which would never equal a BLOB: convert it once, at open."""
        with db:
            for table in ("messages", "dead_letters", "keys"):
                db.execute(f"UPDATE {table} SET id = CAST(id AS BLOB) WHERE typeof(id) = 'text'")

    # ------------------------------------------------------------------ reading

    def load(self) -> tuple[list[StoredMessage], list[StoredDeadLetter]]:
        """Every message in queue order, and every dead letter oldest first."""
        messages = [
            StoredMessage(*row)
            for row in self._reader.execute(
                "SELECT id, queue, seq, content, headers, expires_wall, deliveries, in_flight,"
                " event, reply_to, correlation, visible_wall, message_key, lease"
                " FROM messages ORDER BY queue, seq"
            )
        ]
        dead = [
            StoredDeadLetter(*row)
            for row in self._reader.execute(
                "SELECT queue, id, content, reason, deliveries, dead_at, headers, message_key"
                " FROM dead_letters ORDER BY position"
            )
        ]
        return messages, dead

    def load_bindings(self) -> tuple[list[tuple[str, str]], list[tuple[str, int]]]:
        """Every (queue, pattern) binding, in the order bound, and every queue's
        delete-when-unused setting (queue, ms)."""
        reader = self._reader
        bindings = list(reader.execute("SELECT queue, pattern FROM bindings ORDER BY rowid"))
        unused = list(reader.execute("SELECT queue, unused_ms FROM queue_settings"))
        return bindings, unused

    def load_schedules(self) -> list[tuple[str, bytes, float | None, int]]:
        """Every schedule: (name, spec JSON, last run wall time or None, runs)."""
        return list(self._reader.execute("SELECT name, spec, last_run, runs FROM schedules"))

    def load_keys(self) -> list[StoredKey]:
        """Every idempotency key on disk (some may have expired while the broker was down)."""
        return [
            StoredKey(*row)
            for row in self._reader.execute("SELECT queue, key, id, expires_wall FROM keys")
        ]

    # ------------------------------------------------------------------ writing

    def commit(self, operations: Iterable[tuple], copy_first: bool = False) -> None:
        """Apply a turn's operations in one transaction and fsync it; with `copy_first`,
        after copying the WAL into the database (so that this write starts it over).

        Raises:
            StorageError: nothing was written (the transaction was rolled back).
        """
        started = time.perf_counter()
        if not self.try_open():
            raise StorageError(f"the store is read-only until it can be opened: {self.unopened}")
        db = self._db
        assert db is not None
        # Past its limit the WAL is copied here whatever the thread managed (a write faster
        # than its checkpoints): this transaction then starts it over, within its budget.
        if copy_first or self.hand_off or self.wal_bytes() > self.wal_limit_bytes:
            self._take_hand_off(db)
        try:
            db.execute("BEGIN")
            self._write(db, operations)
            free_pages = self._reclaim_slice(db)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):  # a failed rollback leaves it to SQLite
                if db.in_transaction:
                    db.execute("ROLLBACK")
            raise StorageError(str(exc)) from None
        self.free_pages = free_pages
        self.commits += 1
        self.last_commit_ms = (time.perf_counter() - started) * 1000
        self.longest_commit_ms = max(self.longest_commit_ms, self.last_commit_ms)

    def _write(self, db: sqlite3.Connection, operations: Iterable[tuple]) -> None:
        for kind, rows in _runs(operations):
            if kind in (DEAD, DELETE_QUEUE):
                for row in rows:
                    self._apply(db, (kind, *row))
            else:
                db.executemany(_STATEMENTS[kind], rows)

    def read_with(self, operations: list[tuple]) -> None:
        """Until `read_done()`, load() and the other readers read a copy of the store in
        memory with `operations` applied: operations a stop could not write (the disk was
        full), to be written before any others once it can.

        Raises:
            StorageError: the store cannot be read.
        """
        copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        try:
            self._reader.backup(copy)
            copy.execute("BEGIN")
            self._write(copy, operations)
            copy.execute("COMMIT")
        except sqlite3.Error as exc:
            copy.close()
            raise StorageError(f"cannot read the store: {exc}") from None
        self._copy = self._reader = copy

    def read_done(self) -> None:
        """The end of read_with's copy."""
        if self._copy is not None:
            self._copy.close()
            self._copy = None
            self._reader = self._db or self._immutable  # type: ignore[assignment]

    def reclaim(self) -> None:
        """Give one slice of free pages back, in a transaction of its own (a turn that had
        nothing else to write).

        Raises:
            StorageError: nothing was given back this time.
        """
        db = self._db
        if db is None:
            raise StorageError("the store is read-only")
        try:
            db.execute("BEGIN")
            free_pages = self._reclaim_slice(db)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                if db.in_transaction:
                    db.execute("ROLLBACK")
            raise StorageError(str(exc)) from None
        self.free_pages = free_pages

    def _take_hand_off(self, db: sqlite3.Connection) -> None:
        """Copy the few frames committed since the checkpoint thread's last checkpoint, so
        that the transaction that follows starts the WAL over (a write can only do that when
        every frame is copied, and the thread cannot time that: the loop is mostly between
        BEGIN and COMMIT). About one commit's frames: the thread left no more. PASSIVE: if
        the thread happens to be checkpointing, SQLite answers busy at once; never a wait."""
        self.hand_off = False
        started = time.perf_counter()
        with contextlib.suppress(sqlite3.Error):  # housekeeping: the commit goes on anyway
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.hand_offs += 1
        ms = (time.perf_counter() - started) * 1000
        self.longest_hand_off_ms = max(self.longest_hand_off_ms, ms)

    def _reclaim_slice(self, db: sqlite3.Connection) -> int:
        """Inside the open transaction: when more than RECLAIM_FREE_PAGES pages are free,
        move up to RECLAIM_SLICE_PAGES of them to the end of the file and cut it there (the
        file shrinks at the next checkpoint). Returns the free pages left."""
        free_pages = db.execute("PRAGMA freelist_count").fetchone()[0]
        if free_pages <= RECLAIM_FREE_PAGES:
            return free_pages
        started = time.perf_counter()
        # Python's sqlite3 steps this pragma once, which gives back one page (it has no result
        # columns, so the module never steps it again): one execute per page.
        for _ in range(min(RECLAIM_SLICE_PAGES, free_pages - RECLAIM_FREE_PAGES)):
            db.execute("PRAGMA incremental_vacuum")
        left = db.execute("PRAGMA freelist_count").fetchone()[0]
        self.last_reclaim_ms = (time.perf_counter() - started) * 1000
        self.pages_reclaimed += free_pages - left
        self.reclaims += 1
        return left

    @staticmethod
    def _apply(db: sqlite3.Connection, operation: tuple) -> None:
        kind = operation[0]
        if kind == DEAD:
            db.execute("DELETE FROM messages WHERE id = ?", (operation[2],))
            db.execute(
                "INSERT INTO dead_letters (queue, id, content, reason, deliveries, dead_at,"
                " headers, message_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                operation[1:],
            )
        elif kind == DELETE_QUEUE:
            for table in ("messages", "dead_letters", "bindings", "queue_settings"):
                db.execute(f"DELETE FROM {table} WHERE queue = ?", operation[1:])
        else:
            db.execute(_STATEMENTS[kind], operation[1:])

    # ------------------------------------------------------------------ reporting

    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += Path(f"{self.path}{suffix}").stat().st_size
        return total

    def wal_bytes(self) -> int:
        try:
            return Path(f"{self.path}-wal").stat().st_size
        except OSError:
            return 0

    def stats(self) -> dict[str, float | int | str]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        checkpointer = self._checkpointer
        return {
            "data_dir": str(self.directory),
            "size_bytes": self.size_bytes(),
            "wal_bytes": self.wal_bytes(),
            "commits": self.commits,
            "fsyncs_per_s": round(self.commits / elapsed, 1),
            "last_commit_ms": round(self.last_commit_ms, 3),
            "longest_commit_ms": round(self.longest_commit_ms, 3),
            "free_pages": self.free_pages,
            "pages_reclaimed": self.pages_reclaimed,
            "last_reclaim_ms": round(self.last_reclaim_ms, 3),
            "checkpoints": checkpointer.checkpoints,
            "wal_truncations": checkpointer.truncations,
            "wal_hand_offs": self.hand_offs,
            "longest_hand_off_ms": round(self.longest_hand_off_ms, 3),
            "longest_checkpoint_ms": round(checkpointer.longest_ms, 3),
            "checkpoint_errors": checkpointer.errors,
            "checkpoint_at_wal_bytes": self.checkpoint_bytes,
            "wal_limit_bytes": self.wal_limit_bytes,
            "read_only": self.read_only,
        }

    def close(self) -> None:
        self.read_done()
        self._checkpointer.stop()
        for db in (self._db, self._immutable):
            if db is not None:
                db.close()
        if self._lock is not None:
            self._lock.release()
