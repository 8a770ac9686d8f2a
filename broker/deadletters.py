"""Dead letters: messages taken out of circulation (rejected by a consumer, expired, past
their queue's max deliveries, or pushed out of a full queue), kept per queue up to a bound,
and put back (replay) or deleted (purge) by an operator.
"""

from __future__ import annotations

from .context import Context
from .model import DeadLetterEntry, Queue, Record, new_record, record_bytes
from .queues import Queues


class DeadLetters:
    __slots__ = ("_ctx", "_queues")

    def __init__(self, ctx: Context, queues: Queues) -> None:
        self._ctx = ctx
        self._queues = queues

    def bury(self, queue: Queue, record: Record, reason: str, in_flight: bool = False) -> None:
        """Move a record to the dead-letter store; the entry counts the deliveries made."""
        ctx = self._ctx
        ctx.retire(record)
        delivered = record.deliveries if in_flight else record.deliveries - 1
        entry = DeadLetterEntry(
            record.id,
            record.content,
            reason,
            delivered,
            ctx.clock.wall(),
            record.headers,
            record.message_key,
        )
        dead = queue.dead
        if len(dead) == dead.maxlen:
            ctx.journal.undead(queue.name, dead[0].id)  # evicted by the bound
        queue.add_dead(entry)
        ctx.journal.dead(queue.name, entry)
        queue.dead_lettered += 1
        ctx.counters.dead_lettered += 1

    def count_delivery(self, queue: Queue, record: Record) -> bool:
        """One more delivery; past the queue's max-deliveries the record is dead-lettered
        and False is returned."""
        record.deliveries += 1
        if queue.max_deliveries and record.deliveries > queue.max_deliveries:
            self._ctx.counters.max_deliveries += 1
            self.bury(queue, record, "max-deliveries")
            return False
        return True

    def replay(self, queue: Queue, ids: list[bytes] | None) -> int:
        """Dead letters (all, or those with these IDs) back at the tail of their queue, same
        ID, no TTL; returns how many."""
        journal = self._ctx.journal
        wanted = None if ids is None else set(ids)
        keep = []
        replayed = 0
        for entry in queue.dead:
            if wanted is not None and entry.id not in wanted:
                keep.append(entry)
                continue
            record = new_record(
                entry.id,
                entry.content,
                0,
                entry.deliveries + 1,
                entry.headers,
                journal.durable,
                message_key=entry.message_key,
            )
            self._queues.place(queue, record, to_head=False)
            self._ctx.held_bytes += record_bytes(record)
            journal.undead(queue.name, entry.id)
            journal.put(queue.name, record, entry.id, entry.content)
            replayed += 1
        queue.dead.clear()
        queue.dead.extend(keep)
        self._ctx.mark_dirty(queue)
        return replayed

    def purge(self, queue: Queue) -> int:
        purged = len(queue.dead)
        queue.dead.clear()
        self._ctx.journal.purged(queue.name)
        return purged
