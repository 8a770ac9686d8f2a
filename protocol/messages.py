"""The PHPMQ messages as frozen msgspec Structs: one class per message type.

A Struct holds exactly what is on the wire. An optional field left as None is a packet that is
absent, which is how the two dialects differ: `Send(ttl=None)` is the stock client's pre-TTL
001 (2 packets), `Send(ttl=0)` the README's 001 (3 packets). TTL is in whole seconds and 0
means the message never expires.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from .constants import MessageType


class Send(msgspec.Struct, frozen=True, gc=False):
    """001: a client sends `content` to `queue`."""

    TYPE: ClassVar[MessageType] = MessageType.SEND
    queue: str
    content: bytes
    ttl: int | None = None
    #: Extension packet: a number the producer chooses; the broker answers the send with a
    #: CONFIRM or ERROR carrying it back (publisher confirms).
    tag: int | None = None
    #: Extension packet: the producer's idempotency key; a repeat within the broker's
    #: window is confirmed with the first message's ID instead of being queued again.
    key: str | None = None
    #: Extension packet: a JSON object (its encoded bytes) the broker keeps with the message
    #: and hands to extension consumers untouched (e.g. a worker's per-message timeout).
    headers: bytes | None = None
    #: Extension packets of a request (docs/protocol.md §6.6): where the reply goes ("" the
    #: sender, else a reply queue) and the requester's id for it.
    reply_to: str | None = None
    correlation: str | None = None
    #: Extension packet: the message stays invisible this long first (a delayed job, §6.7).
    delay_ms: int | None = None
    #: Extension packet: the producer's key for the message (Kafka's record key), kept with
    #: it and passed on to extension consumers; the broker never reads it.
    message_key: bytes | None = None


class Consume(msgspec.Struct, frozen=True, gc=False):
    """002: a client asks for at most `count` unacked messages of `queue` at a time.

    `lease_ms` (extension packet) overrides how long the broker waits for each message's ack
    before it takes the message back; 0 means never.
    """

    TYPE: ClassVar[MessageType] = MessageType.CONSUME
    queue: str
    count: int
    lease_ms: int | None = None
    #: Extension packet: binding patterns (separated by single spaces) the queue is bound to
    #: in the same request (docs/protocol.md §6.5).
    patterns: str | None = None
    #: Extension packet: delete the queue once it has had no consumer for this long (ms).
    unused_ms: int | None = None


class Dispatch(msgspec.Struct, frozen=True, gc=False):
    """003: the broker delivers a message; `ttl` is the remaining time to live."""

    TYPE: ClassVar[MessageType] = MessageType.DISPATCH
    queue: str
    content: bytes
    message_id: bytes
    ttl: int | None = None
    delivery_count: int | None = None
    #: The producer's HEADERS packet as it sent it (JSON bytes).
    headers: bytes | None = None
    #: The event a published copy was published as (extension peers only).
    event: str | None = None
    #: A request's reply route ("": its sender) and correlation id; a correlation alone marks
    #: a reply put into a reply queue (§6.6).
    reply_to: str | None = None
    correlation: str | None = None
    #: The producer's message key (extension peers only).
    message_key: bytes | None = None


class Ack(msgspec.Struct, frozen=True, gc=False):
    """004: a client is done with a message."""

    TYPE: ClassVar[MessageType] = MessageType.ACK
    queue: str
    message_id: bytes


class Requeue(msgspec.Struct, frozen=True, gc=False):
    """005: a client puts a message back at the tail of its queue with a new TTL.

    `delay_ms` (extension packet) keeps it out of the queue that long first: a retry backoff.
    `flags` (extension packet) with REQUEUE_UNSTARTED: the consumer never started it, so it
    goes back to the head as it was (TTL and delivery count unchanged; `ttl` and `delay_ms`
    are ignored).
    """

    TYPE: ClassVar[MessageType] = MessageType.REQUEUE
    queue: str
    message_id: bytes
    ttl: int
    delay_ms: int | None = None
    flags: int | None = None


#: REQUEUE flag: the consumer hands the message back without having started it.
REQUEUE_UNSTARTED = 1


class DeadLetter(msgspec.Struct, frozen=True, gc=False):
    """006: a client gives up on a message; `reason` is an extension packet."""

    TYPE: ClassVar[MessageType] = MessageType.DEAD_LETTER
    queue: str
    message_id: bytes
    reason: str | None = None


class Error(msgspec.Struct, frozen=True, gc=False):
    """100 (extension): the broker refuses something a peer sent."""

    TYPE: ClassVar[MessageType] = MessageType.ERROR
    code: int
    reason: str
    message_id: bytes | None = None
    queue: str | None = None
    #: The TAG of the send this refuses, when it carried one.
    tag: int | None = None
    #: The type of the message refused (1 a send, 2 a consume, ...), when the broker knows
    #: it: lets a client tell a refused send from a refused subscription.
    refused: int | None = None
    #: How many messages of the frame this one ERROR refuses (None: one). With a tag, the
    #: refused sends are those tagged tag, tag + 1, ..., tag + count - 1.
    count: int | None = None


class Confirm(msgspec.Struct, frozen=True, gc=False):
    """105 (extension): the broker accepted a send (durable mode: it is on disk); the ID is
    the message's, or the first one's for a repeated idempotency key."""

    TYPE: ClassVar[MessageType] = MessageType.CONFIRM
    message_id: bytes
    tag: int | None = None
    #: A PUBLISH's answer: how many queues got a copy (absent for a send, and for a publish
    #: answered from its idempotency key).
    count: int | None = None


class Pause(msgspec.Struct, frozen=True, gc=False):
    """106 (extension): the broker asks a producer to stop sending to `queue` (None: to any
    queue) until a RESUME: the queue is nearly full (429) or the broker's memory high (503)."""

    TYPE: ClassVar[MessageType] = MessageType.PAUSE
    code: int
    reason: str
    queue: str | None = None


class Resume(msgspec.Struct, frozen=True, gc=False):
    """107 (extension): the pause on `queue` (None: the broker-wide one) is over."""

    TYPE: ClassVar[MessageType] = MessageType.RESUME
    queue: str | None = None


class Publish(msgspec.Struct, frozen=True, gc=False):
    """108 (extension): publish `content` as `event`: one copy into every queue bound to a
    pattern that matches it. TTL, tag, key, headers and message key work as in 001."""

    TYPE: ClassVar[MessageType] = MessageType.PUBLISH
    event: str
    content: bytes
    ttl: int | None = None
    tag: int | None = None
    key: str | None = None
    headers: bytes | None = None
    message_key: bytes | None = None


class Cancel(msgspec.Struct, frozen=True, gc=False):
    """109 (extension). From a client: stop consuming `queue` and take back what I hold. From
    the broker: your consumption of `queue` is over (`reason`), `count` messages you held
    went back to it (cancelled) or are gone (queue deleted)."""

    TYPE: ClassVar[MessageType] = MessageType.CANCEL
    queue: str
    reason: str | None = None
    count: int | None = None


class Reply(msgspec.Struct, frozen=True, gc=False):
    """112 (extension). From a worker: the answer to the request `message_id` of `queue` that
    it holds (it settles the request like an ACK). From the broker: that answer, delivered to
    the requester, which matches it by `correlation`. `code` and `reason` make it an error
    reply (the handler failed)."""

    TYPE: ClassVar[MessageType] = MessageType.REPLY
    content: bytes
    queue: str | None = None
    message_id: bytes | None = None
    correlation: str | None = None
    code: int | None = None
    reason: str | None = None
    headers: bytes | None = None


class Hello(msgspec.Struct, frozen=True):
    """101 (extension): a peer opts in to extensions and states its options."""

    TYPE: ClassVar[MessageType] = MessageType.HELLO
    options: dict[str, Any] = {}


class Heartbeat(msgspec.Struct, frozen=True, gc=False):
    """102 (extension): I am alive and idle."""

    TYPE: ClassVar[MessageType] = MessageType.HEARTBEAT


class Disconnect(msgspec.Struct, frozen=True, gc=False):
    """103 (extension): stop sending me work; answer with KBAI."""

    TYPE: ClassVar[MessageType] = MessageType.DISCONNECT
    reason: str | None = None


class Kbai(msgspec.Struct, frozen=True, gc=False):
    """104 (extension): goodbye; forget me."""

    TYPE: ClassVar[MessageType] = MessageType.KBAI


class Admin(msgspec.Struct, frozen=True):
    """110 (extension): an operator command (stats, dead-letter list/replay/purge)."""

    TYPE: ClassVar[MessageType] = MessageType.ADMIN
    options: dict[str, Any] = {}


class AdminReply(msgspec.Struct, frozen=True):
    """111 (extension): the broker's answer to an ADMIN command."""

    TYPE: ClassVar[MessageType] = MessageType.ADMIN_REPLY
    options: dict[str, Any] = {}


class Forward(msgspec.Struct, frozen=True, gc=False):
    """113 (extension, between the shards of a cluster). From the shard a peer talks to: the
    messages in `content` came from that peer (`peer`, an opaque reference) for queues the
    receiving shard owns; `flags` say how the peer speaks (FORWARD_* bits) or that it is gone.
    From the owner: `content` is what to send that peer, unchanged."""

    TYPE: ClassVar[MessageType] = MessageType.FORWARD
    peer: bytes
    content: bytes
    flags: int | None = None
    #: From the shard a peer talks to: who the peer is (its principal, encoded by the
    #: broker), so the owner checks its messages with the peer's own rights.
    principal: bytes | None = None


#: FORWARD flags: the peer speaks extensions, the TTL form, asked for confirms, is gone.
FORWARD_EXTENSIONS = 1
FORWARD_TTL_FORM = 2
FORWARD_CONFIRM = 4
FORWARD_GONE = 8


Message = (
    Send
    | Consume
    | Dispatch
    | Ack
    | Requeue
    | DeadLetter
    | Error
    | Confirm
    | Pause
    | Resume
    | Publish
    | Cancel
    | Hello
    | Heartbeat
    | Disconnect
    | Kbai
    | Admin
    | AdminReply
    | Reply
    | Forward
)
