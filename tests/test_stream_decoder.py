"""protocol.StreamDecoder: messages split at any byte, several per chunk, end of stream, errors."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import phpmq.protocol.stream as protocol_stream
from phpmq.protocol import (
    Ack,
    Consume,
    Dispatch,
    ErrorCode,
    Heartbeat,
    Hello,
    Message,
    RemoteProtocolError,
    Send,
    StreamDecoder,
    TruncatedError,
    encode,
    encode_all,
)

# TV-C (php-mq/client ClientTest): the push-back stream is the ack then the send, 195 bytes.
C_ACK = (
    b"H0100402P0100000000000000000000000000015Unit-Test-Queue"
    b"P0300000000000000000000000000012Unit-Test-ID"
)
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
PUSH_BACK = C_ACK + C_SEND
STREAM = PUSH_BACK + C_REQUEST + C_DISPATCH
EXPECTED = [
    Ack("Unit-Test-Queue", b"Unit-Test-ID"),
    Send("Unit-Test-Queue", b"Unit-Test"),
    Consume("Unit-Test-Queue", 5),
    Dispatch("Unit-Test-Queue", b"Hello World", b"Unit-Test-ID"),
]


def drain(decoder: StreamDecoder) -> list[Message]:
    out = []
    while (message := decoder.next_message()) is not None:
        out.append(message)
    return out


def feed(chunks: list[bytes], decoder: StreamDecoder | None = None) -> list[Message]:
    """Feed the chunks one by one, draining after each, then end the stream. (An empty chunk
    would mean end of stream, so empty pieces of a split are skipped.)"""
    decoder = decoder or StreamDecoder()
    out = []
    for chunk in chunks:
        if not chunk:
            continue
        decoder.receive_data(chunk)
        out += drain(decoder)
    decoder.receive_data(b"")
    out += drain(decoder)
    assert decoder.buffered == 0
    assert decoder.next_message() is None
    return out


def test_vector_lengths() -> None:
    assert len(PUSH_BACK) == 195
    assert [len(C_ACK), len(C_SEND), len(C_REQUEST), len(C_DISPATCH)] == [99, 96, 88, 142]


def test_push_back_stream_in_one_chunk() -> None:
    assert feed([PUSH_BACK]) == EXPECTED[:2]


@pytest.mark.parametrize("split", range(len(PUSH_BACK) + 1))
def test_push_back_stream_split_anywhere(split: int) -> None:
    assert feed([PUSH_BACK[:split], PUSH_BACK[split:]]) == EXPECTED[:2]


def test_stream_split_at_every_point() -> None:
    for split in range(len(STREAM) + 1):
        assert feed([STREAM[:split], STREAM[split:]]) == EXPECTED, split


def test_stream_split_at_every_pair_of_points_of_the_push_back() -> None:
    for first in range(len(PUSH_BACK) + 1):
        for second in range(first, len(PUSH_BACK) + 1):
            chunks = [PUSH_BACK[:first], PUSH_BACK[first:second], PUSH_BACK[second:]]
            assert feed(chunks) == EXPECTED[:2], (first, second)


def test_stream_byte_by_byte() -> None:
    decoder = StreamDecoder()
    out = []
    completed_at = []
    for index in range(len(STREAM)):
        decoder.receive_data(STREAM[index : index + 1])
        got = drain(decoder)
        assert len(got) <= 1
        if got:
            completed_at.append(index + 1)
        out += got
    assert out == EXPECTED
    # Each message comes out exactly when its last byte arrives, not later.
    assert completed_at == [99, 195, 283, 425]
    assert decoder.buffered == 0


def test_several_messages_in_one_chunk_come_out_in_order() -> None:
    decoder = StreamDecoder()
    decoder.receive_data(STREAM * 3)
    assert decoder.buffered == 3 * len(STREAM)
    assert decoder.next_message() == EXPECTED[0]
    assert decoder.buffered == 3 * len(STREAM) - 99
    assert drain(decoder) == EXPECTED[1:] + EXPECTED * 2
    assert decoder.buffered == 0


def test_buffered_counts_unread_bytes() -> None:
    decoder = StreamDecoder()
    assert decoder.buffered == 0
    decoder.receive_data(C_ACK[:50])
    assert decoder.next_message() is None
    assert decoder.buffered == 50
    decoder.receive_data(C_ACK[50:] + C_SEND[:10])
    assert decoder.buffered == 99 + 10
    assert decoder.next_message() == EXPECTED[0]
    assert decoder.buffered == 10
    assert decoder.next_message() is None
    assert decoder.buffered == 10


def test_empty_stream_ends_cleanly() -> None:
    decoder = StreamDecoder()
    assert decoder.next_message() is None
    decoder.receive_data(b"")
    assert decoder.next_message() is None
    assert decoder.next_message() is None


def test_end_of_stream_at_a_message_boundary() -> None:
    decoder = StreamDecoder()
    decoder.receive_data(PUSH_BACK)
    decoder.receive_data(b"")
    assert drain(decoder) == EXPECTED[:2]


@pytest.mark.parametrize("cut", [1, 7, 8, 39, 40, 41, 98])
def test_end_of_stream_inside_a_message(cut: int) -> None:
    decoder = StreamDecoder()
    decoder.receive_data(C_SEND + C_ACK[:cut])
    decoder.receive_data(b"")
    assert decoder.next_message() == EXPECTED[1]
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_message()
    error = info.value
    assert not isinstance(error, TruncatedError)
    assert error.code == ErrorCode.MALFORMED
    assert "ended inside a message" in error.reason
    assert f"{cut} bytes" in error.reason
    # Broken for good: the same error again.
    with pytest.raises(RemoteProtocolError) as again:
        decoder.next_message()
    assert again.value is error


def test_end_of_stream_before_the_next_message_call() -> None:
    # EOF noticed even when the partial message was already known to be short.
    decoder = StreamDecoder()
    decoder.receive_data(C_ACK[:60])
    assert decoder.next_message() is None
    decoder.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="ended inside a message"):
        decoder.next_message()


def test_data_after_end_of_stream_is_refused() -> None:
    decoder = StreamDecoder()
    decoder.receive_data(C_ACK)
    decoder.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="after end of stream"):
        decoder.receive_data(C_SEND)
    # What was received before the end is still delivered, and nothing of the refused data.
    assert drain(decoder) == [EXPECTED[0]]


def test_malformed_message_breaks_the_decoder_for_good() -> None:
    decoder = StreamDecoder()
    decoder.receive_data(C_ACK + b"H0200202" + C_REQUEST[8:] + C_SEND)
    assert decoder.next_message() == EXPECTED[0]
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_message()
    error = info.value
    assert error.code == ErrorCode.UNSUPPORTED_VERSION
    for _ in range(3):
        with pytest.raises(RemoteProtocolError) as again:
            decoder.next_message()
        assert again.value is error
    # More valid data does not repair framing.
    decoder.receive_data(C_SEND)
    with pytest.raises(RemoteProtocolError) as again:
        decoder.next_message()
    assert again.value is error


def test_malformed_bytes_are_refused_as_soon_as_they_are_seen() -> None:
    decoder = StreamDecoder()
    decoder.receive_data(b"X")
    with pytest.raises(RemoteProtocolError, match="must start with 'H'"):
        decoder.next_message()


def test_oversized_packet_is_refused_without_waiting_for_it() -> None:
    decoder = StreamDecoder(max_content_bytes=100)
    decoder.receive_data(b"H0100102P0100000000000000000000000000003FooP02%029d" % 101)
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_message()
    assert info.value.code == ErrorCode.TOO_LARGE


def test_content_up_to_the_limit_is_accepted() -> None:
    decoder = StreamDecoder(max_content_bytes=100)
    wire = encode(Send("Foo", b"x" * 100))
    assert feed([wire[:50], wire[50:]], decoder) == [Send("Foo", b"x" * 100)]


def test_large_message_in_small_chunks() -> None:
    content = bytes(range(256)) * 4096  # 1 MiB
    wire = encode(Dispatch("q", content, b"id", 60, 1))
    chunks = [wire[i : i + 1000] for i in range(0, len(wire), 1000)]
    assert feed(chunks) == [Dispatch("q", content, b"id", 60, 1)]


def test_bytearray_and_memoryview_chunks() -> None:
    decoder = StreamDecoder()
    chunk = bytearray(PUSH_BACK[:100])
    decoder.receive_data(chunk)
    chunk[:] = b"\x00" * 100  # the caller reusing its buffer must not corrupt the decoder
    decoder.receive_data(memoryview(PUSH_BACK)[100:])
    assert drain(decoder) == EXPECTED[:2]


# ---------------------------------------------------------------------------------------------
# Many buffered messages: draining must be linear in the buffered bytes

MANY = 10_000


def test_ten_thousand_small_messages_in_one_chunk() -> None:
    small = [Heartbeat(), Consume("q", 1), Ack("q", b"i")]
    batch = [small[i % 3] for i in range(MANY)]
    decoder = StreamDecoder()
    decoder.receive_data(encode_all(batch))
    assert drain(decoder) == batch
    assert decoder.buffered == 0


def test_draining_decodes_from_one_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    # The quadratic failure mode is copying the whole unread buffer once per message. Count the
    # distinct buffers handed to decode_message while draining one received chunk.
    calls = []
    first: list[bytes] = []
    real = protocol_stream.decode_message

    def spy(data: bytes, pos: int = 0, *args: int) -> tuple[Message, int]:
        if not first:
            first.append(data)
        calls.append((data is first[0], pos))
        return real(data, pos, *args)

    monkeypatch.setattr(protocol_stream, "decode_message", spy)
    wire = encode(Ack("q", b"i"))
    decoder = StreamDecoder()
    decoder.receive_data(wire * MANY)
    assert len(drain(decoder)) == MANY
    assert len(calls) == MANY
    assert all(same for same, _ in calls)
    assert [pos for _, pos in calls] == [i * len(wire) for i in range(MANY)]


def test_partial_tail_survives_compaction() -> None:
    # Drain part of a buffer, then complete the tail with a new chunk.
    wire = encode(Ack("q", b"i"))
    decoder = StreamDecoder()
    decoder.receive_data(wire * 100 + wire[:10])
    assert len(drain(decoder)) == 100
    assert decoder.buffered == 10
    decoder.receive_data(wire[10:] + wire)
    assert drain(decoder) == [Ack("q", b"i")] * 2
    assert decoder.buffered == 0


# ---------------------------------------------------------------------------------------------
# Random messages, random chunking

_messages = st.one_of(
    st.builds(Send, st.text(max_size=20), st.binary(max_size=100), st.none() | st.integers(0, 99)),
    st.builds(Consume, st.text(max_size=20), st.integers(0, 10**6)),
    st.builds(
        Dispatch,
        st.text(max_size=20),
        st.binary(max_size=100),
        st.binary(max_size=32),
        st.none() | st.integers(0, 10**6),
    ),
    st.builds(Ack, st.text(max_size=20), st.binary(max_size=32)),
    st.builds(Hello, st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)),
    st.just(Heartbeat()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_messages, min_size=1, max_size=10), st.data())
def test_random_chunking_gives_back_the_messages(batch: list[Message], data: st.DataObject) -> None:
    wire = encode_all(batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=12)))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    assert b"".join(chunks) == wire
    assert feed(chunks) == batch


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=5))
def test_random_bytes_raise_only_remote_protocol_errors(data: bytes, cuts: list[int]) -> None:
    decoder = StreamDecoder()
    bounds = sorted(min(c, len(data)) for c in cuts)
    chunks = [data[a:b] for a, b in zip([0, *bounds], [*bounds, len(data)], strict=True)]
    try:
        for chunk in filter(None, chunks):
            decoder.receive_data(chunk)
            drain(decoder)
        decoder.receive_data(b"")
        drain(decoder)
    except RemoteProtocolError as exc:
        assert exc.reason
        # Once broken, always broken.
        with pytest.raises(RemoteProtocolError):
            decoder.next_message()
    else:
        assert decoder.buffered == 0
