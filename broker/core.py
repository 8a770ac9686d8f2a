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
import math
from collections.abc import Callable
from typing import Any

import msgspec

from ..protocol import (
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
    clamp_liveness,
    decode_frame,
    encode,
    encode_confirm,
    encode_dispatch,
    key_problem,
    queue_name_problem,
)
from .admin import run_admin
from .clock import Clock
from .config import BrokerConfig, QueueSettings
from .dedup import KeyWindow
from .durable import BACK, DEAD, DROP, FLY, KEY, PURGE, PUT, UNDEAD, UNKEY
from .store import (
    DELAYED,
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
from .timers import DELAY_OVER, HEARTBEAT, LEASE, PEER_EXPIRY, Timers

log = logging.getLogger("phpmq.broker")
_json = msgspec.json.Encoder()

BROKER_NAME = "phpmq-zmq"
BROKER_VERSION = "0.1.0"
NS_PER_MS = 1_000_000
#: Peers declared gone without a goodbye that are remembered as extension peers.
MAX_DEPARTED_PEERS = 10_000
#: The TTL heap is compacted when it grows past twice its live entries, and never below this.
EXPIRY_COMPACT_MIN = 65_536
UNKNOWN_PEER_REASON = (
    "unknown peer: say HELLO again and re-consume (the broker restarted or gave up on you)"
)
FIRST_EXTENSION_TYPE = min(EXTENSION_TYPES)
#: 005 and 006 exist only in the README (TTL) dialect: a peer that sends them speaks it.
TTL_DIALECT_ONLY_TYPES = frozenset((MessageType.REQUEUE, MessageType.DEAD_LETTER))
#: Peer ids of raw-TCP connections: the STREAM routing id behind two zero bytes, a prefix no
#: ROUTER identity has (libzmq refuses custom identities starting with a zero byte, and its
#: own are 5 bytes long).
TCP_PEER_PREFIX = b"\x00\x00tcp:"
#: Expired idempotency keys are deleted from the durable store at most this often.
KEY_PURGE_INTERVAL_NS = 1_000_000_000


class Peer:
    """A client as the core knows it, keyed by its ZeroMQ routing id."""

    __slots__ = (
        "closing",
        "confirm",
        "expiry_ns",
        "extensions",
        "forgotten",
        "heartbeat_ns",
        "hello",
        "id",
        "last_seen",
        "last_sent",
        "name",
        "report",
        "role",
        "expiry_due",
        "heartbeat_due",
        "ttl_form",
        "windows",
    )

    def __init__(self, peer_id: bytes, ttl_form: bool, now: int) -> None:
        self.id = peer_id
        #: Dispatch in the TTL (README) form; switched on by any TTL-form or extension message.
        self.ttl_form = ttl_form
        #: Spoke an extension type: gets ERROR replies and delivery counts.
        self.extensions = False
        #: Said HELLO: the broker knows who it is (a HEARTBEAT without it gets DISCONNECT).
        self.hello = False
        #: Said HELLO with `confirm: true`: every 001 it sends is answered (CONFIRM or ERROR).
        self.confirm = False
        self.windows: dict[str, Window] = {}
        self.name = ""
        self.role = ""
        #: What a bridge last reported about itself (ADMIN `report`), shown by `stats`.
        self.report: dict[str, Any] | None = None
        #: Sent DISCONNECT: gets no new work, may still ack what it holds.
        self.closing = False
        #: Said KBAI or was declared gone: a later message from the same id starts afresh.
        self.forgotten = False
        #: Agreed heartbeat interval, and the silence after which it is dead (0: no heartbeats).
        self.heartbeat_ns = 0
        self.expiry_ns = 0
        #: Monotonic ns of the last frame from it, and of the last frame to it.
        self.last_seen = now
        self.last_sent = now
        #: When its liveness check and its next heartbeat are due (0: not armed). A timer
        #: entry acts only if its time is still the one recorded here, so re-arming earlier
        #: (a new HELLO) makes older entries moot.
        self.expiry_due = 0
        self.heartbeat_due = 0


class Core:
    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        new_id: Callable[[], str] | None = None,
        ttl_form_default: bool = True,
        tcp_ttl_form_default: bool = False,
    ) -> None:
        self.config = config
        self.clock = clock
        self.new_id = new_id or IdSource()
        self.ttl_form_default = ttl_form_default
        self.tcp_ttl_form_default = tcp_ttl_form_default
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
                "lease_expired",
                "peers_expired",
                "max_deliveries",
                "overflowed",
                "confirmed",
                "deduplicated",
                "errors",
            ),
            0,
        )
        self.timers = Timers()
        #: Durable mode: every change of a message's fate, for the store (broker/durable.py);
        #: None in memory mode, where nothing is journaled.
        self.journal: list[tuple] | None = None
        #: Set while the store cannot write: sends are refused with this reason.
        self.storage_problem: str | None = None
        self._tail_seq = 0
        self._head_seq = 0
        #: Raw-TCP peers given up on: the shell closes their connections (the core has none).
        self.tcp_to_close: list[bytes] = []
        #: The durable store's `stats()`, for the stats command (None in memory mode).
        self.storage_stats: Callable[[], dict[str, Any]] | None = None
        self._heartbeats_due: list[Peer] = []
        #: Extension peers declared gone without a goodbye, most recent last (bounded).
        self._departed: dict[bytes, None] = {}
        self._timer_handlers: dict[int, Callable[[int, Any], None]] = {
            PEER_EXPIRY: self._on_peer_expiry_due,
            HEARTBEAT: self._on_heartbeat_due,
            LEASE: self._on_lease_due,
            DELAY_OVER: self._on_delay_over,
        }
        self._outbox: dict[bytes, list[bytes]] = {}
        #: Durable mode: CONFIRMs held until the turn's commit is on disk (release_confirms).
        self._confirms: dict[bytes, list[bytes]] = {}
        self.keys = KeyWindow(
            int(config.dedup_window_seconds * NS_PER_SECOND), config.max_dedup_keys
        )
        self._keys_purged_at = self.now
        self._dirty: dict[Queue, None] = {}
        #: (expires_at, tiebreak, queue, record) for READY records with a TTL.
        self._expiry: list[tuple[int, int, Queue, Record]] = []
        self._expiry_seq = 0
        self._expiry_compact_at = EXPIRY_COMPACT_MIN
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
        if self.keys:
            self._expire_keys()

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
        peer.last_seen = self.now  # any message counts as a heartbeat
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
        if peer.extensions or peer.ttl_form != self._default_form(peer_id):
            if not peer.expiry_due and not peer.forgotten:
                # Remembered, so bound how long: HELLO arms its own check; others idle out.
                self._arm_expiry(peer, self.now + self._idle_ns)
        elif not peer.windows:
            # Nothing to remember about a stock producer; forgetting it keeps memory flat
            # however many identities come and go.
            self.peers.pop(peer_id, None)

    def _peer(self, peer_id: bytes) -> Peer:
        peer = self.peers.get(peer_id)
        if peer is None:
            peer = self.peers[peer_id] = Peer(peer_id, self._default_form(peer_id), self.now)
            if self._departed.pop(peer_id, False) is None:
                self._opt_in(peer)  # a peer given up on comes back: it speaks extensions
        return peer

    def _default_form(self, peer_id: bytes) -> bool:
        if peer_id.startswith(TCP_PEER_PREFIX):
            return self.tcp_ttl_form_default
        return self.ttl_form_default

    def end_turn(self) -> list[tuple[bytes, bytes]]:
        """Expire, run due timers, dispatch, and return what to send: one frame per peer."""
        self._expire_due()
        if self.timers.next_deadline() is not None:
            self._run_timers()
        if self._dirty and not self.draining:
            dirty = self._dirty
            self._dirty = {}
            for queue in dirty:
                self._dispatch(queue)
        else:
            self._dirty.clear()
        if self._heartbeats_due:
            self._send_due_heartbeats()
        outbox = self._outbox
        if not outbox:
            return []
        self._outbox = {}
        now = self.now
        peers = self.peers
        frames = []
        for peer_id, chunks in outbox.items():
            peer = peers.get(peer_id)
            if peer is not None:
                peer.last_sent = now
            frames.append((peer_id, b"".join(chunks)))
        return frames

    def release_confirms(self) -> list[tuple[bytes, bytes]]:
        """Durable mode: the CONFIRMs of every send committed so far, one frame per peer. The
        shell calls it only after a commit succeeded, so nothing is confirmed before it is on
        disk; while the store fails they wait here. (In memory mode confirms go out with the
        turn's other replies.)"""
        confirms = self._confirms
        if not confirms:
            return []
        self._confirms = {}
        now = self.now
        peers = self.peers
        frames = []
        for peer_id, chunks in confirms.items():
            peer = peers.get(peer_id)
            if peer is not None:
                peer.last_sent = now  # a CONFIRM spares the peer a heartbeat
            frames.append((peer_id, b"".join(chunks)))
        return frames

    def next_deadline(self) -> int | None:
        """Monotonic ns of the next thing the core must do on its own: now, if a queue is
        waiting for a dispatch pass, else the earliest TTL expiry or timer, else None."""
        if self._dirty and not self.draining:
            return self.now
        deadlines = [d for d in (self.timers.next_deadline(), self._expiry_deadline()) if d]
        return min(deadlines) if deadlines else None

    def _expiry_deadline(self) -> int | None:
        return self._expiry[0][0] if self._expiry else None

    def peer_gone(self, peer_id: bytes, said_goodbye: bool = False) -> int:
        """The peer is gone (KBAI, transport error, silence): its held messages return to the
        head of their queues. Returns how many.

        An extension peer that did not say goodbye is remembered for a while: if it was only
        frozen, what it sends later (late acks) is refused with ERRORs and its next
        heartbeat is told to say HELLO again, instead of being taken for a stock peer.
        """
        peer = self.peers.pop(peer_id, None)
        if peer is None:
            return 0
        peer.forgotten = True
        if peer_id.startswith(TCP_PEER_PREFIX) and not said_goodbye:
            self.tcp_to_close.append(peer_id)
        if peer.extensions and not said_goodbye:
            self._departed[peer_id] = None
            if len(self._departed) > MAX_DEPARTED_PEERS:
                del self._departed[next(iter(self._departed))]
        return self._release_all(peer)

    def replay_dead(self, queue: Queue, entry: DeadLetterEntry) -> None:
        """A dead letter back at the tail of its queue, same ID, no TTL (dlq-replay)."""
        record = Record(entry.id, entry.content, 0, entry.deliveries + 1, headers=entry.headers)
        self._place(queue, record, to_head=False)
        if self.journal is not None:
            self.journal.append((UNDEAD, queue.name, entry.id))
            self._journal_put(queue, record)
        self._dirty[queue] = None

    def purge_dead(self, queue: Queue) -> int:
        purged = len(queue.dead)
        queue.dead.clear()
        if self.journal is not None:
            self.journal.append((PURGE, queue.name))
        return purged

    def restore_keys(self, keys: list) -> int:
        """Idempotency keys from the durable store, those still inside their window; returns
        how many."""
        wall = self.clock.wall()
        window_ns = self.keys.window_ns
        restored = 0
        for stored in sorted(keys, key=lambda k: k.expires_wall):
            if stored.expires_wall > wall and window_ns:
                # Not past today's window either, if it was shortened: keeps expiry order.
                remaining = min(int((stored.expires_wall - wall) * NS_PER_SECOND), window_ns)
                self.keys.add(stored.queue, stored.key, stored.id, self.now + remaining)
                restored += 1
        if self.journal is not None and restored < len(keys):
            # Expired while down, or keys are off now: delete them from the store too.
            self.journal.append((UNKEY, wall if window_ns else math.inf))
        return restored

    def restore(self, messages: list, dead_letters: list) -> tuple[int, int, int]:
        """Rebuild the queues from the durable store at start: messages in their order, TTLs
        from their wall-clock deadlines (expired ones are dead-lettered), those that were in
        flight back as ready with delivery count +1. Returns (ready, were in flight, dead)."""
        wall = self.clock.wall()
        were_in_flight = 0
        for stored in messages:
            queue = self.queues.get(stored.queue) or self._new_queue(stored.queue)
            expires_at = 0
            if stored.expires_wall:
                expires_at = self.now + int((stored.expires_wall - wall) * NS_PER_SECOND)
            record = Record(
                stored.id, stored.content, expires_at, stored.deliveries, headers=stored.headers
            )
            self._tail_seq = max(self._tail_seq, stored.seq)
            self._head_seq = min(self._head_seq, stored.seq)
            record.seq = stored.seq
            if stored.in_flight:  # back as ready, in its place, with one more delivery
                were_in_flight += 1
                if not self._count_delivery(queue, record):
                    continue
                if self.journal is not None:
                    self._journal_back(record)
            queue.ready.append(record)
            if expires_at:
                self._watch_expiry(queue, record)
        for stored in dead_letters:
            queue = self.queues.get(stored.queue) or self._new_queue(stored.queue)
            queue.add_dead(
                DeadLetterEntry(
                    stored.id,
                    stored.content,
                    stored.reason,
                    stored.deliveries,
                    stored.dead_at,
                    stored.headers,
                )
            )
        return self.ready, were_in_flight, sum(len(q.dead) for q in self.queues.values())

    def mark_dirty(self, queue: Queue) -> None:
        """Ask for a dispatch pass over `queue` at the end of this turn."""
        self._dirty[queue] = None

    def start_drain(self) -> None:
        """Stop taking sends and dispatching; acks of held messages still work. Every peer
        that speaks extensions is told to go elsewhere or come back later."""
        self.draining = True
        for peer in self.peers.values():
            if peer.extensions:
                self._reply(peer, Disconnect("broker shutting down: reconnect later"))

    @property
    def in_flight(self) -> int:
        return sum(queue.in_flight for queue in self.queues.values())

    @property
    def ready(self) -> int:
        """Messages waiting for a consumer, including delayed requeues."""
        return sum(queue.ready_count + queue.delayed for queue in self.queues.values())

    # ----------------------------------------------------------------- message handlers

    def _on_send(self, peer: Peer, message: Send) -> None:
        tag = message.tag
        if tag is not None:
            self._opt_in(peer)  # asking for an answer is speaking the extensions
        elif message.ttl is not None or message.headers is not None:
            peer.ttl_form = True
        if self.draining:
            self._refuse(
                peer, ErrorCode.SHUTTING_DOWN, "broker is shutting down", None, message.queue, tag
            )
            return
        if self.storage_problem is not None:
            self._refuse(
                peer,
                ErrorCode.INSUFFICIENT_STORAGE,
                self.storage_problem,
                None,
                message.queue,
                tag,
            )
            return
        key = message.key
        if key is not None and self._is_repeat(peer, message):
            return
        queue = self._queue(peer, message.queue, tag)
        if queue is None:
            return
        if (
            queue.max_length
            and queue.ready_count >= queue.max_length
            and not self._make_room(peer, queue, tag)
        ):
            return
        ttl = message.ttl or 0
        record = Record(
            self.new_id(), message.content, self.now + ttl * NS_PER_SECOND if ttl else 0
        )
        if message.headers:
            record.headers = _json.encode(message.headers)
        self._place(queue, record, to_head=False)
        if self.journal is not None:
            self._journal_put(queue, record)
        if key is not None and self.keys.window_ns:
            self._remember_key(queue.name, key, record.id)
        if ttl:
            self._watch_expiry(queue, record)
        if queue.windows:
            self._dirty[queue] = None
        self.counters["received"] += 1
        self._confirm(peer, record.id, tag)

    def _is_repeat(self, peer: Peer, message: Send) -> bool:
        """A send whose idempotency key is bad (refused) or was already accepted on its
        queue within the window (confirmed with the first message's ID): nothing to queue."""
        problem = key_problem(message.key)  # type: ignore[arg-type]
        if problem is not None:
            self._refuse(peer, ErrorCode.INVALID_VALUE, problem, None, message.queue, message.tag)
            return True
        first_id = self.keys.get(message.queue, message.key)  # type: ignore[arg-type]
        if first_id is None:
            return False
        self.counters["deduplicated"] += 1
        self._confirm(peer, first_id, message.tag)
        return True

    def _remember_key(self, queue_name: str, key: str, message_id: str) -> None:
        expires_at = self.now + self.keys.window_ns
        self.keys.add(queue_name, key, message_id, expires_at)
        if self.journal is not None:
            self.journal.append((KEY, queue_name, key, message_id, self._wall_at(expires_at)))

    def _expire_keys(self) -> None:
        if not self.keys.expire(self.now) or self.journal is None:
            return
        if self.now - self._keys_purged_at >= KEY_PURGE_INTERVAL_NS:
            self._keys_purged_at = self.now
            self.journal.append((UNKEY, self.clock.wall()))

    def _confirm(self, peer: Peer, message_id: str, tag: int | None) -> None:
        """CONFIRM a send that asked for it (a tag, or a HELLO with `confirm`): with the
        turn's replies in memory mode; in durable mode held until the turn's commit is on
        disk (release_confirms)."""
        if tag is None and not peer.confirm:
            return
        outbox = self._outbox if self.journal is None else self._confirms
        chunks = outbox.get(peer.id)
        if chunks is None:
            chunks = outbox[peer.id] = []
        chunks.append(encode_confirm(message_id, tag))
        self.counters["confirmed"] += 1

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
            if len(queue.windows) >= self.config.max_consumers:
                self._refuse(
                    peer,
                    ErrorCode.LIMIT_REACHED,
                    f"queue {queue.name!r} has the maximum of {self.config.max_consumers}"
                    " consumers",
                    None,
                    queue.name,
                )
                return
            window = peer.windows[queue.name] = Window(peer, queue, count)
            queue.windows.append(window)
        if message.lease_ms is not None:
            window.lease_ms = message.lease_ms
        window.limit = 0 if peer.closing else count
        self._close_window_if_idle(window)
        self._dirty[queue] = None

    def _on_ack(self, peer: Peer, message: Ack) -> None:
        record = self._take_held(peer, message.queue, message.message_id, "ack")
        if record is not None:
            record.state = GONE
            self.counters["acked"] += 1
            if self.journal is not None:
                self.journal.append((DROP, record.id))

    def _on_requeue(self, peer: Peer, message: Requeue) -> None:
        record = self._take_held(peer, message.queue, message.message_id, "requeue")
        if record is None:
            return
        record.expires_at = self.now + message.ttl * NS_PER_SECOND if message.ttl else 0
        queue = self.queues[message.queue]
        if message.delay_ms:
            self._delay(queue, record, message.delay_ms)
        else:
            self._return(queue, record, to_head=False)
        self.counters["requeued"] += 1

    def _on_dead_letter(self, peer: Peer, message: DeadLetter) -> None:
        record = self._take_held(peer, message.queue, message.message_id, "dead-letter")
        if record is not None:
            self._bury(self.queues[message.queue], record, message.reason or "rejected", True)

    def _on_hello(self, peer: Peer, message: Hello) -> None:
        """Agree on heartbeats (docs/protocol.md §6.2) and answer with the broker's terms."""
        options = message.options
        config = self.config
        peer.hello = True
        peer.confirm = options.get("confirm") is True
        peer.name = _text_option(options, "name")
        peer.role = _text_option(options, "role")
        heartbeat_ms = options.get("heartbeat_ms")
        liveness = 0
        if type(heartbeat_ms) is int and heartbeat_ms > 0:
            heartbeat_ms = min(max(heartbeat_ms, config.min_heartbeat_ms), config.max_heartbeat_ms)
            liveness = options.get("liveness")
            liveness = clamp_liveness(liveness, config.liveness)
            peer.heartbeat_ns = heartbeat_ms * NS_PER_MS
            peer.expiry_ns = peer.heartbeat_ns * liveness
        else:
            heartbeat_ms = 0
            peer.heartbeat_ns = peer.expiry_ns = 0
        self._arm_expiry(peer, self.now + (peer.expiry_ns or self._idle_ns))
        if peer.heartbeat_ns:
            self._arm_heartbeat(peer, self.now + peer.heartbeat_ns)
        else:
            peer.heartbeat_due = 0
        self._reply(
            peer,
            Hello(
                {
                    "broker": BROKER_NAME,
                    "version": BROKER_VERSION,
                    "broker_heartbeat_ms": config.heartbeat_ms,
                    "heartbeat_ms": heartbeat_ms,
                    "liveness": liveness,
                    "lease_ms": self._peer_lease_ms(peer),
                    "max_content_bytes": config.max_content_bytes,
                    "max_window": config.max_window,
                    "confirm": peer.confirm,
                    "durable": self.journal is not None,
                    "dedup_window_ms": int(config.dedup_window_seconds * 1000),
                }
            ),
        )

    def _on_heartbeat(self, peer: Peer, message: Heartbeat) -> None:
        """Any message shows the peer is alive. A heartbeat from a peer that never said HELLO
        (the broker restarted, or declared it dead) asks it to start over."""
        if not peer.hello:
            self._reply(peer, Disconnect(UNKNOWN_PEER_REASON))

    def _on_disconnect(self, peer: Peer, message: Disconnect) -> None:
        """eMQP: answer KBAI, send no more work, let the peer finish (ack) what it holds."""
        peer.closing = True
        for window in list(peer.windows.values()):
            window.limit = 0
            self._close_window_if_idle(window)
        self._reply(peer, Kbai())

    def _on_kbai(self, peer: Peer, message: Kbai) -> None:
        """Goodbye: whatever the peer still holds goes back to the head of its queue."""
        self.peer_gone(peer.id, said_goodbye=True)

    def _on_admin(self, peer: Peer, message: Admin) -> None:
        """The answer is always an ADMIN_REPLY, so a client can tell it from other refusals."""
        try:
            result = run_admin(self, message.options, peer)
        except ValueError as exc:
            self.counters["errors"] += 1
            result = {"error": {"code": int(ErrorCode.INVALID_VALUE), "reason": str(exc)}}
        self._reply(peer, AdminReply(result))

    # ----------------------------------------------------------------- internals

    def _opt_in(self, peer: Peer) -> None:
        peer.extensions = True
        peer.ttl_form = True

    def _arm_expiry(self, peer: Peer, when: int) -> None:
        peer.expiry_due = when
        self.timers.arm(when, PEER_EXPIRY, peer)

    def _arm_heartbeat(self, peer: Peer, when: int) -> None:
        peer.heartbeat_due = when
        self.timers.arm(when, HEARTBEAT, peer)

    # ----------------------------------------------------------------- timers

    def _run_timers(self) -> None:
        handlers = self._timer_handlers
        for when, kind, target in self.timers.due(self.now):
            handlers[kind](when, target)

    def _current(self, peer: Peer) -> bool:
        return self.peers.get(peer.id) is peer

    def _on_peer_expiry_due(self, when: int, peer: Peer) -> None:
        """A heartbeating peer silent for interval x liveness is dead; an extension peer that
        does not heartbeat is forgotten once it holds nothing and has been quiet too long."""
        if when != peer.expiry_due or not self._current(peer):
            return
        if peer.expiry_ns:
            deadline = peer.last_seen + peer.expiry_ns
        else:
            deadline = peer.last_seen + self._idle_ns
            if peer.windows:  # dispatch to a vanished peer fails and releases its messages
                deadline = max(deadline, self.now + self._idle_ns)
        if deadline > self.now:
            self._arm_expiry(peer, deadline)
            return
        returned = self.peer_gone(peer.id)
        if peer.expiry_ns:
            self.counters["peers_expired"] += 1
            log.warning(
                "peer %s %s silent for %.1fs (interval x liveness): gone; %d messages back"
                " to their queues",
                peer.id.hex(),
                peer.name or "",
                (self.now - peer.last_seen) / NS_PER_SECOND,
                returned,
            )

    def _on_heartbeat_due(self, when: int, peer: Peer) -> None:
        """A peer the broker may owe a heartbeat: decided after this turn's dispatch, which
        may send it something anyway."""
        if when != peer.heartbeat_due or not self._current(peer) or not peer.heartbeat_ns:
            return
        due = peer.last_sent + peer.heartbeat_ns
        if due > self.now:
            self._arm_heartbeat(peer, due)
        else:
            self._heartbeats_due.append(peer)

    def _send_due_heartbeats(self) -> None:
        outbox = self._outbox
        for peer in self._heartbeats_due:
            if not self._current(peer):
                continue  # declared gone in this turn
            if peer.id not in outbox:
                self._reply(peer, Heartbeat())
            self._arm_heartbeat(peer, self.now + peer.heartbeat_ns)
        self._heartbeats_due.clear()

    def _on_lease_due(self, when: int, window: Window) -> None:
        """Messages held past their lease go back to the head of their queue.

        One timer per window, not per message: it is armed for the earliest lease the window
        holds, and on firing takes back what ran out and re-arms for the next. Acks touch no
        timer, so a busy stock consumer costs one heap entry however fast it goes.
        """
        if when != window.lease_due:
            return  # superseded by an earlier lease
        window.lease_due = 0
        queue = window.queue
        if window.peer.windows.get(queue.name) is not window:  # type: ignore[attr-defined]
            return  # the window was closed or its peer released everything
        now = self.now
        held = window.held
        expired = [r for r in held.values() if r.lease_until and r.lease_until <= now]
        for record in expired:
            del held[record.id]
        queue.in_flight -= len(expired)
        self.counters["lease_expired"] += len(expired)
        for record in reversed(expired):  # back to the head, in dispatch order
            self._return(queue, record, to_head=True)
        if expired:
            self._log_limited(
                f"{len(expired)} leases on {queue.name!r} ran out with peer"
                f" {window.peer.id.hex()}: back to the queue",  # type: ignore[attr-defined]
                "lease",
            )
            self._dirty[queue] = None
        self._arm_lease(window)
        self._close_window_if_idle(window)

    def _arm_lease(self, window: Window) -> None:
        deadlines = [r.lease_until for r in window.held.values() if r.lease_until]
        if deadlines:
            window.lease_due = min(deadlines)
            self.timers.arm(window.lease_due, LEASE, window)

    # ----------------------------------------------------------------- queues and records

    def _queue(self, peer: Peer, name: str, tag: int | None = None) -> Queue | None:
        queue = self.queues.get(name)
        if queue is not None:
            return queue
        reason = queue_name_problem(name)
        if reason is not None:
            self._refuse(peer, ErrorCode.INVALID_VALUE, reason, tag=tag)
            return None
        config = self.config
        if len(self.queues) >= config.max_queues:
            self._refuse(
                peer,
                ErrorCode.LIMIT_REACHED,
                f"the broker has the maximum of {config.max_queues} queues",
                None,
                name,
                tag,
            )
            return None
        return self._new_queue(name)

    def _new_queue(self, name: str) -> Queue:
        config = self.config
        settings = config.queues.get(name) or QueueSettings()
        queue = self.queues[name] = Queue(
            name,
            config.dead_letter_limit,
            _setting(settings.max_deliveries, config.max_deliveries),
            _setting(settings.max_length, config.max_queue_length),
            settings.overflow or config.overflow,
        )
        return queue

    def _make_room(self, peer: Peer, queue: Queue, tag: int | None) -> bool:
        """A send to a full queue: refuse it, or bury the oldest ready message for it."""
        self.counters["overflowed"] += 1
        if queue.overflow == "reject":
            self._refuse(
                peer,
                ErrorCode.LIMIT_REACHED,
                f"queue {queue.name!r} is full ({queue.max_length} ready messages)",
                None,
                queue.name,
                tag,
            )
            return False
        ready = queue.ready
        while ready:
            oldest = ready.popleft()
            if oldest.state == READY:
                self._bury(queue, oldest, "overflow")
                return True
            queue.stale -= 1
        return True

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

    def _release_all(self, peer: Peer) -> int:
        returned = 0
        for window in peer.windows.values():
            queue = window.queue
            records = list(window.held.values())
            window.held.clear()
            queue.in_flight -= len(records)
            # Back to the head, in the order they were dispatched.
            for record in reversed(records):
                self._return(queue, record, to_head=True)
            self.counters["redelivered"] += len(records)
            returned += len(records)
            if window in queue.windows:
                queue.windows.remove(window)
            self._dirty[queue] = None
        peer.windows.clear()
        return returned

    def _delay(self, queue: Queue, record: Record, delay_ms: int) -> None:
        """A requeue with a backoff: counted as a delivery now, queued when the delay ends."""
        if not self._count_delivery(queue, record):
            return
        record.state = DELAYED
        queue.delayed += 1
        self.timers.arm(self.now + delay_ms * NS_PER_MS, DELAY_OVER, (queue, record))
        if self.journal is not None:
            # On disk it is ready at the tail: after a restart the delay is not kept.
            record.seq = self._next_seq(to_head=False)
            self._journal_back(record)

    def _on_delay_over(self, when: int, target: tuple[Queue, Record]) -> None:
        queue, record = target
        if record.state != DELAYED:
            return
        queue.delayed -= 1
        record.state = READY
        self._place(queue, record, to_head=False)
        if self.journal is not None:
            self._journal_back(record)
        if record.expires_at:
            self._watch_expiry(queue, record)
        self._dirty[queue] = None

    def _return(self, queue: Queue, record: Record, to_head: bool) -> None:
        """A message comes back from a consumer: that was one more delivery. Past the queue's
        max-deliveries it is dead-lettered instead of being dispatched again."""
        if not self._count_delivery(queue, record):
            return
        record.state = READY
        self._place(queue, record, to_head)
        if self.journal is not None:
            self._journal_back(record)
        if record.expires_at:
            self._watch_expiry(queue, record)

    def _count_delivery(self, queue: Queue, record: Record) -> bool:
        """One more delivery; past the queue's max-deliveries the record is dead-lettered
        and False is returned."""
        record.deliveries += 1
        if queue.max_deliveries and record.deliveries > queue.max_deliveries:
            self.counters["max_deliveries"] += 1
            self._bury(queue, record, "max-deliveries")
            return False
        return True

    def _place(self, queue: Queue, record: Record, to_head: bool) -> None:
        """Into the queue's ready deque; `seq` records the place for the durable store."""
        record.seq = self._next_seq(to_head)
        if to_head:
            queue.ready.appendleft(record)
        else:
            queue.ready.append(record)

    def _next_seq(self, to_head: bool) -> int:
        if to_head:
            self._head_seq -= 1
            return self._head_seq
        self._tail_seq += 1
        return self._tail_seq

    def _wall_expiry(self, record: Record) -> float:
        return self._wall_at(record.expires_at) if record.expires_at else 0.0

    def _wall_at(self, monotonic_ns: int) -> float:
        return self.clock.wall() + (monotonic_ns - self.now) / NS_PER_SECOND

    def _journal_put(self, queue: Queue, record: Record) -> None:
        self.journal.append(  # type: ignore[union-attr]
            (
                PUT,
                record.id,
                queue.name,
                record.seq,
                record.content,
                record.headers,
                self._wall_expiry(record),
                record.deliveries,
            )
        )

    def _journal_back(self, record: Record) -> None:
        self.journal.append(  # type: ignore[union-attr]
            (BACK, record.id, record.seq, self._wall_expiry(record), record.deliveries)
        )

    def _dispatch(self, queue: Queue) -> None:
        ready = queue.ready
        if not ready:
            return
        windows = [w for w in queue.windows if len(w.held) < w.limit]
        if not windows:
            return
        leases = [self._lease_ns(window) for window in windows]
        arm = self.timers.arm
        journal = self.journal
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
            if journal is not None:
                journal.append((FLY, record.id))
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
            chunks.append(
                encode_dispatch(
                    packet,
                    record.content,
                    record.id,
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
        queue.in_flight += dispatched
        self.counters["dispatched"] += dispatched

    @property
    def _idle_ns(self) -> int:
        return int(self.config.idle_peer_seconds * NS_PER_SECOND)

    def _peer_lease_ms(self, peer: Peer) -> int:
        """The lease a window of this peer gets unless its 002 names one."""
        lease_ms = 0 if peer.heartbeat_ns else self.config.lease_ms
        cap = self.config.max_in_flight_ms
        return cap if cap and (not lease_ms or lease_ms > cap) else lease_ms

    def _lease_ns(self, window: Window) -> int:
        """How long a message dispatched into this window may stay unacked (0: forever).

        The consumer's own lease if it set one on 002; else the broker's lease for peers that
        do not heartbeat (the only sign they are alive is their acks), none for those that do;
        `max_in_flight_ms` caps both.
        """
        if window.lease_ms is None:
            return self._peer_lease_ms(window.peer) * NS_PER_MS  # type: ignore[arg-type]
        lease_ms = window.lease_ms
        cap = self.config.max_in_flight_ms
        if cap and (not lease_ms or lease_ms > cap):
            lease_ms = cap
        return lease_ms * NS_PER_MS

    def _watch_expiry(self, queue: Queue, record: Record) -> None:
        self._expiry_seq += 1
        heapq.heappush(self._expiry, (record.expires_at, self._expiry_seq, queue, record))
        if len(self._expiry) > self._expiry_compact_at:
            self._compact_expiry()

    def _compact_expiry(self) -> None:
        """Drop entries of records acked or dispatched since they were watched: otherwise a
        fast queue with long TTLs keeps one heap entry per message for the whole TTL."""
        live = [e for e in self._expiry if e[3].state == READY and e[3].expires_at == e[0]]
        heapq.heapify(live)
        self._expiry = live
        self._expiry_compact_at = max(EXPIRY_COMPACT_MIN, 2 * len(live))

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
        entry = DeadLetterEntry(
            record.id, record.content, reason, delivered, self.clock.wall(), record.headers
        )
        if self.journal is not None and len(queue.dead) == queue.dead.maxlen:
            self.journal.append((UNDEAD, queue.name, queue.dead[0].id))  # evicted by the bound
        queue.add_dead(entry)
        if self.journal is not None:
            self.journal.append(
                (
                    DEAD,
                    queue.name,
                    entry.id,
                    entry.content,
                    entry.reason,
                    entry.deliveries,
                    entry.dead_at,
                    entry.headers,
                )
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
        tag: int | None = None,
    ) -> None:
        """An ERROR to extension peers; a counted, rate-limited log line for stock peers."""
        self.counters["errors"] += 1
        if peer.extensions:
            self._reply(peer, Error(int(code), reason, message_id, queue, tag))
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


def _text_option(options: dict[str, Any], key: str) -> str:
    value = options.get(key)
    return value[:200] if isinstance(value, str) else ""


def _setting(override: int | None, default: int) -> int:
    return default if override is None else override


__all__ = ["Core", "Peer", "ProtocolError"]
