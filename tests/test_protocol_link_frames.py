"""A link's frames (protocol/link_frames.py): FORWARDs joined up to the receiving broker's
frame limit, and a frame cut at its messages' boundaries where one FORWARD would pass it."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

import phpmq.protocol as p
from phpmq.protocol.link_frames import cut_at_messages, join_within

messages = st.lists(
    st.builds(
        p.Send,
        st.sampled_from(["a", "orders"]),
        st.binary(max_size=300),
        st.integers(min_value=0, max_value=10**6),
    ),
    min_size=1,
    max_size=20,
)


@given(messages, st.integers(min_value=1, max_value=2_000))
def test_a_cut_frame_is_its_messages_in_order_in_pieces_within_the_limit(
    sent: list[p.Send], limit: int
) -> None:
    frame = p.encode_all(sent)
    pieces = cut_at_messages(frame, limit)
    assert b"".join(pieces) == frame
    decoded = [m for piece in pieces for m in p.decode_frame(piece)[0]]
    assert decoded == sent, "every piece is whole messages"
    for piece in pieces:
        one_message = len(p.decode_frame(piece)[0]) == 1
        assert len(piece) <= limit or one_message, "only a lone message may pass the limit"


def test_a_frame_that_fits_or_is_not_whole_messages_is_not_cut() -> None:
    frame = p.encode_all([p.Send("a", b"x" * 100, 0)] * 3)
    one = len(frame) // 3
    assert cut_at_messages(frame, len(frame)) == [frame]
    assert cut_at_messages(frame, 2 * one) == [frame[: 2 * one], frame[2 * one :]]
    each = [frame[:one], frame[one : 2 * one], frame[2 * one :]]
    assert cut_at_messages(frame, 2 * one - 1) == each
    assert cut_at_messages(frame, 1) == each  # a lone message longer than the limit: whole
    assert cut_at_messages(frame[:-1], 100) == [frame[:-1]]
    assert cut_at_messages(frame + b"H01", 100) == [frame + b"H01"]
    # A sign or spaces in a length field, which int() would take, are not a length.
    content_header = b"P02" + b"%029d" % 100
    negative = frame.replace(content_header, b"P02-" + b"%028d" % 40)
    assert cut_at_messages(negative, 100) == [negative]
    spaced = frame.replace(b"H0100103", b"H01001 3")
    assert cut_at_messages(spaced, 100) == [spaced]


@given(st.lists(st.lists(st.binary(min_size=1, max_size=50), max_size=4), max_size=30),
       st.integers(min_value=1, max_value=200))  # fmt: skip
def test_joined_forwards_keep_their_order_and_each_frame_its_limit(
    forwards: list[list[bytes]], limit: int
) -> None:
    sized = [(parts, sum(map(len, parts))) for parts in forwards]
    frames = join_within(sized, limit)
    assert b"".join(frames) == b"".join(b"".join(parts) for parts in forwards)
    sizes = [size for _, size in sized if size]
    for frame in frames:
        assert len(frame) <= limit or len(frame) in sizes, "only a lone FORWARD passes it"
    # As few frames as the order allows: no two neighbours would fit in one.
    for first, second in itertools.pairwise(frames):
        assert len(first) + len(second) > limit
