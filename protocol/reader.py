"""Bytes -> messages. Strict: anything that is not exactly a PHPMQ v01 message is refused
with a RemoteProtocolError naming what is wrong, and nothing else ever escapes.

The hot path is one dict look-up per header: the whole 8-byte message header, then each
32-byte packet header, whose length is remembered once read (`_HeaderEntry.canonical`). A
frame's messages are read in one loop, without a call per message. The slow path runs only to
explain a refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .constants import (
    DEFAULT_MAX_CONTENT_BYTES,
    MESSAGE_HEADER_BYTES,
    MESSAGE_MARKER,
    MIN_CONTROL_PACKET_BYTES,
    PACKET_HEADER_BYTES,
    PACKET_MARKER,
    PROTOCOL_VERSION,
    ErrorCode,
    MessageType,
    PacketType,
)
from .errors import ProtocolError, RemoteProtocolError, TruncatedError
from .messages import Message
from .table import DECODE_VALUE, SPECS, TypeSpec

#: (Struct field, how to read the bytes, whether the packet is content: limited by the content
#: limit alone, where other packets may be MIN_CONTROL_PACKET_BYTES long whatever it is).
_PacketEntry = tuple[str, Callable[[bytes], Any] | None, bool]
#: A packet at its place in table order: (its header's first 23 bytes, how to read the bytes,
#: whether it is content, the lengths of the whole 32-byte headers seen there).
_CanonicalPacket = tuple[bytes, Callable[[bytes], Any] | None, bool, dict[bytes, int]]
#: A message's packets in table order, None for an optional one it skips (its field is None).
_Form = tuple[_CanonicalPacket | None, ...]
#: The packets that carry what producers send, as opposed to control packets.
CONTENT_PACKETS = frozenset((PacketType.CONTENT, PacketType.HEADERS))
#: The fast path reads lengths below 10**9 (1 GB): the first 20 of the 29 digits are zeros.
_FAST_LENGTH_DIGITS = 9
_ZEROS = b"0" * (PACKET_HEADER_BYTES - 3 - _FAST_LENGTH_DIGITS)
_FAST_PREFIX_BYTES = PACKET_HEADER_BYTES - _FAST_LENGTH_DIGITS
#: Packet headers whose length is remembered, over all places: bounds the memory a peer that
#: sends every length it can think of costs (about 100 bytes each); past it, lengths are read.
MAX_REMEMBERED_HEADERS = 16_384


class _HeaderEntry:
    __slots__ = ("canonical", "cls", "count", "last_form", "ordered", "packets", "required", "spec")

    def __init__(self, spec: TypeSpec, count: int) -> None:
        self.spec = spec
        self.cls = spec.cls
        self.count = count
        self.packets: dict[bytes, _PacketEntry] = {
            b"P%02d" % packet: (field, DECODE_VALUE[packet], packet in CONTENT_PACKETS)
            for packet, field in spec.fields
        }
        self.required = tuple(field for _, field in spec.fields[: len(spec.required)])
        #: The first `count` packets in table order, which is also the Struct's field order:
        #: a message written that way decodes positionally, without a dict. Each is keyed by
        #: its header's first 23 bytes (`P`, type, 20 zeros), so one `startswith` checks the
        #: marker and type and leaves 9 digits to parse; longer contents take the general path.
        #: A header read there is remembered with its length: the next one like it is a single
        #: dict look-up (most frames repeat a few queue names, ID and content lengths).
        every: tuple[_CanonicalPacket, ...] = tuple(
            (b"P%02d%s" % (packet, _ZEROS), DECODE_VALUE[packet], packet in CONTENT_PACKETS, {})
            for packet, _ in spec.fields
        )
        self.canonical = every[:count]
        #: Every packet in table order, for a message that skips some optional ones (a send
        #: with a key and a message key but no request packets): None where the Struct's
        #: fields are not in table order, with None for each absent one.
        self.ordered = every if _fields_in_table_order(spec) else None
        #: The form the last message with this header had: its packets in table order, None
        #: for each one it skipped (`_Form`). `decode_frame` tries it first, so a run of keyed
        #: sends, which skip the request packets, is read as fast as plain ones.
        self.last_form: _Form = self.canonical


def _fields_in_table_order(spec: TypeSpec) -> bool:
    """The Struct's fields are the table's packets, in order, optional ones defaulting to
    None: a message can be built from values in table order with None for absent packets."""
    names = [field for _, field in spec.fields]
    struct_fields = spec.cls.__struct_fields__
    defaults = spec.cls.__struct_defaults__
    optional = struct_fields[len(struct_fields) - len(defaults) :]
    return list(struct_fields[: len(names)]) == names and all(
        default is None for name, default in zip(optional, defaults, strict=True) if name in names
    )


#: How many packet headers `_HeaderEntry.canonical` remembers, over all entries.
_remembered = 0
#: Every valid 8-byte message header -> how to read the packets that follow.
_HEADERS: dict[bytes, _HeaderEntry] = {
    b"H%02d%03d%02d" % (PROTOCOL_VERSION, spec.type, count): _HeaderEntry(spec, count)
    for spec in SPECS.values()
    for count in spec.counts
}


def decode_message(
    data: bytes, pos: int = 0, max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES
) -> tuple[Message, int]:
    """Decode the message that starts at `data[pos]`.

    Returns:
        The message and the offset just past it.
    Raises:
        TruncatedError: `data` ends inside the message (`needed` says how much it wants).
        RemoteProtocolError: the bytes are not a valid message.
    """
    entry = _HEADERS.get(data[pos : pos + MESSAGE_HEADER_BYTES])
    if entry is None:
        _explain_bad_header(data[pos : pos + MESSAGE_HEADER_BYTES])
    # Fast path: packets in table order. Anything unusual falls through to the general path,
    # which also produces the precise error.
    values: list[Any] = []
    p = _read_canonical(
        data, pos + MESSAGE_HEADER_BYTES, entry.canonical, values, max_content_bytes
    )
    if p >= 0:
        entry.last_form = entry.canonical
        return entry.cls(*values), p
    p = -p
    ordered = entry.ordered
    if ordered is not None and len(values) >= len(entry.required):
        skipping = _decode_skipping(data, p, ordered, values, entry.count, max_content_bytes)
        if skipping is not None:
            entry.last_form = tuple(
                None if value is None else packet
                for packet, value in zip(ordered, values, strict=False)
            )
            return entry.cls(*values), skipping
    try:
        return _decode_any_order(data, pos, entry, max_content_bytes)
    except ProtocolError as exc:
        exc.message_type = entry.spec.type  # the refusal can say what it refuses (413 a send)
        raise


def _read_canonical(
    data: bytes,
    p: int,
    canonical: tuple[_CanonicalPacket, ...],
    values: list[Any],
    max_content_bytes: int,
) -> int:
    """Append to `values` the packets from `p` on while they are in table order; returns where
    they end once all are read, or minus where the first one that is not starts."""
    global _remembered
    end_of_data = len(data)
    for prefix, convert, content, lengths in canonical:
        start = p + PACKET_HEADER_BYTES
        length = lengths.get(data[p:start])
        if length is None:
            if start > end_of_data or not data.startswith(prefix, p):
                return -p  # the input ends inside the header, or it is not this packet's
            digits = data[p + _FAST_PREFIX_BYTES : start]
            if not digits.isdigit():
                return -p
            length = int(digits)
            if _remembered < MAX_REMEMBERED_HEADERS:
                lengths[data[p:start]] = length
                _remembered += 1
        if length > max_content_bytes and (content or length > MIN_CONTROL_PACKET_BYTES):
            return -p
        if start + length > end_of_data:
            return -p
        p = start + length
        raw = data[start:p]
        values.append(raw if convert is None else convert(raw))
    return p


def _decode_skipping(
    data: bytes,
    p: int,
    ordered: tuple[_CanonicalPacket, ...],
    values: list[Any],
    count: int,
    max_content_bytes: int,
) -> int | None:
    """The fast path's second chance, for packets in table order that skip optional ones:
    appends to `values` (None for each skipped packet) the packets from `p` on, until `count`
    are read; returns where the message ends, or None for anything else (the general path
    then reads it, and explains a fault). Lengths read are remembered, as the fast path's."""
    global _remembered
    read = len(values)
    end_of_data = len(data)
    for prefix, convert, content, lengths in ordered[len(values) :]:
        if read == count:
            return p
        if not data.startswith(prefix, p):
            values.append(None)
            continue
        start = p + PACKET_HEADER_BYTES
        if start > end_of_data:
            return None
        digits = data[p + _FAST_PREFIX_BYTES : start]
        if not digits.isdigit():
            return None
        length = int(digits)
        if _remembered < MAX_REMEMBERED_HEADERS:
            lengths[data[p:start]] = length
            _remembered += 1
        if length > max_content_bytes and (content or length > MIN_CONTROL_PACKET_BYTES):
            return None
        p = start + length
        if p > end_of_data:
            return None
        raw = data[start:p]
        values.append(raw if convert is None else convert(raw))
        read += 1
    return p if read == count else None


def _decode_any_order(
    data: bytes, pos: int, entry: _HeaderEntry, max_content_bytes: int
) -> tuple[Message, int]:
    end_of_data = len(data)
    p = pos + MESSAGE_HEADER_BYTES
    values: dict[str, Any] = {}
    packets = entry.packets
    for _ in range(entry.count):
        packet_header = data[p : p + PACKET_HEADER_BYTES]
        if len(packet_header) < PACKET_HEADER_BYTES:
            _check_partial_packet_header(packet_header)
            raise TruncatedError("input ends inside a packet header", p + PACKET_HEADER_BYTES - pos)
        packet = packets.get(packet_header[:3])
        if packet is None:
            _explain_bad_packet(packet_header, entry.spec)
        length_digits = packet_header[3:]
        if not length_digits.isdigit():
            raise RemoteProtocolError("packet length must be 29 ASCII digits")
        length = int(length_digits)
        field, convert, content = packet
        if length > max_content_bytes:
            _check_size(length, max_content_bytes, content, field)
        start = p + PACKET_HEADER_BYTES
        p = start + length
        if p > end_of_data:
            raise TruncatedError("input ends inside a packet's content", p - pos)
        if field in values:
            raise RemoteProtocolError(f"duplicate packet {packet_header[:3].decode()}")
        raw = data[start:p]
        values[field] = raw if convert is None else convert(raw)
    for field in entry.required:
        if field not in values:
            raise RemoteProtocolError(f"{entry.spec.type.name} message lacks its {field} packet")
    return entry.cls(**values), p


def control_packet_limit(max_content_bytes: int) -> int:
    """How long a packet that is not content may be under this content limit."""
    return max(max_content_bytes, MIN_CONTROL_PACKET_BYTES)


def _check_size(length: int, max_content_bytes: int, content: bool, field: str) -> None:
    """Raise 413 for a packet over its limit: content's, or the larger one of control
    packets."""
    if content:
        raise RemoteProtocolError(
            f"{field} packet of {length} bytes is over the limit of {max_content_bytes}",
            ErrorCode.TOO_LARGE,
        )
    limit = control_packet_limit(max_content_bytes)
    if length > limit:
        raise RemoteProtocolError(
            f"{field} packet of {length} bytes is over the limit of {limit} for packets that"
            " are not content",
            ErrorCode.TOO_LARGE,
        )


def decode_frame(
    data: bytes, max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES
) -> tuple[list[Message], ProtocolError | None]:
    """Decode a frame holding one or more concatenated messages.

    Returns:
        The messages decoded, and the error that stopped decoding (None if the whole frame was
        valid). Messages before a bad one are valid and returned; after it framing is lost, so
        the rest of the frame is not read. A frame that ends inside a message is an error.
    """
    messages: list[Message] = []
    pos = 0
    end = len(data)
    if end == 0:
        return messages, RemoteProtocolError("empty frame")
    headers = _HEADERS
    append = messages.append
    try:
        while pos < end:
            # decode_message's fast path for headers seen before, inline: a call per message
            # is a tenth of the time a message takes here.
            entry = headers.get(data[pos : pos + MESSAGE_HEADER_BYTES])
            if entry is not None:
                values: list[Any] = []
                p = pos + MESSAGE_HEADER_BYTES
                for packet in entry.last_form:
                    if packet is None:
                        values.append(None)
                        continue
                    _, convert, content, lengths = packet
                    start = p + PACKET_HEADER_BYTES
                    length = lengths.get(data[p:start])
                    if length is None or start + length > end:
                        break
                    if length > max_content_bytes and (
                        content or length > MIN_CONTROL_PACKET_BYTES
                    ):
                        break
                    p = start + length
                    raw = data[start:p]
                    values.append(raw if convert is None else convert(raw))
                else:
                    append(entry.cls(*values))
                    pos = p
                    continue
            message, pos = decode_message(data, pos, max_content_bytes)
            append(message)
    except TruncatedError as exc:
        error = RemoteProtocolError(f"truncated message: {exc.reason}")
        error.message_type = exc.message_type
        return messages, error
    except ProtocolError as exc:
        return messages, exc
    return messages, None


def _explain_bad_header(header: bytes) -> None:
    """Raise the error that says why `header` is not a valid message header."""
    if header and header[0] != MESSAGE_MARKER:
        raise RemoteProtocolError("message header must start with 'H'")
    digits = header[1:]
    if not (digits.isdigit() or (digits == b"")):
        raise RemoteProtocolError("message header must be 'H' followed by 7 ASCII digits")
    if len(header) < MESSAGE_HEADER_BYTES:
        raise TruncatedError("input ends inside a message header", MESSAGE_HEADER_BYTES)
    version, type_code, count = int(header[1:3]), int(header[3:6]), int(header[6:8])
    if version != PROTOCOL_VERSION:
        raise RemoteProtocolError(
            f"protocol version {version:02d} is not supported (only 01)",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    try:
        spec = SPECS[MessageType(type_code)]
    except (ValueError, KeyError):
        raise RemoteProtocolError(
            f"unknown message type {type_code:03d}", ErrorCode.UNSUPPORTED_TYPE
        ) from None
    counts = spec.counts
    raise RemoteProtocolError(
        f"message type {type_code:03d} carries {counts.start}"
        + (f"-{counts.stop - 1}" if len(counts) > 1 else "")
        + f" packets, header says {count}"
    )


def _check_partial_packet_header(partial: bytes) -> None:
    if partial and partial[0] != PACKET_MARKER:
        raise RemoteProtocolError("packet header must start with 'P'")


def _explain_bad_packet(packet_header: bytes, spec: TypeSpec) -> None:
    if packet_header[0] != PACKET_MARKER:
        raise RemoteProtocolError("packet header must start with 'P'")
    code = packet_header[1:3]
    if not code.isdigit():
        raise RemoteProtocolError("packet type must be 2 ASCII digits")
    raise RemoteProtocolError(
        f"packet type {code.decode()} is not allowed in a {spec.type.name} message"
    )
