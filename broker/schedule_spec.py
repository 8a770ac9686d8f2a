"""What a schedule is (docs/protocol.md §6.7): its spec, read and checked from the
`schedule-add` options, kept in the journal as JSON, and when it runs next.

Cron expressions are read by the `cronsim` library in the schedule's IANA time zone, so
daylight saving time follows the zone: a local time skipped in spring runs at the next valid
time, a fixed local time repeated in autumn runs once.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from cronsim import CronSim, CronSimError

from ..protocol import event_name_problem
from ..protocol.constants import INTEGER_LIMIT, MAX_INTEGER_DIGITS
from ..protocol.rules import (
    CATCH_UP_POLICIES,
    MIN_SCHEDULE_INTERVAL_MS,
    queue_name_problem,
    schedule_name_problem,
)
from .errors import CommandError

#: `every_ms` and `ttl` are below this: what an integer packet holds (a client's TTL is one),
#: so that the times worked out from them stay within a float's range.
NUMBER_LIMIT = INTEGER_LIMIT


class ScheduleSpec(msgspec.Struct, kw_only=True, frozen=True):
    """A schedule as added; `added` is the wall-clock time it was added (seconds)."""

    name: str
    queue: str | None = None
    event: str | None = None
    content: bytes = b""
    every_ms: int | None = None
    cron: str | None = None
    tz: str = "UTC"
    nohaste: bool = False
    catch_up: str = "run-once"
    ttl: int = 0
    #: The HEADERS packet each run carries (a JSON object, encoded), if any.
    headers: bytes | None = None
    added: float = 0.0


def encode_spec(spec: ScheduleSpec) -> bytes:
    return msgspec.json.encode(spec)


def decode_spec(data: bytes) -> ScheduleSpec:
    """A spec as the store keeps it; an interval or TTL an older broker took past
    NUMBER_LIMIT is held just under it (it would stop the start, or go out as 19 digits)."""
    spec = msgspec.json.decode(data, type=ScheduleSpec)
    every_ms, ttl = spec.every_ms, spec.ttl
    if (every_ms is not None and every_ms >= NUMBER_LIMIT) or ttl >= NUMBER_LIMIT:
        spec = msgspec.structs.replace(
            spec,
            every_ms=None if every_ms is None else min(every_ms, NUMBER_LIMIT - 1),
            ttl=min(ttl, NUMBER_LIMIT - 1),
        )
    return spec


def parse_spec(options: dict[str, Any], added: float, max_content_bytes: int) -> ScheduleSpec:
    """The spec of a `schedule-add` command; CommandError (422) with the reason if bad."""
    name = _string(options, "name")
    problem = schedule_name_problem(name)
    if problem is not None:
        raise CommandError(problem)
    queue, event = _target(options)
    every_ms, cron, tz = _when(options)
    content = _content(options)
    if len(content) > max_content_bytes:
        raise CommandError(f"content is longer than the broker's {max_content_bytes} bytes")
    catch_up = options.get("catch_up", "run-once")
    if catch_up not in CATCH_UP_POLICIES:
        raise CommandError(f"'catch_up' must be one of {', '.join(CATCH_UP_POLICIES)}")
    nohaste = options.get("nohaste", False)
    if not isinstance(nohaste, bool):
        raise CommandError("'nohaste' must be true or false")
    ttl = options.get("ttl", 0)
    if type(ttl) is not int or not 0 <= ttl < NUMBER_LIMIT:
        raise CommandError(
            f"'ttl' must be a non-negative integer (seconds) of at most {MAX_INTEGER_DIGITS} digits"
        )
    headers = options.get("headers")
    if headers is not None and not isinstance(headers, dict):
        raise CommandError("'headers' must be a JSON object")
    return ScheduleSpec(
        name=name,
        queue=queue,
        event=event,
        content=content,
        every_ms=every_ms,
        cron=cron,
        tz=tz,
        nohaste=nohaste,
        catch_up=catch_up,
        ttl=ttl,
        headers=msgspec.json.encode(headers) if headers else None,
        added=added,
    )


def _string(options: dict[str, Any], key: str) -> str:
    value = options.get(key)
    if not isinstance(value, str):
        raise CommandError(f"this command needs a {key!r} string")
    return value


def _target(options: dict[str, Any]) -> tuple[str | None, str | None]:
    queue, event = options.get("queue"), options.get("event")
    if (queue is None) == (event is None):
        raise CommandError("a schedule needs either 'queue' or 'event' (one of them)")
    if queue is not None:
        problem = queue_name_problem(queue) if isinstance(queue, str) else "'queue' not a string"
    else:
        problem = event_name_problem(event) if isinstance(event, str) else "'event' not a string"
    if problem is not None:
        raise CommandError(problem)
    return queue, event


def _when(options: dict[str, Any]) -> tuple[int | None, str | None, str]:
    every_ms, cron = options.get("every_ms"), options.get("cron")
    if (every_ms is None) == (cron is None):
        raise CommandError("a schedule needs either 'every_ms' or 'cron' (one of them)")
    tz = options.get("tz", "UTC")
    if not isinstance(tz, str):
        raise CommandError("'tz' must be an IANA time zone name such as 'Europe/Berlin'")
    zone = load_zone(tz)
    if every_ms is not None:
        if type(every_ms) is not int or not MIN_SCHEDULE_INTERVAL_MS <= every_ms < NUMBER_LIMIT:
            raise CommandError(
                f"'every_ms' must be an integer of at least {MIN_SCHEDULE_INTERVAL_MS} ms and at"
                f" most {MAX_INTEGER_DIGITS} digits"
            )
        return every_ms, None, tz
    if not isinstance(cron, str):
        raise CommandError("'cron' must be a five-field cron expression string")
    try:
        CronSim(cron, datetime.now(zone))
    except CronSimError as exc:
        raise CommandError(f"bad cron expression {cron!r}: {exc}") from None
    return None, cron, tz


def load_zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder, a long name
        raise CommandError(
            f"unknown time zone {tz!r}: use an IANA name such as 'Europe/Berlin'"
        ) from None


def _content(options: dict[str, Any]) -> bytes:
    text, encoded = options.get("content"), options.get("content_base64")
    if text is not None and encoded is not None:
        raise CommandError("give 'content' or 'content_base64', not both")
    if encoded is not None:
        if not isinstance(encoded, str):
            raise CommandError("'content_base64' must be a base64 string")
        try:
            return base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise CommandError("'content_base64' is not valid base64") from None
    if text is None:
        return b""
    if not isinstance(text, str):
        raise CommandError("'content' must be a string")
    return text.encode()


def next_cron(spec: ScheduleSpec, zone: ZoneInfo, after_wall: float) -> float:
    """The first cron time strictly after `after_wall`, as wall-clock seconds."""
    start = datetime.fromtimestamp(after_wall, zone)
    return next(CronSim(spec.cron or "", start)).timestamp()
