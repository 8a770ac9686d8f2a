# auto-generated from aio_schedules.py by tools/unasync.py; do not edit.
"""`Client`'s schedules (docs/protocol.md §6.7, docs/client.md "Schedules"): jobs the
broker runs itself. A mixin of `Client` (sync.py); the arguments are checked in
schedules.py.
"""

from __future__ import annotations

from typing import Any

from ..protocol import ErrorCode
from ..protocol import admin_commands as cmd
from .errors import BrokerRefused
from .schedules import Duration, schedule_options


class SyncSchedules:
    """Schedules for the blocking client (every method is `Client`'s)."""

    def schedule(
        self,
        name: str,
        queue: str | None = None,
        content: bytes | str = b"",
        *,
        event: str | None = None,
        every: Duration | None = None,
        cron: str | None = None,
        tz: str = "UTC",
        nohaste: bool = False,
        catch_up: str = "run-once",
        ttl: int = 0,
        headers: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Have the broker send `content` to `queue` (or publish it as `event`) every
        `every` seconds (at least 0.1; a float or timedelta) or on `cron` (five fields, read
        in the IANA zone `tz`). It runs at once unless `nohaste` (then after one interval; a
        cron schedule always waits for its first time). A schedule with the same name is
        replaced. `catch_up` says what a durable broker does about runs missed while it was
        down: "run-once" (one run at start) or "skip". Returns `{"name", "replaced",
        "next_run"}` (next_run: wall-clock seconds).

        Raises:
            InvalidArgument: (nothing sent) a bad name, queue or event, interval, catch_up.
            BrokerRefused: 422 with the reason: a bad cron expression or time zone, more
                schedules than the broker's `max_schedules`.
        """
        options = schedule_options(
            name, queue, content, event, every, cron, tz, nohaste, catch_up, ttl, headers
        )
        # A schedule with a queue goes to its owning shard, as `admin` sends every command
        # with a `queue` option.
        return self.admin(cmd.SCHEDULE_ADD, **options)  # type: ignore[attr-defined]

    def unschedule(self, name: str) -> bool:
        """Remove the schedule `name`: it stops at once. False if there was none (on a
        sharded broker: on any shard)."""
        removed = False
        for shard in self._every_shard():  # type: ignore[attr-defined]
            try:
                shard.admin(cmd.SCHEDULE_REMOVE, name=name)
            except BrokerRefused as exc:
                if exc.error.code != ErrorCode.NOT_FOUND:
                    raise
            else:
                removed = True
        return removed

    def schedules(self) -> list[dict[str, Any]]:
        """Every schedule, sorted by name: `name`, `queue` or `event`, `every_ms` or `cron`
        with `tz`, `nohaste`, `catch_up`, `next_run` and `last_run` (wall-clock seconds;
        last_run None before the first), `runs` and `refused` (runs the queue refused).
        On a sharded broker: those of every shard."""
        found = []
        for shard in self._every_shard():  # type: ignore[attr-defined]
            listed = shard.admin_pages(cmd.SCHEDULE_LIST, "schedules")
            found.extend(listed["schedules"])
        return sorted(found, key=lambda schedule: str(schedule["name"]))
