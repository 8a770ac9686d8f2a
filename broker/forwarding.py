"""Forwarding at a shard (docs/cluster.md "Forwarding"): a peer that knows nothing of shards
(a stock PHPMQ client, a plain DEALER, a bridge, a client with a stale map) may talk to any
shard. A message for a queue another shard owns goes there over this shard's link to the
owner, wrapped in a 113 FORWARD that names the peer; what the owner answers comes back in
FORWARDs and is passed to the peer unchanged, in order.

This part decides and remembers; the server's links (transports/links.py) move the bytes.
Per owner, the messages of one turn leave as one frame. A consumer's windows are remembered
so that an owner that restarted (and forgot its peers) gets them again.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..protocol import (
    FORWARD_CONFIRM,
    FORWARD_EXTENSIONS,
    FORWARD_GONE,
    FORWARD_TTL_FORM,
    Ack,
    Admin,
    AdminReply,
    Cancel,
    Confirm,
    Consume,
    DeadLetter,
    Error,
    ErrorCode,
    Forward,
    Message,
    Publish,
    Reply,
    Requeue,
    Send,
    decode_frame,
    encode,
    forward_parts,
)
from ..protocol import admin_commands as cmd
from ..protocol.cluster import ClusterMap
from ..protocol.link_frames import cut_at_messages, join_within
from ..protocol.writer import admin_reply_with_ref
from .context import Context
from .copies import COPY_REF, copy_ref
from .guard import Guard
from .model import Peer

#: The message types that name the queue they act on, so that its owner handles them.
QUEUE_ADDRESSED: frozenset[type] = frozenset(
    (Send, Consume, Cancel, Ack, Requeue, DeadLetter, Reply)
)
#: Admin commands that run where they arrive, even when they name a queue.
LOCAL_COMMANDS = frozenset((cmd.STATS,))
#: Queue names whose owner is remembered; past it the memo starts over.
MAX_REMEMBERED_OWNERS = 100_000
#: Consumers (peer, queue) of other shards' queues remembered for a restarted owner.
MAX_FORWARDED_WINDOWS = 100_000
#: (owner, peer) pairs with forwarded admin commands awaiting answers that are remembered.
MAX_ADMINS_OUT = 10_000
#: A frame of at least this many messages for one owner is a FORWARD of its own, which the
#: owner reads as from the peer (a run of sends or acks to one queue unread); smaller ones
#: share one with what comes before and after: a FORWARD costs the owner more than decoding
#: a message or two (a stock client sends one message a frame).
OWN_FORWARD_MESSAGES = 8


class _Forward:
    """One FORWARD to send: how its peer speaks and who it is (as when its first message
    came, and as the wire says it), and its content's pieces."""

    __slots__ = ("admin_granted", "content", "flags", "principal", "wire")

    def __init__(self, peer: Peer, flags: int, content: list[bytes]) -> None:
        self.flags = flags
        self.principal = peer.principal
        self.admin_granted = peer.admin_granted
        self.wire = Guard.principal_wire(peer)
        self.content = content

    def speaks_as(self, peer: Peer, flags: int) -> bool:
        """Whether `peer` (maybe a new object for the same id) speaks and is as this one's."""
        return (
            flags == self.flags
            and peer.principal == self.principal
            and peer.admin_granted == self.admin_granted
        )


class _Pending:
    """What one peer id sent this turn for one owner, as the FORWARDs to send; `copy`: on
    behalf of the peer's copy peer (copies.py), which speaks the extensions.

    A frame the peer sent of OWN_FORWARD_MESSAGES or more is a FORWARD of its own (the owner
    reads a run of sends or acks to one queue unread, as from the peer itself); smaller
    frames and messages routed one by one share one, as consecutive messages of a frame
    would, while the peer speaks as it did and is who it was (a routing id taken over by a
    new peer, with other flags or another principal, starts another). Where the peer went
    away, a FORWARD with the GONE bit and no content: what follows is a new peer's."""

    __slots__ = ("copy", "forwards", "loose")

    def __init__(self, copy: bool = False) -> None:
        self.forwards: list[_Forward] = []
        #: Whether the last FORWARD takes more messages routed one by one.
        self.loose = False
        self.copy = copy

    def add(self, peer: Peer, data: bytes, whole: bool) -> None:
        flags = self._flags(peer)
        forwards = self.forwards
        if not whole and self.loose and forwards[-1].speaks_as(peer, flags):
            forwards[-1].content.append(data)
            return
        forwards.append(_Forward(peer, flags, [data]))
        self.loose = not whole

    def went_away(self, peer: Peer) -> None:
        self.forwards.append(_Forward(peer, self._flags(peer) | FORWARD_GONE, []))
        self.loose = False

    def _flags(self, peer: Peer) -> int:
        return _flags(peer) | (FORWARD_EXTENSIONS if self.copy else 0)


class _Windows:
    """A peer's windows on queues of other shards, as its last CONSUME for each."""

    __slots__ = ("consumes", "peer")

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.consumes: dict[str, Consume] = {}


class Forwarding:
    __slots__ = (
        "_admins_out",
        "_copy_shards",
        "_ctx",
        "_map",
        "_owners",
        "_pending",
        "down",
        "forwarded",
        "_reopened",
        "admins_untracked",
        "refused",
        "relayed",
        "shard",
        "windows",
    )

    def __init__(self, ctx: Context, cluster_map: ClusterMap, shard: str) -> None:
        self._ctx = ctx
        self._map = cluster_map
        self.shard = shard
        #: queue -> name of the owner, None when it is this shard.
        self._owners: dict[str, str | None] = {}
        #: owner -> peer id -> what to forward at the end of the turn.
        self._pending: dict[str, dict[bytes, _Pending]] = {}
        #: Owners whose link is lost, and why: their queues are refused with 503 meanwhile.
        self.down: dict[str, str] = {}
        #: peer id -> its windows on queues of other shards (window > 0).
        self.windows: dict[bytes, _Windows] = {}
        #: Windows on this shard's queues to open here once this replica leads it.
        self._reopened: list[tuple[Peer, Consume]] = []
        #: Publishers with a copy peer at other shards, and which.
        self._copy_shards: dict[bytes, set[str]] = {}
        #: (owner, peer id) -> the refs of the admin commands forwarded there and not answered
        #: yet, oldest first: answered here with 503 if the link to the owner is lost first
        #: (the client would wait).
        self._admins_out: dict[tuple[str, bytes], list[int | None]] = {}
        #: Admin commands forwarded while _admins_out was full: not answered on a lost link.
        self.admins_untracked = 0
        self.forwarded = 0
        self.relayed = 0
        self.refused = 0

    def set_map(self, cluster_map: ClusterMap) -> None:
        """A new map of the same shards (docs/cluster.md "Membership": their replicas moved);
        queues keep their owners."""
        self._map = cluster_map

    def owner_of(self, queue: str) -> str | None:
        """The name of the shard owning `queue`, None if this one does."""
        owners = self._owners
        owner = owners.get(queue, "")
        if owner == "":
            if len(owners) >= MAX_REMEMBERED_OWNERS:
                owners.clear()
            name = self._map.owner(queue).name
            # A follower replica serves none of its shard's queues: its leader does.
            here = name == self.shard and self._ctx.standby is None
            owner = owners[queue] = None if here else name
        return owner

    def route(self, peer: Peer, message: Any) -> bool:
        """Forward `message` if another shard owns its queue; False: handle it here."""
        queue = message.queue
        if queue is None:
            return False
        owner = self.owner_of(queue)
        if owner is None:
            return False
        if owner in self.down:
            self._refuse(peer, message, owner)
            return True
        if type(message) is Consume or type(message) is Cancel:
            self._remember_window(peer, message)
        self._add(peer, owner, encode(message))
        self.forwarded += 1
        return True

    def take_whole(self, peer: Peer, messages: list[Message], frame: bytes) -> bool:
        """A frame whose messages all go to one other shard goes there as it came, without
        being written again (the common case: a producer's batch, a consumer's acks)."""
        owner = ""
        owner_of = self.owner_of
        for message in messages:
            if type(message) not in QUEUE_ADDRESSED:
                return False
            queue = message.queue  # type: ignore[union-attr]
            if queue is None:
                return False
            this = owner_of(queue)
            if this is None or (owner and this != owner):
                return False
            owner = this
        if not owner or owner in self.down:
            return False
        for message in messages:
            if type(message) is Consume or type(message) is Cancel:
                self._remember_window(peer, message)
        self._add(peer, owner, frame, whole=len(messages) >= OWN_FORWARD_MESSAGES)
        self.forwarded += len(messages)
        return True

    def all_owned_by(self, owner: str, queues: list[bytes]) -> bool:
        """Whether `owner` owns every one of `queues` (names as a frame holds them)."""
        owner_of = self.owner_of
        try:
            return all(owner_of(queue.decode()) == owner for queue in queues)
        except UnicodeDecodeError:
            return False

    def take_frame(self, peer: Peer, owner: str, count: int, frame: bytes) -> None:
        """`take_whole` for a frame read by its headers only: `count` 001s and 004s for
        queues of `owner` (protocol/runs.py `sends_and_acks`)."""
        self._add(peer, owner, frame, whole=count >= OWN_FORWARD_MESSAGES)
        self.forwarded += count

    def route_admin(self, peer: Peer, message: Admin) -> bool:
        """An admin command about one queue (`queue` option) runs at that queue's owner;
        `stats` and the rest run here, or, at a follower replica, at its leader (`stats`
        with `here` shows the follower's own figures)."""
        options = message.options
        queue = options.get("queue")
        if type(queue) is str and options.get("command") not in LOCAL_COMMANDS:
            owner = self.owner_of(queue)
        elif self._ctx.standby is not None and not options.get("here"):
            owner = self.shard
        else:
            return False
        if owner is None:
            return False
        if owner in self.down:
            self.refused += 1
            reason = self._unreachable(queue if type(queue) is str else "", owner)
            self._ctx.reply(peer, AdminReply(cmd.answering(options, {"error": reason})))
            return True
        self._add(peer, owner, encode(message))
        self.forwarded += 1
        out = self._admins_out
        key = (owner, peer.id)
        if key in out:
            out[key].append(cmd.ref_of(options))
        elif len(out) < MAX_ADMINS_OUT:
            out[key] = [cmd.ref_of(options)]
        else:
            self.admins_untracked += 1
        return True

    def fan_out(self, peer: Peer, message: Publish) -> bool:
        """A PUBLISH reaches the queues bound at every shard: each other shard gets one copy
        (with its key, so a retry is a duplicate there too) and routes it to its own queues.
        A tagged one is confirmed once every shard confirmed its copy (copies.py); an
        untagged copy goes without its tag. With a shard unreachable it is refused whole
        with 503 (True: handled)."""
        if self.down:
            owner = next(iter(self.down))
            self.refused += 1
            self._ctx.refuse(
                peer,
                ErrorCode.SHUTTING_DOWN,
                f"cannot publish to every shard: shard {owner} cannot be reached:"
                f" {self.down[owner]}",
                tag=message.tag,
            )
            return True
        standby = self._ctx.standby is not None
        others = tuple(s.name for s in self._map.shards if s.name != self.shard or standby)
        self.forwarded += 1
        if message.tag is not None and others:
            return not self._ctx.copies.expect(peer, message, others)
        copy = encode(msgspec.structs.replace(message, tag=None))
        for shard in others:
            self._add(peer, shard, copy)
        return False

    def _unreachable(self, queue: str, owner: str) -> dict[str, Any]:
        what = f"queue {queue!r} lives on shard {owner}" if queue else f"shard {owner}"
        return {
            "code": int(ErrorCode.SHUTTING_DOWN),
            "reason": f"{what}, which cannot be reached: {self.down[owner]}",
        }

    def _add(
        self, peer: Peer, owner: str, data: bytes, ref: bytes | None = None, whole: bool = False
    ) -> _Pending:
        """`data` for `owner` from `peer`, or from its copy peer `ref`; `whole`: a frame the
        peer sent, a FORWARD of its own."""
        by_peer = self._pending.get(owner)
        if by_peer is None:
            by_peer = self._pending[owner] = {}
        key = peer.id if ref is None else ref
        pending = by_peer.get(key)
        if pending is None:
            pending = by_peer[key] = _Pending(ref is not None)
        if data or whole:
            pending.add(peer, data, whole)
        return pending

    def _add_copies(self, copies: list[tuple[Peer, bytes, tuple[str, ...]]]) -> None:
        """Copies of confirmed publishes for other shards, from each publisher's copy peer."""
        for peer, copy, shards in copies:
            ref = copy_ref(peer.id)
            self._copy_shards.setdefault(peer.id, set()).update(shards)
            for shard in shards:
                self._add(peer, shard, copy, ref)

    def _refuse(self, peer: Peer, message: Any, owner: str) -> None:
        self.refused += 1
        self._ctx.refuse(
            peer,
            ErrorCode.SHUTTING_DOWN,
            self._unreachable(message.queue, owner)["reason"],
            queue=message.queue,
            tag=getattr(message, "tag", None),
        )

    def _remember_window(self, peer: Peer, message: Consume | Cancel) -> None:
        held = self.windows.get(peer.id)
        if type(message) is Consume and message.count > 0:
            if held is None:
                if len(self.windows) >= MAX_FORWARDED_WINDOWS:
                    return  # still forwarded; only a restarted owner would not get it again
                held = self.windows[peer.id] = _Windows(peer)
            held.consumes[message.queue] = message
            peer.forwarding = True
        elif held is not None:
            held.consumes.pop(message.queue, None)
            if not held.consumes:
                del self.windows[peer.id]
                peer.forwarding = False

    # ------------------------------------------------------------------ the links

    def take(self) -> list[tuple[str, bytes]]:
        """One frame per owner: the turn's FORWARDs, each peer's messages in its order."""
        copies = self._ctx.copies
        copies.expire()
        self._add_copies(copies.take_copies())
        pending = self._pending
        if not pending:
            return []
        self._pending = {}
        limit = self._ctx.config.max_frame_bytes
        frames = []
        for owner, by_peer in pending.items():
            forwards = (
                parts
                for peer_id, entry in by_peer.items()
                for forward in entry.forwards
                for parts in _forward_within(peer_id, forward, limit)
            )
            frames.extend((owner, frame) for frame in join_within(forwards, limit))
        return frames

    def on_link_message(self, message: Forward, shard: str) -> None:
        """An owner's answer for one of our peers: passed on as it is; for a copy peer,
        its answers to the copies (copies.py)."""
        self.relayed += 1
        peer_id = message.peer
        if peer_id[:1] == COPY_REF and peer_id[1:] in self._copy_shards:
            messages, _ = decode_frame(message.content, self._ctx.config.max_content_bytes)
            for answer in messages:
                if type(answer) is Confirm or type(answer) is Error:
                    self._ctx.copies.on_answer(shard, answer)
            return
        if message.content:
            if self._admins_out and (shard, peer_id) in self._admins_out:
                self._count_admin_answers((shard, peer_id), message.content)
            self._ctx.add(peer_id, message.content)

    def _count_admin_answers(self, key: tuple[str, bytes], content: bytes) -> None:
        messages, _ = decode_frame(content, self._ctx.config.max_content_bytes)
        refs = self._admins_out[key]
        del refs[: sum(1 for m in messages if type(m) is AdminReply)]
        if not refs:
            del self._admins_out[key]

    def _answer_lost_admins(self, owner: str, why: str) -> None:
        """The admin commands forwarded to `owner` and not answered: each gets a 503 now. A
        late answer cannot follow it: a lost link's socket is replaced (transports/links.py),
        and what the owner sends to the old one goes nowhere."""
        lost = [key for key in self._admins_out if key[0] == owner]
        if not lost:
            return
        reason = {
            "code": int(ErrorCode.SHUTTING_DOWN),
            "reason": f"shard {owner} was lost before it answered ({why}): the command may"
            " or may not have run there; ask again",
        }
        answer = encode(AdminReply({"error": reason}))
        for key in lost:
            refs = self._admins_out.pop(key)
            self._ctx.add(key[1], b"".join([admin_reply_with_ref(answer, ref) for ref in refs]))

    def copied(self, peer: Peer) -> bool:
        """Whether the peer's publishes have copies at other shards (a copy peer there), or
        wait to be copied this turn."""
        return peer.id in self._copy_shards or self._ctx.copies.has_copies_of(peer)

    def peer_gone(self, peer: Peer) -> None:
        """A peer with windows at other shards is gone: they let go of what it held; and so
        is its copy peer, where it had one."""
        # Its copies of this turn go first, then its copy peer's goodbye.
        self._add_copies(self._ctx.copies.take_copies_of(peer))
        copied_to = self._copy_shards.pop(peer.id, None)
        if copied_to is not None:
            self._ctx.copies.peer_gone(peer)
            for shard in copied_to:
                self._add(peer, shard, b"", copy_ref(peer.id)).went_away(peer)
        held = self.windows.pop(peer.id, None)
        if held is None:
            return
        for owner in {self.owner_of(queue) for queue in held.consumes}:
            if owner is not None:
                self._add(peer, owner, b"").went_away(peer)

    def link_down(self, owner: str, why: str) -> None:
        self.down[owner] = why
        self._answer_lost_admins(owner, why)
        self._ctx.copies.shard_lost(owner, why)

    def link_up(self, owner: str) -> None:
        """The link to `owner` answered HELLO: the owner may have restarted and forgotten our
        peers, so it gets every window they hold there again (a window it still knows is
        only set to the same count)."""
        self.down.pop(owner, None)
        for held in self.windows.values():
            for queue, consume in held.consumes.items():
                if self.owner_of(queue) == owner:
                    self._add(held.peer, owner, encode(consume))

    def forget_owners(self) -> None:
        """Owners are found again (this replica's role changed)."""
        self._owners.clear()

    def serve_own_shard(self) -> None:
        """This replica leads its shard now: its queues are served here, and the windows its
        peers held on them at the old leader open here (as that leader's restart would)."""
        own = self.shard
        self.forget_owners()
        self.down.pop(own, None)
        self._pending.pop(own, None)
        self._answer_lost_admins(own, "this replica leads the shard now")
        for held in list(self.windows.values()):
            mine = [queue for queue in held.consumes if self._map.owner(queue).name == own]
            for queue in mine:
                self._reopened.append((held.peer, held.consumes.pop(queue)))
            if not held.consumes:
                del self.windows[held.peer.id]
                held.peer.forwarding = False

    def take_reopened(self) -> list[tuple[Peer, Consume]]:
        reopened, self._reopened = self._reopened, []
        return reopened

    def stats(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "forwarded": self.forwarded,
            "relayed": self.relayed,
            "refused_unreachable": self.refused,
            "admins_awaiting_answers": sum(map(len, self._admins_out.values())),
            "admins_untracked": self.admins_untracked,
            "forwarded_windows": sum(len(held.consumes) for held in self.windows.values()),
            "links_down": dict(self.down),
            "publish_copies": self._ctx.copies.stats(),
        }


def _forward_within(peer_id: bytes, forward: _Forward, limit: int) -> list[tuple[list[bytes], int]]:
    """`forward` as the pieces of its bytes, and its length; as several FORWARDs, its content
    cut at its messages' boundaries, where it would be longer than the owner takes (`limit`,
    its max_frame_bytes): a peer's frame near that size, or many messages joined."""
    content = forward.content
    parts = forward_parts(peer_id, content, forward.flags, forward.wire)
    overhead = sum(map(len, parts[:3])) + sum(map(len, parts[3 + len(content) :]))
    size = overhead + sum(map(len, content))
    if size <= limit:
        return [(parts, size)]
    pieces = cut_at_messages(b"".join(content), limit - overhead)
    return [
        (forward_parts(peer_id, [piece], forward.flags, forward.wire), overhead + len(piece))
        for piece in pieces
    ]


def _flags(peer: Peer) -> int:
    return (
        (FORWARD_EXTENSIONS if peer.extensions else 0)
        | (FORWARD_TTL_FORM if peer.ttl_form else 0)
        | (FORWARD_CONFIRM if peer.confirm else 0)
    )
