"""The clocks the core is given. The core never reads time itself: the shell passes a
SystemClock, tests a FakeClock they move by hand."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic_ns(self) -> int: ...

    def wall(self) -> float:
        """Seconds since the epoch, only for display (dead-letter times)."""
        ...


class SystemClock:
    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    def wall(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told to, and never backwards."""

    def __init__(self, start_ns: int = 1_000_000_000_000, wall: float = 1_800_000_000.0) -> None:
        self._ns = start_ns
        self._wall = wall

    def monotonic_ns(self) -> int:
        return self._ns

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time cannot go backwards")
        self._ns += int(seconds * 1_000_000_000)
        self._wall += seconds
