"""TTL expiry of ready messages: a message whose time to live is over becomes a dead letter
(reason `expired`) at its deadline, whether or not a consumer is waiting. Messages already
dispatched are not touched: their TTL is checked again if they come back.
"""

from __future__ import annotations

from .context import Context
from .deadletters import DeadLetters
from .deadlines import TTL
from .model import READY, Queue, Record


class Expiry:
    __slots__ = ("_ctx", "_dead")

    def __init__(self, ctx: Context, dead_letters: DeadLetters) -> None:
        self._ctx = ctx
        self._dead = dead_letters

    def watch(self, queue: Queue, record: Record) -> None:
        """Arm the record's TTL (call when it becomes READY with `expires_at` set)."""
        self._ctx.deadlines.arm(record.expires_at, TTL, (queue, record))

    @staticmethod
    def is_live(due: int, target: tuple[Queue, Record]) -> bool:
        record = target[1]
        return record.state == READY and record.expires_at == due

    def on_due(self, due: int, target: tuple[Queue, Record]) -> None:
        queue, record = target
        if record.state != READY or record.expires_at != due:
            return  # dispatched, acked or re-timed since it was watched
        if queue.purging is not None:  # it may be one a purge set aside: decided after it
            queue.purging.append(record)
            return
        queue.stale += 1
        self.expire(queue, record)
        queue.compact()

    def expire(self, queue: Queue, record: Record) -> None:
        self._dead.bury(queue, record, "expired")
        queue.expired += 1
        self._ctx.counters.expired += 1
