"""Recovery at start: the queues, dead letters, key holds and idempotency keys read from the
durable store become the core's state again.

Messages come back in their order, TTLs from their wall-clock deadlines (expired ones are
dead-lettered at the first turn), those that were in flight as ready in their place with one
more delivery, delayed sends whose visible time is still ahead delayed until then, leased
ones in their batch lease again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..protocol.constants import INTEGER_LIMIT
from .batch_leases import BatchLeases
from .context import Context
from .deadletters import DeadLetters
from .deadlines import DELAY_OVER
from .expiry import Expiry
from .idempotency import entry
from .intake import Intake
from .key_holds import held_batch as writer_batch_of
from .model import DELAYED, NS_PER_SECOND, DeadLetterEntry, Queue, Record, new_record, record_bytes
from .queues import Queues
from .quotas import KEY_HOLDS

#: The store's in-flight mark of a dispatched message (2 marks a delayed one).
IN_FLIGHT_ON_DISK = 1
#: ... and of a message in a batch lease.
LEASED_ON_DISK = 3
#: The longest TTL a 003 can carry (18 digits). A deadline read back from its wall-clock
#: seconds (a float, exact to about a minute at 10**18 s) is held to it.
MAX_TTL_NS = (INTEGER_LIMIT - 1) * NS_PER_SECOND


def restore_messages(
    ctx: Context,
    queues: Queues,
    dead_letters: DeadLetters,
    expiry: Expiry,
    leases: BatchLeases,
    messages: Iterable[Any],
    dead: Iterable[Any],
) -> tuple[int, int, int]:
    """Rebuild the queues; returns (ready, were in flight, dead letters)."""
    wall = ctx.clock.wall()
    were_in_flight = 0
    for stored in messages:
        queue = queues.get(stored.queue) or queues.create(stored.queue)
        expires_at = 0
        if stored.expires_wall:
            left = int((stored.expires_wall - wall) * NS_PER_SECOND)
            # (a delayed send's TTL counts from when it becomes visible)
            hidden = max(0, int((stored.visible_wall - wall) * NS_PER_SECOND))
            expires_at = ctx.now + min(left, hidden + MAX_TTL_NS)
        record = new_record(
            stored.id,
            stored.content,
            expires_at,
            stored.deliveries,
            stored.headers,
            durable=True,
            event=stored.event,
            reply_to=stored.reply_to,
            correlation=stored.correlation,
            message_key=stored.message_key,
        )
        queues.restore_seq(stored.seq)
        record.seq = stored.seq  # type: ignore[attr-defined]
        ctx.held_bytes += record_bytes(record)
        if stored.in_flight == LEASED_ON_DISK and stored.lease:
            leases.restore(queue, stored.lease, record)
            continue
        if stored.in_flight == IN_FLIGHT_ON_DISK:  # ready again, with one more delivery
            were_in_flight += 1
            if not dead_letters.count_delivery(queue, record):
                continue
            ctx.journal.back(record, queue.name, stored.seq)
        elif stored.visible_wall > wall:  # a delayed send: invisible until its time
            _delay_until(ctx, queue, record, stored.visible_wall - wall)
            continue
        elif stored.in_flight:  # delayed when the broker stopped: ready now, count kept
            ctx.journal.back(record, queue.name, stored.seq)
        queue.ready.append(record)
        if expires_at:
            expiry.watch(queue, record)
    for stored in dead:
        queue = queues.get(stored.queue) or queues.create(stored.queue)
        queue.add_dead(
            DeadLetterEntry(
                stored.id,
                stored.content,
                stored.reason,
                stored.deliveries,
                stored.dead_at,
                stored.headers,
                stored.message_key,
            )
        )
    dead_count = sum(len(queue.dead) for queue in queues.by_name.values())
    return queues.ready, were_in_flight, dead_count


def _delay_until(ctx: Context, queue: Queue, record: Record, seconds: float) -> None:
    """A stored delayed send whose time has not come: DELAYED again for what is left."""
    record.state = DELAYED
    queue.delayed += 1
    queue.delayed_sends += 1
    due = ctx.now + int(seconds * NS_PER_SECOND)
    ctx.deadlines.arm_pair(due, DELAY_OVER, queue.serial, record)


def restore_keys(ctx: Context, intake: Intake, keys: list[Any], holds: Iterable[Any] = ()) -> int:
    """The key holds, and the idempotency keys held by them or still inside their window;
    returns how many keys."""
    wall = ctx.clock.wall()
    window_ns = intake.keys.window_ns
    for stored_hold in holds:
        intake.holds.add(
            stored_hold.scope, stored_hold.owner, stored_hold.committed, stored_hold.created_wall
        )
        ctx.quotas.take(KEY_HOLDS, stored_hold.owner)
    restored = 0
    #: Writer batches whose held keys a crash left on disk after their hold let them go.
    gone: dict[tuple[str, str], None] = {}
    for stored in sorted(keys, key=lambda k: k.expires_wall):
        if stored.expires_wall == math.inf and window_ns:
            restored += _restore_held(ctx, intake, stored, gone)
        elif stored.expires_wall > wall and window_ns:
            # Not past today's window either, if it was shortened: keeps expiry order.
            remaining = min(int((stored.expires_wall - wall) * NS_PER_SECOND), window_ns)
            intake.restore_key(stored.queue, stored.key, stored.id, ctx.now + remaining)
            restored += 1
    for queue_name, writer_batch in gone:
        ctx.journal.held_gone(queue_name, writer_batch)
    if restored < len(keys):
        # Expired while down, or keys are off now: delete them from the store too.
        intake.forget_stored_keys(wall if window_ns else math.inf)
    return restored


def _restore_held(
    ctx: Context, intake: Intake, stored: Any, gone: dict[tuple[str, str], None]
) -> int:
    """A held key: held again by its hold; one whose hold is gone (or committed past it)
    gets the window from now, and its writer batch goes into `gone` (every key of it does
    the same: one hold, one batch)."""
    held_batch = intake.holds.batch_of(stored.key)
    if held_batch is None:
        expires_at = ctx.now + intake.keys.window_ns
        intake.remember_key(entry(stored.queue, stored.key), stored.id, expires_at, True)
        gone[(stored.queue, writer_batch_of(stored.key))] = None
    else:
        hold, batch = held_batch
        intake.restore_held_key(hold, batch, stored.queue, stored.key, stored.id)
    return 1
