"""Schedules (docs/protocol.md §6.7): named jobs the broker runs itself, each run a send into
a queue or a publish of an event, every interval or on a cron expression.

Runs are driven by the core's one schedule heap (SCHEDULE_RUN entries, target the Job): an
entry acts only while it is its job's current one, so replacing or removing a schedule stops
it at once without touching the heap. A run goes through intake (or events) like a client's
send, as an internal peer of its own that is never in the peer table: its refusals (a full
queue, a memory alarm) are counted in the schedule's `refused` and the run is skipped.

Interval schedules keep their phase in monotonic time; cron schedules are computed in wall
time (their zone's) and armed at the monotonic time that wall time is now away.
"""

from __future__ import annotations

import math
from typing import Any
from zoneinfo import ZoneInfo

from ..protocol import ErrorCode, Publish, Send
from .context import Context
from .deadlines import SCHEDULE_RUN
from .errors import CommandError
from .events import Events
from .intake import Intake
from .model import NS_PER_MS, NS_PER_SECOND, Peer, PeerProfile
from .pages import page, page_request
from .quotas import SCHEDULES
from .schedule_spec import (
    ScheduleSpec,
    decode_spec,
    encode_spec,
    load_zone,
    next_cron,
    parse_spec,
)

#: The profile of the internal peers runs are sent as (never in the peer table).
RUN_PROFILE = PeerProfile("schedule", ttl_form=False)


class Job:
    """A schedule in force: its spec, its next due time and what it has done."""

    __slots__ = (
        "due",
        "last_run",
        "next_wall",
        "owner",
        "peer",
        "removed",
        "runs",
        "spec",
        "zone",
    )

    def __init__(self, spec: ScheduleSpec, peer: Peer) -> None:
        self.spec = spec
        #: Whose quota it counts against (quotas.py; "" restored from the store).
        self.owner = ""
        self.zone: ZoneInfo | None = load_zone(spec.tz) if spec.cron else None
        #: Monotonic ns of the armed run (the heap entry that is current).
        self.due = 0
        #: The wall-clock time the armed run stands for (cron: its cron time).
        self.next_wall = 0.0
        self.last_run: float | None = None
        self.runs = 0
        #: Sends runs as; its `refused` counts the runs refused.
        self.peer = peer
        self.removed = False


class Schedules:
    __slots__ = ("_ctx", "_events", "_intake", "by_name")

    def __init__(self, ctx: Context, intake: Intake, events: Events) -> None:
        self._ctx = ctx
        self._intake = intake
        self._events = events
        self.by_name: dict[str, Job] = {}

    # ----------------------------------------------------------------- commands

    def add(self, options: dict[str, Any]) -> dict[str, Any]:
        ctx = self._ctx
        wall = ctx.clock.wall()
        spec = parse_spec(options, wall, ctx.config.max_content_bytes)
        old = self.by_name.get(spec.name)
        quotas, owner = ctx.quotas, ctx.owner
        if old is None or old.owner != owner:
            problem = quotas.problem(SCHEDULES, owner)
            if problem is not None:
                raise CommandError(f"{problem}: remove some first", ErrorCode.LIMIT_REACHED)
        limit = ctx.config.max_schedules
        if old is None and len(self.by_name) >= limit:
            raise CommandError(f"the broker has the maximum of {limit} schedules")
        if old is not None:
            old.removed = True
            quotas.give_back(SCHEDULES, old.owner)
        job = self._new_job(spec)
        job.owner = owner
        quotas.take(SCHEDULES, owner)
        ctx.journal.scheduled(spec.name, encode_spec(spec))
        if spec.cron:
            self._arm_wall(job, next_cron(spec, job.zone, wall))  # type: ignore[arg-type]
        else:
            every_ns = (spec.every_ms or 0) * NS_PER_MS
            self._arm(job, ctx.now + every_ns if spec.nohaste else ctx.now)
        return {"name": spec.name, "replaced": old is not None, "next_run": job.next_wall}

    def remove(self, options: dict[str, Any]) -> dict[str, Any]:
        name = options.get("name")
        if not isinstance(name, str):
            raise CommandError("this command needs a 'name' string")
        job = self.by_name.pop(name, None)
        if job is None:
            raise CommandError(f"no schedule named {name!r}", ErrorCode.NOT_FOUND)
        job.removed = True
        self._ctx.quotas.give_back(SCHEDULES, job.owner)
        self._ctx.journal.unscheduled(name)
        return {"name": name, "removed": True}

    def listing(self, options: dict[str, Any]) -> dict[str, Any]:
        """The schedules sorted by name, a page at a time (broker/pages.py)."""
        names = sorted(self.by_name)
        by_name = self.by_name
        listed, next_offset = page(
            len(names), lambda index: _listed(by_name[names[index]]), page_request(options)
        )
        return {"schedules": listed, "next_offset": next_offset}

    # ----------------------------------------------------------------- runs

    @staticmethod
    def is_run_live(due: int, job: Job) -> bool:
        return due == job.due and not job.removed

    def on_run_due(self, due: int, job: Job) -> None:
        if due != job.due or job.removed:
            return
        self._run(job)
        spec = job.spec
        if spec.cron:
            after = max(job.next_wall, self._ctx.clock.wall())
            self._arm_wall(job, next_cron(spec, job.zone, after))  # type: ignore[arg-type]
        else:
            every_ns = (spec.every_ms or 0) * NS_PER_MS
            behind = max(0, self._ctx.now - due)
            self._arm(job, due + every_ns * (behind // every_ns + 1))

    def _run(self, job: Job) -> None:
        """One run: a send (or publish) as the job's own peer; refused: counted, skipped."""
        ctx = self._ctx
        spec = job.spec
        peer = job.peer
        refused = peer.refused
        ttl = spec.ttl or None
        if spec.queue is not None:
            self._intake.on_send(peer, Send(spec.queue, spec.content, ttl, headers=spec.headers))
        else:
            event = spec.event or ""
            self._events.on_publish(peer, Publish(event, spec.content, ttl, headers=spec.headers))
        if peer.refused == refused:
            job.runs += 1
            ctx.counters.scheduled_runs += 1
        job.last_run = ctx.clock.wall()
        ctx.journal.ran(spec.name, job.last_run, job.runs)

    # ----------------------------------------------------------------- arming

    def _arm(self, job: Job, due: int) -> None:
        ctx = self._ctx
        job.due = due
        job.next_wall = ctx.wall_at(due)
        ctx.deadlines.arm(due, SCHEDULE_RUN, job)

    def _arm_wall(self, job: Job, wall: float) -> None:
        """Armed for a wall-clock time: as far away in monotonic time as it is now."""
        ctx = self._ctx
        delta_ns = int((wall - ctx.clock.wall()) * NS_PER_SECOND)
        job.due = ctx.now + max(0, delta_ns)
        job.next_wall = wall
        ctx.deadlines.arm(job.due, SCHEDULE_RUN, job)

    def _new_job(self, spec: ScheduleSpec) -> Job:
        peer = Peer(f"schedule {spec.name}".encode(), RUN_PROFILE, self._ctx.now)
        job = self.by_name[spec.name] = Job(spec, peer)
        return job

    # ----------------------------------------------------------------- restart

    def restore(self, rows: list[tuple[str, bytes, float | None, int]]) -> int:
        """Schedules read back from the store. Each resumes where it was: the next run after
        its last one (or after it was added) if that is still ahead; if runs were missed while
        the broker was down, `run-once` runs once now and `skip` waits for the next due time.
        Returns how many schedules."""
        wall = self._ctx.clock.wall()
        for _name, raw, last_run, runs in rows:
            spec = decode_spec(raw)
            job = self._new_job(spec)
            job.runs = runs
            job.last_run = last_run
            missed_from = self._due_after(job, wall)
            if missed_from > wall:
                self._arm_wall(job, missed_from)
            elif spec.catch_up == "run-once":
                self._arm_wall(job, wall)
            else:
                self._arm_wall(job, self._skip_to(job, missed_from, wall))
        return len(rows)

    def _due_after(self, job: Job, wall: float) -> float:
        """When the job was next due, as of its last run (or its adding): may be past."""
        spec = job.spec
        if spec.cron:
            return next_cron(spec, job.zone, job.last_run or spec.added)  # type: ignore[arg-type]
        every = (spec.every_ms or 0) / 1000
        if job.last_run is not None:
            return job.last_run + every
        return spec.added + every if spec.nohaste else spec.added

    @staticmethod
    def _skip_to(job: Job, missed: float, wall: float) -> float:
        """The first due time after `wall`: an interval keeps its phase."""
        spec = job.spec
        if spec.cron:
            return next_cron(spec, job.zone, wall)  # type: ignore[arg-type]
        every = (spec.every_ms or 0) / 1000
        return missed + every * (math.floor((wall - missed) / every) + 1)


def _listed(job: Job) -> dict[str, Any]:
    spec = job.spec
    return {
        "name": spec.name,
        "queue": spec.queue,
        "event": spec.event,
        "every_ms": spec.every_ms,
        "cron": spec.cron,
        "tz": spec.tz,
        "nohaste": spec.nohaste,
        "catch_up": spec.catch_up,
        "next_run": job.next_wall,
        "last_run": job.last_run,
        "runs": job.runs,
        "refused": job.peer.refused,
    }
