"""Schedules and delayed sends as a client states them (docs/protocol.md §6.7), sans-IO:
durations in seconds (or timedelta) become the broker's milliseconds, and `schedule`'s
arguments become the `schedule-add` options, checked before anything is sent so that a
mistake is an InvalidArgument naming it. The broker checks the rest (cron, zone) with 422.
"""

from __future__ import annotations

import base64
import math
from datetime import timedelta
from typing import Any

from ..protocol import event_name_problem
from ..protocol.constants import INTEGER_LIMIT
from ..protocol.rules import (
    CATCH_UP_POLICIES,
    MIN_SCHEDULE_INTERVAL_MS,
    queue_name_problem,
    schedule_name_problem,
)
from .errors import InvalidArgument

Duration = float | int | timedelta


def duration_ms(value: Duration, what: str) -> int:
    """Seconds (or a timedelta) as whole milliseconds; InvalidArgument if negative."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise InvalidArgument(f"{what} must be a non-negative number of seconds", repr(value))
    # (nan and inf, and what 18 digits of milliseconds cannot say: no packet carries them)
    if not math.isfinite(seconds) or seconds * 1000 >= INTEGER_LIMIT:
        raise InvalidArgument(f"{what} must be under 10**15 seconds", repr(value))
    return round(seconds * 1000)


def delay_ms(delay: Duration | None) -> int:
    """`send(delay=)` as the DELAY_MS packet's value (0: none)."""
    return 0 if delay is None else duration_ms(delay, "a delay")


def schedule_options(
    name: str,
    queue: str | None,
    content: bytes | str,
    event: str | None,
    every: Duration | None,
    cron: str | None,
    tz: str,
    nohaste: bool,
    catch_up: str,
    ttl: int,
    headers: dict[str, Any] | None,
) -> dict[str, Any]:
    """The `schedule-add` options, or InvalidArgument for what the broker would refuse."""
    _check(schedule_name_problem(name), name)
    if (queue is None) == (event is None):
        raise InvalidArgument("a schedule needs a queue or an event (one of them)", f"{name}")
    options: dict[str, Any] = {"name": name, "tz": tz, "nohaste": nohaste, "catch_up": catch_up}
    if queue is not None:
        _check(queue_name_problem(queue), queue)
        options["queue"] = queue
    else:
        _check(event_name_problem(event or ""), event or "")
        options["event"] = event
    options.update(_when(every, cron))
    if catch_up not in CATCH_UP_POLICIES:
        raise InvalidArgument(f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}", catch_up)
    if ttl:
        options["ttl"] = ttl
    if headers:
        options["headers"] = headers
    if isinstance(content, str):
        options["content"] = content
    else:
        options["content_base64"] = base64.b64encode(content).decode()
    return options


def _when(every: Duration | None, cron: str | None) -> dict[str, Any]:
    if (every is None) == (cron is None):
        raise InvalidArgument("a schedule needs every= or cron= (one of them)", f"{every or cron}")
    if cron is not None:
        return {"cron": cron}
    every_ms = duration_ms(every, "every")  # type: ignore[arg-type]
    if every_ms < MIN_SCHEDULE_INTERVAL_MS:
        raise InvalidArgument(
            f"an interval must be at least {MIN_SCHEDULE_INTERVAL_MS} ms", repr(every)
        )
    return {"every_ms": every_ms}


def _check(problem: str | None, value: str) -> None:
    if problem is not None:
        raise InvalidArgument(problem, value)
