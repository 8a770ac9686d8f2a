"""Reading messages without taking them (docs/protocol.md §9): the entries `queue-peek`,
`dlq-list` and `lease-read` answer with, and paging by position.

Entries are msgspec Structs, encoded straight into the ADMIN_REPLY's JSON (content as
base64) without a dict per message. A page is one OPTIONS packet: it stops at the caller's
`max_bytes` or half the broker's packet limit, whichever is less, but never before its first
entry, so a message of any size can be read.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

from ..protocol import sent_at
from ..protocol.constants import INTEGER_LIMIT, MAX_INTEGER_DIGITS
from .config import BrokerConfig
from .errors import CommandError
from .model import READY, DeadLetterEntry, Queue, Record, record_bytes

DEFAULT_PEEK_LIMIT = 10
DEFAULT_DEAD_LIMIT = 100
#: JSON keys, ID, numbers and punctuation of one entry, rounded up.
ENTRY_OVERHEAD_BYTES = 200


class Entry(msgspec.Struct):
    """One message as a reader sees it."""

    id: str
    content: bytes
    ttl: int
    deliveries: int
    sent_at: float | None
    #: The producer's HEADERS packet as text ("" without one): a JSON object by contract.
    headers: str
    key: bytes | None


class DeadEntry(Entry):
    reason: str
    dead_at: float


def entry_of_record(record: Record, now: int, deliveries: int) -> Entry:
    message_id = record.id
    return Entry(
        message_id.decode(errors="replace"),
        record.content,
        record.remaining_ttl(now),
        deliveries,
        sent_at(message_id),
        record.headers.decode(errors="replace"),
        record.message_key or None,
    )


def dead_entry(entry: DeadLetterEntry) -> DeadEntry:
    return DeadEntry(
        entry.id.decode(errors="replace"),
        entry.content,
        0,
        entry.deliveries,
        sent_at(entry.id),
        entry.headers.decode(errors="replace"),
        entry.message_key or None,
        entry.reason,
        entry.dead_at,
    )


def oldest_sent_at(queue: Queue) -> float | None:
    """When the queue's oldest ready message came in (None: none ready, or no time in its
    ID). Tombstones at the head are few: dispatch and leases pop them."""
    for record in queue.ready:
        if record.state == READY:
            return sent_at(record.id)
    return None


def page_budget(config: BrokerConfig, options: dict[str, Any]) -> int:
    """Bytes of content a page may hold: the caller's `max_bytes`, within one packet."""
    ceiling = config.max_content_bytes // 2 * 3 // 4  # base64 makes 4 bytes of 3
    value = options.get("max_bytes", ceiling)
    if type(value) is not int or value < 1:
        raise CommandError("'max_bytes' must be a positive integer")
    return min(value, ceiling)


def _window(options: dict[str, Any], default_limit: int) -> tuple[int, int | None, int]:
    offset = options.get("offset", 0)
    end = options.get("end")
    limit = options.get("limit", default_limit)
    for key, value in (("offset", offset), ("limit", limit), ("end", end)):
        if (value is not None or key != "end") and not _is_position(value):
            raise CommandError(
                f"{key!r} must be a non-negative integer of at most {MAX_INTEGER_DIGITS} digits"
            )
    return offset, end, limit


def _is_position(value: object) -> bool:
    """A place in a queue (itertools.islice takes none past sys.maxsize)."""
    return type(value) is int and 0 <= value < INTEGER_LIMIT


def peek(queue: Queue, config: BrokerConfig, now: int, options: dict[str, Any]) -> dict[str, Any]:
    """Ready messages from position `offset` (a place in the queue: removed messages not yet
    compacted away take places too, so a page may hold fewer than `limit`); `next_offset`
    continues, `positions` is where the queue ends now."""
    offset, end, limit = _window(options, DEFAULT_PEEK_LIMIT)
    budget = page_budget(config, options)
    entries: list[Entry] = []
    position = offset
    ready = queue.ready
    stop = len(ready) if end is None else min(end, len(ready))
    for record in itertools.islice(ready, offset, stop):
        if len(entries) >= limit:
            break
        if record.state == READY:
            size = record_bytes(record) + ENTRY_OVERHEAD_BYTES
            if entries and size > budget:
                break
            budget -= size
            entries.append(entry_of_record(record, now, record.deliveries - 1))
        position += 1
    return {
        "queue": queue.name,
        "ready": queue.ready_count,
        "positions": len(ready),
        "next_offset": position,
        "truncated": position < stop and len(entries) < limit,
        "entries": entries,
    }


def dead_letters(queue: Queue, config: BrokerConfig, options: dict[str, Any]) -> dict[str, Any]:
    """Dead letters from position `offset`, oldest first."""
    offset, end, limit = _window(options, DEFAULT_DEAD_LIMIT)
    budget = page_budget(config, options)
    dead = queue.dead
    stop = len(dead) if end is None else min(end, len(dead))
    entries: list[DeadEntry] = []
    for entry in itertools.islice(dead, offset, stop):
        if len(entries) >= limit:
            break
        size = len(entry.content) + len(entry.headers) + len(entry.reason) + ENTRY_OVERHEAD_BYTES
        if entries and size > budget:
            break
        budget -= size
        entries.append(dead_entry(entry))
    next_offset = offset + len(entries)
    return {
        "queue": queue.name,
        "total": len(dead),
        "dropped": queue.dead_dropped,
        "next_offset": next_offset,
        "truncated": next_offset < stop and len(entries) < limit,
        "entries": entries,
    }
