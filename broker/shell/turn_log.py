"""The turn log: a busy pipe's turns appended to the store as one row each, and folded into
the tables a little later, by when most of what they put has been acked and is never
written at all (docs/durability.md, "The turn log").

A message in the tables costs a row: an insert, the in-flight update and a delete, about
6 µs of SQLite a message (issue #32). A logged turn costs one
encoded row, committed and fsynced in the turn's transaction as before, so a confirm still
means "on disk". The turn's operations stay in memory too, and a later commit folds the
oldest turns into the tables in its own transaction: a PUT whose message a later DROP or
DEAD of the log removes is left out, and so is that DROP. What the tables plus the log say
is always what the tables alone would say had every turn been written to them: a start after
a crash folds whatever the log holds before it reads (`fold_stored`).

Logging pays only where acks follow puts closely; a queue that fills (a producer, a Spark
sink) would write every message twice. So the store logs while the acks it sees keep up
with the puts, and writes turns straight to the tables again as soon as folds find little
to leave out.

Leaving a PUT out relies on one rule the core keeps: a PUT names a message ID no row holds
(a new message's ID; a replayed dead letter's row went when it died).
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Sequence
from operator import itemgetter

import msgspec

from ..journal import DEAD, DROP, PUT
from .store_purges import finish_all, has_marks
from .store_schema import write

#: Logged turns are folded once this old (seconds): the time acks have to arrive...
FOLD_AFTER_S = 0.25
#: ...or sooner, once the log holds this many operations or encoded bytes (its memory,
#: what a start after a crash replays, and what a fold may write a second time)...
MAX_LOGGED_OPERATIONS = 32_768
MAX_LOGGED_BYTES = 8 << 20
#: ...and only while the volume has this many times that much room above its floor (a fold
#: writes what it keeps again; on a nearly full volume every byte goes straight in).
ROOM_FACTOR = 4
#: Recent counts decay by this factor a turn (about the last 20 turns weigh).
DECAY = 0.95
#: Logging starts when the recent acks are at least this share of the recent puts...
START_KILL_SHARE = 0.5
#: ...and there are at least this many recent puts (a trickle is not worth switching for).
START_MIN_PUTS = 32.0
#: Logging stops when folds leave out less than this share of the puts they fold...
STOP_SKIP_SHARE = 0.25
#: ...judged again after every this many folded puts;
JUDGED_EVERY_PUTS = 256
#: and it is not tried again for this long (seconds), twice as long after each stop in a row
#: that found it did not pay, up to the longest.
RETRY_AFTER_S = 5.0
LONGEST_RETRY_AFTER_S = 300.0
#: Once logging stopped, the log still holds turns: each commit logs its own turn too, and
#: folds at most this many operations beyond those due, until the log is empty (one fold of
#: the whole log would stall a turn for up to a couple of hundred milliseconds).
DRAIN_OPERATIONS = 1024

#: The operations that remove a message, and where their message ID is.
_KILLS = {DROP: 1, DEAD: 2}

_KIND = itemgetter(0)
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[list]).decode


class TurnLog:
    """The turns logged and not yet folded, and whether the next turn is logged."""

    def __init__(self) -> None:
        #: (row, logged at, operations, encoded bytes), oldest first: the rows of `turn_log`.
        self._turns: deque[tuple[int, float, Sequence[tuple], int]] = deque()
        self.logged_operations = 0
        self.logged_bytes = 0
        #: Whether the volume has room for the log (room_above_floor: StoreKeeper.watch, or
        #: a replica's floor check).
        self.room = True
        #: Message ID -> DROPs and DEADs of it in logged turns not yet folded.
        self._kills: dict[bytes, int] = {}
        #: IDs whose PUT a fold left out and whose DROP is still logged.
        self._left_out: set[bytes] = set()
        self._next_row = 1
        self.logging = False
        self._retry_at = 0.0
        self._retry_after = RETRY_AFTER_S
        self._recent_puts = 0.0
        self._recent_kills = 0.0
        #: The folded puts since the last judgement, and how many of them were left out;
        #: whether logging paid at the last one.
        self._window_puts = 0
        self._window_left_out = 0
        self._pays = True
        # Counters (the store's stats).
        self.turns_logged = 0
        self.folds = 0
        self.puts_never_written = 0
        self.switches = 0
        #: Folds made early by MAX_LOGGED_OPERATIONS or MAX_LOGGED_BYTES.
        self.early_folds = 0
        #: A transaction this log wrote in was rolled back: what it remembers may not be
        #: what its table holds, so it reads the table again first (`_reload`).
        self.stale = False

    @property
    def pending(self) -> bool:
        """Whether the log's table may hold turns."""
        return bool(self._turns) or self.stale

    def room_above_floor(self, room: int) -> None:
        """The volume's free bytes above its floor (sends are refused under it)."""
        self.room = room >= ROOM_FACTOR * MAX_LOGGED_BYTES

    def write_turn(self, db: sqlite3.Connection, operations: Sequence[tuple], now: float) -> None:
        """Inside the open transaction of `db`: the turn's operations, logged or written
        to the tables, and the logged turns that are due folded."""
        if self.stale:
            self._reload(db, now)
        if not self.logging:
            self._watch(operations, now)
        elif not self.room or not self._pays:
            self.logging = False
            self._retry_at = now + self._retry_after
            if not self._pays:  # acks come too late: try again less and less often
                self._retry_after = min(2 * self._retry_after, LONGEST_RETRY_AFTER_S)
            self.switches += 1
        if self.logging or self._turns:  # the log's turns are older: they go first
            if operations:
                self._append(db, operations, now)
            self.fold(db, now, beyond_due=0 if self.logging else DRAIN_OPERATIONS)
            return
        write(db, operations)

    def _watch(self, operations: Sequence[tuple], now: float) -> None:
        """Writing to the tables: start logging once the acks keep up with the puts."""
        kinds = list(map(_KIND, operations))
        puts = kinds.count(PUT)
        self._recent_puts = self._recent_puts * DECAY + puts
        self._recent_kills = self._recent_kills * DECAY + kinds.count(DROP) + kinds.count(DEAD)
        if (
            puts  # not a drain: a turn that only acks has nothing to leave out
            and self.room
            and now >= self._retry_at
            and self._recent_puts >= START_MIN_PUTS
            and self._recent_kills >= START_KILL_SHARE * self._recent_puts
        ):
            self.logging = True
            self._window_puts = self._window_left_out = 0
            self._pays = True
            self.switches += 1

    def _append(self, db: sqlite3.Connection, operations: Sequence[tuple], now: float) -> None:
        row = self._next_row
        blob = _encode(operations)
        db.execute("INSERT INTO turn_log VALUES (?, ?)", (row, blob))
        self._next_row = row + 1
        self.remember(row, now, operations, len(blob))
        self.turns_logged += 1

    def remember(self, row: int, now: float, operations: Sequence[tuple], size: int) -> None:
        """A turn that is in the log's table (written now, or found there at a start)."""
        kills = self._kills
        for operation in operations:
            at = _KILLS.get(operation[0])
            if at is None:
                continue
            message_id = operation[at]
            kills[message_id] = kills.get(message_id, 0) + 1
        self._turns.append((row, now, operations, size))
        self.logged_operations += len(operations)
        self.logged_bytes += size
        self._next_row = max(self._next_row, row + 1)

    def fold(
        self, db: sqlite3.Connection, now: float, every: bool = False, beyond_due: int = 0
    ) -> None:
        """Inside the open transaction of `db`: write the logged turns that are due (all
        with `every`; and about `beyond_due` operations more) to the tables, oldest first,
        and delete their rows of the log. Each turn is written on its own, as it would have
        been: a turn's keys share a batch that a later turn's keys must not join
        (store_schema._write_keys)."""
        if self.stale:
            self._reload(db, now)
        turns = self._turns
        last_row = 0
        early = False
        while turns:
            if not every and now - turns[0][1] < FOLD_AFTER_S:
                if (
                    self.logged_operations > MAX_LOGGED_OPERATIONS
                    or self.logged_bytes > MAX_LOGGED_BYTES
                ):
                    early = True
                elif beyond_due > 0:
                    beyond_due -= len(turns[0][2])
                else:
                    break
            last_row, _, operations, size = turns.popleft()
            self.logged_operations -= len(operations)
            self.logged_bytes -= size
            write(db, *self._left(operations))
        if last_row:
            db.execute("DELETE FROM turn_log WHERE turn <= ?", (last_row,))
            self.folds += 1
            self.early_folds += early

    def _reload(self, db: sqlite3.Connection, now: float) -> None:
        """Remember exactly the turns the table holds, and stop logging: they drain, and
        later turns go straight to the tables (a rolled-back transaction: a disk that is
        full or failing)."""
        self._turns.clear()
        self._kills.clear()
        self._left_out.clear()  # their DROPs are applied: deleting no row is harmless
        self.logged_operations = self.logged_bytes = 0
        for row, blob in db.execute("SELECT turn, operations FROM turn_log ORDER BY turn"):
            self.remember(row, 0.0, _decoded(blob), len(blob))
        self.stale = False
        self._retry_at = now + RETRY_AFTER_S
        if self.logging:
            self.logging = False
            self.switches += 1

    def _left(self, operations: Sequence[tuple]) -> tuple[list[tuple], set[bytes]]:
        """The operations of a logged turn that change the tables, in their order: without
        the PUTs of messages a later logged DROP or DEAD removes, nor those DROPs; and the
        IDs of the messages its DEADs bury that were never written (store_schema.write)."""
        kills, left_out = self._kills, self._left_out
        kept: list[tuple] = []
        absent: set[bytes] = set()
        puts = never = 0
        for operation in operations:
            kind = operation[0]
            if kind == PUT:
                message_id = operation[1]
                if message_id in kills:  # removed later: never written
                    left_out.add(message_id)
                    never += 1
                    continue
                puts += 1
            elif kind in _KILLS:
                message_id = operation[_KILLS[kind]]
                count = kills.pop(message_id)
                if count > 1:
                    kills[message_id] = count - 1
                if message_id in left_out:
                    left_out.discard(message_id)
                    if kind == DROP:
                        continue  # its row was never written
                    absent.add(message_id)
            kept.append(operation)
        self.puts_never_written += never
        self._window_puts += puts + never
        self._window_left_out += never
        if self._window_puts >= JUDGED_EVERY_PUTS:
            self._pays = self._window_left_out >= STOP_SKIP_SHARE * self._window_puts
            self._window_puts = self._window_left_out = 0
            if self._pays:
                self._retry_after = RETRY_AFTER_S
        return kept, absent

    def stats(self) -> dict[str, int | bool]:
        return {
            "turn_log_on": self.logging,
            "turns_logged": self.turns_logged,
            "turn_log_operations": self.logged_operations,
            "turn_log_bytes": self.logged_bytes,
            "turn_log_early_folds": self.early_folds,
            "turn_log_folds": self.folds,
            "puts_never_written": self.puts_never_written,
            "turn_log_switches": self.switches,
        }


def fold_stored(db: sqlite3.Connection) -> int:
    """Inside the open transaction of `db`: fold every turn its log holds into its tables,
    then finish every purge they mark (a start after a crash, a copy being read: the tables
    are then exactly what they say, store_purges.py). Returns the turns folded."""
    rows: list[tuple[int, bytes]] = []
    if has_logged_turns(db):
        rows = db.execute("SELECT turn, operations FROM turn_log ORDER BY turn").fetchall()
        log = TurnLog()
        for row, blob in rows:
            log.remember(row, 0.0, _decoded(blob), len(blob))
        log.fold(db, 0.0, every=True)
    if has_marks(db):
        finish_all(db)
    return len(rows)


def has_logged_turns(db: sqlite3.Connection) -> bool:
    """Whether `db`'s log holds turns (a store from before the log has no table for it)."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'turn_log'").fetchone() is None:
        return False
    return db.execute("SELECT 1 FROM turn_log LIMIT 1").fetchone() is not None


def _decoded(blob: bytes) -> list[tuple]:
    return [tuple(operation) for operation in _decode(blob)]
