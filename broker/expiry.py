"""TTL expiry of ready messages: a message whose time to live is over becomes a dead letter
(reason `expired`) at its deadline, whether or not a consumer is waiting. Messages already
dispatched are not touched: their TTL is checked again if they come back.
"""

from __future__ import annotations

from .context import Context
from .deadletters import DeadLetters
from .deadlines import TTL
from .model import READY, Queue, Record
from .queues import Queues


class Expiry:
    __slots__ = ("_ctx", "_dead", "_queues")

    def __init__(self, ctx: Context, dead_letters: DeadLetters, queues: Queues) -> None:
        self._ctx = ctx
        self._dead = dead_letters
        self._queues = queues

    def watch(self, queue: Queue, record: Record) -> None:
        """Arm the record's TTL (call when it becomes READY with `expires_at` set). The
        deadline names the queue by its serial: an entry of numbers and a record (whose type
        the GC does not track) is not tracked either, so a million TTLs add nothing to the
        GC's full passes (they took 0.2-0.5 s each with the queue in the entry)."""
        self._ctx.deadlines.arm_pair(record.expires_at, TTL, queue.serial, record)

    @staticmethod
    def is_live(due: int, target: tuple[int, Record]) -> bool:
        record = target[1]
        return record.state == READY and record.expires_at == due

    def on_due(self, due: int, target: tuple[int, Record]) -> None:
        serial, record = target
        if record.state != READY or record.expires_at != due:
            return  # dispatched, acked or re-timed since it was watched
        queue = self._queues.by_serial.get(serial)
        if queue is None:
            return  # deleted: what it still held is being retired (queues.py)
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
