"""What a message ID says: the broker's IDs are time-ordered (docs/protocol.md §10), so the
time a message was taken in (its sent_at) is read from its ID, and never stored apart."""

from __future__ import annotations

#: Hex digits of wall-clock milliseconds at the head of an ID, then the version digit.
_TIME_DIGITS = 12
_VERSION = ord("7")
#: IDs claiming a time outside these bounds (ms since the epoch: 2020 to 2200) are not
#: time-ordered ones: an older broker's random IDs, or a client's own.
_EARLIEST_MS = 1_577_836_800_000
_LATEST_MS = 7_258_118_400_000


def sent_at(message_id: bytes | str) -> float | None:
    """Wall-clock seconds when the broker took the message in, or None for an ID that does
    not carry a time (32 hex characters with `7` as the 13th)."""
    raw = message_id.encode() if isinstance(message_id, str) else message_id
    if len(raw) != 32 or raw[_TIME_DIGITS] != _VERSION:
        return None
    try:
        milliseconds = int(raw[:_TIME_DIGITS], 16)
    except ValueError:
        return None
    if not _EARLIEST_MS <= milliseconds < _LATEST_MS:
        return None
    return milliseconds / 1000
