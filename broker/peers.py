"""Peers: who is connected, on what terms (HELLO), whether they are alive (heartbeats,
interval x liveness), and what happens when they leave (DISCONNECT drains, KBAI and death
return what they held).

eMQP/1.0 heartbeating: any traffic counts as a heartbeat in both directions; the broker
heartbeats a peer only when it has sent it nothing for an interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from ..protocol import Disconnect, Heartbeat, Hello, Kbai, clamp_liveness
from .context import Context
from .deadlines import HEARTBEAT, PEER_EXPIRY
from .dispatch import Dispatch
from .flow import Flow
from .model import NS_PER_MS, NS_PER_SECOND, Peer, PeerProfile
from .permissions import NOTHING
from .quotas import CONNECTIONS
from .relayed_ids import is_relayed

log = logging.getLogger("phpmq.broker")

BROKER_NAME = "phpmq-zmq"
BROKER_VERSION = "0.1.0"
#: Peers declared gone without a goodbye that are remembered as extension peers.
MAX_DEPARTED_PEERS = 10_000
#: After a look for a peer to reclaim found none, a key's new peers wait this long for the
#: next look (each is refused meanwhile): a key at its quota pays for one scan of its peers a
#: second, not one a refused frame.
RECLAIM_RETRY_NS = NS_PER_SECOND
UNKNOWN_PEER_REASON = (
    "unknown peer: say HELLO again and re-consume (the broker restarted or gave up on you)"
)


class Peers:
    __slots__ = (
        "_cluster",
        "_counted",
        "_ctx",
        "_departed",
        "_reclaim_after",
        "_dispatch",
        "_flow",
        "_heartbeats_due",
        "by_id",
        "on_gone",
        "to_close",
    )

    def __init__(
        self,
        ctx: Context,
        dispatch: Dispatch,
        flow: Flow,
        on_gone: Callable[[Peer], None] | None = None,
    ) -> None:
        self._ctx = ctx
        self._dispatch = dispatch
        self._flow = flow
        self.by_id: dict[bytes, Peer] = {}
        #: The peers counted against each owner's quota of connections, oldest first.
        self._counted: dict[str, dict[bytes, Peer]] = {}
        #: Owners whose last look for a peer to reclaim found none: when to look again.
        self._reclaim_after: dict[str, int] = {}
        #: Extension peers declared gone without a goodbye, most recent last (bounded).
        self._departed: dict[bytes, None] = {}
        self._heartbeats_due: list[Peer] = []
        #: Peers given up on whose transport holds a connection to close.
        self.to_close: list[bytes] = []
        #: Told of every peer that is gone (a shard's forwarding and links need to know).
        self.on_gone = on_gone
        #: What a HELLO answer says of the cluster this broker is a shard of (docs/cluster.md).
        config = ctx.config
        self._cluster: dict[str, Any] = (
            {"cluster": msgspec.json.decode(config.cluster), "shard": config.shard}
            if config.cluster
            else {}
        )

    def set_cluster(self, cluster: str, shard: str) -> None:
        """What HELLO answers say of the cluster from now on (a map of a new epoch)."""
        self._cluster = {"cluster": msgspec.json.decode(cluster), "shard": shard}

    def get(self, peer_id: bytes, profile: PeerProfile) -> Peer:
        """The peer behind an id, known or new. A new one that was given up on earlier comes
        back speaking extensions: it gets ERRORs, not silence."""
        peer = self.by_id.get(peer_id)
        if peer is None:
            peer = self.by_id[peer_id] = Peer(peer_id, profile, self._ctx.now)
            if self._departed.pop(peer_id, False) is None:
                peer.opt_in()
        return peer

    def admit(self, peer: Peer) -> None:
        """A new peer counts against its owner's quota of connections. At the quota, it
        takes the place of the owner's oldest peer that cannot be told from a vanished one
        (`_reclaim`); failing that, it may do nothing (`over_quota`: every message refused
        with 429) and is forgotten after its frame."""
        owner = peer.owner
        if peer.connection_of == owner:
            return  # counted already (a relayed peer identified again), or nobody's to count
        self._uncount(peer)
        quotas = self._ctx.quotas
        if quotas.full(CONNECTIONS, owner):
            self._reclaim(owner)
        problem = quotas.problem(CONNECTIONS, owner)
        if problem is not None:
            peer.over_quota = f"{problem}: close some first"
            peer.rights = NOTHING  # so that the guard sees every message it sends
            return
        if owner:
            quotas.take(CONNECTIONS, owner)
            peer.connection_of = owner
            counted = self._counted.get(owner)
            if counted is None:
                counted = self._counted[owner] = {}
            counted[peer.id] = peer

    def _uncount(self, peer: Peer) -> None:
        owner = peer.connection_of
        if owner:
            self._ctx.quotas.give_back(CONNECTIONS, owner)
            peer.connection_of = ""
            counted = self._counted.get(owner)
            if counted is not None:
                counted.pop(peer.id, None)
                if not counted:
                    del self._counted[owner]
                    self._reclaim_after.pop(owner, None)

    def _reclaim(self, owner: str) -> None:
        """Forget the oldest of `owner`'s peers that may have gone unseen (`_reclaimable`),
        counted in connections_reclaimed; none while frames wait unread (its may be among
        them), and at most one look a second that finds none."""
        ctx = self._ctx
        if ctx.input_pending or ctx.now < self._reclaim_after.get(owner, 0):
            return
        silent_since = ctx.now - int(ctx.config.reclaim_silent_seconds * NS_PER_SECOND)
        waiting: set[bytes] | None = None  # publishers waiting for copies, once it matters
        for peer in self._counted.get(owner, {}).values():
            if peer.last_seen > silent_since or not self._reclaimable(peer):
                continue
            if waiting is None:
                waiting = ctx.copies.publishers_waiting()
            if peer.id in waiting:
                continue
            self.gone(peer.id)
            self._reclaim_after.pop(owner, None)
            ctx.counters.connections_reclaimed += 1
            ctx.log_limited(
                f"gave up on peer {peer.id.hex()} {peer.name}: silent for"
                f" {(ctx.now - peer.last_seen) / NS_PER_SECOND:.0f}s without heartbeats,"
                f" holding nothing, and {owner} at its quota of connections",
                "connection-reclaimed",
            )
            return
        self._reclaim_after[owner] = ctx.now + RECLAIM_RETRY_NS

    def _reclaimable(self, peer: Peer) -> bool:
        """A peer whose going would leave no trace and that nothing is owed to or kept for: a
        ZeroMQ peer of this broker's own (a raw-TCP one's going is seen; a relayed one is its
        link's; a link is kept) without heartbeats (they show it alive), windows, forwarding,
        a PAUSE to lift, a request whose reply is due to it, or a HELLO that asked for
        confirms (its later sends would go unconfirmed) or carried the admin secret."""
        return not (
            peer.heartbeat_ns
            or peer.windows
            or peer.forwarding
            or peer.link
            or peer.paused_on
            or peer.confirm
            or peer.admin_granted
            or peer.id in self._ctx.awaiting_replies
            or peer.profile.closable
            or is_relayed(peer.id)
        )

    def after_input(self, peer: Peer) -> None:
        """Bound how long the peer is remembered: HELLO arms its own check, other peers that
        showed anything worth remembering idle out; a stock producer is forgotten at once,
        which keeps memory flat however many identities come and go."""
        if peer.over_quota is not None:
            self.gone(peer.id, said_goodbye=True)  # nothing of it is kept
        elif peer.extensions or peer.ttl_form != peer.profile.ttl_form:
            if not peer.expiry_due and not peer.forgotten:
                self._arm_expiry(peer, self._ctx.now + self._idle_ns)
        elif not peer.windows and not peer.forwarding:
            self.by_id.pop(peer.id, None)
            self._uncount(peer)

    def gone(self, peer_id: bytes, said_goodbye: bool = False) -> int:
        """The peer is gone (KBAI, transport error, silence): its held messages return to the
        head of their queues. Returns how many.

        An extension peer that did not say goodbye is remembered for a while: if it was only
        frozen, what it sends later (late acks) is refused with ERRORs and its next
        heartbeat is told to say HELLO again, instead of being taken for a stock peer.
        """
        peer = self.by_id.pop(peer_id, None)
        if peer is None:
            return 0
        peer.forgotten = True
        self._uncount(peer)
        if peer.paused_on:
            self._flow.forget(peer)
        if peer.profile.closable and not said_goodbye:
            self.to_close.append(peer_id)
        if peer.extensions and not said_goodbye:
            self._departed[peer_id] = None
            if len(self._departed) > MAX_DEPARTED_PEERS:
                del self._departed[next(iter(self._departed))]
        if self.on_gone is not None:
            self.on_gone(peer)
        return self._dispatch.release_all(peer)

    def give_up(self, peer: Peer, why: str) -> None:
        """Forget a peer that does not count any more (a frozen or vanished consumer): its
        messages go back to their queues and a raw-TCP connection is closed."""
        returned = self.gone(peer.id)
        self._ctx.log_limited(
            f"gave up on peer {peer.id.hex()} {peer.name}: {why}; {returned} messages back to"
            " their queues",
            "give-up",
        )

    def start_drain(self) -> None:
        """Every peer that speaks extensions is told to go elsewhere or come back later."""
        for peer in self.by_id.values():
            if peer.extensions:
                self._ctx.reply(peer, Disconnect("broker shutting down: reconnect later"))

    # ----------------------------------------------------------------- messages

    def on_hello(self, peer: Peer, message: Hello) -> None:
        """Agree on heartbeats (docs/protocol.md §6.2) and answer with the broker's terms."""
        ctx = self._ctx
        options = message.options
        config = ctx.config
        peer.hello = True
        peer.confirm = options.get("confirm") is True
        peer.name = _text_option(options, "name")
        peer.role = _text_option(options, "role")
        heartbeat_ms = options.get("heartbeat_ms")
        liveness = 0
        if type(heartbeat_ms) is int and heartbeat_ms > 0:
            heartbeat_ms = min(max(heartbeat_ms, config.min_heartbeat_ms), config.max_heartbeat_ms)
            liveness = clamp_liveness(options.get("liveness"), config.liveness)
            peer.heartbeat_ns = heartbeat_ms * NS_PER_MS
            peer.expiry_ns = peer.heartbeat_ns * liveness
        else:
            heartbeat_ms = 0
            peer.heartbeat_ns = peer.expiry_ns = 0
        self._arm_expiry(peer, ctx.now + (peer.expiry_ns or self._idle_ns))
        if peer.heartbeat_ns:
            self._arm_heartbeat(peer, ctx.now + peer.heartbeat_ns)
        else:
            peer.heartbeat_due = 0
        ctx.reply(
            peer,
            Hello(
                {
                    "broker": BROKER_NAME,
                    "version": BROKER_VERSION,
                    "broker_heartbeat_ms": config.heartbeat_ms,
                    "heartbeat_ms": heartbeat_ms,
                    "liveness": liveness,
                    "lease_ms": self._dispatch.peer_lease_ms(peer),
                    "max_content_bytes": config.max_content_bytes,
                    "max_window": config.max_window,
                    "confirm": peer.confirm,
                    "durable": ctx.journal.durable,
                    "dedup_window_ms": int(config.dedup_window_seconds * 1000),
                    "key_holds": config.dedup_window_seconds > 0,
                    **self._cluster,
                    **self._replica_role(),
                }
            ),
        )

    def _replica_role(self) -> dict[str, Any]:
        """A follower replica says so, and where its shard's leader is: a link follows it."""
        ctx = self._ctx
        if ctx.standby is None:
            return {}
        return {"standby": ctx.standby, "leader": ctx.leader_hint}

    def on_heartbeat(self, peer: Peer, message: Heartbeat) -> None:
        """Any message shows the peer is alive. A heartbeat from a peer that never said HELLO
        (the broker restarted, or declared it dead) asks it to start over."""
        if not peer.hello:
            self._ctx.reply(peer, Disconnect(UNKNOWN_PEER_REASON))

    def on_disconnect(self, peer: Peer, message: Disconnect) -> None:
        """eMQP: answer KBAI, send no more work, let the peer finish (ack) what it holds."""
        peer.closing = True
        self._dispatch.stop_windows(peer)
        self._ctx.reply(peer, Kbai())

    def on_kbai(self, peer: Peer, message: Kbai) -> None:
        """Goodbye: whatever the peer still holds goes back to the head of its queue."""
        self.gone(peer.id, said_goodbye=True)

    # ----------------------------------------------------------------- liveness

    @property
    def _idle_ns(self) -> int:
        return int(self._ctx.config.idle_peer_seconds * NS_PER_SECOND)

    def _current(self, peer: Peer) -> bool:
        return self.by_id.get(peer.id) is peer

    def _arm_expiry(self, peer: Peer, when: int) -> None:
        peer.expiry_due = when
        self._ctx.deadlines.arm(when, PEER_EXPIRY, peer)

    def _arm_heartbeat(self, peer: Peer, when: int) -> None:
        peer.heartbeat_due = when
        self._ctx.deadlines.arm(when, HEARTBEAT, peer)

    def is_expiry_live(self, due: int, peer: Peer) -> bool:
        return due == peer.expiry_due and self._current(peer)

    def is_heartbeat_live(self, due: int, peer: Peer) -> bool:
        return due == peer.heartbeat_due and self._current(peer)

    def on_expiry_due(self, due: int, peer: Peer) -> None:
        """A heartbeating peer silent for interval x liveness is dead; an extension peer that
        does not heartbeat is forgotten once it holds nothing and has been quiet too long."""
        if due != peer.expiry_due or not self._current(peer):
            return
        ctx = self._ctx
        if peer.expiry_ns:
            deadline = peer.last_seen + peer.expiry_ns
        else:
            deadline = peer.last_seen + self._idle_ns
            if peer.windows:  # dispatch to a vanished peer fails and releases its messages
                deadline = max(deadline, ctx.now + self._idle_ns)
        if deadline > ctx.now:
            self._arm_expiry(peer, deadline)
            return
        if ctx.input_pending:
            # Frames are waiting unread (the server's turn budget ran out): this peer's may be
            # among them. Look again once the broker has caught up.
            self._arm_expiry(peer, ctx.now + (peer.heartbeat_ns or self._idle_ns))
            return
        returned = self.gone(peer.id)
        if peer.expiry_ns:
            ctx.counters.peers_expired += 1
            log.warning(
                "peer %s %s silent for %.1fs (interval x liveness): gone; %d messages back"
                " to their queues",
                peer.id.hex(),
                peer.name or "",
                (ctx.now - peer.last_seen) / NS_PER_SECOND,
                returned,
            )

    def on_heartbeat_due(self, due: int, peer: Peer) -> None:
        """A peer the broker may owe a heartbeat: decided after this turn's dispatch, which
        may send it something anyway."""
        if due != peer.heartbeat_due or not self._current(peer) or not peer.heartbeat_ns:
            return
        next_due = peer.last_sent + peer.heartbeat_ns
        if next_due > self._ctx.now:
            self._arm_heartbeat(peer, next_due)
        else:
            self._heartbeats_due.append(peer)

    def send_due_heartbeats(self) -> None:
        """Heartbeat the peers that are owed one and get nothing else this turn."""
        if not self._heartbeats_due:
            return
        ctx = self._ctx
        outbox = ctx.outbox
        for peer in self._heartbeats_due:
            if not self._current(peer):
                continue  # declared gone in this turn
            if peer.id not in outbox:
                ctx.reply(peer, Heartbeat())
            self._arm_heartbeat(peer, ctx.now + peer.heartbeat_ns)
        self._heartbeats_due.clear()


def _text_option(options: dict, key: str) -> str:
    value = options.get(key)
    return value[:200] if isinstance(value, str) else ""
