"""`AsyncClient`'s schedules: sync_schedules.py's methods as coroutines, with the same
arguments, results and exceptions (docs/client.md "Schedules"). A mixin of `AsyncClient`.
"""

from __future__ import annotations

from typing import Any

from ..protocol import ErrorCode
from .errors import BrokerRefused
from .schedules import Duration, schedule_options


class AsyncSchedules:
    """Schedules for the asyncio client."""

    async def schedule(
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
        """As `Client.schedule`."""
        options = schedule_options(
            name, queue, content, event, every, cron, tz, nohaste, catch_up, ttl, headers
        )
        owner = None
        if queue is not None and self._routing is not None:  # type: ignore[attr-defined]
            owner = await self._link_for(queue)  # type: ignore[attr-defined]
        return await (owner or self).admin("schedule-add", **options)  # type: ignore[attr-defined]

    async def unschedule(self, name: str) -> bool:
        """As `Client.unschedule`: False if there was no such schedule (on any shard)."""
        removed = False
        for shard in await self._every_shard():  # type: ignore[attr-defined]
            try:
                await shard.admin("schedule-remove", name=name)
            except BrokerRefused as exc:
                if exc.error.code != ErrorCode.NOT_FOUND:
                    raise
            else:
                removed = True
        return removed

    async def schedules(self) -> list[dict[str, Any]]:
        """As `Client.schedules` (on a sharded broker: those of every shard)."""
        found = []
        for shard in await self._every_shard():  # type: ignore[attr-defined]
            found.extend((await shard.admin_pages("schedule-list", "schedules"))["schedules"])
        return sorted(found, key=lambda schedule: str(schedule["name"]))
