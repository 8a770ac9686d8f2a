"""Runs of like sends read by their headers only (protocol/runs.py): the count and the end
agree with what the decoder reads, for any frame of sends and other messages, cut anywhere."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phpmq import protocol as p
from phpmq.protocol.runs import (
    MAX_FRAME_QUEUES,
    ack_run,
    confirm_run,
    leading_queue,
    like_sends,
    run_queue,
    send_run,
    sends_and_acks,
)

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMIT = 64

queues = st.sampled_from(["q", "q", "q", "jobs.a"])
#: Mostly a few lengths, so that like messages of one length (the fast path) come in runs.
contents = st.one_of(
    st.sampled_from([b"a", b"b", b"ab", b"x" * LIMIT, b"x" * (LIMIT + 1)]),
    st.binary(max_size=LIMIT + 8),
)
ttls = st.sampled_from([None, 0, 30, 99])
#: Groups of sends alike but for their contents (lengths mostly alike too), and other messages
#: between them: like and unlike neighbours are both common.
groups = st.builds(
    lambda queue, ttl, bodies: [p.encode_send(p.queue_packet(queue), b, ttl) for b in bodies],
    queues,
    ttls,
    st.lists(contents, min_size=1, max_size=6),
)
others = st.one_of(
    st.builds(lambda q, c: [p.encode_send(p.queue_packet(q), c, 0, tag=7)], queues, contents),
    st.just([p.encode(p.Heartbeat())]),
    st.builds(lambda q: [p.encode(p.Consume(q, 5))], queues),
)
wire = st.lists(st.one_of(groups, groups, others), min_size=1, max_size=8).map(
    lambda parts: [message for part in parts for message in part]
)


def expected_run(data: bytes, after: int, first: bytes) -> tuple[int, int]:
    """What the decoder says: the sends after `first` whose bytes differ from it only in
    their content (and that the decoder takes whole)."""
    first_message, _ = p.decode_message(first, 0, LIMIT)
    count, pos = 0, after
    while pos < len(data):
        try:
            message, end = p.decode_message(data, pos, LIMIT)
        except p.ProtocolError:
            break
        if not (
            isinstance(message, p.Send)
            and isinstance(first_message, p.Send)
            and data[pos : pos + 8] == first[:8]
            and p.encode_send(p.queue_packet(message.queue), message.content, message.ttl)
            == data[pos:end]
            and (message.queue, message.ttl) == (first_message.queue, first_message.ttl)
        ):
            break
        count, pos = count + 1, end
    return count, pos


@FAST
@given(wire, st.just(0) | st.integers(min_value=0, max_value=200))
def test_a_run_is_what_the_decoder_reads(messages: list[bytes], cut: int) -> None:
    data = b"".join(messages)
    data = data[: max(len(messages[0]), len(data) - cut)]  # the first whole, the rest cut
    first = messages[0]
    try:
        decoded, after = p.decode_message(data, 0, LIMIT)
    except p.ProtocolError:
        return  # over the limit: the decoder's error, never a run
    if isinstance(decoded, p.Send) and first == p.encode_send(
        p.queue_packet(decoded.queue), decoded.content, decoded.ttl
    ):
        assert run_queue(data) == decoded.queue.encode()
    assert like_sends(data, 0, after, LIMIT) == expected_run(data, after, first)


def test_a_frame_of_like_sends_is_one_run_however_their_contents_differ() -> None:
    packet = p.queue_packet("flood")
    frame = b"".join(p.encode_send(packet, b"x" * (n % 7), 0) for n in range(256))
    _, after = p.decode_message(frame)
    assert run_queue(frame) == b"flood"
    assert like_sends(frame, 0, after, LIMIT) == (255, len(frame))


def test_a_run_stops_at_another_queue_ttl_or_form() -> None:
    packet = p.queue_packet("flood")
    like = p.encode_send(packet, b"x", 0)
    for unlike in (
        p.encode_send(p.queue_packet("other"), b"x", 0),
        p.encode_send(packet, b"x", 5),
        p.encode_send(packet, b"x", None),
        p.encode_send(packet, b"x", 0, tag=1),
        p.encode_send(packet, b"x" * (LIMIT + 1), 0),
    ):
        frame = like * 3 + unlike + like
        assert like_sends(frame, 0, len(like), LIMIT) == (2, 3 * len(like))


def test_only_the_canonical_forms_start_a_run() -> None:
    assert run_queue(p.encode_send(p.queue_packet("q"), b"x", 0, tag=1)) is None
    assert run_queue(p.encode(p.Heartbeat())) is None
    assert run_queue(b"") is None
    assert run_queue(p.encode_send(p.queue_packet("q"), b"x", None)) == b"q"


#: A consumer's acks of one queue in a row (like but for their IDs, the fast path), IDs of
#: another length among them now and then.
acks = st.builds(
    lambda q, ids: [p.encode_ack(p.queue_packet(q), message_id) for message_id in ids],
    queues,
    st.lists(
        st.sampled_from([b"d7e7f68761d34838494b233148b5486c", b"%032d" % 7, b"short"]),
        min_size=1,
        max_size=4,
    ),
)
frames = st.lists(st.one_of(groups, acks, others), min_size=1, max_size=8).map(
    lambda parts: [message for part in parts for message in part]
)


@FAST
@given(frames, st.integers(min_value=0, max_value=40))
def test_sends_and_acks_is_what_the_decoder_reads(messages: list[bytes], cut: int) -> None:
    data = b"".join(messages)
    data = data[: len(data) - cut] if cut < len(data) else data
    decoded, error = p.decode_frame(data, 1 << 20)
    names = list(dict.fromkeys(m.queue.encode() for m in decoded if type(m) in (p.Send, p.Ack)))  # type: ignore[attr-defined]
    read = error is None and all(type(m) in (p.Send, p.Ack) for m in decoded)
    assert sends_and_acks(data) == ((len(decoded), names) if read else (0, []))
    first = decoded[0] if decoded else None
    if type(first) in (p.Send, p.Ack):
        assert leading_queue(data) == first.queue.encode()  # type: ignore[union-attr]
    elif first is not None:
        assert leading_queue(data) is None


def test_sends_and_acks_reads_no_frame_that_is_not_whole() -> None:
    frame = p.encode(p.Send("q", b"abc", 0)) + p.encode_ack(p.queue_packet("q"), b"1" * 32)
    assert sends_and_acks(frame) == (2, [b"q"])
    assert sends_and_acks(frame[:-1]) == (0, [])
    assert sends_and_acks(frame + b"H") == (0, [])
    assert sends_and_acks(b"") == (0, [])
    assert sends_and_acks(frame + p.encode(p.Send("r", b"abc", 0))) == (3, [b"q", b"r"])
    assert sends_and_acks(frame + p.encode(p.Heartbeat())) == (0, [])


def test_a_run_of_like_messages_is_read_whole_and_only_whole() -> None:
    """The fast path (one comparison per message like the one before) ends exactly where the
    frame does: a last message cut short, or one longer than those before, is not whole."""
    packet = p.queue_packet("flood")
    like = p.encode_send(packet, b"x" * 100, 0)
    acks = b"".join(p.encode_ack(p.queue_packet(f"q{i % 3}"), b"%032d" % i) for i in range(9))
    assert sends_and_acks(like * 256) == (256, [b"flood"])
    assert sends_and_acks(like * 256 + acks) == (265, [b"flood", b"q0", b"q1", b"q2"])
    assert sends_and_acks(like * 255 + like[:-1]) == (0, [])
    assert sends_and_acks(like * 255 + like + b"x") == (0, [])
    with_ttl = p.encode_send(packet, b"x" * 100, 30)
    assert sends_and_acks(with_ttl * 3 + with_ttl[:-1] + b"9") == (4, [b"flood"])
    assert sends_and_acks(with_ttl * 3 + with_ttl.replace(b"P05", b"Q05")) == (0, [])


def test_a_frame_naming_too_many_queues_is_left_to_the_decoder() -> None:
    frame = b"".join(p.encode(p.Send(f"q{i}", b"x", 0)) for i in range(MAX_FRAME_QUEUES))
    assert sends_and_acks(frame)[0] == MAX_FRAME_QUEUES
    assert sends_and_acks(frame + p.encode(p.Send("one-more", b"x", 0))) == (0, [])


ids = st.sampled_from([b"i" * 32, b"j" * 32, b"k" * 31])
one_send = st.builds(
    lambda q, c, ttl, tag: [
        p.encode_send(p.queue_packet(q), c, ttl if tag is None else ttl or 0, tag)
    ],
    queues,
    contents,
    ttls,
    st.none() | st.integers(0, 10**6),
)
#: A confirmed, idempotent send, with headers and a message key or not (a Spark sink's row).
one_keyed_send = st.builds(
    lambda q, c, ttl, tag, key, headers, message_key: [
        p.encode(
            p.Send(q, c, ttl or 0, tag=tag, key=key, headers=headers, message_key=message_key)
        )
    ],
    queues,
    contents,
    ttls,
    st.integers(0, 10**6),
    st.sampled_from(["k", "k2", "\u00e9"]),
    st.none() | st.sampled_from([b"", b'{"a":"b"}']),
    st.none() | st.sampled_from([b"", b"m", b"\xff\x00"]),
)
one_ack = st.builds(lambda q, i: [p.encode(p.Ack(q, i))], queues, ids)
one_confirm = st.builds(lambda i, tag: [p.encode_confirm(i, tag)], ids, st.integers(0, 10**6))
#: Frames of one kind (runs, or nearly) and mixed ones.
run_frames = st.one_of(
    *(
        st.lists(kind, min_size=2, max_size=6)
        for kind in (one_send, one_keyed_send, one_ack, one_confirm)
    ),
    st.lists(
        st.one_of(one_send, one_keyed_send, one_ack, one_confirm, others), min_size=1, max_size=10
    ),
)


def _only(decoded: list, kind: type) -> bool:
    return bool(decoded) and all(type(m) is kind for m in decoded)


@FAST
@given(run_frames, st.just(0) | st.integers(min_value=0, max_value=40))
def test_the_run_readers_read_what_the_decoder_reads(parts: list, cut: int) -> None:
    """ack_run, send_run and confirm_run (frames read by their headers: a consumer's acks,
    a producer's sends, a producer's confirms) give what the decoder gives, or None."""
    data = b"".join(message for part in parts for message in part)
    data = data[: len(data) - cut] if cut < len(data) else data
    decoded, error = p.decode_frame(data, LIMIT)
    whole = error is None
    acks = ack_run(data)
    if acks is not None:
        assert whole and _only(decoded, p.Ack)
        assert acks == (decoded[0].queue.encode(), [m.message_id for m in decoded])
    elif (
        whole
        and _only(decoded, p.Ack)
        and len({(m.queue, len(m.message_id)) for m in decoded}) == 1
    ):
        raise AssertionError("a frame of acks of one queue was not read")
    sends = send_run(data, LIMIT)
    if sends is not None:
        assert whole and _only(decoded, p.Send)
        assert {(m.queue, m.ttl) for m in decoded} == {
            (sends.queue.decode(), int(sends.ttl) if sends.ttl else None)
        } or (
            sends.ttl == b""
            and {(m.queue, m.ttl) for m in decoded} == {(sends.queue.decode(), None)}
        )
        assert sends.contents == [m.content for m in decoded]
        tags = [m.tag for m in decoded]
        assert sends.tags == (None if tags[0] is None else [b"%d" % t for t in tags])
        keys = [m.key for m in decoded]
        assert sends.keys == (None if keys[0] is None else [k.encode() for k in keys])
        headers = [m.headers for m in decoded]
        message_keys = [m.message_key for m in decoded]
        assert (sends.headers, sends.message_keys) == (
            (None, None) if headers[0] is None else (headers, message_keys)
        )
        starts = [0]
        for message in decoded[:-1]:
            starts.append(starts[-1] + len(p.encode(message)))
        assert [sends.offset_of(i) for i in range(len(decoded))] == starts
    confirms = confirm_run(data)
    if confirms is not None:
        assert whole and _only(decoded, p.Confirm)
        assert confirms == ([m.message_id for m in decoded], [m.tag for m in decoded])


@FAST
@given(
    run_frames,
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_the_run_readers_take_any_corrupted_frame_without_raising(
    parts: list, flips: list[tuple[int, int]]
) -> None:
    """A frame whose bytes were changed (a packet header's length digits, a type, a message
    header) is read or refused (None, or no run), never an exception: lengths the readers find
    wrong are checked before they are sliced with, as a compiled reader needs (mypyc slices
    bytes whose start is past their end with a SystemError; docs/performance.md)."""
    data = bytearray(b"".join(message for part in parts for message in part))
    for at, value in flips:
        data[at % len(data)] = value
    frame = bytes(data)
    ack_run(frame)
    send_run(frame, LIMIT)
    confirm_run(frame)
    sends_and_acks(frame)
    run_queue(frame)
    decoded, _ = p.decode_frame(frame, LIMIT)
    first = next((i for i, m in enumerate(decoded) if type(m) is p.Send), None)
    if first == 0:
        _, after = p.decode_message(frame, 0, LIMIT)
        like_sends(frame, 0, after, LIMIT)
