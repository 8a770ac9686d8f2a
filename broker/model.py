"""The broker's records: messages, queues, consumer windows, peers and counters.

Plain data with no behaviour beyond their own bookkeeping; the parts of the core
(intake, dispatch, peers, deadletters, ...) move records between these places.

Rule: a record is in exactly one place. READY records sit in their queue's `ready` deque;
IN_FLIGHT records sit in one consumer window's `held` dict; LEASED records in one batch
lease's list (broker/leases.py); GONE records (acked, dead-lettered
or expired) are referenced from nowhere that counts. An expired record may linger in `ready` as
a tombstone (state GONE) until it is popped or compacted; `stale` counts those.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, ClassVar

import msgspec

from ..protocol import queue_packet
from .permissions import NOTHING

READY = 0
IN_FLIGHT = 1
GONE = 2
DELAYED = 3  # requeued with a delay: back in the queue when the delay is over
LEASED = 4  # held by a batch lease (broker/leases.py) until it is committed or released

NS_PER_SECOND = 1_000_000_000
NS_PER_MS = 1_000_000
#: Message IDs: 32 lowercase hex characters (IdSource).
ID_BYTES = 32


#: What one held message costs beyond its content and headers: the record, its ID, the
#: bytes objects' headers, its slot in a deque or window (measured: `phpmq bench --memory`).
RECORD_OVERHEAD_BYTES = 200


def record_bytes(record: Record) -> int:
    """What a held message counts against the memory limit."""
    return (
        record.content_bytes + len(record.headers) + len(record.message_key) + RECORD_OVERHEAD_BYTES
    )


class Record(msgspec.Struct, gc=False):
    """One message inside the broker. `expires_at` is monotonic ns, 0 for never.

    Compact, since a queue may hold millions (`phpmq bench --memory`): the ID and the content
    share one bytes object (`data`: the 32-byte ID, then the content), which saves a second
    object header per message; make one with `new_record`. gc=False: a record refers only to
    bytes and ints, so it can never be part of a cycle; untracked, a queue of millions of
    records costs the garbage collector nothing.
    """

    #: The message ID (ID_BYTES) followed by the content.
    data: bytes
    expires_at: int
    #: Which delivery the next dispatch is: 1 the first time, +1 after each return.
    deliveries: int = 1
    state: int = READY
    #: While in flight under a lease: monotonic ns when it comes back; else 0.
    lease_until: int = 0
    #: The producer's HEADERS packet (JSON), passed on to extension consumers.
    headers: bytes = b""
    #: What only a RoutedRecord holds: the event a published copy was published as, and a
    #: request's reply route ("" its sender's peer, else a reply queue), the sender's peer id
    #: and the correlation id (alone: a reply put into a reply queue).
    #: Whether this is a RoutedRecord (its 003 then carries what it routes by).
    routed: ClassVar[bool] = False
    event: ClassVar[bytes] = b""
    reply_to: ClassVar[str | None] = None
    reply_peer: ClassVar[bytes] = b""
    correlation: ClassVar[str | None] = None
    #: The producer's message key (packet 27): only RoutedRecords carry one.
    message_key: ClassVar[bytes] = b""

    @property
    def id(self) -> bytes:
        return self.data[:ID_BYTES]

    @property
    def content(self) -> bytes:
        return self.data[ID_BYTES:]

    @property
    def content_bytes(self) -> int:
        return len(self.data) - ID_BYTES

    def remaining_ttl(self, now: int) -> int:
        """Whole seconds left, rounded up so that a live message never reads 0 (= never)."""
        if not self.expires_at:
            return 0
        return max(1, -((now - self.expires_at) // NS_PER_SECOND))


class DurableRecord(Record, gc=False):
    """A record of a durable broker: with its position for the store. Memory mode does without
    it: 7 fields instead of 6 take a record from 64 to 80 bytes."""

    #: Queue order is seq order (broker/queues.py, broker/durable.py).
    seq: int = 0


class RoutedRecord(Record, gc=False):
    """A message that carries more with it: a copy of a published event (broker/events.py),
    a request and its reply route (broker/replies.py), or a producer's message key. A
    subclass, so that a plain send's record stays as small as it was."""

    routed: ClassVar[bool] = True
    event: bytes = b""
    reply_to: str | None = None
    reply_peer: bytes = b""
    correlation: str | None = None
    message_key: bytes = b""  # type: ignore[misc]
    #: A request's: whose in-flight requests it counts against until it is retired (quotas.py).
    requester: str = ""


class DurableRoutedRecord(DurableRecord, gc=False):
    routed: ClassVar[bool] = True
    event: bytes = b""
    reply_to: str | None = None
    reply_peer: bytes = b""
    correlation: str | None = None
    message_key: bytes = b""  # type: ignore[misc]
    #: A request's: whose in-flight requests it counts against until it is retired (quotas.py).
    requester: str = ""


def new_record(
    message_id: bytes,
    content: bytes,
    expires_at: int,
    deliveries: int = 1,
    headers: bytes = b"",
    durable: bool = False,
    event: bytes = b"",
    reply_to: str | None = None,
    correlation: str | None = None,
    message_key: bytes = b"",
) -> Record:
    """A record (a DurableRecord if `durable`) for a message with this ID (ID_BYTES long);
    with an `event`, a reply route, a correlation id or a message key, a RoutedRecord
    (DurableRoutedRecord).

    Raises:
        ValueError: the ID is not ID_BYTES long.
    """
    if len(message_id) != ID_BYTES:
        raise ValueError(f"message IDs are {ID_BYTES} bytes, not {len(message_id)}")
    if event or reply_to is not None or correlation is not None or message_key:
        kind = DurableRoutedRecord if durable else RoutedRecord
        return kind(
            message_id + content,
            expires_at,
            deliveries,
            headers=headers,
            event=event,
            reply_to=reply_to,
            correlation=correlation,
            message_key=message_key,
        )
    kind = DurableRecord if durable else Record
    return kind(message_id + content, expires_at, deliveries, headers=headers)


class DeadLetterEntry(msgspec.Struct, frozen=True, gc=False):
    """A message taken out of circulation; `deliveries` is how often it was dispatched."""

    id: bytes
    content: bytes
    reason: str
    deliveries: int
    dead_at: float  # wall-clock seconds
    #: The producer's HEADERS packet and message key, kept so that a replay restores them.
    headers: bytes = b""
    message_key: bytes = b""


class Window:
    """One consumer's credit on one queue: at most `limit` messages held unacked."""

    __slots__ = ("held", "lease_due", "lease_ms", "limit", "peer", "queue")

    def __init__(self, peer: Peer, queue: Queue, limit: int) -> None:
        self.peer = peer
        self.queue = queue
        self.limit = limit
        self.held: dict[bytes, Record] = {}
        #: The consumer's own lease for this window (002's lease packet); None: the default.
        self.lease_ms: int | None = None
        #: When the window's lease timer is due (0: none armed); older timer entries are moot.
        self.lease_due = 0


class Queue:
    """A named queue: ready records in order, the windows consuming it, its dead letters."""

    __slots__ = (
        "creator",
        "dead",
        "dead_dropped",
        "deleted",
        "delayed",
        "delayed_sends",
        "in_flight",
        "leased",
        "leases",
        "max_deliveries",
        "max_length",
        "name",
        "overflow",
        "paused",
        "purging",
        "queue_packet",
        "ready",
        "refused",
        "serial",
        "stale",
        "turn",
        "unused_due",
        "unused_ms",
        "windows",
        # Totals for /metrics and `phpmq top` (docs/metrics.md): plain ints on the hot path.
        "published",
        "delivered",
        "acked",
        "requeued",
        "expired",
        "dead_lettered",
    )

    def __init__(
        self,
        name: str,
        dead_letter_limit: int,
        max_deliveries: int = 0,
        max_length: int = 0,
        overflow: str = "reject",
    ) -> None:
        self.name = name
        #: A number no other queue of this broker's life had (queues.py): what a TTL's
        #: deadline names it by, so that the deadline holds no object the GC must walk.
        self.serial = 0
        #: The owner (quotas.py) its creation counts against ("": the broker's own).
        self.creator = ""
        #: Settings (docs/protocol.md §8); 0 means no limit.
        self.max_deliveries = max_deliveries
        self.max_length = max_length
        self.overflow = overflow
        self.queue_packet = queue_packet(name)
        self.ready: deque[Record] = deque()
        self.stale = 0
        self.windows: list[Window] = []
        #: Round-robin offset, so that no consumer is always served first.
        self.turn = 0
        self.in_flight = 0
        #: Requeued with a delay, or sent with one (§6.7), and not yet back (visible).
        self.delayed = 0
        #: Of those, the delayed sends: unlike requeues they count against `max_length`.
        self.delayed_sends = 0
        self.dead: deque[DeadLetterEntry] = deque(maxlen=dead_letter_limit)
        self.dead_dropped = 0
        #: Sends refused (full, memory), and the HELLO producers told to pause on it (flow.py).
        self.refused = 0
        self.paused: dict[Peer, None] = {}
        #: Delete when unused (docs/protocol.md §6.5): after this many ms without a consumer
        #: window (None: never), and when that wait is due (0: not waiting).
        self.unused_ms: int | None = None
        self.unused_due = 0
        #: Deleted from the queue table: what still refers to it (a delay, a lease) lets go.
        self.deleted = False
        #: While ready records a purge set aside are being retired (queues.py): the records
        #: whose TTL came due meanwhile, looked at again once that is done (None: no purge).
        self.purging: list[Record] | None = None
        #: Batch leases of its messages by name (broker/leases.py), and the messages in them.
        self.leases: dict[str, Any] = {}
        self.leased = 0
        self.published = self.delivered = self.acked = 0
        self.requeued = self.expired = self.dead_lettered = 0

    @property
    def ready_count(self) -> int:
        return len(self.ready) - self.stale

    @property
    def pause_mark(self) -> int:
        """Ready messages at which a HELLO producer is asked to pause (90% of the limit):
        what it sends before the PAUSE arrives still fits."""
        return self.max_length - self.max_length // 10

    @property
    def resume_mark(self) -> int:
        """Ready messages below which paused producers may send again (80% of the limit)."""
        return self.max_length - self.max_length // 5

    def add_dead(self, entry: DeadLetterEntry) -> None:
        if len(self.dead) == self.dead.maxlen:
            self.dead_dropped += 1
        self.dead.append(entry)

    def compact(self) -> None:
        """Drop the tombstones at the head (TTLs mostly run out in the order sent: a few
        each time, never a pass over the deque), and the others once they are most of it."""
        ready = self.ready
        while self.stale and ready and ready[0].state != READY:
            ready.popleft()
            self.stale -= 1
        if self.stale > 64 and self.stale * 2 > len(ready):
            self.ready = deque(record for record in ready if record.state == READY)
            self.stale = 0


class IdSource:
    """Message IDs: 32 lowercase hex characters, as the bytes that go on the wire, encoded
    once, here. Time-ordered (docs/protocol.md §10): 12 hex digits of wall-clock milliseconds
    at intake (the turn's, set by `stamp`), the version digit `7`, then 19 random hex digits
    (76 bits) from the OS, read 4 KiB at a time: one syscall per 431 IDs.
    """

    _RANDOM_DIGITS = 19
    _READ_BYTES = 4096

    def __init__(self) -> None:
        self._hex = b""
        self._pos = 0
        self._prefix = b"0000000000007"

    def stamp(self, wall_ms: int) -> None:
        """The wall-clock time the next IDs carry (the core stamps once per turn)."""
        self._prefix = b"%012x7" % (wall_ms & 0xFFFF_FFFF_FFFF)

    def __call__(self) -> bytes:
        start = self._pos
        end = start + self._RANDOM_DIGITS
        if end > len(self._hex):
            self._hex = os.urandom(self._READ_BYTES).hex().encode()
            start, end = 0, self._RANDOM_DIGITS
        self._pos = end
        return self._prefix + self._hex[start:end]


class PeerProfile(msgspec.Struct, frozen=True):
    """What the transport a peer came in on tells the core about it: the core never reads
    peer ids. One profile per transport, shared by all its peers."""

    #: The transport's name, for logs and stats ("router", "tcp").
    transport: str
    #: Dispatch in the TTL (README) form until the peer shows which form it speaks.
    ttl_form: bool
    #: The transport holds a connection per peer, which it closes when the broker gives up on
    #: the peer (raw TCP); ZeroMQ peers have none to close.
    closable: bool = False


class Peer:
    """A client as the core knows it, keyed by the id its transport gave it."""

    __slots__ = (
        "admin_granted",
        "closing",
        "confirm",
        "connection_of",
        "expiry_due",
        "expiry_ns",
        "extensions",
        "forgotten",
        "forwarding",
        "heartbeat_due",
        "heartbeat_ns",
        "hello",
        "id",
        "last_seen",
        "last_sent",
        "link",
        "name",
        "owner",
        "over_quota",
        "paused_on",
        "principal",
        "principal_wire",
        "profile",
        "refused",
        "rights",
        "report",
        "role",
        "stalled",
        "ttl_form",
        "windows",
    )

    def __init__(self, peer_id: bytes, profile: PeerProfile, now: int) -> None:
        self.id = peer_id
        self.profile = profile
        #: Dispatch in the TTL (README) form; switched on by any TTL-form or extension message.
        self.ttl_form = profile.ttl_form
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
        #: Consumes queues of other shards through this one (forwarding.py): kept while so.
        self.forwarding = False
        #: Agreed heartbeat interval, and the silence after which it is dead (0: no heartbeats).
        self.heartbeat_ns = 0
        self.expiry_ns = 0
        #: Monotonic ns of the last frame from it, and of the last frame to it.
        self.last_seen = now
        self.last_sent = now
        #: When its liveness check and its next heartbeat are due (0: not armed). A schedule
        #: entry acts only if its time is still the one recorded here, so re-arming earlier
        #: (a new HELLO) makes older entries moot.
        self.expiry_due = 0
        self.heartbeat_due = 0
        #: Messages of its refused (counted for stats).
        self.refused = 0
        #: Who it is as its transport knows it (broker/guard.py), and what it may do (None:
        #: everything, unchecked). Until the guard has identified it, nothing: a missing
        #: record never means "allowed".
        self.principal: Any = None
        self.rights: Any = NOTHING
        #: Its HELLO carried the admin secret (the admin right on top of its own).
        self.admin_granted = False
        #: A shard link of this broker's own cluster, proven by key or link secret
        #: (broker/guard.py): the only peer whose FORWARDs are taken.
        self.link = False
        #: Its principal as a FORWARD carries it to other shards (forwarding.py), encoded once.
        self.principal_wire: bytes | None = None
        #: Whom its quotas count against (quotas.py): its key, or its host.
        self.owner = ""
        #: Why it may do nothing: its key had its quota of connections when it came (429).
        self.over_quota: str | None = None
        #: The owner its connection is counted against while it is known (peers.py).
        self.connection_of = ""
        #: A lease ran out while it said nothing at all: frozen or gone. It gets no new work
        #: until it speaks again (dispatch.py).
        self.stalled = False
        #: Where it was told to PAUSE: queues, and None for the broker-wide pause (flow.py).
        self.paused_on: list[Queue | None] = []

    def opt_in(self) -> None:
        """The peer spoke an extension: it gets ERRORs, delivery counts and the TTL form."""
        self.extensions = True
        self.ttl_form = True


class Counters:
    """What the broker did, as plain int attributes (bumped on the hot path); `stats` shows
    them in this order."""

    received: int
    dispatched: int
    acked: int
    requeued: int
    dead_lettered: int
    expired: int
    redelivered: int
    lease_expired: int
    peers_expired: int
    max_deliveries: int
    overflowed: int
    confirmed: int
    deduplicated: int
    errors: int
    refused_memory: int
    pauses: int
    resumes: int
    stalled_consumers: int
    consumers_reclaimed: int
    connections_reclaimed: int
    published: int
    routed: int
    unrouted: int
    cancelled: int
    queues_deleted: int
    queues_unused_deleted: int
    deleted_messages: int
    requests: int
    replied: int
    replies_dropped: int
    scheduled_runs: int
    leased: int
    lease_committed: int
    lease_released: int
    leases_timed_out: int
    returned_unstarted: int

    __slots__ = tuple(__annotations__)

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}
