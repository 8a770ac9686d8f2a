"""Queues that come and go (docs/protocol.md §6.5): consume with bindings, cancel one
consumer, delete a queue at once (telling its consumers), and delete a queue once it has
been without consumers for its grace time.

Deleting closes every window on the queue first, so that nothing points to it afterwards:
what the consumers held is gone with it (their later acks get 404), a delayed message finds
its queue deleted when its delay ends (dispatch.py), and a TTL or lease entry finds nothing.
"""

from __future__ import annotations

from typing import Any

from ..protocol import Cancel, Consume
from .batch_leases import BatchLeases
from .context import Context
from .dispatch import Dispatch
from .events import Events
from .model import Peer, Queue
from .peers import Peers
from .queues import Queues


class Lifecycle:
    __slots__ = ("_ctx", "_dispatch", "_events", "_leases", "_peers", "_queues")

    def __init__(
        self,
        ctx: Context,
        queues: Queues,
        dispatch: Dispatch,
        events: Events,
        leases: BatchLeases,
        peers: Peers,
    ) -> None:
        self._ctx = ctx
        self._queues = queues
        self._dispatch = dispatch
        self._events = events
        self._leases = leases
        self._peers = peers

    # ----------------------------------------------------------------- consume, cancel

    def on_consume(self, peer: Peer, message: Consume) -> None:
        """A 002; with PATTERNS its queue is bound in the same request (checked first: a bad
        pattern opens no window), with UNUSED_MS it is marked delete-when-unused."""
        dispatch = self._dispatch
        if message.count and message.queue not in peer.windows:
            self._make_room(message.queue)
        if (message.patterns is None and message.unused_ms is None) or message.count == 0:
            dispatch.on_consume(peer, message)
            return
        peer.opt_in()  # binding in a 002 is speaking the extensions: it gets the event names
        patterns: list[str] = []
        if message.patterns is not None:
            checked = self._events.consume_patterns(peer, message.queue, message.patterns)
            if checked is None:
                return
            patterns = checked
        dispatch.on_consume(peer, message)
        window = peer.windows.get(message.queue)
        if window is None:
            return  # refused (a bad name, a limit)
        queue = window.queue
        if patterns:
            self._events.bind_checked(queue, patterns, peer.owner)
        if message.unused_ms is not None and message.unused_ms != queue.unused_ms:
            queue.unused_ms = message.unused_ms
            self._ctx.journal.unused(queue.name, message.unused_ms)

    def _make_room(self, queue_name: str) -> None:
        """A queue at its maximum of consumers: the peer of the window that counts least
        (frozen or gone) is given up on, so that a new consumer gets its slot."""
        queue = self._queues.get(queue_name)
        if queue is None or len(queue.windows) < self._ctx.config.max_consumers:
            return
        window = self._dispatch.vacant_window(queue)
        if window is not None:
            self._ctx.counters.consumers_reclaimed += 1
            self._peers.give_up(
                window.peer, f"its window on {queue.name!r} was reclaimed for a new consumer"
            )

    def on_cancel(self, peer: Peer, message: Cancel) -> None:
        """109 from a client: its window on the queue closes and what it held there goes
        back; the answer says how many."""
        ctx = self._ctx
        ctx.counters.cancelled += 1
        window = peer.windows.get(message.queue)
        returned = 0 if window is None else self._dispatch.release_window(window)
        ctx.reply(peer, Cancel(message.queue, "cancelled", returned))

    def revoke(self, peer: Peer, queue_name: str) -> None:
        """The peer may no longer consume the queue (SIGHUP took the right away): its window
        closes, what it held there goes back, and it is told with a CANCEL."""
        window = peer.windows.get(queue_name)
        if window is None:
            return
        returned = self._dispatch.release_window(window)
        reason = "forbidden: the consume right was revoked"
        self._ctx.reply(peer, Cancel(queue_name, reason, returned))

    # ----------------------------------------------------------------- delete

    def delete(self, queue: Queue) -> dict[str, Any]:
        """Delete a queue at once with everything in it; its consumers are told (CANCEL)."""
        self._ctx.counters.queues_deleted += 1
        return self._remove(queue)

    def _remove(self, queue: Queue) -> dict[str, Any]:
        ctx = self._ctx
        consumers = len(queue.windows)
        in_flight = 0
        for window in list(queue.windows):
            held = window.held
            for record in held.values():
                ctx.retire(record)
            in_flight += len(held)
            peer = window.peer
            if peer.windows.get(queue.name) is window:
                del peer.windows[queue.name]
            if peer.extensions:
                ctx.reply(peer, Cancel(queue.name, "queue deleted", len(held)))
            held.clear()
        queue.windows.clear()
        queue.in_flight = 0
        delayed = queue.delayed  # each lets go when its delay ends (dispatch.on_delay_over)
        leased = self._leases.drop_all(queue)
        bindings = self._events.bindings.count(queue.name)
        self._events.forget(queue.name)
        purged, dead = self._queues.delete(queue)
        ctx.counters.deleted_messages += purged + in_flight + delayed + dead + leased
        return {
            "queue": queue.name,
            "purged": purged,
            "in_flight": in_flight,
            "delayed": delayed,
            "leased": leased,
            "dead_letters": dead,
            "consumers": consumers,
            "bindings": bindings,
        }

    # ----------------------------------------------------------------- delete when unused

    def unused(self, queue: Queue) -> None:
        """The queue's last window closed: it is deleted if none opens within its grace."""
        self._queues.mark_unused(queue)

    def restore_unused(self, settings: list[tuple[str, int]]) -> None:
        """Delete-when-unused settings read back from the store: after a restart no queue
        has a consumer, so each one's wait starts now."""
        for name, unused_ms in settings:
            queue = self._queues.get(name) or self._queues.create(name)
            queue.unused_ms = unused_ms
            self.unused(queue)

    @staticmethod
    def is_unused_live(due: int, queue: Queue) -> bool:
        return due == queue.unused_due and not queue.deleted

    def on_unused_due(self, due: int, queue: Queue) -> None:
        if due != queue.unused_due or queue.deleted:
            return
        queue.unused_due = 0
        if queue.windows:
            return  # a consumer came back in time
        if queue.leases:  # a reader's batch is not done with it: wait again
            self.unused(queue)
            return
        self._remove(queue)
        self._ctx.counters.queues_unused_deleted += 1
