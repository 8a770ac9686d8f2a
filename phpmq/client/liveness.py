"""Whether the broker is alive and when the client owes it a heartbeat, sans-IO
(docs/protocol.md §6.2).

The client asks for a heartbeat interval and a liveness in HELLO; until the broker answers,
they count as the broker will clamp them, and afterwards as it agreed. A broker silent for
interval x liveness is lost; a client that sent nothing for an interval heartbeats. The times
are the driver's monotonic seconds, handed in as `now`; a `Connection` owns one of these and
says whether its silence counts: from HELLO, or from the transport's start when nothing takes
the greeting (nobody listens at the address).
"""

from __future__ import annotations

from typing import Any

from ..protocol import Heartbeat, clamp_liveness, encode
from ..protocol.rules import MAX_HEARTBEAT_MS, MIN_HEARTBEAT_MS

HEARTBEAT = encode(Heartbeat())


class Liveness:
    """The heartbeat terms and when the broker was last heard from and last sent to."""

    __slots__ = ("interval", "last_heard", "last_sent", "timeout")

    def __init__(self, heartbeat_ms: int, liveness: int) -> None:
        """`heartbeat_ms` and `liveness` as asked for in HELLO (0 ms: no heartbeats)."""
        #: Seconds between heartbeats when nothing else is sent (0: no heartbeats).
        self.interval = 0.0
        #: Seconds of silence after which the broker counts as lost (0: never).
        self.timeout = 0.0
        if heartbeat_ms > 0:
            self.interval = min(max(heartbeat_ms, MIN_HEARTBEAT_MS), MAX_HEARTBEAT_MS) / 1000
            self.timeout = self.interval * clamp_liveness(liveness)
        self.last_heard = self.last_sent = 0.0

    def adopt(self, options: dict[str, Any]) -> None:
        """Heartbeat by the interval and liveness the broker agreed to in its HELLO answer,
        not the ones asked (unless heartbeats are off)."""
        heartbeat_ms, liveness = options.get("heartbeat_ms"), options.get("liveness")
        agreed = type(heartbeat_ms) is int and type(liveness) is int
        if self.interval and agreed and heartbeat_ms > 0 and liveness > 0:
            self.interval = heartbeat_ms / 1000
            self.timeout = self.interval * liveness

    def lost(self, now: float, since: float | None) -> bool:
        """The broker was silent for interval x liveness counted from `since` (None: its
        silence does not count now)."""
        return self.interval > 0 and since is not None and now - since > self.timeout

    def heartbeat_due(self, now: float) -> bool:
        """Nothing was sent for an interval (with heartbeats on)."""
        return bool(self.interval) and now - self.last_sent >= self.interval

    def deadline(self, greeted: bool, retry: float | None) -> float | None:
        """When a heartbeat, the greeting (owed while not `greeted`), a lost broker or a
        `retry` is next due (None: never)."""
        if not self.interval:
            return retry
        if not greeted:
            return self.last_sent
        due = min(self.last_sent + self.interval, self.last_heard + self.timeout)
        return due if retry is None else min(due, retry)
