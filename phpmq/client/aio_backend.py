"""What the asyncio client does its own way, for the modules written once (tools/unasync.py);
sync_backend.py is the blocking twin."""

from __future__ import annotations


class NoLock:
    """`AsyncClient._lock`: locks nothing. The blocking client's lock keeps its threads from
    interleaving on the socket; the asyncio client's tasks may run many calls at once, and a
    lock held while one of them waits for the broker would queue all the others."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc_info: object) -> None:
        return None
