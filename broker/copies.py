"""A confirmed PUBLISH across shards (docs/cluster.md "Forwarding", docs/protocol.md §6.8):
confirmed to its publisher only once every shard has its copy.

The shard a PUBLISH reaches first (the front) routes it to its own queues; its CONFIRM is
then held here, and a copy goes to every other shard, tagged by the front, on behalf of a
*copy peer* of the publisher (the publisher's id behind COPY_REF: its own rights, and answers
that never reach the publisher itself). Each shard confirms its copy once it has it (on
disk, or with a replicated shard's majority); when all have, the publisher gets one CONFIRM
whose count adds up every shard's queues. A shard that refuses its copy, cannot be reached,
or does not answer within COPY_TIMEOUT_S fails the publish with 503; the same publish sent
again with the same key is copied again (a shard that has the copy answers from the key).

Pure: it takes the context's `now` and says what to send; forwarding.py moves the copies.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from ..protocol import Confirm, Error, ErrorCode, MessageType, Publish, encode
from ..protocol.writer import encode_confirm
from .model import NS_PER_SECOND, Counters, Peer
from .quotas import MAX_WAITING_PUBLISHES, PUBLISHES, Quotas


class Context(Protocol):
    """What this part uses of the core's context (context.py, which holds a CopyConfirms:
    named here rather than imported, so the two do not import each other)."""

    now: int
    counters: Counters
    handling: int | None
    quotas: Quotas

    @property
    def journal(self) -> Any: ...

    def hold(self, peer: Peer, data: bytes) -> None: ...

    def add(self, peer_id: bytes, data: bytes) -> None: ...

    def refuse(
        self,
        peer: Peer,
        code: int,
        reason: str,
        message_id: bytes | None = None,
        queue: str | None = None,
        tag: int | None = None,
        count: int = 1,
    ) -> None: ...


#: What a copy peer's reference begins with (a publisher's own id follows).
COPY_REF = b"\xfe"
#: A copy not confirmed in this long fails its publish (503).
COPY_TIMEOUT_S = 10.0


def copy_ref(peer_id: bytes) -> bytes:
    """The reference of a publisher's copy peer at the other shards."""
    return COPY_REF + peer_id[:254]


class _Waiting:
    """A publish routed here whose CONFIRM waits for the other shards' copies."""

    __slots__ = ("count", "message_id", "owner", "peer", "shards", "since", "tag")

    def __init__(
        self, peer: Peer, tag: int, message_id: bytes, count: int | None, shards: set[str]
    ) -> None:
        self.peer = peer
        #: Whose quota it counts against (the peer's owner when it began).
        self.owner = peer.owner
        self.tag = tag
        self.message_id = message_id
        #: Queues that got a copy, summed (None once an answer came from a key).
        self.count = count
        #: Shards whose copy is not confirmed yet.
        self.shards = shards
        self.since = 0


class CopyConfirms:
    __slots__ = ("_ctx", "_next_tag", "_out", "_waiting", "failed", "held", "routing")

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        #: Confirmed publishes of this turn that will have copies, by (publisher id, tag):
        #: empty but on a shard's turn with a tagged publish (intake reads it first).
        self.routing: dict[tuple[bytes, int], tuple[Publish, tuple[str, ...]]] = {}
        #: Publishes waiting for their copies, by the tag the copies carry (oldest first).
        self._waiting: dict[int, _Waiting] = {}
        #: Copies to send at the end of the turn: (publisher, encoded copy, shards).
        self._out: list[tuple[Peer, bytes, tuple[str, ...]]] = []
        self._next_tag = 1
        self.held = 0
        self.failed = 0

    def expect(self, peer: Peer, message: Publish, shards: tuple[str, ...]) -> bool:
        """A confirmed PUBLISH about to be routed here, whose copies go to `shards` once this
        shard confirms it. False: too many wait already, the key's (its quota) or the
        shard's (refused, 429)."""
        ctx = self._ctx
        problem = ctx.quotas.problem(PUBLISHES, peer.owner)
        if problem is None and len(self._waiting) + len(self.routing) >= MAX_WAITING_PUBLISHES:
            problem = f"{MAX_WAITING_PUBLISHES} publishes wait for their copies at other shards"
        if problem is not None:
            ctx.refuse(
                peer,
                ErrorCode.LIMIT_REACHED,
                f"{problem}: publish it again later",
                tag=message.tag,
            )
            return False
        self.routing[(peer.id, message.tag)] = (message, shards)  # type: ignore[index]
        return True

    def hold(self, peer: Peer, tag: int | None, message_id: bytes, count: int | None) -> bool:
        """This shard's CONFIRM of a publish: True if it waits here for the copies."""
        if tag is None:
            return False
        routing = self.routing.pop((peer.id, tag), None)
        if routing is None:
            return False
        message, shards = routing
        copy_tag = self._next_tag
        self._next_tag += 1
        waiting = self._waiting[copy_tag] = _Waiting(peer, tag, message_id, count, set(shards))
        waiting.since = self._ctx.now
        self._ctx.quotas.take(PUBLISHES, waiting.owner)
        self._out.append((peer, encode(msgspec.structs.replace(message, tag=copy_tag)), shards))
        self.held += 1
        return True

    def take_copies(self) -> list[tuple[Peer, bytes, tuple[str, ...]]]:
        """The copies to send this turn. A publish refused here has none (forgotten)."""
        if self.routing:
            self.routing.clear()
        out = self._out
        if out:
            self._out = []
        return out

    def publishers_waiting(self) -> set[bytes]:
        """The ids of the peers whose confirmed publishes wait for their copies (one routed
        this turn is not here: its peer has just been heard from)."""
        return {entry.peer.id for entry in self._waiting.values()}

    def has_copies_of(self, peer: Peer) -> bool:
        return any(entry[0] is peer for entry in self._out)

    def take_copies_of(self, peer: Peer) -> list[tuple[Peer, bytes, tuple[str, ...]]]:
        """The copies of this turn that `peer` published (it is going away)."""
        mine = [entry for entry in self._out if entry[0] is peer]
        if mine:
            self._out = [entry for entry in self._out if entry[0] is not peer]
        return mine

    def on_answer(self, shard: str, answer: Any) -> None:
        """A shard's CONFIRM or ERROR of a copy."""
        waiting = self._waiting.get(answer.tag)
        if waiting is None or shard not in waiting.shards:
            return
        if type(answer) is Error:
            self._fail(answer.tag, f"shard {shard} refused its copy: {answer.code} {answer.reason}")
            return
        waiting.shards.discard(shard)
        if waiting.count is not None and type(answer) is Confirm and answer.count is not None:
            waiting.count += answer.count
        else:
            waiting.count = None
        if not waiting.shards:
            self._forget(answer.tag)
            self._confirm(waiting)

    def shard_lost(self, shard: str, why: str) -> None:
        """A shard cannot be reached: the publishes waiting for its copy fail."""
        for copy_tag, waiting in list(self._waiting.items()):
            if shard in waiting.shards:
                self._fail(copy_tag, f"shard {shard} cannot be reached: {why}")

    def expire(self) -> None:
        """Publishes whose copies did not all answer within COPY_TIMEOUT_S fail."""
        oldest = self._ctx.now - int(COPY_TIMEOUT_S * NS_PER_SECOND)
        expired = []
        for copy_tag, waiting in self._waiting.items():  # oldest first: stops at the first
            if waiting.since > oldest:  # young one, so a turn costs nothing when none is due
                break
            expired.append((copy_tag, ", ".join(sorted(waiting.shards))))
        for copy_tag, late in expired:
            self._fail(copy_tag, f"no answer from shard {late} within {COPY_TIMEOUT_S:.0f}s")

    def peer_gone(self, peer: Peer) -> None:
        for copy_tag, waiting in list(self._waiting.items()):
            if waiting.peer is peer:
                self._forget(copy_tag)

    def _forget(self, copy_tag: int) -> _Waiting:
        waiting = self._waiting.pop(copy_tag)
        self._ctx.quotas.give_back(PUBLISHES, waiting.owner)
        return waiting

    def stats(self) -> dict[str, int]:
        return {"held": self.held, "waiting": len(self._waiting), "failed": self.failed}

    def _confirm(self, waiting: _Waiting) -> None:
        ctx = self._ctx
        data = encode_confirm(waiting.message_id, waiting.tag, waiting.count)
        if ctx.journal.durable:
            ctx.hold(waiting.peer, data)  # after this shard's own commit of it, too
        else:
            ctx.add(waiting.peer.id, data)
        ctx.counters.confirmed += 1

    def _fail(self, copy_tag: int, why: str) -> None:
        waiting = self._forget(copy_tag)
        self.failed += 1
        ctx = self._ctx
        ctx.handling = MessageType.PUBLISH
        ctx.refuse(
            waiting.peer,
            ErrorCode.SHUTTING_DOWN,
            f"the publish reached this shard's queues but not every shard's ({why}): publish"
            " it again with the same key",
            tag=waiting.tag,
        )
