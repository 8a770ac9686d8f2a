"""Messages -> bytes, in the table's packet order.

`encode` takes any message Struct. `dispatch_prefix`/`encode_dispatch` are the broker's hot
path: the queue packet is built once per queue and the ID packet once per message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from .constants import (
    INTEGER_LIMIT,
    LENGTH_DIGITS,
    MAX_INTEGER_DIGITS,
    PACKET_HEADER_BYTES,
    PROTOCOL_VERSION,
    MessageType,
    PacketType,
)
from .errors import LocalProtocolError
from .messages import Confirm, Message
from .table import SPEC_OF_CLASS, SPECS

_json = msgspec.json.Encoder()
_MAX_LENGTH = 10**LENGTH_DIGITS - 1


def packet(packet_type: int, content: bytes) -> bytes:
    """One packet: its 32-byte header and the content."""
    return b"P%02d%029d" % (packet_type, len(content)) + content


def message_header(message_type: int, packet_count: int) -> bytes:
    return b"H%02d%03d%02d" % (PROTOCOL_VERSION, message_type, packet_count)


def _value_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        raise LocalProtocolError("booleans have no PHPMQ encoding")
    if isinstance(value, int):
        if not 0 <= value < INTEGER_LIMIT:
            raise LocalProtocolError(f"integers are 0 to {MAX_INTEGER_DIGITS} digits: {value}")
        return b"%d" % value
    if isinstance(value, dict):
        return _json.encode(value)
    raise LocalProtocolError(f"cannot encode a {type(value).__name__} as a packet")


def encode(message: Message) -> bytes:
    """Encode one message.

    Raises:
        LocalProtocolError: a required field is None, or a value cannot be encoded.
    """
    spec = SPEC_OF_CLASS[type(message)]
    parts = []
    for index, (packet_type, field) in enumerate(spec.fields):
        value = getattr(message, field)
        if value is None:
            if index < len(spec.required):
                raise LocalProtocolError(f"{spec.type.name} needs {field}")
            continue
        if field == "options" and not value and index >= len(spec.required):
            continue
        content = _value_bytes(value)
        if len(content) > _MAX_LENGTH:
            raise LocalProtocolError("content longer than a 29-digit length allows")
        parts.append(packet(packet_type, content))
    return message_header(spec.type, len(parts)) + b"".join(parts)


def admin_reply_with_ref(frame: bytes, ref: int | None) -> bytes:
    """An encoded ADMIN_REPLY (one message, its answer an object) with `ref` put at the top
    of its answer: one answer encoded once for many askers, each with its own ref."""
    if ref is None:
        return frame
    header = message_header(MessageType.ADMIN_REPLY, 1)
    answer = frame[len(header) + PACKET_HEADER_BYTES :] or b"{}"  # {} is sent as no packet
    rest = b"}" if answer == b"{}" else b"," + answer[1:]
    return header + packet(PacketType.OPTIONS, b'{"ref":%d' % ref + rest)


def encode_all(messages: list[Message]) -> bytes:
    """Encode several messages into one frame."""
    return b"".join([encode(message) for message in messages])


#: Packet headers as %-forms of their length.
_CONTENT_PACKET = b"P%02d%%029d" % PacketType.CONTENT
_ID_PACKET = b"P%02d%%029d" % PacketType.MESSAGE_ID
_TTL_PACKET = b"P%02d%%029d" % PacketType.TTL
_DELIVERY_COUNT_PACKET = b"P%02d%%029d" % PacketType.DELIVERY_COUNT
_TAG_PACKET = b"P%02d%%029d" % PacketType.TAG
_KEY_PACKET = b"P%02d%%029d" % PacketType.KEY
_HEADERS_PACKET = b"P%02d%%029d" % PacketType.HEADERS
_MESSAGE_KEY_PACKET = b"P%02d%%029d" % PacketType.MESSAGE_KEY
_REPLY_TO_PACKET = b"P%02d%%029d" % PacketType.REPLY_TO
_CORRELATION_PACKET = b"P%02d%%029d" % PacketType.CORRELATION
_EVENT_PACKET = b"P%02d%%029d" % PacketType.EVENT
#: Packet headers (or whole number packets) remembered per kind; past it they are formatted
#: each time, so no peer can grow them.
MAX_REMEMBERED = 1024


class _Remembered(dict[int, bytes]):
    """`form % n` for each n asked for (a packet header for a length, or a number packet for
    a value): most repeat (IDs, contents of one size, TTLs, delivery counts), and a dict
    look-up is a third of the cost of formatting 29 digits."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[int], bytes]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, n: int) -> bytes:
        made = self.make(n)
        if len(self) < MAX_REMEMBERED:
            self[n] = made
        return made


def _number_packet_of(form: bytes) -> Callable[[int], bytes]:
    def make(value: int) -> bytes:
        digits = b"%d" % value
        return form % len(digits) + digits

    return make


_CONTENT_HEADERS = _Remembered(_CONTENT_PACKET.__mod__)
_ID_HEADERS = _Remembered(_ID_PACKET.__mod__)
_TTL_PACKETS = _Remembered(_number_packet_of(_TTL_PACKET))
_DELIVERY_PACKETS = _Remembered(_number_packet_of(_DELIVERY_COUNT_PACKET))
_HEADERS_HEADERS = _Remembered(_HEADERS_PACKET.__mod__)
_TAG_HEADERS = _Remembered(_TAG_PACKET.__mod__)
_KEY_HEADERS = _Remembered(_KEY_PACKET.__mod__)
_MESSAGE_KEY_HEADERS = _Remembered(_MESSAGE_KEY_PACKET.__mod__)
#: 003's message header by the parts after its ID packet: none, TTL, TTL and delivery count,
#: and those with the headers packet (two parts).
_DISPATCH_HEADERS = {
    parts: message_header(MessageType.DISPATCH, count)
    for parts, count in ((0, 3), (1, 4), (2, 5), (4, 6))
}


#: 003's message header by its packet count, for the routed form (5 packets and more).
_ROUTED_DISPATCH_HEADERS = {
    count: message_header(MessageType.DISPATCH, count) for count in range(5, 11)
}


def queue_packet(queue: str) -> bytes:
    """The queue packet, which the broker caches per queue."""
    return packet(PacketType.QUEUE, queue.encode())


def event_packet(event: str) -> bytes:
    """The event packet of a 108, built once for many publishes of one event."""
    return packet(PacketType.EVENT, event.encode())


def encode_dispatch(
    queue_packet: bytes,
    content: bytes,
    message_id: bytes,
    ttl: int | None,
    delivery_count: int | None,
    headers: bytes = b"",
) -> bytes:
    """003 in the form the receiving peer speaks: `ttl=None` is the pre-TTL 3-packet form,
    a `delivery_count` adds the extension packet (only for peers that opted in), and so do
    `headers` (JSON bytes as the producer's HEADERS packet carried them). A 003 with an
    event or a reply route is rare enough for `encode(Dispatch(...))`."""
    after_id: tuple[bytes, ...]
    if ttl is None:
        after_id = ()
    elif delivery_count is None:
        after_id = (_TTL_PACKETS[ttl],)
    elif not headers:
        after_id = (_TTL_PACKETS[ttl], _DELIVERY_PACKETS[delivery_count])
    else:
        after_id = (
            _TTL_PACKETS[ttl],
            _DELIVERY_PACKETS[delivery_count],
            _HEADERS_HEADERS[len(headers)],
            headers,
        )
    return b"".join(
        (
            _DISPATCH_HEADERS[len(after_id)],
            queue_packet,
            _CONTENT_HEADERS[len(content)],
            content,
            _ID_HEADERS[len(message_id)],
            message_id,
            *after_id,
        )
    )


def encode_routed_dispatch(
    queue_packet: bytes,
    content: bytes,
    message_id: bytes,
    ttl: int,
    delivery_count: int,
    headers: bytes,
    event: bytes,
    reply_to: str | None,
    correlation: str | None,
    message_key: bytes,
) -> bytes:
    """003 to an extension peer with what a published copy, a request, a reply put into a
    reply queue or a keyed message carries (the broker's hot path for requests): the bytes
    `encode(Dispatch(...))` writes, an empty `headers`, `event` or `message_key` left out."""
    parts = [
        b"",
        queue_packet,
        _CONTENT_HEADERS[len(content)],
        content,
        _ID_HEADERS[len(message_id)],
        message_id,
        _TTL_PACKETS[ttl],
        _DELIVERY_PACKETS[delivery_count],
    ]
    packets = 5
    if headers:
        parts += (_HEADERS_HEADERS[len(headers)], headers)
        packets += 1
    if event:
        parts += (_EVENT_PACKET % len(event), event)
        packets += 1
    if reply_to is not None:
        reply_to_bytes = reply_to.encode()
        parts += (_REPLY_TO_PACKET % len(reply_to_bytes), reply_to_bytes)
        packets += 1
    if correlation is not None:
        correlation_bytes = correlation.encode()
        parts += (_CORRELATION_PACKET % len(correlation_bytes), correlation_bytes)
        packets += 1
    if message_key:
        parts += (_MESSAGE_KEY_HEADERS[len(message_key)], message_key)
        packets += 1
    parts[0] = _ROUTED_DISPATCH_HEADERS[packets]
    return b"".join(parts)


_SEND_HEADERS = {
    count: message_header(MessageType.SEND, count) for count in SPECS[MessageType.SEND].counts
}
#: A message header up to its packet count: "H", the version, the type.
_PUBLISH_TYPE = message_header(MessageType.PUBLISH, 0)[:-2]
_ACK_HEADER = message_header(MessageType.ACK, 2)


def encode_send(
    queue_packet: bytes,
    content: bytes,
    ttl: int | None,
    tag: int | None = None,
    key: str | None = None,
    headers: bytes | None = None,
    message_key: bytes | None = None,
    reply_to: str | None = None,
    correlation: str | None = None,
) -> bytes:
    """001 on the client's hot path; `ttl=None` writes the stock client's pre-TTL form. A
    `tag` asks for a CONFIRM (it needs a TTL packet before it), a `key` makes it idempotent;
    `headers` (JSON bytes) and a `message_key` go in packets 17 and 27 (b"": an empty packet,
    which the broker takes as none); `reply_to` and `correlation` make it a request (§6.6)."""
    if ttl is None:
        extended = reply_to is not None or correlation is not None or message_key is not None
        if tag is not None or key is not None or headers is not None or extended:
            raise LocalProtocolError(
                "a tag, key, headers or message key need the TTL form (ttl=0: never expires)"
            )
        return b"".join((_SEND_HEADERS[2], queue_packet, _CONTENT_HEADERS[len(content)], content))
    if not 0 <= ttl < INTEGER_LIMIT:
        raise LocalProtocolError(f"a TTL is 0 to {MAX_INTEGER_DIGITS} digits: {ttl}")
    parts = [
        _SEND_HEADERS[3],
        queue_packet,
        _CONTENT_HEADERS[len(content)],
        content,
        _TTL_PACKETS[ttl],
    ]
    if tag is not None:
        if tag < 0:
            raise LocalProtocolError(f"tag cannot be negative: {tag}")
        tag_bytes = b"%d" % tag
        parts += (_TAG_HEADERS[len(tag_bytes)], tag_bytes)
    if key is not None:
        key_bytes = key.encode()
        parts += (_KEY_HEADERS[len(key_bytes)], key_bytes)
    if headers is not None:
        parts += (_HEADERS_HEADERS[len(headers)], headers)
    if reply_to is not None:
        reply_to_bytes = reply_to.encode()
        parts += (_REPLY_TO_PACKET % len(reply_to_bytes), reply_to_bytes)
    if correlation is not None:
        correlation_bytes = correlation.encode()
        parts += (_CORRELATION_PACKET % len(correlation_bytes), correlation_bytes)
    if message_key is not None:
        parts += (_MESSAGE_KEY_HEADERS[len(message_key)], message_key)
    # Parts: the header, the queue and TTL packets one each, every other packet two.
    parts[0] = _SEND_HEADERS[(len(parts) + 1) // 2]
    return b"".join(parts)


def encode_publish(
    event_packet: bytes,
    content: bytes,
    ttl: int,
    tag: int | None = None,
    key: str | None = None,
    headers: bytes | None = None,
    message_key: bytes | None = None,
) -> bytes:
    """108 on the client's hot path (publish_many), with the event's packet built once
    (`event_packet`): a 001's packets in the same order, so the 001 writer's bytes with the
    type in the message header changed."""
    send = encode_send(event_packet, content, ttl, tag, key, headers, message_key)
    return _PUBLISH_TYPE + send[len(_PUBLISH_TYPE) :]


def _keyed_writer(message_type: MessageType) -> Callable[..., bytes]:
    header = message_header(message_type, 7)

    def encode_keyed(
        target_packet: bytes,
        content: bytes,
        ttl_packet: bytes,
        tag: int,
        key: str,
        headers: bytes,
        message_key: bytes,
    ) -> bytes:
        tag_bytes = b"%d" % tag
        key_bytes = key.encode()
        return b"".join(
            (
                header,
                target_packet,
                _CONTENT_HEADERS[len(content)],
                content,
                ttl_packet,
                _TAG_HEADERS[len(tag_bytes)],
                tag_bytes,
                _KEY_HEADERS[len(key_bytes)],
                key_bytes,
                _HEADERS_HEADERS[len(headers)],
                headers,
                _MESSAGE_KEY_HEADERS[len(message_key)],
                message_key,
            )
        )

    return encode_keyed


#: The one form of a keyed, confirmed, idempotent batch's 001 (108): every packet there, an
#: empty headers or message key packet for none, which the broker reads as a run by its
#: packet headers. For the client's hot path (send_batches): the caller has checked what
#: encode_send checks; `ttl_packet` is `ttl_packet(ttl)`, `tag` not negative.
encode_keyed_send = _keyed_writer(MessageType.SEND)
encode_keyed_publish = _keyed_writer(MessageType.PUBLISH)


def ttl_packet(ttl: int) -> bytes:
    """The TTL packet of `ttl` seconds.

    Raises:
        LocalProtocolError: a TTL the wire cannot carry.
    """
    if not 0 <= ttl < INTEGER_LIMIT:
        raise LocalProtocolError(f"a TTL is 0 to {MAX_INTEGER_DIGITS} digits: {ttl}")
    return _TTL_PACKETS[ttl]


_CONFIRM_1 = message_header(MessageType.CONFIRM, 1) + _ID_PACKET + b"%b"
_CONFIRM_2 = message_header(MessageType.CONFIRM, 2) + _ID_PACKET + b"%b" + _TAG_PACKET + b"%b"


def encode_confirm(message_id: bytes, tag: int | None, count: int | None = None) -> bytes:
    """105 on the broker's hot path: one formatting call per confirm. A `count` (how many
    queues a PUBLISH reached) takes the general path."""
    if count is not None:
        return encode(Confirm(message_id, tag, count))
    if tag is None:
        return _CONFIRM_1 % (len(message_id), message_id)
    tag_bytes = b"%d" % tag
    return _CONFIRM_2 % (len(message_id), message_id, len(tag_bytes), tag_bytes)


def encode_ack(queue_packet: bytes, message_id: bytes) -> bytes:
    """004 on the consumer's hot path."""
    return b"".join((_ACK_HEADER, queue_packet, _ID_HEADERS[len(message_id)], message_id))


def ack_prefix(queue_packet: bytes, id_length: int) -> bytes:
    """A 004's bytes up to its message ID, which come last (`id_length` of them): the acks of
    one queue share it, so a consumer's run of acks is this and each ID, joined once."""
    return _ACK_HEADER + queue_packet + _ID_HEADERS[id_length]


_REPLY_3 = message_header(MessageType.REPLY, 3)


def encode_reply(content: bytes, queue_packet: bytes, message_id: bytes) -> bytes:
    """112 from a worker on its hot path: the answer to the request it holds, `message_id`
    of the queue of `queue_packet` (it settles it like an ACK). An error reply, with its code
    and reason, is rare enough for `encode(Reply(...))`."""
    return b"".join(
        (
            _REPLY_3,
            _CONTENT_HEADERS[len(content)],
            content,
            queue_packet,
            _ID_HEADERS[len(message_id)],
            message_id,
        )
    )


def encode_reply_to_requester(content: bytes, message_id: bytes, correlation: str) -> bytes:
    """112 from the broker on its hot path: a worker's answer to the request `message_id`,
    for its requester, which matches it by `correlation`. An error reply, or one with
    headers, is rare enough for `encode(Reply(...))`."""
    correlation_bytes = correlation.encode()
    return b"".join(
        (
            _REPLY_3,
            _CONTENT_HEADERS[len(content)],
            content,
            _ID_HEADERS[len(message_id)],
            message_id,
            _CORRELATION_PACKET % len(correlation_bytes),
            correlation_bytes,
        )
    )


_FORWARD_HEADERS = {
    count: message_header(MessageType.FORWARD, count) for count in SPECS[MessageType.FORWARD].counts
}


def forward_parts(
    peer: bytes, content: list[bytes], flags: int | None = None, principal: bytes | None = None
) -> list[bytes]:
    """113 FORWARD as the pieces of its bytes, its content given as pieces too: a shard's
    frame of FORWARDs (most of a link's bytes) is then joined once, not once per layer.
    `b"".join(forward_parts(...))` is `encode(Forward(peer, b"".join(content), flags,
    principal))`."""
    size = sum(map(len, content))
    parts = [b"", packet(PacketType.PEER, peer), _CONTENT_PACKET % size, *content]
    if flags is not None:
        parts.append(packet(PacketType.FLAGS, b"%d" % flags))
    if principal is not None:
        parts.append(packet(PacketType.PRINCIPAL, principal))
    parts[0] = _FORWARD_HEADERS[2 + (flags is not None) + (principal is not None)]
    return parts
