"""The broker's pure core: queues, consume windows, TTL, redelivery and dead letters.

No sockets and no clock reads. The shell drives it once per loop turn:

    core.begin_turn()                      # reads the injected clock once
    core.handle_frame(peer_id, payload)    # for every frame read this turn
    for peer_id, frame in core.end_turn(): # dispatches + replies, one frame per peer
        send(peer_id, frame)

and tells it `peer_gone(peer_id)` when a peer cannot be reached. Everything the core wants
sent comes back from end_turn(); everything it decides is in its counters and logs.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from typing import Any

from broker.admin import run_admin
from broker.clock import Clock
from broker.config import BrokerConfig
from broker.store import (
    GONE,
    IN_FLIGHT,
    NS_PER_SECOND,
    READY,
    DeadLetterEntry,
    IdSource,
    Queue,
    Record,
    Window,
)
from protocol import (
    EXTENSION_TYPES,
    Ack,
    Admin,
    AdminReply,
    Consume,
    DeadLetter,
    Disconnect,
    Error,
    ErrorCode,
    Heartbeat,
    Hello,
    Kbai,
    Message,
    MessageType,
    ProtocolError,
    Requeue,
    Send,
    decode_frame,
    encode,
    encode_dispatch,
)

log = logging.getLogger("phpmq.broker")

BROKER_NAME = "phpmq-zmq"
FIRST_EXTENSION_TYPE = min(EXTENSION_TYPES)
#: 005 and 006 exist only in the README (TTL) dialect: a peer that sends them speaks it.
TTL_DIALECT_ONLY_TYPES = frozenset((MessageType.REQUEUE, MessageType.DEAD_LETTER))
#: Queue names: 1-255 bytes of UTF-8, no whitespace or control characters (docs/protocol.md).
MAX_QUEUE_NAME_BYTES = 255


class Peer:
    """A client as the core knows it, keyed by its ZeroMQ routing id."""

    __slots__ = ("closing", "extensions", "forgotten", "id", "name", "ttl_form", "windows")

    def __init__(self, peer_id: bytes, ttl_form: bool) -> None:
        self.id = peer_id
        #: Dispatch in the TTL (README) form; switched on by any TTL-form or extension message.
        self.ttl_form = ttl_form
        #: Spoke an extension type: gets ERROR replies and delivery counts.
        self.extensions = False
        self.windows: dict[str, Window] = {}
        self.name = ""
        #: Sent DISCONNECT: gets no new work, may still ack what it holds.
        self.closing = False
        #: Said KBAI: its state is gone; a later message from the same id starts afresh.
        self.forgotten = False


class Core:
    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        new_id: Callable[[], str] | None = None,
        ttl_form_default: bool = True,
    ) -> None:
        self.config = config
        self.clock = clock
        self.new_id = new_id or IdSource()
        self.ttl_form_default = ttl_form_default
        self.now = clock.monotonic_ns()
        self.started_ns = self.now
        self.queues: dict[str, Queue] = {}
        self.peers: dict[bytes, Peer] = {}
        self.draining = False
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "received",
                "dispatched",
                "acked",
                "requeued",
                "dead_lettered",
                "expired",
                "redelivered",
                "errors",
            ),
            0,
        )
        self._outbox: dict[bytes, list[bytes]] = {}
        self._dirty: dict[Queue, None] = {}
        #: (expires_at, tiebreak, queue, record) for READY records with a TTL.
        self._expiry: list[tuple[int, int, Queue, Record]] = []
        self._expiry_seq = 0
        self._last_log: dict[str, tuple[int, int]] = {}
        self._handlers: dict[type, Callable[[Peer, Any], None]] = {
            Send: self._on_send,
            Consume: self._on_consume,
            Ack: self._on_ack,
            Requeue: self._on_requeue,
            DeadLetter: self._on_dead_letter,
            Hello: self._on_hello,
            Heartbeat: self._on_heartbeat,
            Disconnect: self._on_disconnect,
            Kbai: self._on_kbai,
            Admin: self._on_admin,
        }

    # ----------------------------------------------------------------- turn driving

    def begin_turn(self) -> None:
        self.now = self.clock.monotonic_ns()

    def handle_frame(self, peer_id: bytes, data: bytes) -> None:
        """Process one ZeroMQ frame from a peer: one or more concatenated PHPMQ messages."""
        messages, error = decode_frame(data, self.config.max_content_bytes)
        self.handle_messages(peer_id, messages, error)

    def handle_messages(
        self, peer_id: bytes, messages: list[Message], error: ProtocolError | None = None
    ) -> None:
        """Process messages decoded from one peer (and the error that ended its input, if any);
        for transports that decode themselves."""
        peer = self._peer(peer_id)
        handlers = self._handlers
        for message in messages:
            if peer.forgotten:  # a KBAI earlier in the same frame
                peer = self._peer(peer_id)
            kind = message.TYPE
            if kind >= FIRST_EXTENSION_TYPE:
                self._opt_in(peer)
            elif kind in TTL_DIALECT_ONLY_TYPES:
                peer.ttl_form = True
            handler = handlers.get(type(message))
            if handler is None:
                self._refuse(
                    peer, ErrorCode.UNSUPPORTED_TYPE, f"clients may not send {kind.name} messages"
                )
            else:
                handler(peer, message)
        if error is not None:
            if peer.forgotten:
                peer = self._peer(peer_id)
            self._refuse(peer, error.code, error.reason)
        if not (peer.windows or peer.extensions or peer.ttl_form != self.ttl_form_default):
            # Nothing to remember about a stock producer; forgetting it keeps memory flat
            # however many identities come and go.
            self.peers.pop(peer_id, None)

    def _peer(self, peer_id: bytes) -> Peer:
        peer = self.peers.get(peer_id)
        if peer is None:
            peer = self.peers[peer_id] = Peer(peer_id, self.ttl_form_default)
        return peer

    def end_turn(self) -> list[tuple[bytes, bytes]]:
        """Expire, dispatch, and return what to send: one frame per peer."""
        self._expire_due()
        if self._dirty and not self.draining:
            dirty = self._dirty
            self._dirty = {}
            for queue in dirty:
                self._dispatch(queue)
        else:
            self._dirty.clear()
        outbox = self._outbox
        if not outbox:
            return []
        self._outbox = {}
        return [(peer_id, b"".join(chunks)) for peer_id, chunks in outbox.items()]

    def next_deadline(self) -> int | None:
        """Monotonic ns of the next thing the core must do on its own: now, if a queue is
        waiting for a dispatch pass, else the next TTL expiry, else None."""
        if self._dirty and not self.draining:
            return self.now
        return self._expiry[0][0] if self._expiry else None

    def peer_gone(self, peer_id: bytes) -> None:
        """The transport says this peer is gone: its held messages return to their queues."""
        peer = self.peers.pop(peer_id, None)
        if peer is not None:
            self._release_all(peer)

    def mark_dirty(self, queue: Queue) -> None:
        """Ask for a dispatch pass over `queue` at the end of this turn."""
        self._dirty[queue] = None

    def start_drain(self) -> None:
        """Stop taking sends and dispatching; acks of held messages still work."""
        self.draining = True

    @property
    def in_flight(self) -> int:
        return sum(queue.in_flight for queue in self.queues.values())

    @property
    def ready(self) -> int:
        return sum(queue.ready_count for queue in self.queues.values())

    # ----------------------------------------------------------------- message handlers

    def _on_send(self, peer: Peer, message: Send) -> None:
        if message.ttl is not None:
            peer.ttl_form = True
        if self.draining:
            self._refuse(
                peer, ErrorCode.SHUTTING_DOWN, "broker is shutting down", None, message.queue
            )
            return
        queue = self._queue(peer, message.queue)
        if queue is None:
            return
        ttl = message.ttl or 0
        record = Record(
            self.new_id(), message.content, self.now + ttl * NS_PER_SECOND if ttl else 0
        )
        queue.ready.append(record)
        if ttl:
            self._watch_expiry(queue, record)
        if queue.windows:
            self._dirty[queue] = None
        self.counters["received"] += 1

    def _on_consume(self, peer: Peer, message: Consume) -> None:
        count = message.count
        if count > self.config.max_window:
            self._refuse(
                peer,
                ErrorCode.INVALID_VALUE,
                f"consume count {count} is over the maximum window {self.config.max_window}",
                None,
                message.queue,
            )
            return
        if count == 0 and message.queue not in peer.windows:
            return  # nothing to stop; and no queue is created just to be told so
        queue = self._queue(peer, message.queue)
        if queue is None:
            return
        window = peer.windows.get(queue.name)
        if window is None:
            window = peer.windows[queue.name] = Window(peer, queue, count)
            queue.windows.append(window)
        window.limit = 0 if peer.closing else count
        self._close_window_if_idle(window)
        self._dirty[queue] = None

    def _on_ack(self, peer: Peer, message: Ack) -> None:
        record = self._take_held(peer, message.queue, message.message_id, "ack")
        if record is not None:
            record.state = GONE
            self.counters["acked"] += 1

    def _on_requeue(self, peer: Peer, message: Requeue) -> None:
        record = self._take_held(peer, message.queue, message.message_id, "requeue")
        if record is None:
            return
        queue = self.queues[message.queue]
        record.expires_at = self.now + message.ttl * NS_PER_SECOND if message.ttl else 0
        record.deliveries += 1
        record.state = READY
        queue.ready.append(record)
        if record.expires_at:
            self._watch_expiry(queue, record)
        self.counters["requeued"] += 1

    def _on_dead_letter(self, peer: Peer, message: DeadLetter) -> None:
        record = self._take_held(peer, message.queue, message.message_id, "dead-letter")
        if record is not None:
            self._bury(self.queues[message.queue], record, message.reason or "rejected", True)

    def _on_hello(self, peer: Peer, message: Hello) -> None:
        name = message.options.get("name")
        peer.name = name if isinstance(name, str) else ""
        self._reply(
            peer,
            Hello(
                {
                    "broker": BROKER_NAME,
                    "max_content_bytes": self.config.max_content_bytes,
                    "max_window": self.config.max_window,
                }
            ),
        )

    def _on_heartbeat(self, peer: Peer, message: Heartbeat) -> None:
        """Any message shows the peer is alive; this one says nothing else."""

    def _on_disconnect(self, peer: Peer, message: Disconnect) -> None:
        """eMQP: answer KBAI, send no more work, let the peer finish (ack) what it holds."""
        peer.closing = True
        for window in list(peer.windows.values()):
            window.limit = 0
            self._close_window_if_idle(window)
        self._reply(peer, Kbai())

    def _on_kbai(self, peer: Peer, message: Kbai) -> None:
        """Goodbye: whatever the peer still holds goes back to the head of its queue."""
        self.peers.pop(peer.id, None)
        self._release_all(peer)
        peer.forgotten = True

    def _on_admin(self, peer: Peer, message: Admin) -> None:
        """The answer is always an ADMIN_REPLY, so a client can tell it from other refusals."""
        try:
            result = run_admin(self, message.options)
        except ValueError as exc:
            self.counters["errors"] += 1
            result = {"error": {"code": int(ErrorCode.INVALID_VALUE), "reason": str(exc)}}
        self._reply(peer, AdminReply(result))

    # ----------------------------------------------------------------- internals

    def _opt_in(self, peer: Peer) -> None:
        peer.extensions = True
        peer.ttl_form = True

    def _queue(self, peer: Peer, name: str) -> Queue | None:
        queue = self.queues.get(name)
        if queue is not None:
            return queue
        reason = queue_name_problem(name)
        if reason is not None:
            self._refuse(peer, ErrorCode.INVALID_VALUE, reason)
            return None
        queue = self.queues[name] = Queue(name, self.config.dead_letter_limit)
        return queue

    def _take_held(self, peer: Peer, queue_name: str, message_id: str, verb: str) -> Record | None:
        """Remove a message from the peer's window, or refuse if the peer does not hold it."""
        window = peer.windows.get(queue_name)
        record = window.held.pop(message_id, None) if window is not None else None
        if record is None:
            self._refuse(
                peer,
                ErrorCode.UNKNOWN_MESSAGE,
                f"cannot {verb}: message {message_id} on {queue_name!r} is not held by you"
                " (already acked, redelivered, or never dispatched to you)",
                message_id,
                queue_name,
            )
            return None
        window.queue.in_flight -= 1
        self._dirty[window.queue] = None
        self._close_window_if_idle(window)
        return record

    def _close_window_if_idle(self, window: Window) -> None:
        if window.limit == 0 and not window.held:
            window.queue.windows.remove(window)
            del window.peer.windows[window.queue.name]  # type: ignore[attr-defined]

    def _release_all(self, peer: Peer) -> None:
        for window in peer.windows.values():
            queue = window.queue
            records = list(window.held.values())
            window.held.clear()
            queue.in_flight -= len(records)
            # Back to the head, in the order they were dispatched.
            for record in reversed(records):
                record.state = READY
                record.deliveries += 1
                queue.ready.appendleft(record)
                if record.expires_at:
                    self._watch_expiry(queue, record)
            self.counters["redelivered"] += len(records)
            if window in queue.windows:
                queue.windows.remove(window)
            self._dirty[queue] = None
        peer.windows.clear()

    def _dispatch(self, queue: Queue) -> None:
        ready = queue.ready
        if not ready:
            return
        windows = [w for w in queue.windows if len(w.held) < w.limit]
        if not windows:
            return
        now = self.now
        count = len(windows)
        index = queue.turn % count
        queue.turn += 1
        outbox = self._outbox
        packet = queue.queue_packet
        dispatched = 0
        while ready:
            record = ready.popleft()
            if record.state != READY:
                queue.stale -= 1
                continue
            if record.expires_at and record.expires_at <= now:
                self._bury(queue, record, "expired")
                self.counters["expired"] += 1
                continue
            window = windows[index]
            peer: Peer = window.peer  # type: ignore[assignment]
            record.state = IN_FLIGHT
            window.held[record.id] = record
            chunks = outbox.get(peer.id)
            if chunks is None:
                chunks = outbox[peer.id] = []
            chunks.append(
                encode_dispatch(
                    packet,
                    record.content,
                    record.id,
                    record.remaining_ttl(now) if peer.ttl_form else None,
                    record.deliveries if peer.extensions else None,
                )
            )
            dispatched += 1
            if len(window.held) >= window.limit:
                del windows[index]
                count -= 1
                if not count:
                    break
                if index >= count:
                    index = 0
            else:
                index = index + 1 if index + 1 < count else 0
        queue.in_flight += dispatched
        self.counters["dispatched"] += dispatched

    def _watch_expiry(self, queue: Queue, record: Record) -> None:
        self._expiry_seq += 1
        heapq.heappush(self._expiry, (record.expires_at, self._expiry_seq, queue, record))

    def _expire_due(self) -> None:
        heap = self._expiry
        now = self.now
        while heap and heap[0][0] <= now:
            expires_at, _, queue, record = heapq.heappop(heap)
            if record.state != READY or record.expires_at != expires_at:
                continue  # dispatched, acked or re-timed since it was watched
            queue.stale += 1
            self._bury(queue, record, "expired")
            self.counters["expired"] += 1
            queue.compact()

    def _bury(self, queue: Queue, record: Record, reason: str, in_flight: bool = False) -> None:
        """Move a record to the dead-letter store; the entry counts the deliveries made."""
        record.state = GONE
        delivered = record.deliveries if in_flight else record.deliveries - 1
        queue.add_dead(
            DeadLetterEntry(record.id, record.content, reason, delivered, self.clock.wall())
        )
        self.counters["dead_lettered"] += 1

    def _reply(self, peer: Peer, message: Message) -> None:
        chunks = self._outbox.get(peer.id)
        if chunks is None:
            chunks = self._outbox[peer.id] = []
        chunks.append(encode(message))

    def _refuse(
        self,
        peer: Peer,
        code: int,
        reason: str,
        message_id: str | None = None,
        queue: str | None = None,
    ) -> None:
        """An ERROR to extension peers; a counted, rate-limited log line for stock peers."""
        self.counters["errors"] += 1
        if peer.extensions:
            self._reply(peer, Error(int(code), reason, message_id, queue))
        else:
            self._log_limited(f"refused from {peer.id.hex()}: {code} {reason}", str(int(code)))

    def _log_limited(self, line: str, key: str) -> None:
        """At most one line per second per key, with the count of lines held back."""
        last_ns, held_back = self._last_log.get(key, (0, 0))
        if self.now - last_ns >= NS_PER_SECOND or last_ns == 0:
            suffix = f" ({held_back} similar lines held back)" if held_back else ""
            log.warning("%s%s", line, suffix)
            self._last_log[key] = (self.now, 0)
        else:
            self._last_log[key] = (last_ns, held_back + 1)


def queue_name_problem(name: str) -> str | None:
    """Why `name` is not a valid queue name, or None if it is."""
    if not name:
        return "queue name is empty"
    if len(name.encode()) > MAX_QUEUE_NAME_BYTES:
        return f"queue name is longer than {MAX_QUEUE_NAME_BYTES} bytes"
    if not name.isprintable() or any(ch.isspace() for ch in name):
        return "queue name contains whitespace or control characters"
    return None


__all__ = ["Core", "Peer", "ProtocolError", "queue_name_problem"]
