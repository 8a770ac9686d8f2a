"""The broker's pure core: a facade that routes each decoded message to the part that owns
it, and returns what the turn wants sent. No sockets and no clock reads of its own.

The server drives it once per loop turn:

    core.begin_turn()                                   # reads the injected clock once
    core.handle_frame(peer_id, payload, profile)        # for every frame read this turn
    turn = core.end_turn()                              # schedule, dispatch, heartbeats
    send(turn.frames); close(turn.close)

and tells it `peer_gone(peer_id)` when a transport cannot reach a peer. The parts, each with
one job (docs/architecture.md): queues (the queue table and positions), intake (sends, keys,
confirms), dispatch (windows, delivery, ack/requeue, leases, delays), expiry (TTL),
deadletters, peers (HELLO, liveness, goodbyes), schedules (jobs the broker runs), admin, and
one schedule for every deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import Any

from ..protocol import (
    EXTENSION_TYPES,
    Ack,
    Admin,
    Cancel,
    Consume,
    DeadLetter,
    Disconnect,
    ErrorCode,
    Forward,
    Heartbeat,
    Hello,
    Kbai,
    Message,
    MessageType,
    ProtocolError,
    Publish,
    Reply,
    Requeue,
    Send,
    decode_frame,
    decode_message,
)
from ..protocol.cluster import decode_map
from ..protocol.runs import (
    ACK_RUN_HEADER,
    SEND_RUN_HEADERS,
    ack_run,
    leading_queue,
    like_sends,
    run_queue,
    send_run,
    sends_and_acks,
)
from .admin import Admin as AdminCommands
from .batch_leases import BatchLeases
from .clock import Clock
from .config import BrokerConfig
from .context import Context, Frames
from .deadletters import DeadLetters
from .deadlines import (
    BATCH_LEASE_TIMEOUT,
    DELAY_OVER,
    HEARTBEAT,
    KEY_EXPIRY,
    KEY_LET_GO,
    LEASE,
    PEER_EXPIRY,
    PURGE_SLICE,
    SCHEDULE_RUN,
    TTL,
    UNUSED_QUEUE,
    Deadlines,
)
from .dispatch import DISPATCH_PER_TURN, Dispatch
from .events import Events
from .expiry import Expiry
from .flow import Flow
from .forwarding import OWN_FORWARD_MESSAGES, QUEUE_ADDRESSED, Forwarding
from .guard import Guard, Principal
from .intake import Intake
from .journal import Journal, NullJournal
from .lifecycle import Lifecycle
from .model import Counters, Peer, PeerProfile, Queue
from .peers import Peers
from .permissions import Permissions
from .queues import Queues
from .recovery import restore_keys, restore_messages
from .relayed import RelayedPeers, is_relayed
from .replies import Replies
from .schedules import Schedules

#: Scheduled entries (TTLs, leases, ...) handled in one turn at most; the rest wait a turn.
DUE_PER_TURN = 8_192

FIRST_EXTENSION_TYPE = min(EXTENSION_TYPES)
#: 005 and 006 exist only in the README (TTL) dialect: a peer that sends them speaks it.
TTL_DIALECT_ONLY_TYPES = frozenset((MessageType.REQUEUE, MessageType.DEAD_LETTER))


class Turn:
    """What a loop turn wants done: frames to send (one per peer), the peers whose transport
    connection to close because the broker gave up on them, and (a shard) frames for the
    links to other shards, by shard name."""

    __slots__ = ("close", "forwards", "frames")

    def __init__(
        self, frames: Frames, close: list[bytes], forwards: list[tuple[str, bytes]] | None = None
    ) -> None:
        self.frames = frames
        self.close = close
        self.forwards = forwards or []


def default_profile(config: BrokerConfig) -> PeerProfile:
    """The profile of ZeroMQ (ROUTER) peers under this configuration."""
    return PeerProfile("router", ttl_form=config.dialect == "ttl")


class Core:
    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        new_id: Callable[[], bytes] | None = None,
        journal: Journal | NullJournal | None = None,
        profile: PeerProfile | None = None,
    ) -> None:
        self.config = config
        journal = journal if journal is not None else NullJournal()
        self.ctx = ctx = Context(config, clock, journal, new_id)
        #: The profile of peers whose transport names none.
        self.profile = profile or default_profile(config)
        self._queues = Queues(ctx)
        self.dead_letters = DeadLetters(ctx, self._queues)
        self.expiry = Expiry(ctx, self.dead_letters, self._queues)
        self.dispatch = Dispatch(ctx, self._queues, self.dead_letters, self.expiry)
        self.flow = Flow(ctx, config.max_memory_bytes)
        self.intake = Intake(ctx, self._queues, self.dead_letters, self.expiry, self.flow)
        self.guard = Guard(ctx, Permissions(), config.binds_loopback())
        # A shard: every peer that goes is told to its forwarding and links (_become_shard).
        on_gone = self._shard_peer_gone if config.cluster else None
        self._peers = Peers(ctx, self.dispatch, self.flow, on_gone)
        self.events = Events(ctx, self._queues, self.intake, self.flow)
        self.leases = leases = BatchLeases(ctx, self._queues, self.dead_letters, self.expiry)
        self.lifecycle = lifecycle = Lifecycle(
            ctx, self._queues, self.dispatch, self.events, leases, self._peers
        )
        self.schedules = schedules = Schedules(ctx, self.intake, self.events)
        self.admin = AdminCommands(
            ctx,
            self._queues,
            self._peers,
            self.dead_letters,
            self.intake,
            self.flow,
            self.events,
            lifecycle,
            schedules,
            leases,
        )
        peers = self._peers
        self.replies = Replies(ctx, self._queues, self.dispatch, self.intake, peers.by_id)
        self._handlers: dict[type, Callable[[Peer, Any], None]] = {
            Send: self.intake.on_send,
            Publish: self.events.on_publish,
            Consume: lifecycle.on_consume,
            Cancel: lifecycle.on_cancel,
            Reply: self.replies.on_reply,
            Ack: self.dispatch.on_ack,
            Requeue: self.dispatch.on_requeue,
            DeadLetter: self.dispatch.on_dead_letter,
            Hello: self._on_hello,
            Heartbeat: peers.on_heartbeat,
            Disconnect: peers.on_disconnect,
            Kbai: peers.on_kbai,
            Admin: self._on_admin,
        }
        #: A shard: messages for other shards' queues go there; theirs come here relayed.
        self.forwarding: Forwarding | None = None
        self.relayed: RelayedPeers | None = None
        if config.cluster:
            self._become_shard(config)
        self._on_due: dict[int, Callable[[int, Any], None]] = {
            TTL: self.expiry.on_due,
            DELAY_OVER: self.dispatch.on_delay_over,
            LEASE: self.dispatch.on_lease_due,
            PEER_EXPIRY: peers.on_expiry_due,
            HEARTBEAT: peers.on_heartbeat_due,
            KEY_EXPIRY: self.intake.on_key_expiry,
            KEY_LET_GO: self.intake.on_let_go_due,
            PURGE_SLICE: self._queues.on_purge_due,
            UNUSED_QUEUE: lifecycle.on_unused_due,
            SCHEDULE_RUN: schedules.on_run_due,
            BATCH_LEASE_TIMEOUT: leases.on_timeout_due,
        }
        self._is_live: dict[int, Callable[[int, Any], bool]] = {
            TTL: self.expiry.is_live,
            DELAY_OVER: self.dispatch.is_delay_live,
            LEASE: self.dispatch.is_lease_live,
            PEER_EXPIRY: peers.is_expiry_live,
            HEARTBEAT: peers.is_heartbeat_live,
            KEY_EXPIRY: self.intake.is_key_expiry_live,
            KEY_LET_GO: self.intake.is_let_go_live,
            PURGE_SLICE: self._queues.is_purge_live,
            UNUSED_QUEUE: lifecycle.is_unused_live,
            SCHEDULE_RUN: schedules.is_run_live,
            BATCH_LEASE_TIMEOUT: leases.is_timeout_live,
        }

    def _become_shard(self, config: BrokerConfig) -> None:
        self.forwarding = Forwarding(self.ctx, decode_map(config.cluster.encode()), config.shard)
        self.relayed = RelayedPeers(
            self.ctx, self._peers, self.guard, self.handle_frame, self.profile
        )
        self._handlers[Forward] = self.relayed.on_forward
        self.admin.stats.add_section("cluster", self.forwarding.stats)

    def set_cluster(self, cluster: str, shard: str) -> None:
        """A new map of this shard's cluster (docs/cluster.md "Membership"): the same shards,
        their replicas moved. HELLO answers and forwarding use it from now on."""
        if self.forwarding is not None:
            self.forwarding.set_map(decode_map(cluster.encode()))
        self._peers.set_cluster(cluster, shard)

    def _shard_peer_gone(self, peer: Peer) -> None:
        forwarding = self.forwarding
        if forwarding is not None and (peer.forwarding or forwarding.copied(peer)):
            forwarding.peer_gone(peer)
        if peer.link and self.relayed is not None:
            self.relayed.link_gone(peer.id)

    # ----------------------------------------------------------------- what others read

    @property
    def now(self) -> int:
        return self.ctx.now

    @property
    def counters(self) -> Counters:
        return self.ctx.counters

    @property
    def queues(self) -> dict[str, Queue]:
        return self._queues.by_name

    @property
    def peers(self) -> dict[bytes, Peer]:
        return self._peers.by_id

    @property
    def journal(self) -> Journal | NullJournal:
        return self.ctx.journal

    @property
    def deadlines(self) -> Deadlines:
        return self.ctx.deadlines

    @property
    def draining(self) -> bool:
        return self.ctx.draining

    @property
    def in_flight(self) -> int:
        return self._queues.in_flight

    @property
    def ready(self) -> int:
        """Messages waiting for a consumer, including delayed requeues."""
        return self._queues.ready

    def note_input_pending(self, pending: bool) -> None:
        """The server says whether its last turn left frames unread (its budget ran out):
        while it did, no peer is declared dead for silence (its frames may be among them)."""
        self.ctx.input_pending = pending

    def set_storage_problem(self, problem: str | None) -> None:
        """While set, sends are refused (507) with this reason: the store cannot write."""
        self.ctx.storage_problem = problem

    @property
    def storage_problem(self) -> str | None:
        return self.ctx.storage_problem

    def set_standby(self, reason: str, leader_hint: str | None) -> None:
        """A follower replica of its shard (docs/cluster.md "Replicated queues"): its queues
        are forwarded to the leader (`leader_hint`: its endpoint, when known)."""
        ctx = self.ctx
        if ctx.standby is None and self.forwarding is not None:
            self.forwarding.forget_owners()
        ctx.standby, ctx.leader_hint = reason, leader_hint

    def serve_own_shard(self) -> None:
        """This replica leads its shard now (its store is loaded): its queues are served
        here, and the windows its peers held at the old leader open here."""
        forwarding = self.forwarding
        assert forwarding is not None
        self.ctx.standby = self.ctx.leader_hint = None
        forwarding.serve_own_shard()
        by_id = self._peers.by_id
        for peer, consume in forwarding.take_reopened():
            if by_id.get(peer.id) is peer:
                self.handle_messages(peer.id, [consume], profile=peer.profile)

    # ----------------------------------------------------------------- turn driving

    def begin_turn(self) -> None:
        ctx = self.ctx
        ctx.now = ctx.clock.monotonic_ns()
        ctx.turns += 1
        ctx.refusing, ctx.refused_sends = ctx.refused_sends, False
        ctx.stamp_ids()

    def handle_frame(
        self,
        peer_id: bytes,
        data: bytes,
        profile: PeerProfile | None = None,
        principal: Principal | None = None,
    ) -> None:
        """Process one ZeroMQ frame from a peer: one or more concatenated PHPMQ messages.
        `principal`: who the peer is, as its transport knows it (broker/guard.py)."""
        if self.ctx.refusing:  # sends were refused lately: this frame may be a run of them
            queue_name = run_queue(data)
            if queue_name is not None and (
                self.intake.refuses_sends_to(queue_name) or self._forbids(peer_id, queue_name)
            ):
                self._handle_run(peer_id, data, profile, principal)
                return
        if (
            self.forwarding is not None
            and not is_relayed(peer_id)
            and self._forwarded_whole(peer_id, data, profile, principal)
        ):
            return
        if data.startswith(ACK_RUN_HEADER):
            if self._acked_run(peer_id, data, profile, principal):
                return
        elif data[:8] in SEND_RUN_HEADERS and self._sent_run(peer_id, data, profile, principal):
            return
        messages, error = decode_frame(data, self._packet_limit(peer_id))
        self.handle_messages(peer_id, messages, error, profile, data, principal)

    def _packet_limit(self, peer_id: bytes) -> int:
        """The largest packet a peer's frame may hold: a shard link's FORWARDs carry frames
        (their messages are held to `max_content_bytes` when the owner reads them), so up to
        `max_frame_bytes`; anyone else's, `max_content_bytes`."""
        if self.relayed is not None:
            peer = self._peers.by_id.get(peer_id)
            if peer is not None and peer.link:
                return self.config.max_frame_bytes
        return self.config.max_content_bytes

    def _acked_run(
        self,
        peer_id: bytes,
        data: bytes,
        profile: PeerProfile | None,
        principal: Principal | None,
    ) -> bool:
        """A frame of acks for one queue of this shard (protocol/runs.py `ack_run`), settled
        without decoding a message, as `handle_messages` would settle them. False: it is
        decoded."""
        run = ack_run(data) if self._may_read_runs(peer_id) else None
        if run is None:
            return False
        name_bytes, message_ids = run
        taker = self._run_taker(peer_id, name_bytes, profile, principal)
        if taker is None:
            return False
        peer, name = taker
        self.ctx.handling = MessageType.ACK
        self.dispatch.ack_run(peer, name, message_ids)
        self._end_run(peer)
        return True

    def _sent_run(
        self,
        peer_id: bytes,
        data: bytes,
        profile: PeerProfile | None,
        principal: Principal | None,
    ) -> bool:
        """A frame of plain 001s to one queue of this shard (protocol/runs.py `send_run`), while
        the queue takes them unread (`Intake.takes_run`): put without decoding a message, as
        `handle_messages` would put them. Sends the broker stops taking part-way (a full
        queue, its memory limit) are decoded and go through `on_send`. False: the frame is
        decoded."""
        limit = self.config.max_content_bytes
        run = send_run(data, limit) if self._may_read_runs(peer_id) else None
        if run is None:
            return False
        taker = self._run_taker(peer_id, run.queue, profile, principal)
        if taker is None:
            return False
        peer, name = taker
        queue = self.intake.takes_run(name)
        if queue is None:
            return False
        self.ctx.handling = MessageType.SEND
        taken = self.intake.take_run(peer, queue, int(run.ttl) if run.ttl else None, run)
        if taken < len(run.contents):
            messages, error = decode_frame(data[run.offset_of(taken) :], limit)
            self.handle_messages(peer_id, messages, error, profile, None, principal)
            return True
        self._end_run(peer)
        return True

    def _may_read_runs(self, peer_id: bytes) -> bool:
        """False for a peer known to have a rights table: the guard reads each of its
        messages, so its frames are not scanned for runs first. One not identified yet (a
        relayed peer its FORWARD just made) holds no rights until `_run_taker` identifies
        it, which decides."""
        peer = self._peers.by_id.get(peer_id)
        return peer is None or peer.rights is None or peer.principal is None

    def _run_taker(
        self,
        peer_id: bytes,
        name_bytes: bytes,
        profile: PeerProfile | None,
        principal: Principal | None,
    ) -> tuple[Peer, str] | None:
        """The peer a run of one queue comes from and the queue's name, when the run may be
        taken unread: the queue is this shard's and the peer (as this frame identifies it)
        has no rights table. None: the frame is decoded."""
        try:
            name = name_bytes.decode()
        except UnicodeDecodeError:
            return None
        if not self._is_local(peer_id, name):
            return None
        peer = self._peer_for_input(peer_id, profile or self.profile, principal)
        return None if peer.rights is not None else (peer, name)

    def _end_run(self, peer: Peer) -> None:
        """What `handle_messages` does after a frame's messages."""
        self.ctx.flush_refusals()
        self._peers.after_input(peer)

    def _is_local(self, peer_id: bytes, queue: str) -> bool:
        """Whether this shard handles a message of `peer_id` to `queue` itself (a relayed
        peer's were forwarded once already)."""
        forwarding = self.forwarding
        return forwarding is None or is_relayed(peer_id) or forwarding.owner_of(queue) is None

    def _forwarded_whole(
        self,
        peer_id: bytes,
        data: bytes,
        profile: PeerProfile | None,
        principal: Principal | None,
    ) -> bool:
        """A frame of 001s and 004s for queues that one other shard owns goes there as it
        came, read by its headers only (`Forwarding.take_whole` without the decoding; the
        owner decodes it, and checks it with the peer's principal). False: it is decoded."""
        forwarding = self.forwarding
        name = leading_queue(data)
        if name is None or forwarding is None:
            return False
        try:
            owner = forwarding.owner_of(name.decode())
        except UnicodeDecodeError:
            return False
        if owner is None or owner in forwarding.down:
            return False
        count, names = sends_and_acks(data)
        if not count:
            return False
        peer = self._peer_for_input(peer_id, profile or self.profile, principal)
        if peer.rights is not None:
            return False  # the guard here reads every message (docs/security.md)
        if not forwarding.all_owned_by(owner, names):
            return False
        if count < OWN_FORWARD_MESSAGES and decode_frame(data, self.config.max_content_bytes)[1]:
            # A small frame shares a FORWARD with the peer's next ones: one the owner could
            # not decode would take them with it. This one is refused here.
            return False
        forwarding.take_frame(peer, owner, count, data)
        self._peers.after_input(peer)
        return True

    def _peer_for_input(
        self, peer_id: bytes, profile: PeerProfile, principal: Principal | None
    ) -> Peer:
        """The peer a frame comes from, identified by `principal` (a new one if the transport
        says it is someone else now), seen now and no longer stalled."""
        peer = self._peers.get(peer_id, profile)
        peer.last_seen = self.ctx.now  # any message counts as a heartbeat
        known = peer.principal
        if known is None or (principal is not None and known is not principal):
            peer = self._identified(peer, profile, principal)
        if peer.stalled:
            self._speaks_again(peer)
        return peer

    def _forbids(self, peer_id: bytes, queue_name: bytes) -> bool:
        """Whether the peer is known and may not send to the queue (a hint: the guard decides
        on the run's first send, with the peer as this frame identifies it)."""
        peer = self._peers.by_id.get(peer_id)
        rights = None if peer is None else peer.rights
        if rights is None:
            return False
        try:
            return not rights.allows("send", queue_name.decode())
        except UnicodeDecodeError:
            return False

    def _handle_run(
        self,
        peer_id: bytes,
        data: bytes,
        profile: PeerProfile | None,
        principal: Principal | None,
    ) -> None:
        """A frame that starts with a 001 the broker is refusing (a full queue, ...): the 001s
        like it that follow are read by their headers only and, if it is refused, refused with
        it (`Context.repeats`); the rest of the frame is decoded as usual."""
        limit = self.config.max_content_bytes
        try:
            first, after = decode_message(data, 0, limit)
        except ProtocolError:
            first = None
        if first is None:
            messages, error = decode_frame(data, limit)
            self.handle_messages(peer_id, messages, error, profile, data, principal)
            return
        like, run_end = like_sends(data, 0, after, limit)
        ctx = self.ctx
        ctx.repeats = like
        self.handle_messages(peer_id, [first], None, profile, None, principal)
        if ctx.repeats:  # not refused with it after all: read them as usual
            ctx.repeats = 0
            run_end = after
        if run_end < len(data):
            messages, error = decode_frame(data[run_end:], limit)
            ctx.reopen_refusal(peer_id)  # the frame's refusals in a row stay one ERROR
            self.handle_messages(peer_id, messages, error, profile, None, principal)

    def handle_messages(
        self,
        peer_id: bytes,
        messages: list[Message],
        error: ProtocolError | None = None,
        profile: PeerProfile | None = None,
        frame: bytes | None = None,
        principal: Principal | None = None,
    ) -> None:
        """Process messages decoded from one peer (and the error that ended its input, if any);
        for transports that decode themselves. `frame`, the bytes they came in, lets a shard
        forward a frame that is all for one other shard as it came."""
        profile = profile or self.profile
        peers = self._peers
        peer = self._peer_for_input(peer_id, profile, principal)
        ctx = self.ctx
        handlers = self._handlers
        # Relayed peers' messages were forwarded once already: they stay here.
        forwarding = None if self.forwarding is None or is_relayed(peer_id) else self.forwarding
        if (
            forwarding is not None
            and frame is not None
            and error is None
            and peer.rights is None
            and forwarding.take_whole(peer, messages, frame)
        ):
            peers.after_input(peer)
            return
        for message in messages:
            if peer.forgotten:  # a KBAI earlier in the same frame: a new peer, identified again
                peer = self._identified(peers.get(peer_id, profile), profile, principal)
            kind = ctx.handling = message.TYPE
            if kind >= FIRST_EXTENSION_TYPE:
                peer.opt_in()
            elif kind in TTL_DIALECT_ONLY_TYPES:
                peer.ttl_form = True
            if peer.rights is not None and not self.guard.allows(peer, message):
                continue
            if forwarding is not None and self._forwarded(forwarding, peer, message):
                continue
            handler = handlers.get(type(message))
            if handler is None:
                ctx.refuse(
                    peer, ErrorCode.UNSUPPORTED_TYPE, f"clients may not send {kind.name} messages"
                )
            else:
                handler(peer, message)
        if error is not None:
            if peer.forgotten:
                peer = self._identified(peers.get(peer_id, profile), profile, principal)
            self._refuse_input(peer, error)
        ctx.flush_refusals()
        peers.after_input(peer)

    def _refuse_input(self, peer: Peer, error: ProtocolError) -> None:
        """The error that ended a peer's input. One in an extension message (a HELLO over the
        size limit, ...) opts the peer in, so that it hears why instead of being taken for
        a stock peer that is only logged (issue 27, finding 11)."""
        ctx = self.ctx
        kind = ctx.handling = error.message_type
        if kind is not None and kind >= FIRST_EXTENSION_TYPE:
            peer.opt_in()
        ctx.refuse(peer, error.code, error.reason)

    def _identified(self, peer: Peer, profile: PeerProfile, principal: Principal | None) -> Peer:
        """The peer with its rights from who it is: a new peer is identified (by its
        transport's word, else as an anonymous peer of its transport); a known id that now
        comes from another connection (a reused routing id) is a new peer, and the old one
        is gone."""
        known = peer.principal
        if principal is None:
            if known is None:
                self.guard.identify(peer, Principal(None, ""))
                self._peers.admit(peer)
            return peer
        if known is not None and known != principal:
            self._peers.gone(peer.id)
            peer = self._peers.get(peer.id, profile)
            known = None
        self.guard.identify(peer, principal)
        if known is None:
            self._peers.admit(peer)
        return peer

    def _may_run_waiting(self, peer: Peer, options: dict[str, Any]) -> bool:
        """An admin command that waited for a turn with room runs if its peer is still here
        and still has the right (a SIGHUP may have come in between): the one check again."""
        if self._peers.by_id.get(peer.id) is not peer:
            return False
        return peer.rights is None or self.guard.allows(peer, Admin(options))

    def _on_hello(self, peer: Peer, message: Hello) -> None:
        self.guard.on_hello(peer, message.options)
        self._peers.on_hello(peer, message)

    def _on_admin(self, peer: Peer, message: Admin) -> None:
        self.guard.audit(peer, message.options)
        self.admin.on_admin(peer, message)

    def set_permissions(self, permissions: Permissions) -> None:
        """Rights from the permissions file (at start, and again on SIGHUP): every peer
        known is re-checked, none is disconnected; a window its peer may no longer consume
        is closed (the peer is told with CANCEL) and what it held there goes back."""
        revoked = self.guard.reload(permissions, list(self._peers.by_id.values()))
        for peer, queue in revoked:
            self.lifecycle.revoke(peer, queue)

    @staticmethod
    def _forwarded(forwarding: Forwarding, peer: Peer, message: Message) -> bool:
        """A shard: whether another shard handles `message` (docs/cluster.md)."""
        kind = type(message)
        if kind in QUEUE_ADDRESSED:
            return forwarding.route(peer, message)
        if kind is Admin:
            return forwarding.route_admin(peer, message)  # type: ignore[arg-type]
        if kind is Publish:
            return forwarding.fan_out(peer, message)  # type: ignore[arg-type]
        return False

    def _speaks_again(self, peer: Peer) -> None:
        """A stalled peer (a lease ran out while it said nothing) is back: it gets work."""
        peer.stalled = False
        for window in peer.windows.values():
            self.ctx.mark_dirty(window.queue)

    def end_turn(self) -> Turn:
        """Run what is due, dispatch, heartbeat, and return what to send: one frame per
        peer, and the connections to close."""
        ctx = self.ctx
        schedule = ctx.deadlines
        due = schedule.next_due()
        if due is not None and due <= ctx.now:
            on_due = self._on_due
            for when, kind, target in islice(schedule.pop_due(ctx.now), DUE_PER_TURN):
                on_due[kind](when, target)
        if schedule.needs_compaction():
            schedule.compact(self._entry_is_live)
        if self.admin.waiting:
            self.admin.run_waiting(self._may_run_waiting)
        if ctx.dirty:
            dirty = ctx.dirty
            ctx.dirty = {}
            if not ctx.draining:
                self._dispatch_within_budget(dirty)
        self.flow.end_turn()
        self._peers.send_due_heartbeats()
        # (Before the refusals are flushed: a publish whose copies timed out is refused here.)
        forwards = self.forwarding.take() if self.forwarding is not None else None
        ctx.flush_refusals()
        close = self.take_closes()
        outbox = ctx.outbox
        if not outbox:
            return Turn([], close, forwards)
        ctx.outbox = {}
        frames = ctx.take_frames(outbox, self._peers.by_id)
        if self.relayed is not None:
            frames = self.relayed.wrap(frames)
        return Turn(frames, close, forwards)

    def _dispatch_within_budget(self, dirty: dict[Queue, None]) -> None:
        """A dispatch pass over the queues that want one, at most DISPATCH_PER_TURN messages
        in all; queues left over stay marked for the next turn."""
        dispatch = self.dispatch.dispatch
        budget = DISPATCH_PER_TURN
        for queue in dirty:
            if budget > 0:
                budget -= dispatch(queue, budget)
            else:
                self.ctx.mark_dirty(queue)

    def take_closes(self) -> list[bytes]:
        """Peers given up on since the last call whose transport holds a connection to close
        (the server closes them in the same turn, before their next bytes are read)."""
        close = self._peers.to_close
        if close:
            self._peers.to_close = []
        return close

    def _entry_is_live(self, due: int, kind: int, target: Any) -> bool:
        return self._is_live[kind](due, target)

    def release_confirms(self) -> Frames:
        """Durable mode: the CONFIRMs of every send committed so far, one frame per peer. The
        server calls it only after a commit succeeded, so nothing is confirmed before it is
        on disk; while the store fails they wait here. (In memory mode confirms go out with
        the turn's other replies.)"""
        confirms = self.ctx.confirms
        if not confirms:
            return []
        self.ctx.confirms = {}
        frames = self.ctx.take_frames(confirms, self._peers.by_id)
        return frames if self.relayed is None else self.relayed.wrap(frames)

    def next_deadline(self) -> int | None:
        """Monotonic ns of the next thing the core must do on its own: now, if a queue is
        waiting for a dispatch pass or the deadlines for their compaction's next slice, else
        the earliest scheduled deadline, else None."""
        ctx = self.ctx
        if (ctx.dirty and not ctx.draining) or self.admin.waiting:
            return ctx.now
        if ctx.deadlines.needs_compaction():  # a slice a turn: an idle broker goes on too
            return ctx.now
        return ctx.deadlines.next_due()  # overdue entries left by the budget: in the past

    # ----------------------------------------------------------------- events from outside

    def peer_gone(self, peer_id: bytes, said_goodbye: bool = False) -> int:
        """The transport lost the peer: its held messages return to the head of their
        queues. Returns how many."""
        return self._peers.gone(peer_id, said_goodbye)

    def start_drain(self) -> None:
        """Stop taking sends and dispatching; acks of held messages still work. Every peer
        that speaks extensions is told to go elsewhere or come back later."""
        self.ctx.draining = True
        self._peers.start_drain()

    def restore(
        self, messages: list, dead_letters: list, purged_seqs: tuple[int, int] | None = None
    ) -> tuple[int, int, int]:
        """Rebuild the queues from the durable store at start; returns (ready, were in
        flight, dead letters). `purged_seqs`: the positions purges covered, never handed out
        again (broker/shell/store_purges.py)."""
        for seq in purged_seqs or ():
            self._queues.restore_seq(seq)
        # On every replica, before recovery's BACKs (at a row's own position): a replica
        # promoted, or a store given the left-over operations of a full disk, may still have
        # a purge's marker over that position.
        self.ctx.journal.purges_settled()
        return restore_messages(
            self.ctx,
            self._queues,
            self.dead_letters,
            self.expiry,
            self.leases,
            messages,
            dead_letters,
        )

    def restore_bindings(
        self, bindings: list[tuple[str, str]], unused: list[tuple[str, int]]
    ) -> int:
        """Bindings and delete-when-unused settings from the durable store; how many
        bindings."""
        restored = self.events.restore(bindings)
        self.lifecycle.restore_unused(unused)
        return restored

    def restore_keys(self, keys: list, holds: list | tuple = ()) -> int:
        """Key holds and idempotency keys from the durable store: those held, and those
        still inside their window."""
        return restore_keys(self.ctx, self.intake, keys, holds)

    def restore_schedules(self, rows: list[tuple[str, bytes, float | None, int]]) -> int:
        """Schedules from the durable store, resumed per their catch-up policy; how many."""
        return self.schedules.restore(rows)


__all__ = ["Core", "Peer", "PeerProfile", "ProtocolError", "Turn", "default_profile"]
