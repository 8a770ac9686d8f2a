"""Property tests of the codec: round trips, robustness on arbitrary and mutated bytes, and
packet-order independence."""

from __future__ import annotations

from typing import Any
from unittest import mock

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phpmq.protocol import (
    Ack,
    Admin,
    AdminReply,
    Confirm,
    Consume,
    DeadLetter,
    Disconnect,
    Dispatch,
    Error,
    Forward,
    Heartbeat,
    Hello,
    Kbai,
    LocalProtocolError,
    Message,
    ProtocolError,
    Publish,
    RemoteProtocolError,
    Reply,
    Requeue,
    Send,
    TruncatedError,
    decode_frame,
    decode_message,
    encode,
    encode_ack,
    encode_all,
    encode_confirm,
    encode_dispatch,
    encode_keyed_publish,
    encode_keyed_send,
    encode_publish,
    encode_reply_to_requester,
    encode_routed_dispatch,
    encode_send,
    event_packet,
    forward_parts,
    queue_packet,
    reader,
    ttl_packet,
)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# Strategies

#: Any text that encodes to UTF-8 (hypothesis leaves out lone surrogates by default).
texts = st.text(max_size=40)
integers = st.integers(min_value=0, max_value=10**18 - 1)
optional_integers = st.none() | integers

_SAMPLE_WIRE = [
    b"H0100102",
    b"H0100304",
    b"P0200000000000000000000000000011",
    b"H0100402P0100000000000000000000000000003Foo",
    b"\x00",
    b"\xff\xd8\xff\xe0",
]
#: Binary content, sometimes with message and packet headers inside it.
contents = st.binary(max_size=200) | st.builds(
    lambda before, inside, after: before + inside + after,
    st.binary(max_size=20),
    st.sampled_from(_SAMPLE_WIRE),
    st.binary(max_size=20),
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
options = st.dictionaries(texts, json_values, max_size=5)
#: Message IDs and producer headers are bytes the codec passes through untouched.
ids = st.binary(max_size=40)
header_packets = st.none() | st.builds(msgspec.json.encode, options)

sends = st.builds(
    Send,
    texts,
    contents,
    optional_integers,
    tag=optional_integers,
    key=st.none() | texts,
    headers=header_packets,
)
consumes = st.builds(Consume, texts, integers, optional_integers)
dispatches = st.builds(
    Dispatch, texts, contents, ids, optional_integers, optional_integers, header_packets
)
acks = st.builds(Ack, texts, ids)
requeues = st.builds(Requeue, texts, ids, integers, optional_integers)
dead_letters = st.builds(DeadLetter, texts, ids, st.none() | texts)
errors = st.builds(
    Error, integers, texts, st.none() | ids, st.none() | texts, optional_integers, optional_integers
)
confirms = st.builds(Confirm, ids, optional_integers)
hellos = st.builds(Hello, options)
admins = st.builds(Admin, options)
admin_replies = st.builds(AdminReply, options)
disconnects = st.builds(Disconnect, st.none() | texts)
messages = st.one_of(
    sends,
    consumes,
    dispatches,
    acks,
    requeues,
    dead_letters,
    errors,
    confirms,
    hellos,
    st.just(Heartbeat()),
    disconnects,
    st.just(Kbai()),
    admins,
    admin_replies,
)


def split_packets(wire: bytes) -> tuple[bytes, list[bytes]]:
    """A message's 8-byte header and its packets (header and content each)."""
    packets = []
    p = 8
    while p < len(wire):
        length = int(wire[p + 3 : p + 32])
        packets.append(wire[p : p + 32 + length])
        p += 32 + length
    assert p == len(wire)
    return wire[:8], packets


# ---------------------------------------------------------------------------------------------
# (a) Round trips


@FAST
@given(messages)
def test_round_trip(message: Message) -> None:
    wire = encode(message)
    decoded, end = decode_message(wire)
    assert type(decoded) is type(message)
    assert decoded == message
    assert end == len(wire)
    assert encode(decoded) == wire


@FAST
@given(messages, st.binary(max_size=30))
def test_round_trip_at_an_offset(message: Message, prefix: bytes) -> None:
    wire = encode(message)
    assert decode_message(prefix + wire + b"trailing", len(prefix)) == (
        message,
        len(prefix) + len(wire),
    )


@FAST
@given(st.lists(messages, min_size=1, max_size=8))
def test_frame_round_trip(batch: list[Message]) -> None:
    frame = encode_all(batch)
    assert frame == b"".join(encode(m) for m in batch)
    assert decode_frame(frame) == (batch, None)


@FAST
@given(messages)
def test_header_count_is_the_number_of_packets(message: Message) -> None:
    wire = encode(message)
    header, packets = split_packets(wire)
    assert int(header[6:8]) == len(packets)
    assert int(header[3:6]) == message.TYPE


@FAST
@given(messages, st.data())
def test_every_strict_prefix_is_truncated(message: Message, data: st.DataObject) -> None:
    wire = encode(message)
    cut = data.draw(st.integers(min_value=0, max_value=len(wire) - 1))
    with pytest.raises(TruncatedError) as info:
        decode_message(wire[:cut])
    assert cut < info.value.needed <= len(wire)
    # Given `needed` bytes, the decoder makes progress: it completes or wants more again.
    try:
        decode_message(wire[: info.value.needed])
    except TruncatedError as exc:
        assert exc.needed > info.value.needed


@FAST
@given(texts, contents, optional_integers)
def test_encode_send_matches_encode(queue: str, content: bytes, ttl: int | None) -> None:
    assert encode_send(queue_packet(queue), content, ttl) == encode(Send(queue, content, ttl))


@FAST
@given(texts, contents, integers, optional_integers, st.none() | texts)
def test_encode_send_with_tag_and_key_matches_encode(
    queue: str, content: bytes, ttl: int, tag: int | None, key: str | None
) -> None:
    wire = encode_send(queue_packet(queue), content, ttl, tag, key)
    assert wire == encode(Send(queue, content, ttl, tag=tag, key=key))
    assert decode_message(wire) == (Send(queue, content, ttl, tag=tag, key=key), len(wire))


@FAST
@given(
    texts, contents, integers, optional_integers, st.none() | texts, st.none() | contents,
    st.none() | contents,
)  # fmt: skip
def test_a_send_or_publish_with_headers_and_message_key_is_encoded_and_decoded_fast(
    name: str,
    content: bytes,
    ttl: int,
    tag: int | None,
    key: str | None,
    headers: bytes | None,
    message_key: bytes | None,
) -> None:
    # Table order with optional packets skipped (no request packets before the message key)
    # decodes without the general path (reader._decode_any_order), the broker's slow one.
    def general_path(*args: object) -> None:
        raise AssertionError("decoded by the general path")

    send = Send(name, content, ttl, tag, key, headers, message_key=message_key)
    publish = Publish(name, content, ttl, tag, key, headers, message_key)
    sent = encode_send(queue_packet(name), content, ttl, tag, key, headers, message_key)
    published = encode_publish(event_packet(name), content, ttl, tag, key, headers, message_key)
    assert sent == encode(send) and published == encode(publish)
    with mock.patch.object(reader, "_decode_any_order", general_path):
        assert decode_message(sent) == (send, len(sent))
        assert decode_message(published) == (publish, len(published))


@FAST
@given(texts, contents, integers, integers, texts, contents, contents)
def test_the_one_form_of_a_keyed_send_or_publish_is_the_general_writers(
    name: str,
    content: bytes,
    ttl: int,
    tag: int,
    key: str,
    headers: bytes,
    message_key: bytes,
) -> None:
    # send_batches' one form: every packet there, empty ones included.
    args = (content, ttl, tag, key, headers, message_key)
    fast = (content, ttl_packet(ttl), tag, key, headers, message_key)
    assert encode_keyed_send(queue_packet(name), *fast) == encode_send(queue_packet(name), *args)
    published = encode_publish(event_packet(name), *args)
    assert encode_keyed_publish(event_packet(name), *fast) == published


@pytest.mark.parametrize("ttl", [-1, 10**18])
def test_a_ttl_packet_is_refused_a_ttl_the_wire_cannot_carry(ttl: int) -> None:
    with pytest.raises(LocalProtocolError, match="TTL is 0 to"):
        ttl_packet(ttl)


@FAST
@given(ids, optional_integers)
def test_encode_confirm_matches_encode(message_id: bytes, tag: int | None) -> None:
    assert encode_confirm(message_id, tag) == encode(Confirm(message_id, tag))


def test_a_tag_or_key_needs_the_ttl_form() -> None:
    with pytest.raises(LocalProtocolError, match="TTL form"):
        encode_send(queue_packet("q"), b"x", None, tag=1)


@FAST
@given(texts, contents, ids, optional_integers, optional_integers)
def test_encode_dispatch_matches_encode(
    queue: str, content: bytes, message_id: bytes, ttl: int | None, delivery_count: int | None
) -> None:
    if ttl is None:
        # The hot path writes the pre-TTL form for stock peers, which take no extension.
        delivery_count = None
    message = Dispatch(queue, content, message_id, ttl, delivery_count)
    fast = encode_dispatch(queue_packet(queue), content, message_id, ttl, delivery_count)
    assert fast == encode(message)


@FAST
@given(
    texts,
    contents,
    ids,
    integers,
    integers,
    st.binary(max_size=30),
    texts,
    st.none() | texts,
    st.none() | texts,
    st.binary(max_size=30),
)
def test_encode_routed_dispatch_matches_encode(
    queue: str,
    content: bytes,
    message_id: bytes,
    ttl: int,
    delivery_count: int,
    headers: bytes,
    event: str,
    reply_to: str | None,
    correlation: str | None,
    message_key: bytes,
) -> None:
    message = Dispatch(
        queue,
        content,
        message_id,
        ttl,
        delivery_count,
        headers or None,
        event or None,
        reply_to,
        correlation,
        message_key or None,
    )
    fast = encode_routed_dispatch(
        queue_packet(queue),
        content,
        message_id,
        ttl,
        delivery_count,
        headers,
        event.encode(),
        reply_to,
        correlation,
        message_key,
    )
    assert fast == encode(message)


@FAST
@given(contents, ids, texts)
def test_encode_reply_to_requester_matches_encode(
    content: bytes, message_id: bytes, correlation: str
) -> None:
    assert encode_reply_to_requester(content, message_id, correlation) == encode(
        Reply(content, None, message_id, correlation)
    )


@FAST
@given(texts, ids)
def test_encode_ack_matches_encode(queue: str, message_id: bytes) -> None:
    assert encode_ack(queue_packet(queue), message_id) == encode(Ack(queue, message_id))


@FAST
@given(
    st.binary(min_size=1, max_size=40),
    st.lists(contents, max_size=4),
    optional_integers,
    st.none() | st.binary(max_size=40),
)
def test_forward_parts_join_to_encode(
    peer: bytes, pieces: list[bytes], flags: int | None, principal: bytes | None
) -> None:
    joined = b"".join(forward_parts(peer, pieces, flags, principal))
    assert joined == encode(Forward(peer, b"".join(pieces), flags, principal))


# ---------------------------------------------------------------------------------------------
# (b) Arbitrary and mutated bytes

_HEADERS = [
    b"H0100102",
    b"H0100103",
    b"H0100202",
    b"H0100303",
    b"H0100304",
    b"H0100305",
    b"H0100402",
    b"H0100503",
    b"H0100602",
    b"H0100603",
    b"H0110002",
    b"H0110101",
    b"H0110200",
    b"H0110301",
    b"H0110400",
    b"H0111001",
    b"H0111101",
]


@st.composite
def packetish(draw: st.DrawFn) -> bytes:
    """Bytes shaped like a message: a valid header, then packets of any type whose lengths
    sometimes lie, then maybe junk."""
    out = draw(st.sampled_from(_HEADERS))
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        content = draw(st.binary(max_size=30) | st.sampled_from([b"5", b"{}", b'{"a":[1]}']))
        length = len(content) + draw(st.sampled_from([0, 0, 0, -1, 1, 10**6]))
        packet_type = draw(st.sampled_from([1, 2, 3, 4, 5, 10, 11, 12, 13]) | st.integers(0, 99))
        out += b"P%02d%029d" % (packet_type, max(length, 0)) + content
    return out + draw(st.binary(max_size=10))


arbitrary_bytes = (
    st.binary(max_size=400)
    | packetish()
    | st.builds(bytes.__add__, messages.map(encode), st.binary(max_size=50))
)


def _check_frame(data: bytes) -> None:
    decoded, error = decode_frame(data)
    assert isinstance(decoded, list)
    assert error is None or isinstance(error, RemoteProtocolError)
    assert not isinstance(error, TruncatedError)
    if error is None:
        # A frame accepted whole re-encodes (canonically) to a frame that decodes the same.
        assert decoded
        assert decode_frame(encode_all(decoded)) == (decoded, None)
    else:
        assert error.reason


def _check_message(data: bytes) -> None:
    try:
        message, end = decode_message(data)
    except RemoteProtocolError as exc:
        assert exc.reason
        if isinstance(exc, TruncatedError):
            assert exc.needed > len(data)
    else:
        assert 8 <= end <= len(data)
        assert decode_message(encode(message))[0] == message


@FAST
@given(arbitrary_bytes)
def test_decode_frame_never_raises(data: bytes) -> None:
    _check_frame(data)


@FAST
@given(arbitrary_bytes)
def test_decode_message_raises_only_protocol_errors(data: bytes) -> None:
    _check_message(data)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    wire = encode(draw(messages))
    index = draw(st.integers(min_value=0, max_value=len(wire) - 1))
    operation = draw(st.sampled_from(["flip", "insert", "delete"]))
    if operation == "flip":
        mask = draw(st.integers(min_value=1, max_value=255))
        return wire[:index] + bytes([wire[index] ^ mask]) + wire[index + 1 :]
    if operation == "insert":
        return wire[:index] + bytes([draw(st.integers(0, 255))]) + wire[index:]
    return wire[:index] + wire[index + 1 :]


@FAST
@given(mutated())
def test_mutated_encoding_raises_only_protocol_errors(data: bytes) -> None:
    _check_message(data)
    _check_frame(data)


def test_mutation_sanity_a_flipped_marker_is_an_error() -> None:
    # Guards the mutation test against a decoder that accepts everything.
    wire = encode(Ack("Foo", "id"))
    with pytest.raises(ProtocolError):
        decode_message(b"h" + wire[1:])
    with pytest.raises(ProtocolError):
        decode_message(wire[:8] + b"p" + wire[9:])


# ---------------------------------------------------------------------------------------------
# (c) Packet order is free on input


@FAST
@given(messages, st.data())
def test_permuted_packets_decode_to_the_same_message(message: Message, data: st.DataObject):
    header, packets = split_packets(encode(message))
    permuted = data.draw(st.permutations(packets))
    wire = header + b"".join(permuted)
    assert decode_message(wire) == (message, len(wire))
    # ...and re-encode in the canonical order.
    assert encode(decode_message(wire)[0]) == header + b"".join(packets)


def test_reversed_dispatch_packets() -> None:
    message = Dispatch("Foo", b"Hello World", b"id", 3300, 2)
    header, packets = split_packets(encode(message))
    assert len(packets) == 5
    assert decode_message(header + b"".join(reversed(packets)))[0] == message


def _json_example() -> dict[str, Any]:
    return {"a": [1, 2.5, None, True, {"b": "ü"}], "big": 2**64 - 1, "neg": -(2**63)}


def test_options_json_round_trip_example() -> None:
    for cls in (Hello, Admin, AdminReply):
        message = cls(_json_example())
        assert decode_message(encode(message))[0] == message


def test_remembered_packet_headers_stop_growing_at_their_bound() -> None:
    from phpmq.protocol import writer

    lengths = range(writer.MAX_REMEMBERED + 50)
    for length in lengths:
        dispatch = encode_dispatch(queue_packet("q"), b"x" * length, b"i" * 32, length, 1)
        assert dispatch == encode(Dispatch("q", b"x" * length, b"i" * 32, length, 1))
    assert len(writer._CONTENT_HEADERS) == writer.MAX_REMEMBERED
    assert len(writer._TTL_PACKETS) == writer.MAX_REMEMBERED


@FAST
@given(
    texts,
    contents,
    st.integers(min_value=0, max_value=10**6),
    st.integers(0, 2**31),
    texts,
    texts,
    header_packets,
    st.none() | texts,
    st.none() | ids,
)
def test_a_request_s_send_matches_encode(
    queue: str,
    content: bytes,
    ttl: int,
    tag: int,
    reply_to: str,
    correlation: str,
    headers: bytes | None,
    key: str | None,
    message_key: bytes | None,
) -> None:
    # Every packet a 001 may carry but DELAY_MS: the most packets encode_send writes.
    sent = encode_send(
        queue_packet(queue),
        content,
        ttl,
        tag,
        key,
        headers,
        message_key,
        reply_to=reply_to,
        correlation=correlation,
    )
    assert sent == encode(
        Send(
            queue,
            content,
            ttl,
            tag,
            key,
            headers,
            reply_to=reply_to,
            correlation=correlation,
            message_key=message_key,
        )
    )


@FAST
@given(texts, contents, ids)
def test_encode_reply_and_ack_prefix_match_encode(
    queue: str, content: bytes, message_id: bytes
) -> None:
    from phpmq.protocol import Ack, Reply, ack_prefix, encode_reply

    assert encode_reply(content, queue_packet(queue), message_id) == encode(
        Reply(content, queue, message_id)
    )
    prefix = ack_prefix(queue_packet(queue), len(message_id))
    assert (
        prefix + message_id
        == encode(Ack(queue, message_id))
        == encode_ack(queue_packet(queue), message_id)
    )
