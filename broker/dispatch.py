"""Delivery: consumer windows, fair dispatch, and the whole life of a message in flight
(ack, requeue, dead letter by the consumer, leases that run out, delayed requeues, and the
return of everything a departed consumer held).

Rule: an IN_FLIGHT record sits in exactly one window's `held`; it leaves it by ack (GONE),
requeue or return (READY again, or DELAYED), or dead letter (GONE). Each return counts a
delivery, except a message its consumer hands back unstarted; past the queue's max
deliveries the message is dead-lettered instead.
"""

from __future__ import annotations

from ..protocol import (
    REQUEUE_UNSTARTED,
    Ack,
    Consume,
    DeadLetter,
    ErrorCode,
    Requeue,
    encode_dispatch,
    encode_routed_dispatch,
)
from .context import Context
from .deadletters import DeadLetters
from .deadlines import DELAY_OVER, LEASE
from .expiry import Expiry
from .model import (
    DELAYED,
    ID_BYTES,
    IN_FLIGHT,
    NS_PER_MS,
    NS_PER_SECOND,
    READY,
    Peer,
    Queue,
    Record,
    Window,
)
from .queues import Queues
from .quotas import CONSUMERS

#: Messages dispatched in one loop turn at most; a queue with more to give stays marked for
#: the next turn, so one big window cannot hold up everyone else's heartbeats.
DISPATCH_PER_TURN = 8_192


class Dispatch:
    __slots__ = ("_ctx", "_dead", "_expiry", "_queues")

    def __init__(
        self, ctx: Context, queues: Queues, dead_letters: DeadLetters, expiry: Expiry
    ) -> None:
        self._ctx = ctx
        self._queues = queues
        self._dead = dead_letters
        self._expiry = expiry

    # ----------------------------------------------------------------- consumer messages

    def on_consume(self, peer: Peer, message: Consume) -> None:
        ctx = self._ctx
        count = message.count
        max_window = ctx.config.max_window
        if count > max_window:
            ctx.refuse(
                peer,
                ErrorCode.INVALID_VALUE,
                f"consume count {count} is over the maximum window {max_window}",
                None,
                message.queue,
            )
            return
        if count == 0 and message.queue not in peer.windows:
            return  # nothing to stop; and no queue is created just to be told so
        queue = self._queues.open(peer, message.queue)
        if queue is None:
            return
        window = peer.windows.get(queue.name)
        if window is None:
            problem = self._consumer_quota_problem(peer, queue)
            if problem is not None:
                ctx.refuse(peer, ErrorCode.LIMIT_REACHED, problem, None, queue.name)
                return
            max_consumers = ctx.config.max_consumers
            if len(queue.windows) >= max_consumers:  # lifecycle.py reclaimed what it could
                ctx.refuse(
                    peer,
                    ErrorCode.LIMIT_REACHED,
                    f"queue {queue.name!r} has the maximum of {max_consumers} consumers",
                    None,
                    queue.name,
                )
                return
            window = peer.windows[queue.name] = Window(peer, queue, count)
            queue.windows.append(window)
        if message.lease_ms is not None:
            window.lease_ms = message.lease_ms
        window.limit = 0 if peer.closing else count
        self.close_window_if_idle(window)
        ctx.mark_dirty(queue)

    def _consumer_quota_problem(self, peer: Peer, queue: Queue) -> str | None:
        """Why the peer's key (or host) may not open one more window on the queue: it holds
        its quota of the queue's consumer slots (counted when a window opens, which is rare;
        bounded by `max_consumers`)."""
        owner = peer.owner
        if not owner:
            return None
        limit = self._ctx.quotas.limits[CONSUMERS]
        held = sum(1 for window in queue.windows if window.peer.owner == owner)
        if held < limit:
            return None
        self._ctx.quotas.refused[CONSUMERS] += 1
        return (
            f"{owner} holds {held} consumers of {queue.name!r}, its quota"
            f" (quota_consumers is {limit})"
        )

    def vacant_window(self, queue: Queue) -> Window | None:
        """Of a queue's windows, the one that counts least (frozen or gone, see
        `_is_vacant`: the stalled first, then the longest silent); None if every one
        counts."""
        now = self._ctx.now
        vacant = [w for w in queue.windows if self._is_vacant(w, now)]
        if not vacant:
            return None
        return min(vacant, key=lambda w: (not w.peer.stalled, w.peer.last_seen))

    def _is_vacant(self, window: Window, now: int) -> bool:
        """A window whose peer let a lease run out without a word (stalled), or a peer
        without heartbeats that holds nothing here and has been silent for longer than its
        lease: the only sign such a peer is alive is what it sends (a vanished stock
        consumer of a ZeroMQ socket leaves no other trace)."""
        peer = window.peer
        if peer.stalled:
            return True
        if peer.heartbeat_ns or window.held:
            return False
        silence_ns = self._lease_ns(window) or int(
            self._ctx.config.idle_peer_seconds * NS_PER_SECOND
        )
        return now - peer.last_seen > silence_ns

    def on_ack(self, peer: Peer, message: Ack) -> None:
        self.ack(peer, message.queue, message.message_id, "ack")

    def ack(self, peer: Peer, queue_name: str, message_id: bytes, verb: str) -> bool:
        """The peer is done with a message it holds (an ACK, or a REPLY that settles its
        request); False (and the peer refused, 404) if it does not hold it."""
        record = self._take_held(peer, queue_name, message_id, verb)
        if record is None:
            return False
        ctx = self._ctx
        ctx.retire(record)
        ctx.counters.acked += 1
        queue = self._queues.by_name.get(queue_name)
        if queue is not None:
            queue.acked += 1
        ctx.journal.acked(queue_name, message_id, record)
        return True

    def ack_run(self, peer: Peer, queue_name: str, message_ids: list[bytes]) -> None:
        """A frame of acks for one queue (protocol/runs.py `ack_run`): each settled as an ACK
        is, the window's and queue's bookkeeping once for the run."""
        window = peer.windows.get(queue_name)
        held = window.held if window is not None else None
        if not held:
            for message_id in message_ids:
                self._take_held(peer, queue_name, message_id, "ack")  # refused, each
            return
        ctx = self._ctx
        retire = ctx.retire
        acked = ctx.journal.acked
        taken = 0
        for message_id in message_ids:
            record = held.pop(message_id, None)
            if record is None:
                self._take_held(peer, queue_name, message_id, "ack")  # refused
                continue
            taken += 1
            retire(record)
            acked(queue_name, message_id, record)
        if not taken:
            return
        ctx.counters.acked += taken
        named = self._queues.by_name.get(queue_name)
        if named is not None:
            named.acked += taken
        queue = window.queue  # type: ignore[union-attr]
        queue.in_flight -= taken
        ctx.mark_dirty(queue)
        self.close_window_if_idle(window)  # type: ignore[arg-type]

    def on_requeue(self, peer: Peer, message: Requeue) -> None:
        record = self._take_held(peer, message.queue, message.message_id, "requeue")
        if record is None:
            return
        ctx = self._ctx
        queue = self._queues.by_name[message.queue]
        if message.flags is not None and message.flags & REQUEUE_UNSTARTED:
            # Never started (a prefetched message of a stopping worker): not a delivery.
            self.give_back(queue, record, to_head=True, counted=False)
            ctx.counters.returned_unstarted += 1
            return
        record.expires_at = ctx.now + message.ttl * NS_PER_SECOND if message.ttl else 0
        if message.delay_ms:
            self._delay(queue, record, message.delay_ms)
        else:
            self.give_back(queue, record, to_head=False)
        queue.requeued += 1
        ctx.counters.requeued += 1

    def on_dead_letter(self, peer: Peer, message: DeadLetter) -> None:
        record = self._take_held(peer, message.queue, message.message_id, "dead-letter")
        if record is not None:
            queue = self._queues.by_name[message.queue]
            self._dead.bury(queue, record, message.reason or "rejected", True)

    def _take_held(
        self, peer: Peer, queue_name: str, message_id: bytes, verb: str
    ) -> Record | None:
        """Remove a message from the peer's window, or refuse if the peer does not hold it."""
        window = peer.windows.get(queue_name)
        record = window.held.pop(message_id, None) if window is not None else None
        if record is None:
            self._ctx.refuse(
                peer,
                ErrorCode.UNKNOWN_MESSAGE,
                f"cannot {verb}: message {message_id.decode(errors='replace')} on"
                f" {queue_name!r} is not held by you"
                " (already acked, redelivered, or never dispatched to you)",
                message_id,
                queue_name,
            )
            return None
        window.queue.in_flight -= 1  # type: ignore[union-attr]
        self._ctx.mark_dirty(window.queue)  # type: ignore[union-attr]
        self.close_window_if_idle(window)  # type: ignore[arg-type]
        return record

    # ----------------------------------------------------------------- windows

    def close_window_if_idle(self, window: Window) -> None:
        if window.limit == 0 and not window.held:
            queue = window.queue
            queue.windows.remove(window)
            del window.peer.windows[queue.name]
            if not queue.windows and queue.unused_ms is not None:
                self._queues.mark_unused(queue)

    def stop_windows(self, peer: Peer) -> None:
        """The peer takes no new work (DISCONNECT); it may still settle what it holds."""
        for window in list(peer.windows.values()):
            window.limit = 0
            self.close_window_if_idle(window)

    def release_all(self, peer: Peer) -> int:
        """Everything the peer holds goes back to the head of its queue, in the order it was
        dispatched, with one more delivery; returns how many."""
        returned = 0
        for window in list(peer.windows.values()):
            returned += self.release_window(window)
        return returned

    def release_window(self, window: Window) -> int:
        """Close one window: what it holds goes back to the head of its queue, in the order
        it was dispatched, with one more delivery; returns how many."""
        queue = window.queue
        records = list(window.held.values())
        window.held.clear()
        queue.in_flight -= len(records)
        for record in reversed(records):
            self.give_back(queue, record, to_head=True)
        self._ctx.counters.redelivered += len(records)
        if window in queue.windows:
            queue.windows.remove(window)
        if window.peer.windows.get(queue.name) is window:
            del window.peer.windows[queue.name]
        self._ctx.mark_dirty(queue)
        if not queue.windows and queue.unused_ms is not None:
            self._queues.mark_unused(queue)
        return len(records)

    # ----------------------------------------------------------------- returns and delays

    def give_back(self, queue: Queue, record: Record, to_head: bool, counted: bool = True) -> None:
        """A message comes back from a consumer: that was one more delivery (unless not
        `counted`: it was handed back unstarted). Past the queue's max-deliveries it is
        dead-lettered instead of being dispatched again."""
        if counted and not self._dead.count_delivery(queue, record):
            return
        record.state = READY
        was = self._queues.place(queue, record, to_head)
        self._ctx.journal.back(record, queue.name, was)
        if record.expires_at:
            self._expiry.watch(queue, record)

    def _delay(self, queue: Queue, record: Record, delay_ms: int) -> None:
        """A requeue with a backoff: counted as a delivery now, queued when the delay ends."""
        if not self._dead.count_delivery(queue, record):
            return
        ctx = self._ctx
        record.state = DELAYED
        queue.delayed += 1
        ctx.deadlines.arm_pair(ctx.now + delay_ms * NS_PER_MS, DELAY_OVER, queue.serial, record)
        was = 0
        if ctx.journal.durable:
            was = record.seq  # type: ignore[attr-defined]
            record.seq = self._queues.next_seq(to_head=False)  # type: ignore[attr-defined]
        ctx.journal.delayed(record, queue.name, was)

    @staticmethod
    def is_delay_live(due: int, target: tuple[int, Record]) -> bool:
        return target[1].state == DELAYED

    def on_delay_over(self, due: int, target: tuple[int, Record]) -> None:
        """(The target names the queue by its serial, as a TTL's does: expiry.py.)"""
        serial, record = target
        if record.state != DELAYED:
            return
        queue = self._queues.by_serial.get(serial)
        if queue is None:  # its queue went while it waited: it goes too
            self._ctx.retire(record)
            return
        queue.delayed -= 1
        if record.deliveries == 1:  # a requeue counted a delivery first: a delayed send
            queue.delayed_sends -= 1
        record.state = READY
        was = self._queues.place(queue, record, to_head=False)
        self._ctx.journal.back(record, queue.name, was)
        if record.expires_at:
            self._expiry.watch(queue, record)
        self._ctx.mark_dirty(queue)

    # ----------------------------------------------------------------- leases

    @staticmethod
    def is_lease_live(due: int, window: Window) -> bool:
        return due == window.lease_due

    def on_lease_due(self, due: int, window: Window) -> None:
        """Messages held past their lease go back to the head of their queue.

        One schedule entry per window, not per message: it is armed for the earliest lease
        the window holds, and on firing takes back what ran out and re-arms for the next.
        Acks touch no entry, so a busy stock consumer costs one heap entry however fast it
        goes.
        """
        if due != window.lease_due:
            return  # superseded by an earlier lease
        window.lease_due = 0
        queue = window.queue
        if window.peer.windows.get(queue.name) is not window:
            return  # the window was closed or its peer released everything
        ctx = self._ctx
        now = ctx.now
        held = window.held
        expired = [r for r in held.values() if r.lease_until and r.lease_until <= now]
        for record in expired:
            del held[record.id]
        queue.in_flight -= len(expired)
        ctx.counters.lease_expired += len(expired)
        peer = window.peer
        if expired and not peer.stalled:
            # Heard nothing from the peer since the first of these went out: it is frozen or
            # gone, and what comes back must not go to it again before it speaks.
            lease_ns = self._lease_ns(window)
            if lease_ns and peer.last_seen <= min(r.lease_until for r in expired) - lease_ns:
                peer.stalled = True
                ctx.counters.stalled_consumers += 1
        for record in reversed(expired):  # back to the head, in dispatch order
            self.give_back(queue, record, to_head=True)
        if expired:
            ctx.log_limited(
                f"{len(expired)} leases on {queue.name!r} ran out with peer"
                f" {window.peer.id.hex()}: back to the queue",
                "lease",
            )
            ctx.mark_dirty(queue)
        self._arm_lease(window)
        self.close_window_if_idle(window)

    def _arm_lease(self, window: Window) -> None:
        deadlines = [r.lease_until for r in window.held.values() if r.lease_until]
        if deadlines:
            window.lease_due = min(deadlines)
            self._ctx.deadlines.arm(window.lease_due, LEASE, window)

    def peer_lease_ms(self, peer: Peer) -> int:
        """The lease a window of this peer gets unless its 002 names one."""
        config = self._ctx.config
        lease_ms = 0 if peer.heartbeat_ns else config.lease_ms
        cap = config.max_in_flight_ms
        return cap if cap and (not lease_ms or lease_ms > cap) else lease_ms

    def _lease_ns(self, window: Window) -> int:
        """How long a message dispatched into this window may stay unacked (0: forever).

        The consumer's own lease if it set one on 002; else the broker's lease for peers that
        do not heartbeat (the only sign they are alive is their acks), none for those that do;
        `max_in_flight_ms` caps both.
        """
        if window.lease_ms is None:
            return self.peer_lease_ms(window.peer) * NS_PER_MS
        lease_ms = window.lease_ms
        cap = self._ctx.config.max_in_flight_ms
        if cap and (not lease_ms or lease_ms > cap):
            lease_ms = cap
        return lease_ms * NS_PER_MS

    # ----------------------------------------------------------------- dispatch

    def dispatch(self, queue: Queue, budget: int = DISPATCH_PER_TURN) -> int:
        """Hand ready messages to the queue's windows with room, round robin from a
        rotating start, until the queue, the room or the `budget` runs out (then the queue
        is marked for another pass). Stalled peers get nothing. Returns how many went out."""
        ready = queue.ready
        if not ready:
            return 0
        windows = [w for w in queue.windows if len(w.held) < w.limit and not w.peer.stalled]
        if not windows:
            return 0
        ctx = self._ctx
        leases = [self._lease_ns(window) for window in windows]
        arm = ctx.deadlines.arm
        journal = ctx.journal
        durable = journal.durable
        now = ctx.now
        count = len(windows)
        index = queue.turn % count
        queue.turn += 1
        outbox = ctx.outbox
        packet = queue.queue_packet
        dispatched = first_seq = last_seq = 0
        while ready:
            if budget <= 0:
                ctx.mark_dirty(queue)  # more next turn
                break
            budget -= 1
            record = ready.popleft()
            if record.state != READY:
                queue.stale -= 1
                continue
            if record.expires_at and record.expires_at <= now:
                self._expiry.expire(queue, record)
                continue
            window = windows[index]
            peer = window.peer
            record.state = IN_FLIGHT
            data = record.data
            message_id = data[:ID_BYTES]
            window.held[message_id] = record
            if durable:
                if not dispatched:
                    first_seq = record.seq  # type: ignore[attr-defined]
                last_seq = record.seq  # type: ignore[attr-defined]
            if leases[index]:
                record.lease_until = now + leases[index]
                if not window.lease_due or record.lease_until < window.lease_due:
                    window.lease_due = record.lease_until
                    arm(record.lease_until, LEASE, window)
            else:
                record.lease_until = 0
            chunks = outbox.get(peer.id)
            if chunks is None:
                chunks = outbox[peer.id] = []
            if record.routed and peer.extensions:
                chunks.append(
                    encode_routed_dispatch(
                        packet,
                        data[ID_BYTES:],
                        message_id,
                        record.remaining_ttl(now),
                        record.deliveries,
                        record.headers,
                        record.event,
                        record.reply_to,
                        record.correlation,
                        record.message_key,
                    )
                )
            else:
                chunks.append(
                    encode_dispatch(
                        packet,
                        data[ID_BYTES:],
                        message_id,
                        record.remaining_ttl(now) if peer.ttl_form else None,
                        record.deliveries if peer.extensions else None,
                        record.headers,
                    )
                )
            dispatched += 1
            if len(window.held) >= window.limit:
                del windows[index]
                del leases[index]
                count -= 1
                if not count:
                    break
                if index >= count:
                    index = 0
            else:
                index = index + 1 if index + 1 < count else 0
        if dispatched:
            journal.dispatched(queue.name, first_seq, last_seq)
        queue.in_flight += dispatched
        queue.delivered += dispatched
        ctx.counters.dispatched += dispatched
        return dispatched
