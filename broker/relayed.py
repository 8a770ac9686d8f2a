"""The owner's side of forwarding (docs/cluster.md "Forwarding"): peers that talk to another
shard, seen through that shard's link.

A link is a peer that said HELLO with role "link" (or sent FORWARD without any HELLO: a link
whose shard restarted under it, which says HELLO again when its next heartbeat is refused).
Each peer a FORWARD names becomes a peer of its own here (a relayed peer), with its own
windows and in-flight messages, speaking as the FORWARD's flags say; everything the core
sends it goes back over the link in a FORWARD. A relayed peer lives as long as its link
does: the link's silence, goodbye or restart lets go of what every peer behind it held.

A relayed peer's id says where it lives (prefix, length of the link's id, the link's id, the
link's reference for the peer), so nothing maps ids to links: a relayed producer is forgotten
as soon as it is served, like any stock producer, and memory stays flat however many come.
"""

from __future__ import annotations

from collections.abc import Callable

from ..protocol import (
    FORWARD_CONFIRM,
    FORWARD_EXTENSIONS,
    FORWARD_GONE,
    FORWARD_TTL_FORM,
    Disconnect,
    ErrorCode,
    Forward,
    forward_parts,
)
from ..protocol.constants import MESSAGE_HEADER_BYTES, PACKET_HEADER_BYTES
from ..protocol.link_frames import cut_at_messages, join_within
from .context import Context, Frames
from .guard import Guard, Principal
from .model import Peer, PeerProfile
from .peers import UNKNOWN_PEER_REASON, Peers
from .relayed_ids import is_relayed, relayed_id, route_of

__all__ = ["HandleFrame", "RelayedPeers", "is_relayed", "relayed_id", "route_of"]

#: The core's `handle_frame`: a relayed peer's frame is read as any peer's (a run of sends
#: or acks for one queue unread, the rest decoded), with its own rights.
HandleFrame = Callable[[bytes, bytes, PeerProfile, Principal], None]


#: What a FORWARD of an answer adds to its content, besides the reference: its header and
#: the headers of packets 25 and 02.
_FORWARD_OVERHEAD = MESSAGE_HEADER_BYTES + 2 * PACKET_HEADER_BYTES


class RelayedPeers:
    __slots__ = ("_ctx", "_guard", "_handle_frame", "_peers", "_profile")

    def __init__(
        self,
        ctx: Context,
        peers: Peers,
        guard: Guard,
        handle_frame: HandleFrame,
        profile: PeerProfile,
    ) -> None:
        self._ctx = ctx
        self._peers = peers
        self._guard = guard
        self._handle_frame = handle_frame
        self._profile = profile

    def on_forward(self, link: Peer, message: Forward) -> None:
        """Messages a peer of another shard sent for queues of this one, run with that
        peer's own rights (its principal travels in the FORWARD)."""
        if not link.link:
            self._refuse_link(link)
            return
        if self._ctx.standby is not None:
            # A follower replica: the link must go to the leader (its HELLO answer says
            # where), so it is asked to say HELLO again, as to a shard that restarted.
            self._ctx.reply(
                link, Disconnect(f"{self._ctx.standby}; leader: {self._ctx.leader_hint}")
            )
            return
        if len(link.id) > 255 or not 0 < len(message.peer) <= 255:
            self._ctx.refuse(
                link, ErrorCode.INVALID_VALUE, "a link id or FORWARD peer is not 1-255 bytes"
            )
            return
        peer_id = relayed_id(link.id, message.peer)
        flags = message.flags or 0
        if message.content:
            principal, admin_granted = self._guard.forwarded_principal(message.principal)
            known = self._peers.by_id.get(peer_id)
            if known is not None and known.principal not in (None, principal):
                self._peers.gone(peer_id)  # another peer on the reference: a new one
            new = peer_id not in self._peers.by_id
            relayed = self._peers.get(peer_id, self._profile)
            _take_flags(relayed, flags, new)
            if relayed.admin_granted != admin_granted:
                relayed.admin_granted = admin_granted
                relayed.principal = None  # identified again below
            self._handle_frame(peer_id, message.content, self._profile, principal)
        if flags & FORWARD_GONE:
            self._peers.gone(peer_id)

    def _refuse_link(self, peer: Peer) -> None:
        """A FORWARD from a peer not proven to be a shard link: refused. One that never said
        HELLO may be a link whose shard restarted under it (without CURVE, only its HELLO
        proves it): it is asked to say HELLO again."""
        if not peer.hello:
            self._ctx.reply(peer, Disconnect(UNKNOWN_PEER_REASON))
            return
        self._ctx.refuse(
            peer,
            ErrorCode.FORBIDDEN,
            "forbidden: only this cluster's shard links may send FORWARD (the broker's key or"
            " link secret)",
        )

    def link_gone(self, link_id: bytes) -> int:
        """A link is gone: so is every peer behind it. Returns how many messages went back."""
        prefix = relayed_id(link_id, b"")
        behind = [peer_id for peer_id in self._peers.by_id if peer_id.startswith(prefix)]
        return sum(self._peers.gone(peer_id) for peer_id in behind)

    def wrap(self, frames: Frames) -> Frames:
        """Frames for relayed peers go to their link, in FORWARDs: one frame per link, or
        more where they would be longer than its shard takes (max_frame_bytes, which the
        shards of a cluster share); a frame for one peer that would make a FORWARD longer
        than that goes as several, cut at its messages' boundaries."""
        limit = self._ctx.config.max_frame_bytes
        out: Frames = []
        by_link: dict[bytes, list[tuple[list[bytes], int]]] = {}
        for peer_id, frame in frames:
            if not is_relayed(peer_id):
                out.append((peer_id, frame))
                continue
            link_id, reference = route_of(peer_id)
            forwards = by_link.get(link_id)
            if forwards is None:
                forwards = by_link[link_id] = []
            overhead = _FORWARD_OVERHEAD + len(reference)
            for piece in cut_at_messages(frame, limit - overhead):
                forwards.append((forward_parts(reference, [piece]), overhead + len(piece)))
        for link_id, forwards in by_link.items():
            out.extend((link_id, joined) for joined in join_within(forwards, limit))
        return out


def _take_flags(peer: Peer, flags: int, new: bool) -> None:
    """The relayed peer speaks as its shard says the real one does. Extensions and the TTL
    form only ever turn on: what this shard learned from the peer's own messages (its shard
    does not read a frame it forwards whole) is not taken back."""
    if flags & FORWARD_EXTENSIONS:
        peer.extensions = True
    if new or flags & FORWARD_TTL_FORM:
        peer.ttl_form = bool(flags & FORWARD_TTL_FORM)
    peer.confirm = bool(flags & FORWARD_CONFIRM)
