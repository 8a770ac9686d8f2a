"""What the asyncio client does its own way, for the modules written once (tools/unasync.py);
sync_backend.py is the blocking twin."""

from __future__ import annotations

import asyncio
from typing import Any


class NoLock:
    """`AsyncClient._lock`: locks nothing. The blocking client's lock keeps its threads from
    interleaving on the socket; the asyncio client's tasks may run many calls at once, and a
    lock held while one of them waits for the broker would queue all the others."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc_info: object) -> None:
        return None


async def news_from_any(routing: Any, clients: list[Any], wait: float | None) -> None:
    """Wait up to `wait` seconds (None: no limit) for news from any of the `clients`, each
    link's reader started: its news wakes `routing` too. With no time left, one turn of the
    loop, so that the readers take what is there."""
    for client in clients:
        client._start()
    if wait is not None and wait <= 0:
        await asyncio.sleep(0)
    else:
        await routing._news_within(wait)
