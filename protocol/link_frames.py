"""A link's frames (docs/protocol.md §6.8): a turn's FORWARDs for one shard joined into frames
no larger than the receiving broker takes (its `max_frame_bytes`: libzmq drops the connection
of a peer that sends a larger one), and a frame cut at its messages' boundaries where one
FORWARD of it would be larger. A single message is never cut: one within a FORWARD's few
hundred bytes of the limit still goes alone and too long, which only a `max_content_bytes` near
`max_frame_bytes` allows.

Both work on bytes this side built or already read (a peer's frame the router took, the
broker's own dispatch frames): well-formed PHPMQ messages, each a message header and its
packets.
"""

from __future__ import annotations

from collections.abc import Iterable

from .constants import MESSAGE_HEADER_BYTES, PACKET_HEADER_BYTES

#: Where a message header's packet count is, and where a packet header's length is.
_COUNT_AT = MESSAGE_HEADER_BYTES - 2
_LENGTH_AT = 3


def cut_at_messages(frame: bytes, limit: int) -> list[bytes]:
    """`frame` as consecutive pieces of whole messages, each at most `limit` bytes where its
    messages allow (a single message longer than `limit` is a piece of its own); `[frame]`
    when it fits, or when it is not whole messages (nothing is cut then)."""
    if len(frame) <= limit:
        return [frame]
    ends = _message_ends(frame)
    if ends is None:
        return [frame]
    pieces = []
    start = last = 0
    for end in ends:
        if end - start > limit and last > start:
            pieces.append(frame[start:last])
            start = last
        last = end
    pieces.append(frame[start:])
    return pieces


def _message_ends(frame: bytes) -> list[int] | None:
    """Where each message of `frame` ends, read from the headers; None if they do not add
    up to the frame."""
    ends = []
    pos, size = 0, len(frame)
    while pos < size:
        count = frame[pos + _COUNT_AT : pos + MESSAGE_HEADER_BYTES]
        if not count.isdigit():  # (int() would take a sign or spaces: no progress)
            return None
        pos += MESSAGE_HEADER_BYTES
        for _ in range(int(count)):
            length = frame[pos + _LENGTH_AT : pos + PACKET_HEADER_BYTES]
            if not length.isdigit():
                return None
            pos += PACKET_HEADER_BYTES + int(length)
        ends.append(pos)
    return ends if pos == size else None


def join_within(forwards: Iterable[tuple[list[bytes], int]], limit: int) -> list[bytes]:
    """Consecutive FORWARDs (each as the pieces of its bytes, and its length) joined into
    frames of at most `limit` bytes each, in order; a FORWARD longer than `limit` is a frame
    of its own."""
    frames: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for forward, length in forwards:
        if parts and size + length > limit:
            frames.append(b"".join(parts))
            parts, size = [], 0
        parts.extend(forward)
        size += length
    if parts:
        frames.append(b"".join(parts))
    return frames
