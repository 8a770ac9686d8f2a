"""Admin answers that list many things (`stats`' queues, `leases`, `schedule-list`) come in
pages (docs/protocol.md §9): at most PAGE_ENTRIES entries and about PAGE_BYTES of JSON each
(one larger entry alone), from position `offset`, with `next_offset` to ask for the next
(None: this page is the last). So no answer grows with the broker: a `stats` of 10,000
queues is ten pages a client reads one by one, not one answer of megabytes built per request.

Entries are encoded one by one as they are listed (that is how a page knows its size) and
go into the answer as `msgspec.Raw`, not encoded a second time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from .errors import CommandError

#: Entries one page lists at most (and by default).
PAGE_ENTRIES = 1_000
#: JSON bytes of entries one page holds at most (and by default); one larger entry is listed
#: alone.
PAGE_BYTES = 512 * 1024

_encode = msgspec.json.Encoder().encode


class PageRequest(NamedTuple):
    offset: int
    limit: int
    max_bytes: int


def page_request(options: dict[str, Any]) -> PageRequest:
    """The page a command asks for: `offset` (default 0), `limit` (entries, 0 to PAGE_ENTRIES,
    default PAGE_ENTRIES: 0 lists none, for the other figures alone), `max_bytes` (1 to
    PAGE_BYTES, default PAGE_BYTES).

    Raises:
        CommandError: (422) a value that is not such an integer.
    """
    offset = options.get("offset", 0)
    limit = options.get("limit", PAGE_ENTRIES)
    max_bytes = options.get("max_bytes", PAGE_BYTES)
    for key, value, low, high in (
        ("offset", offset, 0, None),
        ("limit", limit, 0, PAGE_ENTRIES),
        ("max_bytes", max_bytes, 1, PAGE_BYTES),
    ):
        if type(value) is not int or value < low or (high is not None and value > high):
            bound = f" from {low} to {high:,}" if high is not None else f" of at least {low}"
            raise CommandError(f"{key!r} must be an integer{bound}")
    return PageRequest(offset, limit, max_bytes)


def page(
    count: int, entry_at: Callable[[int], Any], request: PageRequest
) -> tuple[list[msgspec.Raw], int | None]:
    """The entries at positions `request.offset`... of `count` (`entry_at(i)` builds the one
    at i), within the page's limits; and the offset of the next page (None: no more)."""
    entries: list[msgspec.Raw] = []
    used = 0
    index = request.offset
    end = min(count, request.offset + request.limit)
    while index < end:
        raw = _encode(entry_at(index))
        if entries and used + len(raw) > request.max_bytes:
            break
        entries.append(msgspec.Raw(raw))
        used += len(raw)
        index += 1
    return entries, (index if index < count else None)
