"""What every part of the core shares during a loop turn: the clock reading, the settings,
the counters, the schedule, the journal, the replies being gathered for each peer, and which
queues want a dispatch pass.

It owns no decisions. Parts reach each other only through the objects they are given, and
all of them reach the outside world only through this context's outbox.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..protocol import Error, Message, encode
from .clock import Clock
from .config import BrokerConfig
from .copies import CopyConfirms
from .deadlines import Deadlines
from .journal import Journal, NullJournal
from .model import GONE, NS_PER_SECOND, Counters, IdSource, Peer, Queue, Record, record_bytes
from .quotas import REQUESTS, Quotas

log = logging.getLogger("phpmq.broker")

Frames = list[tuple[bytes, bytes]]


class Context:
    __slots__ = (
        "awaiting_replies",
        "clock",
        "config",
        "confirms",
        "copies",
        "counters",
        "dirty",
        "draining",
        "handling",
        "held_bytes",
        "input_pending",
        "journal",
        "new_id",
        "now",
        "outbox",
        "owner",
        "quotas",
        "refusals",
        "refused_sends",
        "refusing",
        "repeats",
        "deadlines",
        "leader_hint",
        "standby",
        "started_ns",
        "storage_problem",
        "turns",
        "_flushed",
        "_last_log",
        "_refusal",
    )

    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        journal: Journal | NullJournal,
        new_id: Callable[[], bytes] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.now = clock.monotonic_ns()
        self.started_ns = self.now
        self.new_id = new_id or IdSource()
        self.stamp_ids()
        self.counters = Counters()
        self.deadlines = Deadlines()
        self.journal = journal
        journal.bind_clock(self.wall_at)
        #: Frames for each peer gathered this turn, sent together at its end.
        self.outbox: dict[bytes, list[bytes]] = {}
        #: Durable mode: CONFIRMs held until the turn's commit is on disk.
        self.confirms: dict[bytes, list[bytes]] = {}
        #: Queues that want a dispatch pass at the end of the turn (a dict keeps the order).
        self.dirty: dict[Queue, None] = {}
        #: Shutting down: no new sends, no dispatch; acks still work.
        self.draining = False
        #: Set while the store cannot write: sends are refused with this reason.
        self.storage_problem: str | None = None
        #: A follower replica of its shard (docs/cluster.md "Replicated queues"): why this
        #: broker does not serve its shard's queues (they are forwarded to the leader), and
        #: the leader's endpoint when known. None: it serves them.
        self.standby: str | None = None
        self.leader_hint: str | None = None
        #: A shard's confirmed publishes waiting for their copies at the other shards.
        self.copies = CopyConfirms(self)
        #: The type of the message being handled, which a refusal names (ERROR packet 19).
        self.handling: int | None = None
        #: Per-key quotas, and whose message is being handled ("": the broker's own work).
        self.quotas = Quotas(config)
        self.owner = ""
        #: The server's last turn stopped reading at its budget: frames are waiting unread, so
        #: silence is not proof that a peer is dead (peers.py).
        self.input_pending = False
        #: Peers' requests whose replies come back to them, not yet retired: peer id -> how
        #: many (none kept at 0; at most the request records held).
        self.awaiting_replies: dict[bytes, int] = {}
        self._last_log: dict[str, tuple[int, int]] = {}
        #: Bytes the messages held (ready, in flight, delayed) take, as `record_bytes` counts
        #: them: what the broker's memory limit is measured against (flow.py).
        self.held_bytes = 0
        #: The refusal being gathered: like refusals in a row from one peer leave as one ERROR
        #: with a count (see `refuse`).
        self._refusal: _Refusal | None = None
        #: The refusal flushed last and its ERROR's bytes (`reopen_refusal`).
        self._flushed: tuple[_Refusal, bytes] | None = None
        #: Refusals by error code since start, for /metrics (docs/metrics.md).
        self.refusals: dict[int, int] = {}
        #: How many 001s like the one being handled follow it in its frame, unread (the core
        #: sets it, protocol/runs.py): a part that refuses it for a reason they share takes
        #: them (`take_repeats`) and refuses them with it, so a refused frame costs one
        #: refusal, not one decode and one refusal per message.
        self.repeats = 0
        #: Loop turns begun (`Core.begin_turn`): what per-turn bounds are counted by.
        self.turns = 0
        #: Whether a send was refused for a reason its like share (a part took `repeats`) in
        #: this turn, and in this turn or the last: only while it is, the core looks for runs
        #: of refused sends, so a broker that refuses nothing pays nothing for it.
        self.refused_sends = False
        self.refusing = False

    def retire(self, record: Record) -> None:
        """A message leaves for good (acked, buried, purged, deleted with its queue): nothing
        that points to it acts on it any more (its deadlines find it GONE), and its bytes no
        longer count against the memory limit. The one place that does both."""
        record.state = GONE
        self.held_bytes -= record_bytes(record)
        if record.routed and record.correlation is not None:  # type: ignore[attr-defined]
            if record.requester:  # type: ignore[attr-defined]
                self.quotas.give_back(REQUESTS, record.requester)  # type: ignore[attr-defined]
            if record.reply_peer:  # type: ignore[attr-defined]
                self._replied(record.reply_peer)  # type: ignore[attr-defined]

    def awaiting_reply(self, peer_id: bytes) -> None:
        """A request of the peer's whose reply comes back to it was put (`retire` ends it)."""
        self.awaiting_replies[peer_id] = self.awaiting_replies.get(peer_id, 0) + 1

    def _replied(self, peer_id: bytes) -> None:
        left = self.awaiting_replies.get(peer_id, 0) - 1  # (none for a request from a store)
        if left > 0:
            self.awaiting_replies[peer_id] = left
        else:
            self.awaiting_replies.pop(peer_id, None)

    def stamp_ids(self) -> None:
        """New message IDs carry this turn's wall-clock time (their sent_at)."""
        stamp = getattr(self.new_id, "stamp", None)
        if stamp is not None:
            stamp(int(self.clock.wall() * 1000))

    def wall_at(self, monotonic_ns: int) -> float:
        """A monotonic deadline as wall-clock seconds (for the store and for display)."""
        return self.clock.wall() + (monotonic_ns - self.now) / NS_PER_SECOND

    def mark_dirty(self, queue: Queue) -> None:
        self.dirty[queue] = None

    def add(self, peer_id: bytes, data: bytes) -> None:
        """Encoded bytes for a peer, sent with the turn's other frames for it."""
        chunks = self.outbox.get(peer_id)
        if chunks is None:
            chunks = self.outbox[peer_id] = []
        chunks.append(data)

    def reply(self, peer: Peer, message: Message) -> None:
        self.reply_encoded(peer, encode(message))

    def reply_encoded(self, peer: Peer, data: bytes) -> None:
        """A reply already encoded (one answer many peers get, encoded once)."""
        if self._refusal is not None:
            self.flush_refusals()
        self.add(peer.id, data)

    def hold(self, peer: Peer, data: bytes) -> None:
        """Durable mode: an answer that says something is stored (a CONFIRM, the reply to
        a command that changed the store) waits with the CONFIRMs for the turn's commit."""
        chunks = self.confirms.get(peer.id)
        if chunks is None:
            chunks = self.confirms[peer.id] = []
        chunks.append(data)

    def take_repeats(self) -> int:
        """The like 001s after the one being refused (see `repeats`), now refused with it."""
        repeats = self.repeats
        self.repeats = 0
        self.refused_sends = self.refusing = True
        return repeats

    def refuse(
        self,
        peer: Peer,
        code: int,
        reason: str,
        message_id: bytes | None = None,
        queue: str | None = None,
        tag: int | None = None,
        count: int = 1,
    ) -> None:
        """An ERROR to extension peers, naming the type of the message refused; a counted,
        rate-limited log line for stock peers. `count`: like messages refused as one (no
        tags; see `repeats`).

        Refusals of one peer in a row that differ only in their tag, when the tags run on
        (tag, tag + 1, ...) or none has one, leave as one ERROR with a count: a frame of 256
        sends to a full queue costs its sender one reply, not 256 (docs/protocol.md §6.1).
        """
        self.counters.errors += count
        self.refusals[code] = self.refusals.get(code, 0) + count
        peer.refused += count
        if not peer.extensions:
            self.log_limited(f"refused from {peer.id.hex()}: {code} {reason}", str(int(code)))
            return
        pending = self._refusal
        if pending is not None:
            if (
                message_id is None
                and pending.peer is peer
                and pending.code == code
                and pending.queue == queue
                and pending.handling == self.handling
                and pending.reason == reason
                and (
                    pending.tag is None
                    if tag is None
                    else pending.tag is not None and tag == pending.tag + pending.count
                )
            ):
                pending.count += count
                return
            self.flush_refusals()
        if message_id is not None:
            error = Error(int(code), reason, message_id, queue, tag, self.handling)
            self.add(peer.id, encode(error))
        else:
            self._refusal = _Refusal(peer, int(code), reason, queue, tag, self.handling, count)

    def flush_refusals(self) -> None:
        """The refusal being gathered goes into the outbox (after each frame, and before
        any other reply, so that replies keep their order)."""
        pending = self._refusal
        if pending is None:
            return
        self._refusal = None
        count = pending.count if pending.count > 1 else None
        error = encode(
            Error(
                pending.code,
                pending.reason,
                None,
                pending.queue,
                pending.tag,
                pending.handling,
                count,
            )
        )
        self.add(pending.peer.id, error)
        self._flushed = (pending, error)

    def reopen_refusal(self, peer_id: bytes) -> None:
        """Take back the refusal of `peer_id` just flushed while its ERROR is still the last
        thing for the peer, so that like refusals after it (the rest of the same frame,
        handled apart) join its count."""
        flushed, self._flushed = self._flushed, None
        if flushed is None or self._refusal is not None or flushed[0].peer.id != peer_id:
            return
        pending, error = flushed
        chunks = self.outbox.get(peer_id)
        if chunks and chunks[-1] is error:
            chunks.pop()
            self._refusal = pending

    def log_limited(self, line: str, key: str) -> None:
        """At most one line per second per key, with the count of lines held back."""
        last_ns, held_back = self._last_log.get(key, (0, 0))
        if self.now - last_ns >= NS_PER_SECOND or last_ns == 0:
            suffix = f" ({held_back} similar lines held back)" if held_back else ""
            log.warning("%s%s", line, suffix)
            self._last_log[key] = (self.now, 0)
        else:
            self._last_log[key] = (last_ns, held_back + 1)

    def take_frames(self, outbox: dict[bytes, list[bytes]], peers: dict[bytes, Peer]) -> Frames:
        """One frame per peer from `outbox`; each peer that gets one was just sent to."""
        now = self.now
        frames = []
        for peer_id, chunks in outbox.items():
            peer = peers.get(peer_id)
            if peer is not None:
                peer.last_sent = now
            frames.append((peer_id, b"".join(chunks)))
        return frames


class _Refusal:
    """Refusals gathered into one ERROR: `count` of them, the first with `tag`."""

    __slots__ = ("code", "count", "handling", "peer", "queue", "reason", "tag")

    def __init__(
        self,
        peer: Peer,
        code: int,
        reason: str,
        queue: str | None,
        tag: int | None,
        handling: int | None,
        count: int = 1,
    ) -> None:
        self.peer = peer
        self.code = code
        self.reason = reason
        self.queue = queue
        self.tag = tag
        self.handling = handling
        self.count = count
