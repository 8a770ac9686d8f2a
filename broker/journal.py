"""The journal: every change of a message's fate, as typed operations for the durable store.

The core writes to a journal through the methods below and never asks which kind it has: in
durable mode a `Journal` collects the operations of a loop turn, which the server hands to
the store in one transaction (broker/durable.py); in memory mode a `NullJournal` drops them.

A message's place in its queue is its `seq` (the tail grows upwards, returns to the head take
numbers below the smallest), so reading by `seq` rebuilds every queue in order. TTLs are kept
as wall-clock deadlines, since monotonic time does not survive a restart.

Dispatch costs one operation per queue and pass, not one per message: a pass hands out a
prefix of the queue's ready deque, which is in `seq` order, so "the ready messages of this
queue from seq A to seq B are in flight" says it all. A delayed message is not ready on disk
(its in-flight mark is 2, "delivery counted"), so no range takes it by mistake.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .idempotency import split_entry
from .model import DeadLetterEntry, Record

# Operation kinds: each operation is a tuple whose first item is its kind.
PUT = "put"  # id, queue, seq, content, headers, expires_wall, deliveries, event, reply_to,
#              correlation, visible_wall (0: visible at once; else a delayed send), message key
FLY = "fly"  # queue, first seq, last seq: the ready messages in that range were dispatched
BACK = "back"  # id, seq, expires_wall, deliveries, queue, seq before: ready again (returned,
# requeued; written before 2026-11 without the queue and the seq it had before)
DELAY = "delay"  # id, seq, expires_wall, deliveries, queue, seq before: requeued with a delay
# (already counted; the same older form)
DROP = "drop"  # id, queue, seq: acked (written before 2026-11: the id alone)
DEAD = "dead"  # queue, id, content, reason, deliveries, dead_at, headers, message key
UNDEAD = "undead"  # queue, id: out of the dead-letter store (replayed, or evicted by its bound)
PURGE = "purge"  # queue: dead letters deleted
CLEAR = "clear"  # queue, lo, hi: its ready messages placed in [lo, hi] deleted (purged)
#: Recovery, before it puts back what was in flight: every purge the store still works
#: through is finished (broker/shell/store_purges.py; a BACK at a row's own position may be
#: inside one).
SETTLE = "settle"
DELETE_QUEUE = "delete-queue"  # queue, lo, hi: its messages (placed in [lo, hi]), dead letters
#                                bindings and settings deleted (older stores: queue alone)
KEY = "key"  # queue, key, id, expires_wall: an idempotency key accepted (inf: held)
LET_GO = "let-go"  # queue, key, id, expires_wall: a held key let go, kept for its window
HELD_GONE = "held-gone"  # queue, writer batch: every held key of it was let go (key_holds.py)
UNKEY = "unkey"  # wall: keys whose window ended by then are deleted
BIND = "bind"  # queue, pattern: the queue is bound to the pattern
UNBIND = "unbind"  # queue, pattern: no longer
UNUSED = "unused"  # queue, ms: the queue is deleted after that long without consumers
SCHEDULE = "schedule"  # name, spec (JSON bytes): a schedule added or replaced
UNSCHEDULE = "unschedule"  # name: removed
RAN = "ran"  # name, last_run_wall, runs: a schedule ran
LEASE_TAKEN = "lease"  # lease name, queue, first seq, last seq: those ready ones were leased
LEASE_DONE = "unlease"  # queue, lease name: the lease was committed (its messages acked)
HOLD = "hold"  # scope, owner, committed batch, created_wall: a key hold made or committed
UNHOLD = "unhold"  # scope: the key hold was released (its keys journaled with a window)

Operation = tuple

#: Converts a monotonic ns deadline to wall-clock seconds (the core's clock, at this turn).
WallAt = Callable[[int], float]


def _no_wall(_: int) -> float:
    raise RuntimeError("journal used before the core bound its clock")


class Journal:
    """Durable mode: the operations of the current turn, in order."""

    durable = True

    def __init__(self) -> None:
        self._operations: list[Operation] = []
        self._wall_at: WallAt = _no_wall
        #: The expiry of the last key journaled, and it as wall-clock time.
        self._key_expires_at = -1
        self._key_expires_wall = 0.0

    def bind_clock(self, wall_at: WallAt) -> None:
        self._wall_at = wall_at

    def __len__(self) -> int:
        return len(self._operations)

    def __iter__(self):
        return iter(self._operations)

    def take(self) -> list[Operation]:
        """The operations written since the last take, oldest first."""
        operations, self._operations = self._operations, []
        return operations

    def _expires_wall(self, record: Record) -> float:
        return self._wall_at(record.expires_at) if record.expires_at else 0.0

    def put(
        self,
        queue_name: str,
        record: Record,
        message_id: bytes,
        content: bytes,
        visible_at: int = 0,
    ) -> None:
        """A new message: its ID and content are passed as the caller has them (the record
        keeps them in one bytes object); `visible_at` (monotonic ns) for a delayed send."""
        self._operations.append(
            (
                PUT,
                message_id,
                queue_name,
                record.seq,  # type: ignore[attr-defined]
                content,
                record.headers,
                self._expires_wall(record),
                record.deliveries,
                record.event,
                record.reply_to,
                record.correlation,
                self._wall_at(visible_at) if visible_at else 0.0,
                record.message_key,
            )
        )

    def dispatched(self, queue_name: str, first_seq: int, last_seq: int) -> None:
        """The queue's ready messages with `seq` from first to last went out in one pass."""
        self._operations.append((FLY, queue_name, first_seq, last_seq))

    def back(self, record: Record, queue_name: str, was_seq: int) -> None:
        """Ready again at its `seq` (returned or requeued), from `was_seq`: where a put run
        keeps it (shell/put_runs.py)."""
        seq = record.seq  # type: ignore[attr-defined]  # a durable journal's records have one
        self._operations.append(
            (BACK, record.id, seq, self._expires_wall(record), record.deliveries, queue_name,
             was_seq)
        )  # fmt: skip

    def delayed(self, record: Record, queue_name: str, was_seq: int) -> None:
        """Requeued with a delay, its delivery counted: at the tail on disk, so after a
        restart it is ready at once (the delay is not kept) with the count it has now; from
        `was_seq`, as for back()."""
        seq = record.seq  # type: ignore[attr-defined]
        self._operations.append(
            (DELAY, record.id, seq, self._expires_wall(record), record.deliveries, queue_name,
             was_seq)
        )  # fmt: skip

    def acked(self, queue_name: str, message_id: bytes, record: Record) -> None:
        """Acked: by its ID, and by its place, which is where a put run keeps it
        (shell/put_runs.py)."""
        seq = record.seq  # type: ignore[attr-defined]
        self._operations.append((DROP, message_id, queue_name, seq))

    def leased(self, queue_name: str, lease_name: str, first_seq: int, last_seq: int) -> None:
        """The queue's ready messages from seq first to last went into a batch lease."""
        self._operations.append((LEASE_TAKEN, lease_name, queue_name, first_seq, last_seq))

    def lease_committed(self, queue_name: str, lease_name: str) -> None:
        self._operations.append((LEASE_DONE, queue_name, lease_name))

    def dead(self, queue_name: str, entry: DeadLetterEntry) -> None:
        self._operations.append(
            (
                DEAD,
                queue_name,
                entry.id,
                entry.content,
                entry.reason,
                entry.deliveries,
                entry.dead_at,
                entry.headers,
                entry.message_key,
            )
        )

    def undead(self, queue_name: str, message_id: bytes) -> None:
        self._operations.append((UNDEAD, queue_name, message_id))

    def purged(self, queue_name: str) -> None:
        self._operations.append((PURGE, queue_name))

    def ready_purged(self, queue_name: str, lo_seq: int, hi_seq: int) -> None:
        """The queue's ready messages purged: every one has its position in [lo, hi]."""
        self._operations.append((CLEAR, queue_name, lo_seq, hi_seq))

    def queue_deleted(self, queue_name: str, lo_seq: int, hi_seq: int) -> None:
        """The queue deleted: every message of it has its position in [lo, hi]."""
        self._operations.append((DELETE_QUEUE, queue_name, lo_seq, hi_seq))

    def purges_settled(self) -> None:
        self._operations.append((SETTLE,))

    def key(self, joined: str, message_id: bytes, expires_at: int) -> None:
        """The key `joined` (an `idempotency.entry`: queue and key) until `expires_at`."""
        if expires_at != self._key_expires_at:  # the keys of a turn share their expiry
            self._key_expires_at, self._key_expires_wall = expires_at, self._wall_at(expires_at)
        queue_name, key = split_entry(joined)
        self._operations.append((KEY, queue_name, key, message_id, self._key_expires_wall))

    def held_key(self, joined: str, message_id: bytes) -> None:
        """A key kept by a key hold: no expiry until its hold lets it go."""
        queue_name, key = split_entry(joined)
        self._operations.append((KEY, queue_name, key, message_id, math.inf))

    def let_go(self, joined: str, message_id: bytes, expires_at: int) -> None:
        """A held key let go by its hold: kept until `expires_at`, like a new key."""
        if expires_at != self._key_expires_at:  # a commit's keys share their expiry
            self._key_expires_at, self._key_expires_wall = expires_at, self._wall_at(expires_at)
        queue_name, key = split_entry(joined)
        self._operations.append((LET_GO, queue_name, key, message_id, self._key_expires_wall))

    def held_gone(self, queue_name: str, writer_batch: str) -> None:
        """Every held key of `writer_batch` (key_holds.held_batch) at `queue_name` was let
        go: what held them on disk is deleted."""
        self._operations.append((HELD_GONE, queue_name, writer_batch))

    def keys_expired(self, wall: float = math.inf) -> None:
        """Keys whose window ended by `wall` are deleted (inf: every key)."""
        self._operations.append((UNKEY, wall))

    def hold(self, scope: str, owner: str, committed: int, created_wall: float) -> None:
        self._operations.append((HOLD, scope, owner, committed, created_wall))

    def unhold(self, scope: str) -> None:
        self._operations.append((UNHOLD, scope))

    def bound(self, queue_name: str, pattern: str) -> None:
        self._operations.append((BIND, queue_name, pattern))

    def unbound(self, queue_name: str, pattern: str) -> None:
        self._operations.append((UNBIND, queue_name, pattern))

    def unused(self, queue_name: str, unused_ms: int) -> None:
        self._operations.append((UNUSED, queue_name, unused_ms))

    def scheduled(self, name: str, spec: bytes) -> None:
        self._operations.append((SCHEDULE, name, spec))

    def unscheduled(self, name: str) -> None:
        self._operations.append((UNSCHEDULE, name))

    def ran(self, name: str, last_run_wall: float, runs: int) -> None:
        self._operations.append((RAN, name, last_run_wall, runs))


class NullJournal:
    """Memory mode: nothing is kept, every method costs one call."""

    durable = False

    def bind_clock(self, wall_at: WallAt) -> None:
        pass

    def __len__(self) -> int:
        return 0

    def __iter__(self):
        return iter(())

    def take(self) -> list[Operation]:
        return []

    def put(
        self,
        queue_name: str,
        record: Record,
        message_id: bytes,
        content: bytes,
        visible_at: int = 0,
    ) -> None:
        pass

    def dispatched(self, queue_name: str, first_seq: int, last_seq: int) -> None:
        pass

    def back(self, record: Record, queue_name: str, was_seq: int) -> None:
        pass

    def delayed(self, record: Record, queue_name: str, was_seq: int) -> None:
        pass

    def acked(self, queue_name: str, message_id: bytes, record: Record) -> None:
        pass

    def leased(self, queue_name: str, lease_name: str, first_seq: int, last_seq: int) -> None:
        pass

    def lease_committed(self, queue_name: str, lease_name: str) -> None:
        pass

    def dead(self, queue_name: str, entry: DeadLetterEntry) -> None:
        pass

    def undead(self, queue_name: str, message_id: bytes) -> None:
        pass

    def purged(self, queue_name: str) -> None:
        pass

    def ready_purged(self, queue_name: str, lo_seq: int, hi_seq: int) -> None:
        pass

    def queue_deleted(self, queue_name: str, lo_seq: int, hi_seq: int) -> None:
        pass

    def purges_settled(self) -> None:
        pass

    def key(self, joined: str, message_id: bytes, expires_at: int) -> None:
        pass

    def held_key(self, joined: str, message_id: bytes) -> None:
        pass

    def let_go(self, joined: str, message_id: bytes, expires_at: int) -> None:
        pass

    def held_gone(self, queue_name: str, writer_batch: str) -> None:
        pass

    def keys_expired(self, wall: float = math.inf) -> None:
        pass

    def hold(self, scope: str, owner: str, committed: int, created_wall: float) -> None:
        pass

    def unhold(self, scope: str) -> None:
        pass

    def bound(self, queue_name: str, pattern: str) -> None:
        pass

    def unbound(self, queue_name: str, pattern: str) -> None:
        pass

    def unused(self, queue_name: str, unused_ms: int) -> None:
        pass

    def scheduled(self, name: str, spec: bytes) -> None:
        pass

    def unscheduled(self, name: str) -> None:
        pass

    def ran(self, name: str, last_run_wall: float, runs: int) -> None:
        pass
