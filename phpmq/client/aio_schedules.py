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
        return await self.admin("schedule-add", **options)  # type: ignore[attr-defined]

    async def unschedule(self, name: str) -> bool:
        """As `Client.unschedule`: False if there was no such schedule."""
        try:
            await self.admin("schedule-remove", name=name)  # type: ignore[attr-defined]
        except BrokerRefused as exc:
            if exc.error.code == ErrorCode.NOT_FOUND:
                return False
            raise
        return True

    async def schedules(self) -> list[dict[str, Any]]:
        """As `Client.schedules`."""
        reply = await self.admin("schedule-list")  # type: ignore[attr-defined]
        return list(reply["schedules"])
