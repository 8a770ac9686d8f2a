"""The queue table: which queues exist, creating them within the broker's limits, and where a
record goes in a queue.

Rule: a queue's ready deque is in `seq` order. The tail takes numbers upwards, the head (a
message coming back) takes numbers below the smallest; the durable store keeps `seq`, so
reading it back in `seq` order rebuilds every queue as it was.
"""

from __future__ import annotations

from collections import deque

from ..protocol import ErrorCode, queue_name_problem
from .config import QueueSettings
from .context import Context
from .deadlines import PURGE_SLICE, TTL, UNUSED_QUEUE, NextTurn
from .model import NS_PER_MS, READY, Peer, Queue, Record
from .quotas import QUEUES

#: A purge (or delete) retires at most this many ready records in its own turn; a bigger
#: queue's are set aside and retired this many a turn after it (about 1.5 ms: 200,000 in
#: one turn stopped the loop for 55 ms). They are out of the queue at once.
PURGE_PER_TURN = 5_000


class Queues:
    __slots__ = (
        "_ctx",
        "_durable",
        "_head_seq",
        "_next_serial",
        "_purge_turn",
        "_set_aside",
        "_tail_seq",
        "by_name",
        "by_serial",
    )

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._durable = ctx.journal.durable
        self.by_name: dict[str, Queue] = {}
        #: The same queues by `Queue.serial` (a deleted queue's serial is never used again).
        self.by_serial: dict[int, Queue] = {}
        self._tail_seq = 0
        self._head_seq = 0
        self._next_serial = 0
        #: Ready records purges set aside, with their queue, oldest purge first.
        self._set_aside: deque[tuple[Queue, deque[Record]]] = deque()
        self._purge_turn = NextTurn(ctx.deadlines, PURGE_SLICE)

    def get(self, name: str) -> Queue | None:
        return self.by_name.get(name)

    def open(self, peer: Peer, name: str, tag: int | None = None) -> Queue | None:
        """The queue named `name`, created on first use; None (and the peer refused) if the
        name is invalid or the broker has its maximum of queues."""
        queue = self.by_name.get(name)
        if queue is not None:
            return queue
        ctx = self._ctx
        reason = queue_name_problem(name)
        if reason is not None:
            ctx.refuse(peer, ErrorCode.INVALID_VALUE, reason, tag=tag)
            return None
        problem = self.room_problem(peer.owner)
        if problem is not None:
            ctx.refuse(peer, ErrorCode.LIMIT_REACHED, problem, None, name, tag)
            return None
        return self.create(name, peer.owner)

    def room_problem(self, owner: str) -> str | None:
        """Why `owner` may not create a queue now (its quota, then the broker's limit)."""
        problem = self._ctx.quotas.problem(QUEUES, owner)
        if problem is not None:
            return f"{problem}: delete some first"
        max_queues = self._ctx.config.max_queues
        if len(self.by_name) >= max_queues:
            return f"the broker has the maximum of {max_queues} queues"
        return None

    def create(self, name: str, owner: str = "") -> Queue:
        """A new queue with its settings (a per-queue override, else the broker's), counted
        against `owner`'s quota."""
        config = self._ctx.config
        settings = config.queues.get(name) or QueueSettings()
        queue = self.by_name[name] = Queue(
            name,
            config.dead_letter_limit,
            _setting(settings.max_deliveries, config.max_deliveries),
            _setting(settings.max_length, config.max_queue_length),
            settings.overflow or config.overflow,
        )
        queue.serial = self._next_serial = self._next_serial + 1
        self.by_serial[queue.serial] = queue
        if owner:
            queue.creator = owner
            self._ctx.quotas.take(QUEUES, owner)
        return queue

    def mark_unused(self, queue: Queue) -> None:
        """A queue set to be deleted when unused lost its last window (or has none after a
        restart): it is deleted if none opens within its grace (lifecycle.py decides when the
        UNUSED_QUEUE deadline comes due)."""
        ctx = self._ctx
        queue.unused_due = ctx.now + (queue.unused_ms or 0) * NS_PER_MS
        ctx.deadlines.arm(queue.unused_due, UNUSED_QUEUE, queue)

    def purge(self, queue: Queue) -> int:
        """Delete the queue's ready messages (not those in flight or delayed); how many.
        Past PURGE_PER_TURN they are set aside and retired in the next turns."""
        ready = queue.ready
        if len(ready) <= PURGE_PER_TURN:
            purged = self._retire(ready, len(ready))
        else:
            purged = len(ready) - queue.stale
            self._set_aside.append((queue, ready))
            if queue.purging is None:
                queue.purging = []
            queue.ready = deque()
            self._arm_purge()
        queue.stale = 0
        self._ctx.journal.ready_purged(queue.name, self._head_seq, self._tail_seq)
        return purged

    def _retire(self, records: deque[Record], count: int) -> int:
        """Retire up to `count` of `records` from the left (its TTL timer, if armed, then
        finds nothing to do); how many were ready."""
        retire, popleft = self._ctx.retire, records.popleft
        purged = 0
        for _ in range(min(count, len(records))):
            record = popleft()
            if record.state == READY:
                retire(record)
                purged += 1
        return purged

    def _arm_purge(self) -> None:
        if self._set_aside:
            self._purge_turn.arm(self._ctx.now)

    def is_purge_live(self, due: int, target: None) -> bool:
        return self._purge_turn.is_live(due, target)

    def on_purge_due(self, due: int, target: None) -> None:
        """Retire up to PURGE_PER_TURN set-aside records; a queue whose last set-aside
        records are retired has the TTLs that came due meanwhile looked at again."""
        if not self._purge_turn.take(due):
            return
        set_aside, budget = self._set_aside, PURGE_PER_TURN
        while set_aside and budget > 0:
            queue, records = set_aside[0]
            take = min(budget, len(records))
            self._retire(records, take)
            budget -= take
            if records:
                break
            set_aside.popleft()
            if not any(other is queue for other, _ in set_aside):
                self._ttls_again(queue)
        self._arm_purge()

    def _ttls_again(self, queue: Queue) -> None:
        """TTLs that came due while the queue's purge was retiring: those still ready (not
        purged) are armed again, at once."""
        deferred, queue.purging = queue.purging or [], None
        arm = self._ctx.deadlines.arm_pair
        for record in deferred:
            if record.state == READY:
                arm(record.expires_at, TTL, queue.serial, record)

    def delete(self, queue: Queue) -> tuple[int, int]:
        """Remove a queue with its ready messages and dead letters; (messages, dead letters)
        deleted. Its windows are closed first (lifecycle.py): nothing may point to it."""
        purged = self.purge(queue)
        dead = len(queue.dead)
        queue.dead.clear()
        queue.deleted = True
        del self.by_name[queue.name]
        del self.by_serial[queue.serial]
        self._ctx.quotas.give_back(QUEUES, queue.creator)
        self._ctx.journal.queue_deleted(queue.name, self._head_seq, self._tail_seq)
        return purged, dead

    def place(self, queue: Queue, record: Record, to_head: bool) -> int:
        """Into the queue's ready deque; a durable record's `seq` records the place for the
        store (memory mode has no seq: broker/model.py). Returns the place it had (0 in
        memory mode): the journal's return names it (journal.back)."""
        was = 0
        if self._durable:
            was = record.seq  # type: ignore[attr-defined]
            record.seq = self.next_seq(to_head)  # type: ignore[attr-defined]
        if to_head:
            queue.ready.appendleft(record)
        else:
            queue.ready.append(record)
        return was

    def next_seq(self, to_head: bool) -> int:
        if to_head:
            self._head_seq -= 1
            return self._head_seq
        self._tail_seq += 1
        return self._tail_seq

    def restore_seq(self, seq: int) -> None:
        """A record read back from the store holds this place: new ones go around it."""
        self._tail_seq = max(self._tail_seq, seq)
        self._head_seq = min(self._head_seq, seq)

    @property
    def in_flight(self) -> int:
        return sum(queue.in_flight for queue in self.by_name.values())

    @property
    def ready(self) -> int:
        """Messages waiting for a consumer, including delayed requeues."""
        return sum(queue.ready_count + queue.delayed for queue in self.by_name.values())


def _setting(override: int | None, default: int) -> int:
    return default if override is None else override
