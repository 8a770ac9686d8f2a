"""Notices the wall clock stepping (NTP stepping it, or someone setting it by hand).

The core's deadlines (TTLs, leases, redelivery) run on the monotonic clock, and so do Raft's
timers (pysyncobj), so a step changes none of them while the broker runs. The wall clock is
what the store keeps: a message's TTL and an idempotency key's window are written as wall-
clock times and read back on a restart or a failover, by whichever node then leads. A step
shifts those (docs/cluster.md "Clock steps"): worth a log line when it happens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("phpmq.broker")

#: A change of the wall clock's offset from the monotonic clock between two looks that counts
#: as a step (NTP slews small corrections at 0.5 ms a second at most).
STEP_S = 1.0
#: How often the loop looks.
LOOK_EVERY_S = 1.0


class ClockWatch:
    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._offset = wall() - monotonic()
        self._looked = monotonic()
        self.steps = 0
        #: The last step, in seconds (+: forward).
        self.last_step_s = 0.0

    def look(self) -> float | None:
        """The step since the last look, if the clock stepped (at most once a second)."""
        now = self._monotonic()
        if now - self._looked < LOOK_EVERY_S:
            return None
        self._looked = now
        offset = self._wall() - now
        step, self._offset = offset - self._offset, offset
        if abs(step) < STEP_S:
            return None
        self.steps += 1
        self.last_step_s = step
        log.warning(
            "the wall clock stepped %+.1f s: TTLs and leases keep running on the monotonic"
            " clock (so do Raft's timers); what is stored from now on carries the new time"
            " (a message's TTL and a key's window, read back by the next leader or at a"
            ' restart: docs/cluster.md "Clock steps")',
            step,
        )
        return step
