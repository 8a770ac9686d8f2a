"""Idempotent producers: the window of recent producer keys per queue.

A send carrying a key (packet 14) that was already accepted on the same queue within the
window is confirmed with the first message's ID instead of being queued again, so a producer
that retries after a lost confirm (a broker crash, a timeout) does not duplicate. Keys are
journaled with the message in durable mode, so the window survives a restart.

Keys expire in the order they were added (the window is the same for all), so a deque in
insertion order is the whole expiry order: expiring is popping from its left end, and the
core's schedule needs one entry, for the oldest key.
"""

from __future__ import annotations

from collections import deque


class KeyWindow:
    """(queue, key) -> message ID for keys younger than `window_ns`, at most `max_keys`."""

    def __init__(self, window_ns: int, max_keys: int) -> None:
        self.window_ns = window_ns
        self.max_keys = max_keys
        self._ids: dict[tuple[str, str], tuple[bytes, int]] = {}
        #: (expires_at, (queue, key)) in the order the keys were added.
        self._order: deque[tuple[int, tuple[str, str]]] = deque()
        #: Keys dropped before their time because the window was full.
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, queue: str, key: str, now: int) -> bytes | None:
        """The ID the key was first accepted with, if its window is not over at `now`."""
        found = self._ids.get((queue, key))
        if found is None or found[1] <= now:
            return None
        return found[0]

    def add(self, queue: str, key: str, message_id: bytes, expires_at: int) -> None:
        entry = (queue, key)
        self._ids[entry] = (message_id, expires_at)
        self._order.append((expires_at, entry))
        while len(self._ids) > self.max_keys:
            self.evicted += self._drop_oldest()

    def expire(self, now: int) -> int:
        """Forget keys whose window is over; returns how many."""
        order = self._order
        expired = 0
        while order and order[0][0] <= now:
            self._drop_oldest()
            expired += 1
        return expired

    def next_expiry(self) -> int | None:
        return self._order[0][0] if self._order else None

    def _drop_oldest(self) -> bool:
        """Forget the oldest key; False if it was re-added since (its newer entry stays)."""
        expires_at, entry = self._order.popleft()
        found = self._ids.get(entry)
        if found is None or found[1] != expires_at:
            return False
        del self._ids[entry]
        return True
