"""Runs of like sends, read by their headers only (docs/protocol.md §6.1).

A flooding producer packs many 001s into one frame, all to the same queue in the same form.
When the broker refuses the first of them for a reason that holds for every one like it (a
full queue, its memory limit, a drain), it refuses the run as one: these functions find the
run's queue and its end without decoding a message, which is what makes a refused frame cost
next to nothing (issue 27, finding 10).

Only the canonical forms are read this way: the stock client's (QUEUE, CONTENT) and the
README's (QUEUE, CONTENT, TTL), packets in table order. Anything else is left to the decoder.

`ack_run` reads a frame of acks for one queue, the other half of a consumer's traffic, so the
broker settles them without a message object each.

`sends_and_acks` does the same for a shard that forwards (docs/cluster.md "Forwarding"): a
frame of 001s and 004s whose queues one other shard owns goes there as it came, so the shard
it arrived at reads its headers and not its messages.
"""

from __future__ import annotations

from itertools import repeat
from typing import NamedTuple

from .constants import (
    MAX_INTEGER_DIGITS,
    MESSAGE_HEADER_BYTES,
    MIN_CONTROL_PACKET_BYTES,
    PACKET_HEADER_BYTES,
    MessageType,
    PacketType,
)
from .table import SPECS
from .writer import message_header

#: The headers of the two forms a run is read in: stock (2 packets) and README (3, with TTL).
RUN_HEADERS = (message_header(MessageType.SEND, 2), message_header(MessageType.SEND, 3))
#: A packet header's fixed part: `P`, its type and the 20 leading zeros of its length (lengths
#: of 10**9 and more take the decoder's path).
_LENGTH_DIGITS = 9
_FIXED_BYTES = PACKET_HEADER_BYTES - _LENGTH_DIGITS
_ZEROS = b"0" * (_FIXED_BYTES - 3)
_QUEUE_FIXED = b"P%02d%s" % (PacketType.QUEUE, _ZEROS)
_CONTENT_FIXED = b"P%02d%s" % (PacketType.CONTENT, _ZEROS)
_TTL_FIXED = b"P%02d%s" % (PacketType.TTL, _ZEROS)
_ID_FIXED = b"P%02d%s" % (PacketType.MESSAGE_ID, _ZEROS)
_TAG_FIXED = b"P%02d%s" % (PacketType.TAG, _ZEROS)
_KEY_FIXED = b"P%02d%s" % (PacketType.KEY, _ZEROS)
_HEADERS_FIXED = b"P%02d%s" % (PacketType.HEADERS, _ZEROS)
_MESSAGE_KEY_FIXED = b"P%02d%s" % (PacketType.MESSAGE_KEY, _ZEROS)
#: The headers of the forms `send_run` reads -> their packet counts: RUN_HEADERS' two,
#: (QUEUE, CONTENT, TTL, TAG), a confirmed `send_many`'s, that with a KEY (idempotent), and
#: that with HEADERS and a MESSAGE_KEY too (a Spark sink's keyed rows).
SEND_RUN_HEADERS = {message_header(MessageType.SEND, count): count for count in (2, 3, 4, 5, 7)}
#: The header of the 004 `ack_run` reads: (QUEUE, MESSAGE_ID).
ACK_RUN_HEADER = message_header(MessageType.ACK, 2)
#: Longest queue name and ID `ack_run` reads: longer ones (refused by the decoder when over
#: the packet limit) take the decoder's path.
_RUN_MAX_QUEUE_BYTES = 255
_RUN_MAX_ID_BYTES = 64
_RUN_MAX_KEY_BYTES = 1024


def _length_at(data: bytes, pos: int, fixed: bytes) -> int:
    """The length in the packet header at `pos` if its type is `fixed`'s, else -1."""
    if not data.startswith(fixed, pos):
        return -1
    digits = data[pos + _FIXED_BYTES : pos + PACKET_HEADER_BYTES]
    return int(digits) if len(digits) == _LENGTH_DIGITS and digits.isdigit() else -1


def run_queue(data: bytes) -> bytes | None:
    """The queue packet's content (the queue name's bytes) of the canonical 001 that `data`
    starts with, or None when it starts with anything else."""
    return _first_queue(data) if data.startswith(RUN_HEADERS) else None


def _first_queue(data: bytes) -> bytes | None:
    """The content of the queue packet right after the message header, if that is one."""
    length = _length_at(data, MESSAGE_HEADER_BYTES, _QUEUE_FIXED)
    if length < 0:
        return None
    start = MESSAGE_HEADER_BYTES + PACKET_HEADER_BYTES
    return data[start : start + length]


def like_sends(data: bytes, first: int, after: int, max_content_bytes: int) -> tuple[int, int]:
    """The 001s right after the canonical one at `data[first:after]` that differ from it only
    in their content: (how many, where the last ends). Reads packet headers, never contents;
    stops at the first message that is not like it (or not whole, or over the size limit),
    which the decoder then reads as usual."""
    head_end = first + MESSAGE_HEADER_BYTES
    queue_length = _length_at(data, head_end, _QUEUE_FIXED)
    if queue_length < 0:
        return 0, after
    head_end += PACKET_HEADER_BYTES + queue_length
    first_content = _length_at(data, head_end, _CONTENT_FIXED)
    if first_content < 0:
        return 0, after
    #: The header and queue packet each like message starts with, and the TTL packet (with its
    #: value) the README form ends with.
    tail_start = head_end + PACKET_HEADER_BYTES + first_content
    if tail_start > after:
        return 0, after
    head = data[first:head_end]
    tail = data[tail_start:after]
    if tail and _length_at(tail, 0, _TTL_FIXED) != len(tail) - PACKET_HEADER_BYTES:
        return 0, after
    content_at = len(head)
    end = len(data)
    count = 0
    pos = after
    while data.startswith(head, pos):
        length = _length_at(data, pos + content_at, _CONTENT_FIXED)
        if length < 0 or length > max_content_bytes:
            break
        # Messages of one length share every byte up to their content: one comparison each.
        same = data[pos : pos + content_at + PACKET_HEADER_BYTES]
        size = len(same) + length + len(tail)
        tail_at = size - len(tail)
        while (
            pos + size <= end
            and data.startswith(same, pos)
            and (not tail or data.startswith(tail, pos + tail_at))
        ):
            pos += size
            count += 1
        if data.startswith(same, pos):
            break  # not whole, or another TTL: not like (another length goes round again)
    return count, pos


#: The message headers `sends_and_acks` reads -> their packet counts: 001 and 004, whose first
#: packet (in table order) is the queue.
_QUEUE_FIRST: dict[bytes, int] = {
    message_header(kind, count): count
    for kind in (MessageType.SEND, MessageType.ACK)
    for count in SPECS[kind].counts
}
_PACKET_MARKER = b"P"
#: Packet headers `sends_and_acks` has read -> their lengths (most frames repeat a few): bounded,
#: past it lengths are read each time.
MAX_REMEMBERED_LENGTHS = 4096
_remembered_lengths: dict[bytes, int] = {}


def _any_length_at(data: bytes, pos: int) -> int:
    """The length in the packet header at `pos`, whatever its type, or -1 if it is not one
    of the fast path's (or the input ends inside it); remembered while there is room."""
    header = data[pos : pos + PACKET_HEADER_BYTES]
    if not header.startswith(_PACKET_MARKER) or not header.startswith(_ZEROS, 3):
        return -1
    digits = header[_FIXED_BYTES:]
    if len(digits) != _LENGTH_DIGITS or not digits.isdigit():
        return -1
    length = int(digits)
    if len(_remembered_lengths) < MAX_REMEMBERED_LENGTHS:
        _remembered_lengths[header] = length
    return length


def leading_queue(data: bytes) -> bytes | None:
    """The queue name of the 001 or 004 that `data` starts with (its first packet's content),
    or None when it starts with anything else."""
    return _first_queue(data) if data[:MESSAGE_HEADER_BYTES] in _QUEUE_FIRST else None


#: Distinct queues a frame read by `sends_and_acks` may name; past it the decoder reads it.
MAX_FRAME_QUEUES = 64
#: A message header and the queue packet's header that follows it.
_START_BYTES = MESSAGE_HEADER_BYTES + PACKET_HEADER_BYTES
#: The starts of 001s and 004s `sends_and_acks` has read -> (packets, queue name length):
#: bounded like `_remembered_lengths`.
_remembered_starts: dict[bytes, tuple[int, int]] = {}


def sends_and_acks(data: bytes) -> tuple[int, list[bytes]]:
    """(how many messages, the distinct queue names they name) when `data` is made only of
    whole 001s and 004s, read by their headers; (0, []) for anything else (the decoder then
    reads the frame). A message whose bytes up to its second packet's content, and after
    that content, are those of the message before it (a producer's batch, a consumer's acks
    of one queue) costs one or two comparisons. Packet types after the queue's and lengths
    past the limit are not checked here: the shard that decodes the frame does."""
    end = len(data)
    names: dict[bytes, None] = {}
    last_name = b""
    count = 0
    pos = 0
    #: The message before: its bytes up to its second packet's content (`head`), the bytes
    #: after that content (`tail`, at `tail_at` from its start) and its size.
    head = tail = b""
    tail_at = size = 0
    remembered = _remembered_lengths
    while pos < end:
        if head:
            run_start = pos
            if tail:
                while data.startswith(head, pos) and data.startswith(tail, pos + tail_at):
                    pos += size
            else:
                while data.startswith(head, pos):
                    pos += size
            count += (pos - run_start) // size
            if pos >= end:
                break
        start = _remembered_starts.get(data[pos : pos + _START_BYTES]) or _read_start(data, pos)
        if start is None:
            return 0, []
        packets, length = start
        name_at = pos + _START_BYTES
        after = name_at + length
        name = data[name_at:after]
        if name != last_name:
            last_name = name
            if name not in names:
                if len(names) == MAX_FRAME_QUEUES:
                    return 0, []
                names[name] = None
        length = remembered.get(data[after : after + PACKET_HEADER_BYTES], -1)
        if length < 0:
            length = _any_length_at(data, after)
            if length < 0:
                return 0, []
        content_at = after + PACKET_HEADER_BYTES
        content_end = content_at + length
        message_end = content_end
        if packets > 2:
            message_end = _past_packets(data, content_end, packets - 2)
            if message_end < 0:
                return 0, []
        head = data[pos:content_at]
        tail = data[content_end:message_end]
        tail_at = content_end - pos
        size = message_end - pos
        pos = message_end
        count += 1
    return (count, list(names)) if pos == end else (0, [])


def _read_start(data: bytes, pos: int) -> tuple[int, int] | None:
    """(packets, queue name length) of the 001 or 004 of two packets or more at `pos`, by its
    message header and queue packet header; remembered while there is room."""
    packets = _QUEUE_FIRST.get(data[pos : pos + MESSAGE_HEADER_BYTES], 0)
    length = _length_at(data, pos + MESSAGE_HEADER_BYTES, _QUEUE_FIXED)
    if packets < 2 or length < 0:
        return None
    if len(_remembered_starts) < MAX_REMEMBERED_LENGTHS:
        _remembered_starts[data[pos : pos + _START_BYTES]] = (packets, length)
    return packets, length


def _past_packets(data: bytes, pos: int, packets: int) -> int:
    """Where the `packets` packets at `pos` end, by their headers; -1 if one is not of the
    fast path's forms."""
    for _ in range(packets):
        length = _remembered_lengths.get(data[pos : pos + PACKET_HEADER_BYTES], -1)
        if length < 0:
            length = _any_length_at(data, pos)
            if length < 0:
                return -1
        pos += PACKET_HEADER_BYTES + length
    return pos


def ack_run(data: bytes) -> tuple[bytes, list[bytes]] | None:
    """(the queue name's bytes, the IDs) when `data` is made only of whole 004s that name one
    queue, with IDs of one length: a consumer's acks of a turn, as the clients send them.
    Read by their headers, one comparison a message; None for anything else (the decoder then
    reads the frame)."""
    if not data.startswith(ACK_RUN_HEADER):
        return None
    queue_length = _length_at(data, MESSAGE_HEADER_BYTES, _QUEUE_FIXED)
    if not 0 <= queue_length <= _RUN_MAX_QUEUE_BYTES:
        return None
    id_at = MESSAGE_HEADER_BYTES + PACKET_HEADER_BYTES + queue_length
    id_length = _length_at(data, id_at, _ID_FIXED)
    if not 0 <= id_length <= _RUN_MAX_ID_BYTES:
        return None
    head_length = id_at + PACKET_HEADER_BYTES
    stride = head_length + id_length
    end = len(data)
    if end % stride:
        return None
    head = data[:head_length]
    if not all(map(data.startswith, repeat(head), range(stride, end, stride))):
        return None
    queue = data[MESSAGE_HEADER_BYTES + PACKET_HEADER_BYTES : id_at]
    return queue, [data[at : at + id_length] for at in range(head_length, end, stride)]


class SendRun(NamedTuple):
    """A frame of plain sends to one queue, read by `send_run`."""

    #: The queue name's bytes.
    queue: bytes
    #: The TTL packet's content (the same in every send), b"" in the stock form.
    ttl: bytes
    contents: list[bytes]
    #: Each send's TAG packet's content (publisher confirms), None in the forms without.
    tags: list[bytes] | None
    #: Each send's KEY packet's content (valid UTF-8), None in the forms without.
    keys: list[bytes] | None
    #: Each send's HEADERS and MESSAGE_KEY packets' contents, None in the forms without.
    headers: list[bytes] | None
    message_keys: list[bytes] | None
    #: The bytes of each send besides its content, its tag's digits, its key, headers and
    #: message key.
    overhead: int

    def offset_of(self, index: int) -> int:
        """Where send `index` starts in the frame."""
        varying = sum(map(len, self.contents[:index]))
        for parts in (self.tags, self.keys, self.headers, self.message_keys):
            if parts is not None:
                varying += sum(map(len, parts[:index]))
        return self.overhead * index + varying


def send_run(data: bytes, max_content_bytes: int) -> SendRun | None:
    """The sends of `data` when it is made only of whole canonical 001s to one queue
    (SEND_RUN_HEADERS: the stock form, the README's with one TTL for all, and that one with a
    TAG each, as `send_many` packs confirmed sends, a KEY each too, and HEADERS and a
    MESSAGE_KEY each too): a producer's frame. Read by their headers; None for anything else
    (the decoder then reads the frame, and refuses what it refuses)."""
    form = SEND_RUN_HEADERS.get(data[:MESSAGE_HEADER_BYTES])
    if form is None:
        return None
    queue_length = _length_at(data, MESSAGE_HEADER_BYTES, _QUEUE_FIXED)
    if not 0 <= queue_length <= _RUN_MAX_QUEUE_BYTES:
        return None
    head_length = MESSAGE_HEADER_BYTES + PACKET_HEADER_BYTES + queue_length
    head = data[:head_length]
    with_ttl, tagged, keyed, extras = form > 2, form > 3, form > 4, form > 5
    tail = b""
    contents: list[bytes] = []
    tags: list[bytes] | None = [] if tagged else None
    keys: list[bytes] | None = [] if keyed else None
    headers: list[bytes] | None = [] if extras else None
    message_keys: list[bytes] | None = [] if extras else None
    message_key_limit = max(max_content_bytes, MIN_CONTROL_PACKET_BYTES)
    lengths = _content_lengths
    key_lengths, headers_lengths = _key_lengths, _headers_lengths
    message_key_lengths = _message_key_lengths
    end = len(data)
    pos = 0
    while pos < end:
        if not data.startswith(head, pos):
            return None
        start = pos + head_length + PACKET_HEADER_BYTES
        header = data[start - PACKET_HEADER_BYTES : start]
        length = lengths[header]
        if length < 0:
            return None
        pos = start + length
        if length > max_content_bytes or pos > end:
            return None
        contents.append(data[start:pos])
        if with_ttl:
            if not tail:
                tail = _number_packet_at(data, pos, _TTL_FIXED)
                if not tail:
                    return None
            elif not data.startswith(tail, pos):
                return None
            pos += len(tail)
        if tags is not None:
            start = pos + PACKET_HEADER_BYTES
            length = _tag_lengths[data[pos:start]]
            if not 1 <= length <= MAX_INTEGER_DIGITS:
                return None  # (what the decoder takes as a number: 1-18 digits)
            pos = start + length
            tag = data[start:pos]
            if len(tag) != length or not tag.isdigit():
                return None
            tags.append(tag)
        # The packets after the tag are read inline: a call each was a third of a keyed
        # send's reading.
        if keys is not None:
            start = pos + PACKET_HEADER_BYTES
            length = key_lengths[data[pos:start]]
            pos = start + length
            if not 0 <= length <= _RUN_MAX_KEY_BYTES or pos > end:
                return None
            keys.append(data[start:pos])
        if headers is not None and message_keys is not None:
            start = pos + PACKET_HEADER_BYTES
            length = headers_lengths[data[pos:start]]
            pos = start + length
            if not 0 <= length <= max_content_bytes or pos > end:
                return None
            headers.append(data[start:pos])
            start = pos + PACKET_HEADER_BYTES
            length = message_key_lengths[data[pos:start]]
            pos = start + length
            if not 0 <= length <= message_key_limit or pos > end:
                return None
            message_keys.append(data[start:pos])
    if pos != end or (keys and not _all_utf8(keys)):
        return None
    queue = data[head_length - queue_length : head_length]
    packets = 1 + tagged + keyed + 2 * extras
    overhead = head_length + PACKET_HEADER_BYTES * packets + len(tail)
    return SendRun(
        queue, tail[PACKET_HEADER_BYTES:], contents, tags, keys, headers, message_keys, overhead
    )


class _Lengths(dict[bytes, int]):
    """Packet headers of one type -> their lengths, as read once (most repeat: keys and
    headers of a few sizes); bounded as the others. -1: not a header of this type."""

    __slots__ = ("fixed",)

    def __init__(self, fixed: bytes) -> None:
        super().__init__()
        self.fixed = fixed

    def __missing__(self, header: bytes) -> int:
        length = _length_at(header, 0, self.fixed)
        if length >= 0 and len(self) < MAX_REMEMBERED_LENGTHS:
            self[header] = length
        return length


#: The packet headers `send_run` has read, per type.
_content_lengths = _Lengths(_CONTENT_FIXED)
_tag_lengths = _Lengths(_TAG_FIXED)
_key_lengths = _Lengths(_KEY_FIXED)
_headers_lengths = _Lengths(_HEADERS_FIXED)
_message_key_lengths = _Lengths(_MESSAGE_KEY_FIXED)


def _all_utf8(parts: list[bytes]) -> bool:
    """Whether every one of `parts` is valid UTF-8 (as the decoder wants a key): joined by
    NULs, which end any character, they are valid together when each is."""
    try:
        b"\x00".join(parts).decode()
    except UnicodeDecodeError:
        return False
    return True


def _number_packet_at(data: bytes, pos: int, fixed: bytes) -> bytes:
    """The whole packet of `fixed`'s type at `pos` when its value is a number the decoder
    takes (1-18 digits), else b""."""
    length = _length_at(data, pos, fixed)
    if not 1 <= length <= MAX_INTEGER_DIGITS:
        return b""
    packet = data[pos : pos + PACKET_HEADER_BYTES + length]
    digits = packet[PACKET_HEADER_BYTES:]
    return packet if len(digits) == length and digits.isdigit() else b""


#: The header of the CONFIRM `confirm_run` reads: (MESSAGE_ID, TAG).
CONFIRM_RUN_HEADER = message_header(MessageType.CONFIRM, 2)


def confirm_run(data: bytes) -> tuple[list[bytes], list[int]] | None:
    """(the IDs, the tags) when `data` is made only of whole CONFIRMs of tagged sends, IDs
    of one length: the broker's answers to a confirmed `send_many`, as a client receives
    them. Read by their headers; None for anything else (the decoder then reads the frame)."""
    if not data.startswith(CONFIRM_RUN_HEADER):
        return None
    id_length = _length_at(data, MESSAGE_HEADER_BYTES, _ID_FIXED)
    if not 0 <= id_length <= _RUN_MAX_ID_BYTES:
        return None
    head_length = MESSAGE_HEADER_BYTES + PACKET_HEADER_BYTES
    head = data[:head_length]
    ids: list[bytes] = []
    tags: list[int] = []
    tag_lengths = _tag_lengths
    end = len(data)
    pos = 0
    while pos < end:  # (the tag packet read inline: two calls a confirm were a third of it)
        if not data.startswith(head, pos):
            return None
        start = pos + head_length
        pos = start + id_length
        tag_start = pos + PACKET_HEADER_BYTES
        length = tag_lengths[data[pos:tag_start]]
        tag_end = tag_start + length
        if not 1 <= length <= MAX_INTEGER_DIGITS or tag_end > end:
            return None
        digits = data[tag_start:tag_end]
        if not digits.isdigit():
            return None
        ids.append(data[start:pos])
        tags.append(int(digits))
        pos = tag_end
    return ids, tags
