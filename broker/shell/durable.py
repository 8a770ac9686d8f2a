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

While acks keep up with puts, a turn is appended to the store as one row and folded into the
tables a little later, leaving out what was acked meanwhile (turn_log.py).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from .checkpoints import Checkpointer
from .data_lock import DataDirInUse, DataDirLock
from .disk import WAL_LIMIT_CHECKPOINTS, Reserve, checkpoint_bytes, free_and_total
from .put_runs import run_span
from .store_purges import delete_slice, finish_all, has_marks, purged_seqs
from .store_schema import (
    ADDED_COLUMNS,
    ADDED_DEAD_COLUMNS,
    SCHEMA,
    StoredDeadLetter,
    StoredHold,
    StoredKey,
    StoredMessage,
    keys_into_batches,
    read_keys,
    read_put_runs,
    with_run_content,
    write,
)
from .turn_log import TurnLog, fold_stored, has_logged_turns

log = logging.getLogger("phpmq.broker")

DB_NAME = "phpmq.sqlite3"
#: A store that could not be opened for writing (a full disk) tries again this often.
REOPEN_S = 1.0
#: Free pages kept for reuse; above this the loop gives them back to the file system...
RECLAIM_FREE_PAGES = 256
#: ...at most this many per turn: a slice of about a millisecond (~7.5 us a page, measured).
RECLAIM_SLICE_PAGES = 128
#: Under this much room above the floor, a commit that lengthens the file is checkpointed at
#: once (_grown_while_short).
SHORT_OF_ROOM_BYTES = 32 << 20


class StorageError(Exception):
    """The store could not write (disk full, I/O error): nothing of the turn was committed."""


class DurableStore:
    def __init__(
        self,
        data_dir: str | Path,
        synchronous: str = "FULL",
        fold_on_read: bool = True,
    ) -> None:
        """`synchronous`: SQLite's setting; OFF only where another log (a replica's Raft
        log, broker/shell/replication.py) is what a confirm waits for. `fold_on_read`: the readers
        fold the log into the tables first; without it (a replica's store, which another
        thread writes) they read a copy with it folded."""
        self.directory = Path(data_dir)
        self._synchronous = synchronous
        self._fold_on_read = fold_on_read
        #: A busy pipe's turns, logged and not yet folded into the tables (turn_log.py).
        self._log = TurnLog()
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
        #: Whether the volume is short of room above its floor (room_above_floor), and the
        #: file's pages at the last commit then.
        self.short_of_room = False
        self._pages = 0
        self.longest_hand_off_ms = 0.0
        #: Pages given back to the file system, the slices that did it and the last's cost.
        self.pages_reclaimed = 0
        self.reclaims = 0
        self.last_reclaim_ms = 0.0
        #: Purge markers (store_purges.py) wait: a slice of their rows goes per commit, and
        #: idle turns call reclaim() for it.
        self.purging = self._db is not None and has_marks(self._db)
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
        if has_logged_turns(self._immutable) or has_marks(self._immutable):
            self.read_with([])  # turns a crash left in the log, folded in a copy
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
        self.purging = has_marks(self._db)  # type: ignore[arg-type]
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
            # FULL: the WAL is fsynced at every commit, so a commit is on disk when it returns
            # (a replica's store is OFF: its Raft log is what is synced, replication.py).
            db.execute(f"PRAGMA synchronous={self._synchronous}")
            # The loop never checkpoints (a checkpoint inside a COMMIT stalls the turn): the
            # checkpoint thread does. The WAL file shrinks back to this size when it restarts:
            # one that starts over then overwrites blocks it already has, and the loop's
            # fsyncs need not record a growing file. Idle, the WAL is emptied anyway.
            db.execute("PRAGMA wal_autocheckpoint=0")
            db.execute(f"PRAGMA journal_size_limit={self.wal_limit_bytes}")
            self._up_to_date(db)
            self._fold_stored_turns(db)
            self._incremental_vacuum_on(db)
            self.free_pages = db.execute("PRAGMA freelist_count").fetchone()[0]
        except sqlite3.Error:
            db.close()
            self._db = None
            raise

    def _up_to_date(self, db: sqlite3.Connection) -> None:
        """A store written by an older broker (opened, or restored from a replica's
        snapshot) gets what this one's has: the tables, columns and index added since, IDs
        as blobs, keys in batches. The columns first: SCHEMA indexes some of them."""
        self._add_columns(db)
        db.executescript(SCHEMA)
        self._ids_as_blobs(db)
        self._add_columns(db)
        db.execute("BEGIN")
        keys_into_batches(db)
        db.execute("COMMIT")
        # Only leased rows are in it: a lease's commit finds them without a queue scan.
        db.execute(
            "CREATE INDEX IF NOT EXISTS messages_by_lease ON messages (queue, lease)"
            " WHERE lease IS NOT NULL"
        )

    def _fold_stored_turns(self, db: sqlite3.Connection) -> None:
        """The turns a crash left in the log, folded into the tables. Where that cannot be
        written (a full disk), the store opens anyway: the readers read a copy with them
        folded, and the log folds them once it can write (it drains them first)."""
        try:
            db.execute("BEGIN")
            folded = fold_stored(db)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._roll_back(db)
            log.warning("cannot fold the turn log into the tables yet (%s): reading a copy", exc)
            return
        if folded:
            log.info("folded %d turns the turn log held into the tables", folded)

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
        """Whether free pages wait to be given back, or logged turns to be folded (the
        server then polls briefly and calls reclaim() in turns that write nothing)."""
        return (
            self.free_pages > RECLAIM_FREE_PAGES
            or self._log.pending
            or (self.purging and self._db is not None)
        )

    def _add_columns(self, db: sqlite3.Connection) -> None:
        """A store written before events, requests or delayed sends lacks their columns: add
        them (empty: a plain send)."""
        for table, added in (("messages", ADDED_COLUMNS), ("dead_letters", ADDED_DEAD_COLUMNS)):
            columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            if not columns:  # a new store: SCHEMA makes the table whole
                continue
            for name, declaration in added:
                if name not in columns:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")

    def _ids_as_blobs(self, db: sqlite3.Connection) -> None:
        """Message IDs are bytes in the broker and BLOBs here; a store written when they were
        str holds TEXT, which would never equal a BLOB: convert it once, at open."""
        with db:
            for table in ("messages", "dead_letters"):
                db.execute(f"UPDATE {table} SET id = CAST(id AS BLOB) WHERE typeof(id) = 'text'")

    # ------------------------------------------------------------------ reading

    def load(self) -> tuple[list[StoredMessage], list[StoredDeadLetter]]:
        """Every message in queue order, and every dead letter oldest first."""
        self._settle_reader()
        messages: list[StoredMessage] = []
        stubs: list[tuple[StoredMessage, int]] = []
        # (a store opened read-only may be older than stubs: none then)
        in_run = "in_run" if _has_column(self._reader, "messages", "in_run") else "NULL"
        for *row, at in self._reader.execute(
            "SELECT id, queue, seq, content, headers, expires_wall, deliveries, in_flight,"
            f" event, reply_to, correlation, visible_wall, message_key, lease, {in_run}"
            " FROM messages ORDER BY queue, seq"
        ):
            if at is None:
                messages.append(StoredMessage(*row))
            else:
                stubs.append((StoredMessage(*row), at))
        # Messages of put runs (put_runs.py): stubbed ones take their content from the run;
        # the others are as the run's bits say, in among the rest.
        in_runs = with_run_content(self._reader, stubs) + read_put_runs(self._reader)
        if in_runs:
            messages += in_runs
            messages.sort(key=_queue_order)
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
        self._settle_reader()
        reader = self._reader
        bindings = list(reader.execute("SELECT queue, pattern FROM bindings ORDER BY rowid"))
        unused = list(reader.execute("SELECT queue, unused_ms FROM queue_settings"))
        return bindings, unused

    def load_schedules(self) -> list[tuple[str, bytes, float | None, int]]:
        """Every schedule: (name, spec JSON, last run wall time or None, runs)."""
        self._settle_reader()
        return list(self._reader.execute("SELECT name, spec, last_run, runs FROM schedules"))

    def load_keys(self) -> list[StoredKey]:
        """Every idempotency key on disk (some may have expired while the broker was down)."""
        self._settle_reader()
        return read_keys(self._reader)

    def load_purged_seqs(self) -> tuple[int, int] | None:
        """The lowest and highest position any purge or delete covered, or a put run spans:
        new positions are handed out outside them (store_purges.py; put_runs.py: an ack
        finds a run's message by its position, which must then be its alone)."""
        self._settle_reader()
        reader = self._reader
        if not reader.execute("SELECT 1 FROM sqlite_master WHERE name = 'purged_seqs'").fetchone():
            return None  # an older store read as it is (read-only)
        spans = [span for span in (purged_seqs(reader), run_span(reader)) if span is not None]
        if not spans:
            return None
        return min(lo for lo, _ in spans), max(hi for _, hi in spans)

    def load_holds(self) -> list[StoredHold]:
        """Every key hold (a store written before holds has the table, empty: SCHEMA)."""
        self._settle_reader()
        return [
            StoredHold(*row)
            for row in self._reader.execute(
                "SELECT scope, owner, committed, created_wall FROM key_holds"
            )
        ]

    # ------------------------------------------------------------------ writing

    def commit(self, operations: Sequence[tuple], copy_first: bool = False) -> None:
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
            self._log.write_turn(db, operations, time.monotonic())
            purging = delete_slice(db)
            free_pages = self._reclaim_slice(db)
            db.execute("COMMIT")
            if self.short_of_room:
                self._grown_while_short(db)
        except sqlite3.Error as exc:
            self._roll_back(db)
            raise StorageError(str(exc)) from None
        self.purging = purging
        self.free_pages = free_pages
        self.commits += 1
        self.last_commit_ms = (time.perf_counter() - started) * 1000
        self.longest_commit_ms = max(self.longest_commit_ms, self.last_commit_ms)

    def backup_into(self, target: sqlite3.Connection) -> None:
        """Copy the whole store into `target` (a replica's snapshot)."""
        if not self.try_open():
            raise StorageError(f"the store is read-only until it can be opened: {self.unopened}")
        assert self._db is not None
        self._fold_every_turn(finish_purges=False)  # the replica taking it in finishes them
        self._db.backup(target)

    def restore_from(self, source: sqlite3.Connection) -> None:
        """Replace the whole store with `source` (a replica's snapshot), brought up to date
        (it may come from an older broker) with its logged turns folded.

        Raises:
            StorageError: the snapshot could not be taken in (the store is as it was, or
                holds it without its log folded: the next commit folds it).
        """
        if not self.try_open():
            raise StorageError(f"the store is read-only until it can be opened: {self.unopened}")
        db = self._db
        assert db is not None
        # What the log remembered is gone with the tables it was for; the volume is the same.
        room, self._log = self._log.room, TurnLog()
        self._log.room = room
        try:
            source.backup(db)
            self._up_to_date(db)
            db.execute("BEGIN")
            fold_stored(db)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._roll_back(db)
            raise StorageError(f"cannot take in the snapshot: {exc}") from None

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
            self._up_to_date(copy)  # (a store opened read-only may be an older broker's)
            copy.execute("BEGIN")
            fold_stored(copy)
            write(copy, operations)
            if has_marks(copy):
                finish_all(copy)
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
            self._log.fold(db, time.monotonic())
            purging = delete_slice(db)
            free_pages = self._reclaim_slice(db)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._roll_back(db)
            raise StorageError(str(exc)) from None
        self.purging = purging
        self.free_pages = free_pages

    def room_above_floor(self, room: int) -> None:
        """The volume's free bytes above the floor sends are refused under (StoreKeeper):
        the turn log is used only with room to spare."""
        self._log.room_above_floor(room)
        short = room < SHORT_OF_ROOM_BYTES
        if short and not self.short_of_room and self._db is not None:
            with contextlib.suppress(sqlite3.Error):  # the length it has now: no checkpoint
                self._pages = self._db.execute("PRAGMA page_count").fetchone()[0]
        self.short_of_room = short

    def _grown_while_short(self, db: sqlite3.Connection) -> None:
        """A commit that made the file longer (stubs of put runs, for one: put_runs.py) has
        the next one copy the WAL first, while the volume still has the room: a checkpoint
        that must lengthen the file fails once the WAL has taken the rest, and then the WAL
        can never start over."""
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        if pages > self._pages:
            self.hand_off = True
        self._pages = pages

    def _settle_reader(self) -> None:
        """Before the tables are read: every logged turn folded into them; where that
        cannot be written (a full disk), the readers read a copy with them folded, until
        read_done()."""
        if self._copy is not None:
            return  # a copy is read: it was folded when it was made
        if not self._log.pending and not self.purging:
            return
        if self._fold_on_read:
            try:
                self._fold_every_turn()
                return
            except StorageError:
                pass  # a full disk: read a copy
        self.read_with([])

    def _fold_every_turn(self, finish_purges: bool = True) -> None:
        """Before the tables are read or copied: every logged turn folded into them, and
        (`finish_purges`) every purge marker finished, in a transaction of its own.

        Raises:
            StorageError: nothing was folded (the turns stay logged, and are read from there
                at the next start).
        """
        db, turn_log = self._db, self._log
        if db is None or not (turn_log.pending or (finish_purges and self.purging)):
            return  # read-only: the reader is a copy, folded (_read_only)
        # (Finished after the fold whatever `purging` says: a logged turn may mark one.)
        try:
            db.execute("BEGIN")
            turn_log.fold(db, time.monotonic(), every=True)
            if finish_purges:
                finish_all(db)
            db.execute("COMMIT")
            if finish_purges:
                self.purging = False
        except sqlite3.Error as exc:
            self._roll_back(db)
            raise StorageError(f"cannot fold the turn log into the tables: {exc}") from None

    def _roll_back(self, db: sqlite3.Connection) -> None:
        """After a failed write: nothing of the transaction stays, so neither does what the
        turn log remembered of it (it reads its table again before its next write)."""
        with contextlib.suppress(sqlite3.Error):  # a failed rollback leaves it to SQLite
            if db.in_transaction:
                db.execute("ROLLBACK")
        self._log.stale = True

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
            "purges_waiting": self.purging,
            **self._log.stats(),
        }

    def close(self) -> None:
        with contextlib.suppress(StorageError):  # left in the log: the next start folds it
            self._fold_every_turn(finish_purges=False)  # (and the next open finishes these)
        self.read_done()
        self._checkpointer.stop()
        for db in (self._db, self._immutable):
            if db is not None:
                db.close()
        if self._lock is not None:
            self._lock.release()


def _queue_order(message: StoredMessage) -> tuple[str, int]:
    return message.queue, message.seq


def _has_column(db: sqlite3.Connection, table: str, column: str) -> bool:
    return any(row[1] == column for row in db.execute(f"PRAGMA table_info({table})"))
