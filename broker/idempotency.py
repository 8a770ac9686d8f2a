"""Idempotent producers: the window of recent producer keys per queue.

A send carrying a key (packet 14) that was already accepted on the same queue within the
window is confirmed with the first message's ID instead of being queued again, so a producer
that retries after a lost confirm (a broker crash, a timeout) does not duplicate. Keys are
journaled with the message in durable mode, so the window survives a restart.

Keys expire in the order they were added (the window is the same for all), so the order they
were added in is the whole expiry order: expiring is popping from the left of a deque of the
keys. The keys added with one expiry time (all those of a turn: the core's `now` is the
turn's) share one entry of a second deque, (expires_at, how many), so a key costs its entry
in the map, a pointer in the order and no object of its own, and the core's schedule needs one
entry, for the oldest batch.

A key is one string, its scope and itself joined by NUL (`entry`), not a (scope, key) tuple:
with a few hundred thousand keys the map's lookups miss the CPU's caches, and one object per
key instead of three (a tuple, its two strings) is what they miss on (issue #31).
"""

from __future__ import annotations

from collections import deque

#: Joins a key's scope (a queue name, or `event NAME`) and the key: no valid scope holds it.
SEPARATOR = "\x00"


def entry(scope: str, key: str) -> str:
    """The one string a (scope, key) is known by in the window and in key holds."""
    return scope + SEPARATOR + key


def split_entry(joined: str) -> tuple[str, str]:
    """(scope, key) of an `entry`."""
    scope, _, key = joined.partition(SEPARATOR)
    return scope, key


class KeyWindow:
    """`entry(queue, key)` -> message ID for keys younger than `window_ns`, at most
    `max_keys`."""

    __slots__ = (
        "_batches",
        "_due",
        "_ids",
        "_order",
        "_readded",
        "_tail",
        "evicted",
        "expired",
        "max_keys",
        "window_ns",
    )

    def __init__(self, window_ns: int, max_keys: int) -> None:
        self.window_ns = window_ns
        self.max_keys = max_keys
        self._ids: dict[str, bytes] = {}
        #: The keys in the order they were added (a re-added key is in it twice).
        self._order: deque[str] = deque()
        #: [expires_at, count] of each run of keys in `_order` added with one expiry time.
        self._batches: deque[list[int]] = deque()
        self._tail: list[int] = [-1, 0]
        #: When the oldest batch expires (no batch: never).
        self._due = _NEVER
        #: Keys added again while in the window: how many older places in `_order` each has,
        #: which forget nothing when they are popped.
        self._readded: dict[str, int] = {}
        #: Keys dropped before their time because the window was full.
        self.evicted = 0
        #: Keys whose window ended, since start.
        self.expired = 0

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, joined: str, now: int) -> bytes | None:
        """The ID the key `joined` (an `entry`) was first accepted with, if its window is not
        over at `now`."""
        if now >= self._due:
            self.expire(now)
        return self._ids.get(joined)

    def add(self, joined: str, message_id: bytes, expires_at: int) -> None:
        """Remember the key `joined` (an `entry`) until `expires_at`, which is never before
        the expiry of the keys added before it (a key added with an earlier one is kept as
        long as they are)."""
        ids = self._ids
        size = len(ids)
        ids[joined] = message_id
        if len(ids) == size:  # it was there already: its older place must not forget it
            self._readded[joined] = self._readded.get(joined, 0) + 1
        self._order.append(joined)
        tail = self._tail
        if expires_at > tail[0]:
            tail = self._tail = [expires_at, 0]
            if not self._batches:
                self._due = expires_at
            self._batches.append(tail)
        tail[1] += 1
        if size >= self.max_keys:
            while len(ids) > self.max_keys:
                self.evicted += self._drop_oldest()

    def expire(self, now: int) -> int:
        """Forget keys whose window is over; returns how many."""
        batches = self._batches
        expired = 0
        while batches and batches[0][0] <= now:
            for _ in range(batches[0][1]):
                expired += self._drop_oldest()
        self.expired += expired
        return expired

    def next_expiry(self) -> int | None:
        return self._batches[0][0] if self._batches else None

    def _drop_oldest(self) -> bool:
        """Forget the oldest key; False if it was added again since (its newer place stays)."""
        joined = self._order.popleft()
        batches = self._batches
        oldest = batches[0]
        oldest[1] -= 1
        if not oldest[1]:
            batches.popleft()
            if batches:
                self._due = batches[0][0]
            else:
                self._due, self._tail = _NEVER, [-1, 0]
        readded = self._readded
        if readded and joined in readded:
            left = readded.pop(joined) - 1
            if left:
                readded[joined] = left
            return False
        del self._ids[joined]
        return True


#: Later than any monotonic time.
_NEVER = 1 << 63
