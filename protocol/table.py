"""Which packets each message type carries: the one table both the reader and writer use.

Rule: a message's header count must equal the number of packets that follow; every required
packet must be present once, optional packets at most once, and nothing else. Packet order is
free on input (the PHP decoders key packets by type) and fixed on output (the table order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from . import messages as m
from .constants import MAX_INTEGER_DIGITS, ErrorCode, MessageType, PacketType
from .errors import RemoteProtocolError

P = PacketType


class TypeSpec:
    """How one message type maps to packets."""

    __slots__ = ("cls", "fields", "optional", "required", "type")

    def __init__(
        self,
        cls: type,
        required: tuple[PacketType, ...],
        optional: tuple[PacketType, ...] = (),
    ) -> None:
        self.cls = cls
        self.type: MessageType = cls.TYPE  # type: ignore[attr-defined]
        self.required = required
        self.optional = optional
        #: (packet, Struct field) in wire order: required first, then optional.
        self.fields = tuple((p, FIELD_OF_PACKET[p]) for p in required + optional)

    @property
    def counts(self) -> range:
        return range(len(self.required), len(self.required) + len(self.optional) + 1)


FIELD_OF_PACKET: dict[PacketType, str] = {
    P.QUEUE: "queue",
    P.CONTENT: "content",
    P.MESSAGE_ID: "message_id",
    P.COUNT: "count",
    P.TTL: "ttl",
    P.ERROR_CODE: "code",
    P.REASON: "reason",
    P.DELIVERY_COUNT: "delivery_count",
    P.OPTIONS: "options",
    P.LEASE_MS: "lease_ms",
    P.DELAY_MS: "delay_ms",
    P.HEADERS: "headers",
    P.KEY: "key",
    P.TAG: "tag",
    P.REFUSED: "refused",
    P.EVENT: "event",
    P.PATTERNS: "patterns",
    P.UNUSED_MS: "unused_ms",
    P.REPLY_TO: "reply_to",
    P.CORRELATION: "correlation",
    P.PEER: "peer",
    P.FLAGS: "flags",
    P.MESSAGE_KEY: "message_key",
    P.PRINCIPAL: "principal",
}

SPECS: dict[MessageType, TypeSpec] = {
    spec.type: spec
    for spec in (
        # 001: the stock client sends 2 packets (pre-TTL), the README form 3; a confirming
        # producer adds its tag (and key) right after, which keeps it on the fast path.
        TypeSpec(
            m.Send,
            (P.QUEUE, P.CONTENT),
            (
                P.TTL,
                P.TAG,
                P.KEY,
                P.HEADERS,
                P.REPLY_TO,
                P.CORRELATION,
                P.DELAY_MS,
                P.MESSAGE_KEY,
            ),
        ),
        TypeSpec(m.Consume, (P.QUEUE, P.COUNT), (P.LEASE_MS, P.PATTERNS, P.UNUSED_MS)),
        # 003: 3 packets pre-TTL, 4 with TTL, 5 with the delivery-count extension.
        TypeSpec(
            m.Dispatch,
            (P.QUEUE, P.CONTENT, P.MESSAGE_ID),
            (
                P.TTL,
                P.DELIVERY_COUNT,
                P.HEADERS,
                P.EVENT,
                P.REPLY_TO,
                P.CORRELATION,
                P.MESSAGE_KEY,
            ),
        ),
        TypeSpec(m.Ack, (P.QUEUE, P.MESSAGE_ID)),
        TypeSpec(m.Requeue, (P.QUEUE, P.MESSAGE_ID, P.TTL), (P.DELAY_MS, P.FLAGS)),
        TypeSpec(m.DeadLetter, (P.QUEUE, P.MESSAGE_ID), (P.REASON,)),
        TypeSpec(
            m.Error,
            (P.ERROR_CODE, P.REASON),
            (P.MESSAGE_ID, P.QUEUE, P.TAG, P.REFUSED, P.COUNT),
        ),
        TypeSpec(m.Confirm, (P.MESSAGE_ID,), (P.TAG, P.COUNT)),
        TypeSpec(m.Pause, (P.ERROR_CODE, P.REASON), (P.QUEUE,)),
        TypeSpec(m.Resume, (), (P.QUEUE,)),
        TypeSpec(m.Publish, (P.EVENT, P.CONTENT), (P.TTL, P.TAG, P.KEY, P.HEADERS, P.MESSAGE_KEY)),
        TypeSpec(m.Cancel, (P.QUEUE,), (P.REASON, P.COUNT)),
        TypeSpec(m.Hello, (), (P.OPTIONS,)),
        TypeSpec(m.Heartbeat, ()),
        TypeSpec(m.Disconnect, (), (P.REASON,)),
        TypeSpec(m.Kbai, ()),
        TypeSpec(m.Admin, (), (P.OPTIONS,)),
        TypeSpec(m.AdminReply, (), (P.OPTIONS,)),
        TypeSpec(
            m.Reply,
            (P.CONTENT,),
            (P.QUEUE, P.MESSAGE_ID, P.CORRELATION, P.ERROR_CODE, P.REASON, P.HEADERS),
        ),
        TypeSpec(m.Forward, (P.PEER, P.CONTENT), (P.FLAGS, P.PRINCIPAL)),
    )
}

SPEC_OF_CLASS: dict[type, TypeSpec] = {spec.cls: spec for spec in SPECS.values()}

#: Message types of the phpmq-zmq extension range.
EXTENSION_TYPES = frozenset(t for t in MessageType if t >= 100)


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise RemoteProtocolError("packet is not valid UTF-8", ErrorCode.MALFORMED) from None


def _integer(raw: bytes) -> int:
    if not raw.isdigit() or len(raw) > MAX_INTEGER_DIGITS:
        raise RemoteProtocolError(
            f"integer packet must be 1-{MAX_INTEGER_DIGITS} ASCII digits", ErrorCode.MALFORMED
        )
    return int(raw)


_json_object = msgspec.json.Decoder(dict[str, Any])


def _options(raw: bytes) -> dict[str, Any]:
    try:
        return _json_object.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        # msgspec reports invalid UTF-8 inside a JSON string as a bare UnicodeDecodeError.
        raise RemoteProtocolError(f"options packet is not a JSON object: {exc}") from None
    except RecursionError:
        # msgspec recurses per nesting level: ~1000 `[` would otherwise escape the decoders.
        raise RemoteProtocolError("options packet is nested too deeply") from None


#: How a packet's raw bytes become a field value; None keeps the bytes as they are. Message
#: IDs and producer headers stay bytes: the broker only matches and passes them on.
DECODE_VALUE: dict[PacketType, Callable[[bytes], Any] | None] = {
    P.QUEUE: _text,
    P.CONTENT: None,
    P.MESSAGE_ID: None,
    P.COUNT: _integer,
    P.TTL: _integer,
    P.ERROR_CODE: _integer,
    P.REASON: _text,
    P.DELIVERY_COUNT: _integer,
    P.OPTIONS: _options,
    P.LEASE_MS: _integer,
    P.DELAY_MS: _integer,
    P.HEADERS: None,
    P.KEY: _text,
    P.TAG: _integer,
    P.REFUSED: _integer,
    P.EVENT: _text,
    P.PATTERNS: _text,
    P.UNUSED_MS: _integer,
    P.REPLY_TO: _text,
    P.CORRELATION: _text,
    P.PEER: None,
    P.FLAGS: _integer,
    P.MESSAGE_KEY: None,
    P.PRINCIPAL: None,
}
