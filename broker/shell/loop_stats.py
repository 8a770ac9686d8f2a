"""What the server loop keeps about itself: the frames a peer's socket would not take yet, and
the loop's own figures for `stats` (under "server")."""

from __future__ import annotations

import time
from collections import deque

#: The "recent" longest turn covers the last one to two of these periods (seconds).
RECENT_TURN_PERIOD_S = 10.0


class Backlog:
    """Frames libzmq would not take yet for one peer, and their size."""

    __slots__ = ("bytes", "frames")

    def __init__(self, frame: bytes) -> None:
        self.frames = deque([frame])
        self.bytes = len(frame)


class LoopStats:
    """What the loop counts about itself, for `stats` (under "server")."""

    __slots__ = (
        "backlog_frames_dropped",
        "longest_turn_ms",
        "peers_unreadable",
        "period_longest_ms",
        "period_started",
        "previous_longest_ms",
        "turns",
        "turns_cut",
    )

    def __init__(self) -> None:
        self.turns = 0
        self.turns_cut = 0
        self.longest_turn_ms = 0.0
        self.period_started = time.monotonic()
        self.period_longest_ms = 0.0
        self.previous_longest_ms = 0.0
        self.backlog_frames_dropped = 0
        self.peers_unreadable = 0

    def turn_took(self, seconds: float, now: float) -> None:
        self.turns += 1
        ms = seconds * 1000
        if now - self.period_started >= RECENT_TURN_PERIOD_S:
            # A period with no turn at all leaves nothing recent to remember.
            recent = now - self.period_started < 2 * RECENT_TURN_PERIOD_S
            self.previous_longest_ms = self.period_longest_ms if recent else 0.0
            self.period_longest_ms = 0.0
            self.period_started = now
        if ms > self.period_longest_ms:
            self.period_longest_ms = ms
            if ms > self.longest_turn_ms:
                self.longest_turn_ms = ms

    def recent_longest_ms(self, now: float) -> float:
        """The longest turn of the last one to two periods."""
        recent = self.period_longest_ms
        if now - self.period_started < 2 * RECENT_TURN_PERIOD_S:
            recent = max(recent, self.previous_longest_ms)
        return recent
