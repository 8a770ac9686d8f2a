"""Malformed input is refused with the right exception, ErrorCode and reason; illegal output is
refused with LocalProtocolError.

The candidate negative vectors are those listed in shared/reference/phpmq.md TV-F (the PHP
decoders accept most of them silently or crash); the rest widen the net.
"""

from __future__ import annotations

import pytest

from phpmq.protocol import (
    DEFAULT_MAX_CONTENT_BYTES,
    MIN_CONTROL_PACKET_BYTES,
    Ack,
    Consume,
    DeadLetter,
    Dispatch,
    Error,
    ErrorCode,
    Hello,
    LocalProtocolError,
    MessageType,
    ProtocolError,
    RemoteProtocolError,
    Requeue,
    Send,
    TruncatedError,
    decode_frame,
    decode_message,
    encode,
    encode_all,
    encode_dispatch,
    encode_send,
    queue_packet,
)

MESSAGE_ID = b"d7e7f68761d34838494b233148b5486c"


def pkt(packet_type: int, content: bytes) -> bytes:
    """A packet written independently of the codec under test."""
    return b"P%02d%029d" % (packet_type, len(content)) + content


QUEUE = pkt(1, b"Foo")
CONTENT = pkt(2, b"Hello World")
ID = pkt(3, MESSAGE_ID)
COUNT = pkt(4, b"5")
TTL = pkt(5, b"3600")

CONSUME = b"H0100202" + QUEUE + COUNT
SEND = b"H0100103" + QUEUE + CONTENT + TTL
DISPATCH = b"H0100304" + QUEUE + CONTENT + ID + TTL
ACK = b"H0100402" + QUEUE + ID


def refused(data: bytes, code: ErrorCode, reason: str, **kwargs: int) -> RemoteProtocolError:
    """Assert that decode_message refuses `data` (not as merely truncated) and that
    decode_frame reports the same refusal; returns the error."""
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(data, **kwargs)
    error = info.value
    assert type(error) is RemoteProtocolError, error
    assert error.code == code
    assert reason in error.reason
    assert str(error) == error.reason
    messages, frame_error = decode_frame(data, **kwargs)
    assert messages == []
    assert type(frame_error) is RemoteProtocolError
    assert frame_error.code == code
    assert reason in frame_error.reason
    return error


def test_sanity_the_building_blocks_are_valid() -> None:
    # Every negative vector below is a valid message with one thing broken.
    assert decode_frame(CONSUME + SEND + DISPATCH + ACK) == (
        [
            Consume("Foo", 5),
            Send("Foo", b"Hello World", 3600),
            Dispatch("Foo", b"Hello World", MESSAGE_ID, 3600),
            Ack("Foo", MESSAGE_ID),
        ],
        None,
    )


# ---------------------------------------------------------------------------------------------
# Message header


@pytest.mark.parametrize("marker", [b"X", b"h", b"P", b"0", b"\x00", b"\xff", b" "])
def test_wrong_message_marker(marker: bytes) -> None:
    refused(marker + CONSUME[1:], ErrorCode.MALFORMED, "must start with 'H'")


def test_wrong_message_marker_is_refused_before_the_header_is_complete() -> None:
    # One wrong byte is enough: waiting for 7 more would only delay the refusal.
    refused(b"X", ErrorCode.MALFORMED, "must start with 'H'")


@pytest.mark.parametrize("version", [b"02", b"00", b"10", b"99"])
def test_unsupported_version(version: bytes) -> None:
    error = refused(
        b"H" + version + CONSUME[3:], ErrorCode.UNSUPPORTED_VERSION, f"version {version.decode()}"
    )
    assert "01" in error.reason


@pytest.mark.parametrize(
    "header",
    [
        b"H0a00202",
        b"H01002x2",
        b"H010020 ",
        b"H 100202",
        b"H01-0202",
        b"H01002\xd9\xa5",
        b"HHHHHHHH",
    ],
)
def test_non_digit_header_fields(header: bytes) -> None:
    refused(header + CONSUME[8:], ErrorCode.MALFORMED, "7 ASCII digits")


def test_non_digit_header_field_is_refused_before_the_header_is_complete() -> None:
    refused(b"H0a", ErrorCode.MALFORMED, "7 ASCII digits")


@pytest.mark.parametrize("type_code", [b"007", b"099", b"999", b"000", b"114", b"150", b"200"])
def test_unknown_message_type(type_code: bytes) -> None:
    refused(
        b"H01" + type_code + b"02" + QUEUE + COUNT,
        ErrorCode.UNSUPPORTED_TYPE,
        f"unknown message type {type_code.decode()}",
    )


@pytest.mark.parametrize(
    ("header", "body", "reason"),
    [
        # TV-F: header count disagreeing with the type.
        (b"H0100206", QUEUE + COUNT + pkt(15, b"1") * 4, "carries 2-5 packets, header says 6"),
        (b"H0100201", QUEUE, "carries 2-5 packets, header says 1"),
        (b"H0100200", b"", "carries 2-5 packets, header says 0"),
        (b"H0100101", QUEUE, "carries 2-10 packets, header says 1"),
        (b"H0100111", QUEUE + CONTENT + TTL * 9, "carries 2-10 packets, header says 11"),
        (b"H0110504", ID * 4, "carries 1-3 packets, header says 4"),
        (b"H0100302", QUEUE + CONTENT, "carries 3-10 packets, header says 2"),
        (b"H0100311", DISPATCH[8:] + pkt(12, b"1") * 7, "carries 3-10 packets, header says 11"),
        (b"H0100403", QUEUE + ID + TTL, "carries 2 packets, header says 3"),
        (b"H0100502", QUEUE + ID, "carries 3-5 packets, header says 2"),
        (b"H0100604", QUEUE + ID + pkt(11, b"x") * 2, "carries 2-3 packets, header says 4"),
        (b"H0110201", pkt(13, b"{}"), "carries 0 packets, header says 1"),
        (b"H0110002", pkt(10, b"400") + pkt(11, b"x"), None),  # valid: control case
        (b"H0110001", pkt(10, b"400"), "carries 2-7 packets, header says 1"),
    ],
)
def test_header_count_disagrees_with_type(header: bytes, body: bytes, reason: str | None) -> None:
    if reason is None:
        assert decode_message(header + body)[0] == Error(400, "x")
    else:
        refused(header + body, ErrorCode.MALFORMED, reason)


# ---------------------------------------------------------------------------------------------
# Packet headers


@pytest.mark.parametrize("marker", [b"X", b"p", b"H", b"0", b"\xff"])
def test_wrong_packet_marker(marker: bytes) -> None:
    refused(b"H0100202" + marker + QUEUE[1:] + COUNT, ErrorCode.MALFORMED, "must start with 'P'")
    # ...also when it is the second packet...
    refused(b"H0100202" + QUEUE + marker + COUNT[1:], ErrorCode.MALFORMED, "must start with 'P'")


def test_wrong_packet_marker_is_refused_before_the_packet_header_is_complete() -> None:
    refused(b"H0100202Q0", ErrorCode.MALFORMED, "must start with 'P'")


def test_36_character_packet_header() -> None:
    # TV-F: the first-draft 36-byte packet header (33-digit length).
    refused(
        b"H0100202" + b"P01000000000000000000000000000000003Foo" + COUNT,
        ErrorCode.MALFORMED,
        "must start with 'P'",
    )


def test_35_character_packet_header() -> None:
    # The pre-fix draft code's `%032d`: a 35-byte header.
    refused(
        b"H0100202" + b"P01%032d" % 3 + b"Foo" + COUNT, ErrorCode.MALFORMED, "must start with 'P'"
    )


def test_non_digit_packet_length_tv_f() -> None:
    # TV-F's vector as given (33 characters): the 32-byte header ends in `x0`.
    vector = b"P01000000000000000000000000000x03"
    refused(b"H0100202" + vector + b"Foo" + COUNT, ErrorCode.MALFORMED, "29 ASCII digits")


@pytest.mark.parametrize(
    "length",
    [
        b"0" * 26 + b"x03",
        b"0" * 27 + b"x3",
        b" " * 28 + b"3",
        b"+" + b"0" * 27 + b"3",
        b"-" + b"0" * 27 + b"3",
        b"0" * 27 + b"3 ",
        b"0" * 27 + "\u0663".encode(),  # ARABIC-INDIC DIGIT THREE: 2 non-ASCII bytes
        b"0" * 28 + b"\x00",
    ],
)
def test_non_digit_packet_length(length: bytes) -> None:
    length = length.rjust(29, b"0")
    assert len(length) == 29
    refused(b"H0100202P01" + length + b"Foo" + COUNT, ErrorCode.MALFORMED, "29 ASCII digits")


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        # TV-F: duplicate packet type.
        (b"H0100202" + QUEUE + pkt(1, b"Bar"), "duplicate packet P01"),
        (b"H0100103" + QUEUE + CONTENT + pkt(2, b"again"), "duplicate packet P02"),
        (b"H0100305" + QUEUE + CONTENT + ID + TTL + TTL, "duplicate packet P05"),
        (b"H0100603" + QUEUE + pkt(11, b"a") + pkt(11, b"b"), "duplicate packet P11"),
        (b"H0110102" + pkt(13, b"{}") + pkt(13, b"{}"), "carries 0-1 packets, header says 2"),
    ],
)
def test_duplicate_packet(wire: bytes, reason: str) -> None:
    refused(wire, ErrorCode.MALFORMED, reason)


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (b"H0100102" + QUEUE + TTL, "SEND message lacks its content packet"),
        (b"H0100102" + CONTENT + TTL, "SEND message lacks its queue packet"),
        (b"H0100303" + QUEUE + CONTENT + TTL, "DISPATCH message lacks its message_id packet"),
        (b"H0100304" + QUEUE + ID + TTL + pkt(12, b"1"), "lacks its content packet"),
        (b"H0100602" + QUEUE + pkt(11, b"why"), "DEAD_LETTER message lacks its message_id"),
        (b"H0110003" + pkt(10, b"400") + ID + pkt(1, b"q"), "ERROR message lacks its reason"),
    ],
)
def test_missing_required_packet(wire: bytes, reason: str) -> None:
    refused(wire, ErrorCode.MALFORMED, reason)


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        # TV-F: "missing required packet": 002 carrying P01 + P03 is refused at the P03.
        (b"H0100202" + QUEUE + ID, "packet type 03 is not allowed in a CONSUME message"),
        (b"H0100202" + QUEUE + pkt(99, b"x"), "packet type 99 is not allowed in a CONSUME"),
        (b"H0100202" + pkt(0, b"x") + COUNT, "packet type 00 is not allowed"),
        (b"H0100103" + QUEUE + CONTENT + pkt(6, b"x"), "packet type 06 is not allowed in a SEND"),
        (b"H0100103" + QUEUE + CONTENT + pkt(12, b"1"), "packet type 12 is not allowed in a SEND"),
        (b"H0100402" + QUEUE + CONTENT, "packet type 02 is not allowed in a ACK message"),
        (b"H0100503" + QUEUE + ID + COUNT, "packet type 04 is not allowed in a REQUEUE"),
        (b"H0110101" + QUEUE, "packet type 01 is not allowed in a HELLO message"),
        (b"H0100202" + b"P0x" + b"0" * 28 + b"3Foo" + COUNT, "packet type must be 2 ASCII digits"),
    ],
)
def test_packet_type_not_allowed_for_message_type(wire: bytes, reason: str) -> None:
    refused(wire, ErrorCode.MALFORMED, reason)


# ---------------------------------------------------------------------------------------------
# Truncation


def _boundaries(wire: bytes) -> list[int]:
    """Offsets where each header and each content ends."""
    ends = [8]
    p = 8
    while p < len(wire):
        length = int(wire[p + 3 : p + 32])
        ends += [p + 32, p + 32 + length]
        p += 32 + length
    return ends


@pytest.mark.parametrize(
    "wire", [CONSUME, SEND, DISPATCH, ACK, encode(Hello({"a": 1})), encode(Error(500, "x"))]
)
def test_truncated_message_needs_the_end_of_the_current_piece(wire: bytes) -> None:
    boundaries = _boundaries(wire)
    assert boundaries[-1] == len(wire)
    for cut in range(len(wire)):
        expected = min(b for b in boundaries if b > cut)
        with pytest.raises(TruncatedError) as info:
            decode_message(wire[:cut])
        assert info.value.needed == expected, cut
        assert info.value.code == ErrorCode.MALFORMED
        # `needed` counts from the start of the message, not of the buffer.
        with pytest.raises(TruncatedError) as info:
            decode_message(CONSUME + wire[:cut], len(CONSUME))
        assert info.value.needed == expected, cut


@pytest.mark.parametrize(
    ("cut", "reason"),
    [(3, "message header"), (8, "packet header"), (30, "packet header"), (41, "content")],
)
def test_truncated_reason_names_the_piece(cut: int, reason: str) -> None:
    with pytest.raises(TruncatedError) as info:
        decode_message(CONSUME[:cut])
    assert reason in info.value.reason


def test_truncated_frame_is_an_error_not_a_wait() -> None:
    for cut in (1, 7, 8, 20, 40, 42, 43, 60, len(CONSUME) - 1):
        messages, error = decode_frame(ACK + CONSUME[:cut])
        assert messages == [Ack("Foo", MESSAGE_ID)]
        # A frame is complete by definition: decode_frame does not hand out a TruncatedError.
        assert type(error) is RemoteProtocolError, cut
        assert error.code == ErrorCode.MALFORMED
        assert "truncated" in error.reason


def test_dialect_mix_ttl_header_with_pre_ttl_body() -> None:
    # TV-F: a HEAD-dialect header (3 packets) on a pre-TTL body (2 packets).
    body = QUEUE + CONTENT
    with pytest.raises(TruncatedError) as info:
        decode_message(b"H0100103" + body)
    assert info.value.needed == 8 + len(body) + 32
    messages, error = decode_frame(b"H0100103" + body)
    assert messages == []
    assert isinstance(error, RemoteProtocolError)


def test_dialect_mix_pre_ttl_header_with_ttl_body() -> None:
    # A pre-TTL header (2 packets) on a HEAD body: the TTL packet is left over and is garbage
    # where the next message header should be (what the pinned PHP server would misparse).
    messages, error = decode_frame(b"H0100102" + QUEUE + CONTENT + TTL)
    assert messages == [Send("Foo", b"Hello World", None)]
    assert type(error) is RemoteProtocolError
    assert "must start with 'H'" in error.reason


# ---------------------------------------------------------------------------------------------
# Limits and values


def test_length_over_max_content_bytes() -> None:
    wire = b"H0100102" + QUEUE + pkt(2, b"x" * 11)
    error = refused(wire, ErrorCode.TOO_LARGE, "over the limit", max_content_bytes=10)
    assert "11" in error.reason
    assert "10" in error.reason
    assert error.message_type == MessageType.SEND  # so the broker can say a send was refused
    # At the limit it is fine.
    assert decode_message(wire, max_content_bytes=11)[0] == Send("Foo", b"x" * 11)


def test_length_over_max_is_refused_before_the_content_arrives() -> None:
    # A huge declared length must not make a stream decoder wait for (and buffer) it.
    header = b"P02" + b"9" * 29
    error = refused(b"H0100102" + QUEUE + header, ErrorCode.TOO_LARGE, "over the limit")
    assert str(DEFAULT_MAX_CONTENT_BYTES) in error.reason


def test_the_content_limit_applies_to_content_and_headers() -> None:
    for packets in (pkt(2, b"x" * 6), pkt(2, b"x") + pkt(5, b"0") + pkt(17, b'{"a":1}')):
        error = refused(
            b"H01001%02d" % (1 + len(packets) // 33) + QUEUE + packets,
            ErrorCode.TOO_LARGE,
            "over the limit of 5",
            max_content_bytes=5,
        )
        assert "for packets that are not content" not in error.reason


def test_control_packets_have_a_limit_of_their_own() -> None:
    """Finding 11 of issue 27: `--max-content-bytes 100` refused every HELLO (105 bytes)."""
    options = b'{"name":"%s"}' % (b"n" * 200)
    assert decode_message(b"H0110101" + pkt(13, options), 0, 100)[0] == Hello({"name": "n" * 200})
    assert decode_message(b"H0100202" + pkt(1, b"a-long-queue") + COUNT, 0, 5)[0] == Consume(
        "a-long-queue", 5
    )
    big = b'{"name":"%s"}' % (b"n" * MIN_CONTROL_PACKET_BYTES)
    error = refused(
        b"H0110101" + pkt(13, big),
        ErrorCode.TOO_LARGE,
        f"over the limit of {MIN_CONTROL_PACKET_BYTES} for packets that are not content",
        max_content_bytes=100,
    )
    assert error.message_type == MessageType.HELLO
    # A content limit above it is every packet's limit, as before.
    assert decode_message(b"H0110101" + pkt(13, big), 0, len(big))[0] == Hello(
        {"name": "n" * MIN_CONTROL_PACKET_BYTES}
    )


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (b"H0100202" + pkt(1, b"F\xffo") + COUNT, None),
        (b"H0100402" + pkt(1, b"\xc3") + ID, None),  # truncated UTF-8 sequence
        (b"H0100603" + QUEUE + ID + pkt(11, b"\xed\xa0\x80"), None),  # encoded surrogate
        (b"H0100202" + pkt(1, "Fö".encode()) + COUNT, Consume("Fö", 5)),
    ],
)
def test_non_utf8_text(wire: bytes, expected: Consume | None) -> None:
    if expected is None:
        refused(wire, ErrorCode.MALFORMED, "not valid UTF-8")
    else:
        assert decode_message(wire)[0] == expected


@pytest.mark.parametrize(
    "value",
    [b"", b"5a", b"a5", b"-5", b"+5", b" 5", b"5 ", b"5.0", b"1e3", b"\xd9\xa5", b"1" * 19],
)
@pytest.mark.parametrize(
    "build",
    [
        lambda v: b"H0100202" + QUEUE + pkt(4, v),
        lambda v: b"H0100103" + QUEUE + CONTENT + pkt(5, v),
        lambda v: b"H0100503" + QUEUE + ID + pkt(5, v),
        lambda v: b"H0100305" + DISPATCH[8:] + pkt(12, v),
        lambda v: b"H0110002" + pkt(10, v) + pkt(11, b"why"),
    ],
    ids=["count", "send-ttl", "requeue-ttl", "delivery-count", "error-code"],
)
def test_bad_integer_packet(value: bytes, build) -> None:
    refused(build(value), ErrorCode.MALFORMED, "1-18 ASCII digits")


def test_integer_packet_limits() -> None:
    assert decode_message(b"H0100202" + QUEUE + pkt(4, b"9" * 18))[0].count == 10**18 - 1
    assert decode_message(b"H0100202" + QUEUE + pkt(4, b"0" * 18))[0].count == 0
    assert decode_message(b"H0100202" + QUEUE + pkt(4, b"007"))[0].count == 7


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (b"[]", "not a JSON object"),
        (b"null", "not a JSON object"),
        (b"not json", "not a JSON object"),
        (b'{"a": 1', "not a JSON object"),
        (b'{"a": 1e400}', "not a JSON object"),
        (b"", "not a JSON object"),
        (b'{"a": "\xff"}', "not a JSON object"),  # invalid UTF-8 inside a JSON string
        (b'{"\xe2\x80": null}', "not a JSON object"),  # ...or inside a key
        (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    ],
)
@pytest.mark.parametrize("header", [b"H0110101", b"H0111001", b"H0111101"])
def test_bad_options_packet(options: bytes, reason: str, header: bytes) -> None:
    refused(header + pkt(13, options), ErrorCode.MALFORMED, reason)


# ---------------------------------------------------------------------------------------------
# Frames


def test_empty_frame() -> None:
    messages, error = decode_frame(b"")
    assert messages == []
    assert type(error) is RemoteProtocolError
    assert error.code == ErrorCode.MALFORMED
    assert "empty" in error.reason


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (b"garbage", "must start with 'H'"),
        (b"\n", "must start with 'H'"),
        (b"H0200202", "version 02"),
        (b"H0100702", "unknown message type 007"),
        (b"H0100202" + QUEUE, "truncated"),
        (b"H01", "truncated"),
        (b"H0100202" + QUEUE + QUEUE, "duplicate packet P01"),
    ],
)
def test_valid_messages_then_garbage(garbage: bytes, reason: str) -> None:
    messages, error = decode_frame(CONSUME + ACK + garbage)
    assert messages == [Consume("Foo", 5), Ack("Foo", MESSAGE_ID)]
    assert isinstance(error, RemoteProtocolError)
    assert reason in error.reason


def test_nothing_after_a_bad_message_is_read() -> None:
    # Framing is lost at the first bad message: valid bytes after it are not decoded.
    messages, error = decode_frame(ACK + b"H0100702" + QUEUE + COUNT + CONSUME)
    assert messages == [Ack("Foo", MESSAGE_ID)]
    assert error is not None
    assert error.code == ErrorCode.UNSUPPORTED_TYPE


def test_decode_frame_carries_max_content_bytes() -> None:
    messages, error = decode_frame(CONSUME + SEND, max_content_bytes=10)
    assert messages == [Consume("Foo", 5)]
    assert error is not None
    assert error.code == ErrorCode.TOO_LARGE


def test_a_remembered_packet_header_is_still_held_to_the_limit_and_the_frame_end() -> None:
    # The decoder remembers the length of each packet header it has read: the next frame with
    # the same headers must still be refused under a lower limit, and when it is cut short.
    wire = b"H0100102" + QUEUE + pkt(2, b"x" * 40)
    assert decode_frame(wire * 3) == ([Send("Foo", b"x" * 40)] * 3, None)
    messages, error = decode_frame(wire + wire, max_content_bytes=39)
    assert messages == []
    assert error is not None
    assert error.code == ErrorCode.TOO_LARGE
    messages, error = decode_frame(wire + wire[:-1])
    assert messages == [Send("Foo", b"x" * 40)]
    assert error is not None
    assert "truncated" in error.reason


def test_packet_headers_past_the_bound_are_read_not_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from phpmq.protocol import reader

    monkeypatch.setattr(reader, "_remembered", reader.MAX_REMEMBERED_HEADERS)
    wire = b"H0100102" + QUEUE + pkt(2, b"y" * 12345)
    assert decode_frame(wire * 2) == ([Send("Foo", b"y" * 12345)] * 2, None)
    assert reader._remembered == reader.MAX_REMEMBERED_HEADERS
    remembered = [
        header
        for entry in reader._HEADERS.values()
        for *_, lengths in entry.canonical
        for header in lengths
    ]
    assert pkt(2, b"y" * 12345)[:32] not in remembered


def test_error_hierarchy() -> None:
    assert issubclass(TruncatedError, RemoteProtocolError)
    assert issubclass(RemoteProtocolError, ProtocolError)
    assert issubclass(LocalProtocolError, ProtocolError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert RemoteProtocolError("x").code == ErrorCode.MALFORMED


# ---------------------------------------------------------------------------------------------
# Encoding something illegal


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (Send("Foo", b"x", -1), "0 to 18 digits"),
        (Requeue("Foo", MESSAGE_ID, -3600), "0 to 18 digits"),
        (Consume("Foo", -5), "0 to 18 digits"),
        (Dispatch("Foo", b"x", MESSAGE_ID, ttl=-1), "0 to 18 digits"),
        (Dispatch("Foo", b"x", MESSAGE_ID, ttl=1, delivery_count=-1), "0 to 18 digits"),
        (Error(-400, "bad"), "0 to 18 digits"),
        (Send("Foo", b"x", 10**18), "0 to 18 digits"),  # the reader takes no 19th
        (Consume("Foo", 10**30), "0 to 18 digits"),
        (Send("Foo", b"x", True), "booleans"),
        (Consume("Foo", False), "booleans"),
        (Send(None, b"x"), "SEND needs queue"),
        (Send("Foo", None), "SEND needs content"),
        (Consume("Foo", None), "CONSUME needs count"),
        (Requeue("Foo", MESSAGE_ID, None), "REQUEUE needs ttl"),
        (Ack("Foo", None), "ACK needs message_id"),
        (Dispatch("Foo", b"x", None), "DISPATCH needs message_id"),
        (DeadLetter(None, MESSAGE_ID), "DEAD_LETTER needs queue"),
        (Error(400, None), "ERROR needs reason"),
        (Send("Foo", b"x", 1.5), "cannot encode a float"),
        (Consume("Foo", [5]), "cannot encode a list"),
    ],
)
def test_encoding_illegal_message(message, reason: str) -> None:
    with pytest.raises(LocalProtocolError) as info:
        encode(message)
    assert reason in info.value.reason


@pytest.mark.parametrize("ttl", [-1, 10**18])
def test_hot_path_send_refuses_a_ttl_no_reader_takes(ttl: int) -> None:
    with pytest.raises(LocalProtocolError) as info:
        encode_send(queue_packet("Foo"), b"x", ttl)
    assert "a TTL is 0 to 18 digits" in info.value.reason


def test_encoder_refusal_is_not_a_remote_error() -> None:
    with pytest.raises(ProtocolError) as info:
        encode(Send("Foo", b"x", -1))
    assert not isinstance(info.value, RemoteProtocolError)


def test_hot_path_dispatch_does_not_check_its_inputs() -> None:
    # Documented gap, not a contract: encode_dispatch trusts the broker (which never passes a
    # negative remaining TTL); the bytes it would write are refused by any strict decoder.
    wire = encode_dispatch(queue_packet("Foo"), b"x", MESSAGE_ID, -1, None)
    refused(wire, ErrorCode.MALFORMED, "ASCII digits")


def test_a_packet_header_cut_short_is_not_remembered() -> None:
    from phpmq.protocol import reader

    wire = b"H0100102" + QUEUE + pkt(2, b"z" * 77)
    cut = wire[: len(b"H0100102" + QUEUE) + 30]  # inside the content packet's header
    messages, error = decode_frame(cut)
    assert messages == [] and error is not None and "truncated" in error.reason
    remembered = [
        header
        for entry in reader._HEADERS.values()
        for *_, lengths in entry.canonical
        for header in lengths
    ]
    assert all(len(header) == 32 for header in remembered)
    assert decode_frame(wire) == ([Send("Foo", b"z" * 77)], None)


def test_sends_that_skip_optional_packets_are_read_by_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A keyed row (tag, key, headers, message key; no request packets) skips packets in table
    # order: once its form is learned, the rest of the frame is read without decode_message.
    from phpmq.protocol import reader

    keyed = [
        Send("Foo", b"row %d" % n, 0, tag=n, key=f"k/{n}", headers=b'{"n":"%d"}' % n,
             message_key=b"m%d" % n)
        for n in range(10, 14)
    ]  # fmt: skip
    wire = encode_all(keyed)
    assert decode_frame(wire) == (keyed, None)
    calls = []
    slow = reader.decode_message
    monkeypatch.setattr(reader, "decode_message", lambda *a: calls.append(a) or slow(*a))
    assert decode_frame(wire) == (keyed, None)
    assert calls == []


def test_messages_of_one_header_in_two_forms_decode_alike() -> None:
    # Both are 001s of four packets: (queue, content, TTL, tag) and (queue, content, tag, key).
    with_ttl = Send("Foo", b"a", 30, tag=1)
    with_key = Send("Foo", b"b", None, tag=2, key="k")
    frame = [with_ttl, with_key, with_key, with_ttl, with_key]
    assert decode_frame(encode_all(frame)) == (frame, None)
    assert decode_frame(encode_all(frame[::-1])) == (frame[::-1], None)
