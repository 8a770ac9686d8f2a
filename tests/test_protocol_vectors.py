"""Conformance: the upstream PHPMQ byte vectors decode to the expected Structs and re-encode
byte for byte.

Vector sources: shared/reference/phpmq.md, section TEST VECTORS (TV-A..TV-E), and the seed
protocol README's examples. Only the bytes are taken from there; the README shows its examples
one piece per line, but the wire has no separators (phpmq.md §1.3), so they are joined here.
"""

from __future__ import annotations

import random

import pytest

from phpmq.protocol import (
    Ack,
    Consume,
    DeadLetter,
    Dispatch,
    ErrorCode,
    Message,
    MessageType,
    PacketType,
    RemoteProtocolError,
    Requeue,
    Send,
    TruncatedError,
    decode_frame,
    decode_message,
    encode,
    encode_ack,
    encode_all,
    encode_dispatch,
    encode_send,
    queue_packet,
)
from phpmq.protocol.writer import message_header, packet

MESSAGE_ID = b"d7e7f68761d34838494b233148b5486c"
#: Stand-in for the PHP tests' `bin2hex(random_bytes(256))`; seeded so a failure reproduces.
RANDOM_CONTENT = random.Random(20180102).randbytes(256).hex().encode()

# ---------------------------------------------------------------------------------------------
# TV-A: protocol HEAD dialect (TTL era)

A1_HEADERS = [
    (b"H0100103", MessageType.SEND, 3),
    (b"H0100202", MessageType.CONSUME, 2),
    (b"H0100304", MessageType.DISPATCH, 4),
    (b"H0100402", MessageType.ACK, 2),
    (b"H0100503", MessageType.REQUEUE, 3),
    (b"H0100602", MessageType.DEAD_LETTER, 2),
]

A2_ENCODE = [
    (1, 3, b"P0100000000000000000000000000003"),
    (2, 11, b"P0200000000000000000000000000011"),
    (3, 32, b"P0300000000000000000000000000032"),
    (4, 1, b"P0400000000000000000000000000001"),
    (5, 1, b"P0500000000000000000000000000001"),
]

A2_DECODE = [
    (b"P0100000000000000000000000000003", 1, 3),
    (b"P0200000000000000000000000000011", 2, 11),
    (b"P0300000000000000000000000000032", 3, 32),
    (b"P0400000000000000000000000000001", 4, 1),
    (b"P0500000000000000000000000000004", 5, 4),
]

A3 = (
    b"H0100103P0100000000000000000000000000003FooP0200000000000000000000000000011Hello World"
    b"P05000000000000000000000000000010"
)
A3_TEMPLATE = (
    b"H0100103"
    + b"P0100000000000000000000000000003"
    + b"Foo"
    + b"P0200000000000000000000000000512"
    + RANDOM_CONTENT
    + b"P0500000000000000000000000000004"
    + b"3600"
)
A4 = b"H0100202P0100000000000000000000000000003FooP04000000000000000000000000000015"
A5 = (
    b"H0100304P0100000000000000000000000000003FooP0200000000000000000000000000011Hello World"
    b"P0300000000000000000000000000032d7e7f68761d34838494b233148b5486c"
    b"P05000000000000000000000000000010"
)
A5_TEMPLATE = (
    b"H0100304"
    + b"P0100000000000000000000000000003"
    + b"Foo"
    + b"P0200000000000000000000000000512"
    + RANDOM_CONTENT
    + b"P0300000000000000000000000000032"
    + b"d7e7f68761d34838494b233148b5486c"
    + b"P0500000000000000000000000000004"
    + b"3300"
)
A6 = (
    b"H0100402P0100000000000000000000000000003Foo"
    b"P0300000000000000000000000000032d7e7f68761d34838494b233148b5486c"
)
A7 = (
    b"H0100503P0100000000000000000000000000003Foo"
    b"P0300000000000000000000000000032d7e7f68761d34838494b233148b5486c"
    b"P05000000000000000000000000000043600"
)
A8 = (
    b"H0100602P0100000000000000000000000000003Foo"
    b"P0300000000000000000000000000032d7e7f68761d34838494b233148b5486c"
)

# ---------------------------------------------------------------------------------------------
# TV-B: pinned pre-TTL dialect (what php-mq/server and php-mq/client speak)

B_HEADERS = [
    (b"H0100102", MessageType.SEND, 2),
    (b"H0100202", MessageType.CONSUME, 2),
    (b"H0100303", MessageType.DISPATCH, 3),
    (b"H0100402", MessageType.ACK, 2),
]
B_SEND = b"H0100102P0100000000000000000000000000003FooP0200000000000000000000000000011Hello World"
B_SEND_TEMPLATE = (
    b"H0100102"
    + b"P0100000000000000000000000000003"
    + b"Foo"
    + b"P0200000000000000000000000000512"
    + RANDOM_CONTENT
)
B_DISPATCH = (
    b"H0100303P0100000000000000000000000000003FooP0200000000000000000000000000011Hello World"
    b"P0300000000000000000000000000032d7e7f68761d34838494b233148b5486c"
)

# ---------------------------------------------------------------------------------------------
# TV-C: php-mq/client ClientTest (pinned dialect)

C_SEND = (
    b"H0100102P0100000000000000000000000000015Unit-Test-Queue"
    b"P0200000000000000000000000000009Unit-Test"
)
C_REQUEST = (
    b"H0100202P0100000000000000000000000000015Unit-Test-QueueP04000000000000000000000000000015"
)
C_DISPATCH = (
    b"H0100303P0100000000000000000000000000015Unit-Test-Queue"
    b"P0200000000000000000000000000011Hello World"
    b"P0300000000000000000000000000012Unit-Test-ID"
)
C_ACK = (
    b"H0100402P0100000000000000000000000000015Unit-Test-Queue"
    b"P0300000000000000000000000000012Unit-Test-ID"
)
C_PUSH_BACK = C_ACK + C_SEND

# ---------------------------------------------------------------------------------------------
# TV-D: php-mq/server listener tests (derived from the pinned format)

D_SEND = (
    b"H0100102P0100000000000000000000000000010Test-QueueP0200000000000000000000000000009Unit-Test"
)
D_CONSUME = b"H0100202P0100000000000000000000000000010Test-QueueP04000000000000000000000000000015"
D_ACK = (
    b"H0100402P0100000000000000000000000000010Test-Queue"
    b"P0300000000000000000000000000012Unit-Test-ID"
)
D_DISPATCH_1 = (
    b"H0100303P0100000000000000000000000000010Test-Queue"
    b"P0200000000000000000000000000011Unit-Test-1"
    b"P0300000000000000000000000000014Unit-Test-ID-1"
)
D_DISPATCH_2 = (
    b"H0100303P0100000000000000000000000000010Test-Queue"
    b"P0200000000000000000000000000011Unit-Test-2"
    b"P0300000000000000000000000000014Unit-Test-ID-2"
)

# ---------------------------------------------------------------------------------------------
# TV-E: historical vectors

E_RECEIPT = (
    b"H0100502"
    + b"P0100000000000000000000000000003"
    + b"Foo"
    + b"P0300000000000000000000000000032"
    + b"d7e7f68761d34838494b233148b5486c"
)
#: 220066 bytes like the upstream test.jpg: its first 10 bytes, then every byte value in turn.
JPEG_LIKE = (b"\xff\xd8\xff\xe0\x00\x10JFIF" + bytes(range(256)) * 860)[:220066]
E_BINARY = (
    b"H0100102"
    + b"P0100000000000000000000000000003"
    + b"Foo"
    + b"P0200000000000000000000000220066"
    + JPEG_LIKE
)

# ---------------------------------------------------------------------------------------------
# The seed README's examples (HEAD dialect), one wire piece per line as the README shows them.

README_SEND = [
    b"H0100103",
    b"P0100000000000000000000000000003",
    b"Foo",
    b"P0200000000000000000000000000011",
    b"Hello World",
    b"P0500000000000000000000000000004",
    b"3600",
]
README_CONSUME = [
    b"H0100202",
    b"P0100000000000000000000000000003",
    b"Foo",
    b"P0400000000000000000000000000001",
    b"5",
]
README_DISPATCH = [
    b"H0100304",
    b"P0100000000000000000000000000003",
    b"Foo",
    b"P0200000000000000000000000000011",
    b"Hello World",
    b"P0300000000000000000000000000032",
    b"d7e7f68761d34838494b233148b5486c",
    b"P0500000000000000000000000000004",
    b"3300",
]
README_ACK = [
    b"H0100402",
    b"P0100000000000000000000000000003",
    b"Foo",
    b"P0300000000000000000000000000032",
    b"d7e7f68761d34838494b233148b5486c",
]
README_REQUEUE = [
    b"H0100503",
    b"P0100000000000000000000000000003",
    b"Foo",
    b"P0300000000000000000000000000032",
    b"d7e7f68761d34838494b233148b5486c",
    b"P0500000000000000000000000000004",
    b"3600",
]
README_DEAD_LETTER = [
    b"H0100602",
    b"P0100000000000000000000000000003",
    b"Foo",
    b"P0300000000000000000000000000032",
    b"d7e7f68761d34838494b233148b5486c",
]
README_HEADER_EXAMPLE = b"H0100102"
#: The README's packet header example: 36 characters (a 33-digit length), a first-draft leftover.
README_36_CHAR_PACKET_HEADER = b"P01000000000000000000000000000000256"

README_EXAMPLES = [
    pytest.param(README_SEND, Send("Foo", b"Hello World", 3600), id="send"),
    pytest.param(README_CONSUME, Consume("Foo", 5), id="consume"),
    pytest.param(
        README_DISPATCH, Dispatch("Foo", b"Hello World", MESSAGE_ID, ttl=3300), id="dispatch"
    ),
    pytest.param(README_ACK, Ack("Foo", MESSAGE_ID), id="ack"),
    pytest.param(README_REQUEUE, Requeue("Foo", MESSAGE_ID, 3600), id="requeue"),
    pytest.param(README_DEAD_LETTER, DeadLetter("Foo", MESSAGE_ID), id="dead-letter"),
]

#: (wire bytes, stated length or None for templates, expected Struct)
VECTORS = [
    pytest.param(A3, 119, Send("Foo", b"Hello World", 0), id="A3-send"),
    pytest.param(A3_TEMPLATE, None, Send("Foo", RANDOM_CONTENT, 3600), id="A3-send-template"),
    pytest.param(A4, 76, Consume("Foo", 5), id="A4-consume"),
    pytest.param(A5, 183, Dispatch("Foo", b"Hello World", MESSAGE_ID, ttl=0), id="A5-dispatch"),
    pytest.param(
        A5_TEMPLATE,
        None,
        Dispatch("Foo", RANDOM_CONTENT, MESSAGE_ID, ttl=3300),
        id="A5-dispatch-template",
    ),
    pytest.param(A6, 107, Ack("Foo", MESSAGE_ID), id="A6-ack"),
    pytest.param(A7, 143, Requeue("Foo", MESSAGE_ID, 3600), id="A7-requeue"),
    pytest.param(A8, 107, DeadLetter("Foo", MESSAGE_ID), id="A8-dead-letter"),
    pytest.param(B_SEND, 86, Send("Foo", b"Hello World"), id="B-send"),
    pytest.param(B_SEND_TEMPLATE, None, Send("Foo", RANDOM_CONTENT), id="B-send-template"),
    pytest.param(B_DISPATCH, 150, Dispatch("Foo", b"Hello World", MESSAGE_ID), id="B-dispatch"),
    pytest.param(C_SEND, 96, Send("Unit-Test-Queue", b"Unit-Test"), id="C-send"),
    pytest.param(C_REQUEST, 88, Consume("Unit-Test-Queue", 5), id="C-request"),
    pytest.param(
        C_DISPATCH,
        142,
        Dispatch("Unit-Test-Queue", b"Hello World", b"Unit-Test-ID"),
        id="C-dispatch",
    ),
    pytest.param(C_ACK, 99, Ack("Unit-Test-Queue", b"Unit-Test-ID"), id="C-ack"),
    pytest.param(D_SEND, 91, Send("Test-Queue", b"Unit-Test"), id="D-send"),
    pytest.param(D_CONSUME, 83, Consume("Test-Queue", 5), id="D-consume"),
    pytest.param(D_ACK, 94, Ack("Test-Queue", b"Unit-Test-ID"), id="D-ack"),
    pytest.param(
        D_DISPATCH_1,
        139,
        Dispatch("Test-Queue", b"Unit-Test-1", b"Unit-Test-ID-1"),
        id="D-dispatch-1",
    ),
    pytest.param(
        D_DISPATCH_2,
        139,
        Dispatch("Test-Queue", b"Unit-Test-2", b"Unit-Test-ID-2"),
        id="D-dispatch-2",
    ),
    pytest.param(E_BINARY, 8 + 32 + 3 + 32 + 220066, Send("Foo", JPEG_LIKE), id="E-binary"),
]


# ---------------------------------------------------------------------------------------------
# Headers (A1, A2, TV-B)


@pytest.mark.parametrize(("header", "message_type", "count"), A1_HEADERS + B_HEADERS)
def test_message_header_encodes_to_vector(
    header: bytes, message_type: MessageType, count: int
) -> None:
    assert len(header) == 8
    assert message_header(message_type, count) == header


@pytest.mark.parametrize(("header", "message_type", "count"), A1_HEADERS + B_HEADERS)
def test_message_header_vector_is_accepted(
    header: bytes, message_type: MessageType, count: int
) -> None:
    # A lone valid header is an incomplete message: the decoder wants the first packet header
    # (8 + 32 bytes), it does not refuse the header.
    with pytest.raises(TruncatedError) as info:
        decode_message(header)
    assert info.value.needed == 8 + 32
    # Sanity of the table itself: the vector's fields are what the header spells out.
    assert int(header[1:3]) == 1
    assert int(header[3:6]) == message_type
    assert int(header[6:8]) == count


@pytest.mark.parametrize(("packet_type", "length", "header"), A2_ENCODE)
def test_packet_header_encodes_to_vector(packet_type: int, length: int, header: bytes) -> None:
    content = b"x" * length
    encoded = packet(packet_type, content)
    assert len(header) == 32
    assert encoded == header + content


#: A message header whose type carries the packet type, so that packet may come first.
_HEADER_ACCEPTING = {
    1: b"H0100202",  # queue, in a consume
    2: b"H0100102",  # content, in a send (packet order is free on input)
    3: b"H0100402",  # message id, in an ack
    4: b"H0100202",  # count, in a consume
    5: b"H0100503",  # ttl, in a re-queue
}
#: A message header whose type does not carry the packet type.
_HEADER_REFUSING = {
    1: b"H0110101",  # HELLO carries only options
    2: b"H0100402",  # no content in an ack
    3: b"H0100202",  # no message id in a consume
    4: b"H0100102",  # no count in a send
    5: b"H0100202",  # no ttl in a consume
}


@pytest.mark.parametrize(("header", "packet_type", "length"), A2_DECODE)
def test_packet_header_vector_decodes_type_and_length(
    header: bytes, packet_type: int, length: int
) -> None:
    # Header accepted for that type, and the decoder now waits for exactly `length` bytes.
    with pytest.raises(TruncatedError) as info:
        decode_message(_HEADER_ACCEPTING[packet_type] + header)
    assert info.value.needed == 8 + 32 + length
    # The type code was read: the same header is refused where that packet does not belong.
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(_HEADER_REFUSING[packet_type] + header + b"x" * length)
    assert not isinstance(info.value, TruncatedError)
    assert f"packet type {packet_type:02d} is not allowed" in info.value.reason


# ---------------------------------------------------------------------------------------------
# Whole messages


@pytest.mark.parametrize(("wire", "length", "expected"), VECTORS)
def test_vector_decodes_to_struct(wire: bytes, length: int | None, expected: Message) -> None:
    if length is not None:
        assert len(wire) == length
    message, end = decode_message(wire)
    assert type(message) is type(expected)
    assert message == expected
    assert end == len(wire)


@pytest.mark.parametrize(("wire", "length", "expected"), VECTORS)
def test_vector_reencodes_byte_for_byte(wire: bytes, length: int | None, expected: Message) -> None:
    assert encode(expected) == wire
    assert encode(decode_message(wire)[0]) == wire


@pytest.mark.parametrize(("wire", "length", "expected"), VECTORS)
def test_vector_as_a_frame(wire: bytes, length: int | None, expected: Message) -> None:
    assert decode_frame(wire) == ([expected], None)


@pytest.mark.parametrize(("wire", "length", "expected"), VECTORS)
def test_vector_decodes_at_an_offset(wire: bytes, length: int | None, expected: Message) -> None:
    prefix = b"garbage!"
    message, end = decode_message(prefix + wire, len(prefix))
    assert message == expected
    assert end == len(prefix) + len(wire)


def test_template_content_is_512_lowercase_hex() -> None:
    assert len(RANDOM_CONTENT) == 512
    assert set(RANDOM_CONTENT.decode()) <= set("0123456789abcdef")


def test_the_two_dialects_of_send_differ_only_by_ttl_packet() -> None:
    # TTL 0 (HEAD) is a present packet; no TTL (pinned) is an absent one.
    assert decode_message(A3)[0] == Send("Foo", b"Hello World", 0)
    assert decode_message(B_SEND)[0] == Send("Foo", b"Hello World", None)
    assert A3.startswith(b"H0100103")
    assert B_SEND.startswith(b"H0100102")
    with_ttl_0 = B_SEND.replace(b"H0100102", b"H0100103") + b"P05000000000000000000000000000010"
    assert with_ttl_0 == A3


def test_the_two_dialects_of_dispatch_differ_only_by_ttl_packet() -> None:
    assert decode_message(A5)[0].ttl == 0
    assert decode_message(B_DISPATCH)[0].ttl is None
    with_ttl_0 = B_DISPATCH.replace(b"H0100303", b"H0100304") + b"P05000000000000000000000000000010"
    assert with_ttl_0 == A5


# ---------------------------------------------------------------------------------------------
# TV-C push-back, TV-D sequences, TV-E


def test_push_back_stream_is_ack_then_send() -> None:
    assert len(C_PUSH_BACK) == 195
    messages, error = decode_frame(C_PUSH_BACK)
    assert error is None
    assert messages == [
        Ack("Unit-Test-Queue", b"Unit-Test-ID"),
        Send("Unit-Test-Queue", b"Unit-Test"),
    ]
    # Read as exactly 99 then 96 bytes, like the client test does.
    first, end = decode_message(C_PUSH_BACK)
    assert (first, end) == (Ack("Unit-Test-Queue", b"Unit-Test-ID"), 99)
    second, end = decode_message(C_PUSH_BACK, end)
    assert (second, end) == (Send("Unit-Test-Queue", b"Unit-Test"), 195)
    assert encode_all(messages) == C_PUSH_BACK


def test_server_dispatch_sequence_as_one_frame() -> None:
    messages, error = decode_frame(D_DISPATCH_1 + D_DISPATCH_2)
    assert error is None
    assert [m.message_id for m in messages] == [b"Unit-Test-ID-1", b"Unit-Test-ID-2"]
    assert [m.content for m in messages] == [b"Unit-Test-1", b"Unit-Test-2"]


def test_server_empty_input_is_not_a_message() -> None:
    messages, error = decode_frame(b"")
    assert messages == []
    assert isinstance(error, RemoteProtocolError)
    with pytest.raises(TruncatedError) as info:
        decode_message(b"")
    assert info.value.needed == 8


def test_historical_receipt_conflicts_with_requeue_and_is_refused() -> None:
    # July 2017's 005 "receipt" had 2 packets; HEAD's 005 re-queue has 3.
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(E_RECEIPT)
    assert not isinstance(info.value, TruncatedError)
    assert info.value.code == ErrorCode.MALFORMED
    assert "header says 2" in info.value.reason


def test_binary_content_is_carried_unchanged() -> None:
    assert len(JPEG_LIKE) == 220066
    assert JPEG_LIKE.startswith(bytes.fromhex("ffd8ffe000104a464946"))
    assert set(JPEG_LIKE) == set(range(256))
    message, _ = decode_message(E_BINARY)
    assert message.content == JPEG_LIKE
    assert encode_send(queue_packet("Foo"), JPEG_LIKE, None) == E_BINARY


def test_content_that_looks_like_headers_is_opaque() -> None:
    content = A5 + b"H0100202P01"  # a whole message and a partial one, inside content
    wire = encode(Send("Foo", content, 7))
    assert decode_frame(wire) == ([Send("Foo", content, 7)], None)


# ---------------------------------------------------------------------------------------------
# The seed README


@pytest.mark.parametrize(("pieces", "expected"), README_EXAMPLES)
def test_readme_example(pieces: list[bytes], expected: Message) -> None:
    wire = b"".join(pieces)
    assert all(len(piece) == 32 for piece in pieces if piece[:1] == b"P" and piece[1:].isdigit())
    assert decode_message(wire) == (expected, len(wire))
    assert encode(expected) == wire


@pytest.mark.parametrize(("pieces", "expected"), README_EXAMPLES)
def test_readme_example_with_display_newlines_is_refused(
    pieces: list[bytes], expected: Message
) -> None:
    # The README's line breaks are typography: on the wire they break framing.
    messages, error = decode_frame(b"\n".join(pieces))
    assert messages == []
    assert isinstance(error, RemoteProtocolError)


def test_readme_header_example() -> None:
    # `H0100102`: version 01, type 001, 2 packets: the pre-TTL send.
    assert message_header(MessageType.SEND, 2) == README_HEADER_EXAMPLE
    assert encode(Send("Foo", b"Hello World")).startswith(README_HEADER_EXAMPLE)


def test_readme_36_character_packet_header_is_rejected() -> None:
    assert len(README_36_CHAR_PACKET_HEADER) == 36
    wire = (
        b"H0100202"
        + README_36_CHAR_PACKET_HEADER
        + b"q" * 256
        + b"P0400000000000000000000000000001"
        + b"5"
    )
    # Read as 32 bytes, the header says "queue of length 0"; the next packet header then
    # starts with the 4 leftover digits.
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(wire)
    assert not isinstance(info.value, TruncatedError)
    assert info.value.code == ErrorCode.MALFORMED
    assert "must start with 'P'" in info.value.reason
    messages, error = decode_frame(wire)
    assert messages == []
    assert isinstance(error, RemoteProtocolError)


def test_36_character_draft_vector_is_rejected() -> None:
    # TV-E's first-draft form: a 33-digit length in a 36-byte packet header.
    wire = b"H0100402" + b"P01000000000000000000000000000000003Foo" + A6[43:]
    messages, error = decode_frame(wire)
    assert messages == []
    assert isinstance(error, RemoteProtocolError)
    assert "'P'" in error.reason


# ---------------------------------------------------------------------------------------------
# Hot-path encoders give the same bytes as encode()

HOT_SENDS = [
    Send("Foo", b"Hello World", 0),
    Send("Foo", RANDOM_CONTENT, 3600),
    Send("Foo", b"Hello World"),
    Send("Unit-Test-Queue", b"Unit-Test"),
    Send("Foo", JPEG_LIKE),
    Send("Ünïcødé-队列", b"", 5),
]
HOT_DISPATCHES = [
    Dispatch("Foo", b"Hello World", MESSAGE_ID, ttl=0),
    Dispatch("Foo", RANDOM_CONTENT, MESSAGE_ID, ttl=3300),
    Dispatch("Foo", b"Hello World", MESSAGE_ID),
    Dispatch("Unit-Test-Queue", b"Hello World", b"Unit-Test-ID"),
    Dispatch("Foo", b"Hello World", MESSAGE_ID, ttl=3300, delivery_count=2),
    Dispatch("Ünïcødé-队列", JPEG_LIKE, "ïd".encode(), ttl=1, delivery_count=1),
]
HOT_ACKS = [Ack("Foo", MESSAGE_ID), Ack("Unit-Test-Queue", b"Unit-Test-ID"), Ack("Ü", "é".encode())]


@pytest.mark.parametrize("message", HOT_SENDS)
def test_encode_send_matches_encode(message: Send) -> None:
    fast = encode_send(queue_packet(message.queue), message.content, message.ttl)
    assert fast == encode(message)
    assert fast[:8] == (b"H0100102" if message.ttl is None else b"H0100103")
    assert decode_message(fast) == (message, len(fast))


@pytest.mark.parametrize("message", HOT_DISPATCHES)
def test_encode_dispatch_matches_encode(message: Dispatch) -> None:
    fast = encode_dispatch(
        queue_packet(message.queue),
        message.content,
        message.message_id,
        message.ttl,
        message.delivery_count,
    )
    assert fast == encode(message)
    if message.ttl is None:
        assert fast[:8] == b"H0100303"  # pre-TTL dialect
    elif message.delivery_count is None:
        assert fast[:8] == b"H0100304"
    else:
        assert fast[:8] == b"H0100305"
    assert decode_message(fast) == (message, len(fast))


@pytest.mark.parametrize("message", HOT_ACKS)
def test_encode_ack_matches_encode(message: Ack) -> None:
    fast = encode_ack(queue_packet(message.queue), message.message_id)
    assert fast == encode(message)
    assert decode_message(fast) == (message, len(fast))


def test_hot_path_reproduces_vectors() -> None:
    foo = queue_packet("Foo")
    assert foo == b"P0100000000000000000000000000003Foo"
    assert encode_send(foo, b"Hello World", 0) == A3
    assert encode_send(foo, b"Hello World", None) == B_SEND
    assert encode_send(foo, RANDOM_CONTENT, 3600) == A3_TEMPLATE
    assert encode_dispatch(foo, b"Hello World", MESSAGE_ID, 0, None) == A5
    assert encode_dispatch(foo, b"Hello World", MESSAGE_ID, None, None) == B_DISPATCH
    assert encode_dispatch(foo, RANDOM_CONTENT, MESSAGE_ID, 3300, None) == A5_TEMPLATE
    assert encode_ack(foo, MESSAGE_ID) == A6
    unit = queue_packet("Unit-Test-Queue")
    assert encode_ack(unit, b"Unit-Test-ID") + encode_send(unit, b"Unit-Test", None) == C_PUSH_BACK
    assert encode_dispatch(unit, b"Hello World", b"Unit-Test-ID", None, None) == C_DISPATCH


def test_extension_delivery_count_packet_follows_ttl() -> None:
    wire = encode(Dispatch("Foo", b"Hello World", MESSAGE_ID, ttl=3300, delivery_count=2))
    assert wire == (
        b"H0100305"
        + b"".join(README_DISPATCH[1:])
        + b"P%02d%029d" % (PacketType.DELIVERY_COUNT, 1)
        + b"2"
    )
