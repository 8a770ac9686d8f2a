"""Which queues the source reads, the leases it takes of them, and their backlog.

`queue` / `queues` name the queues; `queuePattern` is a glob (Python's fnmatch: `*`, `?`,
`[...]`) matched at every trigger against the queues the broker has (every shard of a sharded
broker), so queues created later are read from the next trigger on.
"""

from __future__ import annotations

import fnmatch
import time
from typing import Any

from .broker_link import BrokerLink
from .lease_offsets import LeaseOffset
from .options import SourceOptions

#: `max_messages` of one lease when the broker does not say its max_window.
DEFAULT_MAX_WINDOW = 100_000
#: Stats this recent serve the pattern and the backlog: Spark polls an idle source many times
#: a second, and each `stats` asks every shard.
STATS_MAX_AGE_S = 1.0


class Subscription:
    """The source's queues at the broker, through the runner's BrokerLink."""

    def __init__(self, options: SourceOptions, link: BrokerLink) -> None:
        self._options = options
        self._link = link
        self._stats: dict[str, dict[str, Any]] = {}
        self._stats_at = float("-inf")

    def queues(self) -> list[str]:
        """The queues to read this trigger, in a stable order."""
        pattern = self._options.queue_pattern
        if pattern is None:
            return list(self._options.queues)
        names = self._recent_stats()
        return sorted(name for name in names if fnmatch.fnmatchcase(name, pattern))

    def lease(self, queue: str, name: str, messages: int, max_bytes: int) -> dict[str, Any]:
        """Lease up to `messages` / `max_bytes` of `queue` (at least one if it has any); an
        existing lease of that name comes back as it is."""
        window = self._link.client().broker_info.get("max_window")
        cap = window if type(window) is int and window > 0 else DEFAULT_MAX_WINDOW
        return self._link.call(
            "lease",
            queue=queue,
            lease=name,
            max_messages=max(1, min(messages, cap)),
            max_bytes=max(1, max_bytes),
            timeout_ms=self._options.lease_timeout_ms,
        )

    def _recent_stats(self) -> dict[str, dict[str, Any]]:
        if time.monotonic() - self._stats_at > STATS_MAX_AGE_S:
            self._stats = self._link.stats_everywhere()
            self._stats_at = time.monotonic()
        return self._stats

    def forget_stats(self) -> None:
        """The next figures are fetched afresh (a batch was just leased)."""
        self._stats_at = float("-inf")

    def available_now_target(self, queues: list[str], start: LeaseOffset) -> dict[str, int]:
        """What an availableNow run reads, per queue: the ready messages, and those of this
        reader's leases after `start` (taken by a run that died before Spark recorded them,
        which the run will be given again)."""
        stats = self._link.stats_everywhere()
        target = {name: int(stats.get(name, {}).get("ready", 0)) for name in queues}
        prefix = f"{start.reader}/"
        for queue in queues:
            if not stats.get(queue, {}).get("leased"):
                continue
            for lease in self._link.every("leases", "leases", queue=queue):
                name = str(lease.get("lease", ""))
                number = name[len(prefix) :] if name.startswith(prefix) else ""
                if number.isdigit() and int(number) > start.lease:
                    target[queue] += int(lease.get("messages", 0))
        return target

    def backlog(self, last: LeaseOffset | None) -> dict[str, Any]:
        """Per queue and in all: ready messages, the oldest ready one's age, and messages in
        leases not committed yet (this query's and any other's)."""
        stats = self._recent_stats()
        now = time.time()
        per_queue: dict[str, dict[str, Any]] = {}
        for name in self.queues():
            figures = stats.get(name, {})
            oldest = figures.get("oldest_sent_at")
            per_queue[name] = {
                "ready": int(figures.get("ready", 0)),
                "leased": int(figures.get("leased", 0)),
                "oldest_ready_age_s": None if oldest is None else round(now - oldest, 3),
            }
        ages = [q["oldest_ready_age_s"] for q in per_queue.values() if q["oldest_ready_age_s"]]
        return {
            "reader": None if last is None else last.reader,
            "lease": None if last is None else last.lease,
            "ready": sum(q["ready"] for q in per_queue.values()),
            "leased": sum(q["leased"] for q in per_queue.values()),
            "oldest_ready_age_s": max(ages, default=None),
            "queues": per_queue,
        }
