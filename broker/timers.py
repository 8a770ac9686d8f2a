"""Deadlines the core acts on by itself: peer expiry, heartbeats to send, message leases.

One heap for all of them, driven by the core's injected clock. Entries are never removed
when they become moot (a peer spoke again, a message was acked): the handler checks, when the
entry comes due, whether it still applies. So arming a timer is one heap push, and cancelling
costs nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

#: Timer kinds.
PEER_EXPIRY = 0  # target: the Peer; silent past its expiry (or, without heartbeats, idle)?
HEARTBEAT = 1  # target: the Peer; has the broker been silent towards it for an interval?
LEASE = 2  # target: the Window; has its earliest lease run out?
DELAY_OVER = 3  # target: (Queue, Record); a delayed requeue goes back into its queue


class Timers:
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, Any]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def arm(self, when_ns: int, kind: int, target: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when_ns, self._seq, kind, target))

    def next_deadline(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def due(self, now_ns: int) -> Iterator[tuple[int, int, Any]]:
        """Pop and yield (when, kind, target) for every entry due at `now_ns`, including
        entries armed while iterating that are already due."""
        heap = self._heap
        while heap and heap[0][0] <= now_ns:
            when, _, kind, target = heapq.heappop(heap)
            yield when, kind, target
