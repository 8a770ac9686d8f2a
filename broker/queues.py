"""The queue table: which queues exist, creating them within the broker's limits, and where a
record goes in a queue.

Rule: a queue's ready deque is in `seq` order. The tail takes numbers upwards, the head (a
message coming back) takes numbers below the smallest; the durable store keeps `seq`, so
reading it back in `seq` order rebuilds every queue as it was.
"""

from __future__ import annotations

from ..protocol import ErrorCode, queue_name_problem
from .config import QueueSettings
from .context import Context
from .deadlines import UNUSED_QUEUE
from .model import NS_PER_MS, READY, Peer, Queue, Record
from .quotas import QUEUES


class Queues:
    __slots__ = ("_ctx", "_durable", "_head_seq", "_tail_seq", "by_name")

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._durable = ctx.journal.durable
        self.by_name: dict[str, Queue] = {}
        self._tail_seq = 0
        self._head_seq = 0

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
        """Delete the queue's ready messages (not those in flight or delayed); how many."""
        purged = 0
        for record in queue.ready:
            if record.state == READY:
                self._ctx.retire(record)  # its TTL timer, if armed, now finds nothing to do
                purged += 1
        queue.ready.clear()
        queue.stale = 0
        self._ctx.journal.ready_purged(queue.name)
        return purged

    def delete(self, queue: Queue) -> tuple[int, int]:
        """Remove a queue with its ready messages and dead letters; (messages, dead letters)
        deleted. Its windows are closed first (lifecycle.py): nothing may point to it."""
        purged = self.purge(queue)
        dead = len(queue.dead)
        queue.dead.clear()
        queue.deleted = True
        del self.by_name[queue.name]
        self._ctx.quotas.give_back(QUEUES, queue.creator)
        self._ctx.journal.queue_deleted(queue.name)
        return purged, dead

    def place(self, queue: Queue, record: Record, to_head: bool) -> None:
        """Into the queue's ready deque; a durable record's `seq` records the place for the
        store (memory mode has no seq: broker/model.py)."""
        if self._durable:
            record.seq = self.next_seq(to_head)  # type: ignore[attr-defined]
        if to_head:
            queue.ready.appendleft(record)
        else:
            queue.ready.append(record)

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
