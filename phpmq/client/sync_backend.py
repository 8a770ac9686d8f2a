"""What the blocking client does its own way, for the modules written once (tools/unasync.py);
aio_backend.py is the asyncio twin."""

from __future__ import annotations

import contextlib
from typing import Any

import zmq

#: How long one wait for the broker blocks at most before looking again: the waiting thread
#: lets go of the socket this often, so the heartbeat thread keeps its turn.
WAIT_SLICE_S = 0.05


def news_from_any(routing: Any, clients: list[Any], wait: float | None) -> None:
    """Wait up to `wait` seconds (None: no limit; at most WAIT_SLICE_S at a time) for a frame
    on any of the `clients`' sockets, read what came, and do each one's liveness duties;
    every client's lock is held meanwhile."""
    seconds = WAIT_SLICE_S if wait is None else max(0.0, min(wait, WAIT_SLICE_S))
    with contextlib.ExitStack() as locks:
        for client in clients:
            locks.enter_context(client._lock)
        poller = zmq.Poller()
        for client in clients:
            poller.register(client._dealer.socket, zmq.POLLIN)
        timeout_ms = int(seconds * 1000) or (1 if seconds > 0 else 0)
        ready = dict(poller.poll(timeout_ms))
        for client in clients:
            if client.closed:
                continue
            if client._dealer.socket in ready:
                client._read_available()
            client._tick()
