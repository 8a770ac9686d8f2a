"""Schedules and delayed sends in the pure core (docs/protocol.md §6.7), driven by a fake
clock: interval and cron runs (daylight saving time included), replacing and removing, the
422s for bad input, the journal of a durable broker, and resuming after a restart."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

import phpmq.protocol as p
from harness import CoreHarness, dispatches, errors
from phpmq.broker.clock import FakeClock
from phpmq.broker.schedule_spec import encode_spec, parse_spec
from phpmq.broker.shell.durable import StoredMessage

ALICE = b"alice"
PRODUCER = b"producer"
BERLIN = ZoneInfo("Europe/Berlin")


def listed(core: CoreHarness, name: str) -> dict:
    [entry] = [s for s in core.admin("schedule-list")["schedules"] if s["name"] == name]
    return entry


def ready(core: CoreHarness, queue: str) -> int:
    found = core.core.queues.get(queue)
    return 0 if found is None else found.ready_count


def tick(core: CoreHarness, seconds: float) -> None:
    core.advance(seconds)
    core.turn()


# --------------------------------------------------------------------------- intervals


def test_an_interval_schedule_runs_at_once_and_then_every_interval() -> None:
    core = CoreHarness()
    reply = core.admin("schedule-add", name="tick", queue="jobs", content="hi", every_ms=1000)
    assert reply["replaced"] is False
    assert ready(core, "jobs") == 1
    tick(core, 0.5)
    assert ready(core, "jobs") == 1
    tick(core, 0.5)
    assert ready(core, "jobs") == 2
    tick(core, 3.5)  # a late turn runs once, not once per interval missed
    assert ready(core, "jobs") == 3
    entry = listed(core, "tick")
    assert entry["runs"] == 3
    assert entry["last_run"] == core.clock.wall()
    assert entry["refused"] == 0
    assert core.core.counters.scheduled_runs == 3
    [message] = [r for r in core.core.queues["jobs"].ready][:1]
    assert message.content == b"hi"


def test_nohaste_waits_one_interval_for_the_first_run() -> None:
    core = CoreHarness()
    reply = core.admin("schedule-add", name="later", queue="jobs", every_ms=200, nohaste=True)
    assert reply["next_run"] == pytest.approx(core.clock.wall() + 0.2)
    assert ready(core, "jobs") == 0
    tick(core, 0.2)
    assert ready(core, "jobs") == 1


def test_runs_reach_a_consumer_with_ttl_and_headers() -> None:
    core = CoreHarness()
    core.send(ALICE, p.Hello({}), p.Consume("jobs", 5))
    core.admin(
        "schedule-add",
        name="h",
        queue="jobs",
        content_base64="AAE=",
        every_ms=1000,
        ttl=30,
        headers={"timeout": 5},
    )
    tick(core, 0)
    core.advance(1)
    [dispatch] = dispatches(core.turn()[ALICE])
    assert dispatch.content == b"\x00\x01"
    assert dispatch.ttl == 30
    assert dispatch.headers == b'{"timeout":5}'


def test_a_refused_run_is_counted_and_skipped() -> None:
    core = CoreHarness(max_queue_length=1)
    core.admin("schedule-add", name="full", queue="small", every_ms=100)
    tick(core, 0.1)
    tick(core, 0.1)
    entry = listed(core, "full")
    assert (entry["runs"], entry["refused"]) == (1, 2)
    assert ready(core, "small") == 1


def test_an_event_schedule_publishes_to_bound_queues() -> None:
    core = CoreHarness()
    core.admin("queue-bind", queue="audit", patterns=["clock.*"])
    core.admin("schedule-add", name="beat", event="clock.beat", every_ms=500)
    tick(core, 0.5)
    assert ready(core, "audit") == 2
    assert core.core.counters.published == 2
    assert core.core.queues["audit"].ready[0].event == b"clock.beat"


# --------------------------------------------------------------------------- replace, remove


def test_adding_an_existing_name_replaces_the_schedule() -> None:
    core = CoreHarness()
    core.admin("schedule-add", name="s", queue="a", every_ms=1000)
    reply = core.admin("schedule-add", name="s", queue="b", every_ms=5000, nohaste=True)
    assert reply["replaced"] is True
    tick(core, 1)
    tick(core, 1)
    assert (ready(core, "a"), ready(core, "b")) == (1, 0)
    entry = listed(core, "s")
    assert (entry["queue"], entry["runs"]) == ("b", 0)
    tick(core, 3)
    assert ready(core, "b") == 1
    assert len(core.admin("schedule-list")["schedules"]) == 1


@pytest.mark.parametrize("when", [{"every_ms": 1000}, {"cron": "* * * * *"}])
def test_removing_stops_interval_and_cron_schedules_at_once(when: dict) -> None:
    core = CoreHarness()
    core.admin("schedule-add", name="s", queue="jobs", nohaste=True, **when)
    tick(core, 60)
    assert ready(core, "jobs") == 1
    assert core.admin("schedule-remove", name="s") == {"name": "s", "removed": True}
    for _ in range(5):
        tick(core, 60)
    assert ready(core, "jobs") == 1
    assert core.admin("schedule-list") == {"schedules": [], "next_offset": None}


def test_removing_an_unknown_schedule_is_404() -> None:
    core = CoreHarness()
    reply = core.admin("schedule-remove", name="nope")
    assert reply["error"]["code"] == 404


# --------------------------------------------------------------------------- cron and DST


def cron_runs(start: datetime, expr: str, hours: int) -> list[datetime]:
    """The local times a cron schedule in Berlin ran at, stepping a fake clock whose wall
    time starts at `start` in 5-minute turns."""
    core = CoreHarness(clock=FakeClock(wall=start.timestamp()))
    core.admin("schedule-add", name="c", queue="jobs", cron=expr, tz="Europe/Berlin")
    runs = []
    for _ in range(hours * 12):
        before = ready(core, "jobs")
        tick(core, 300)
        if ready(core, "jobs") > before:
            runs.append(datetime.fromtimestamp(listed(core, "c")["last_run"], BERLIN))
    return runs


def test_cron_in_a_zone_runs_a_time_skipped_in_spring_at_the_next_valid_time() -> None:
    runs = cron_runs(datetime(2026, 3, 28, 12, 0, tzinfo=BERLIN), "30 2 * * *", 72)
    assert [(r.day, r.hour, r.minute, r.utcoffset().seconds // 3600) for r in runs] == [
        (29, 3, 0, 2),  # 02:30 does not exist that night: clocks go 02:00 -> 03:00
        (30, 2, 30, 2),
        (31, 2, 30, 2),
    ]


def test_cron_in_a_zone_runs_a_time_repeated_in_autumn_once() -> None:
    runs = cron_runs(datetime(2026, 10, 24, 12, 0, tzinfo=BERLIN), "30 2 * * *", 72)
    assert [(r.day, r.hour, r.minute, r.utcoffset().seconds // 3600) for r in runs] == [
        (25, 2, 30, 2),  # 02:30 comes twice that night (03:00 -> 02:00): one run
        (26, 2, 30, 1),
        (27, 2, 30, 1),
    ]


def test_cron_follows_its_zone_not_utc() -> None:
    runs = cron_runs(datetime(2026, 7, 1, 0, 0, tzinfo=BERLIN), "0 9 * * *", 24)
    assert [(r.hour, r.minute) for r in runs] == [(9, 0)]
    assert runs[0].astimezone(ZoneInfo("UTC")).hour == 7


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"queue": "q", "cron": "61 * * * *"}, "bad cron expression"),
        ({"queue": "q", "cron": "every day"}, "bad cron expression"),
        ({"queue": "q", "every_ms": 99}, "at least 100 ms"),
        ({"queue": "q", "every_ms": "1000"}, "at least 100 ms"),
        ({"queue": "q", "cron": "* * * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"queue": "q"}, "either 'every_ms' or 'cron'"),
        ({"queue": "q", "every_ms": 100, "cron": "* * * * *"}, "either 'every_ms' or 'cron'"),
        ({"every_ms": 100}, "either 'queue' or 'event'"),
        ({"queue": "q", "event": "e", "every_ms": 100}, "either 'queue' or 'event'"),
        ({"queue": "bad name", "every_ms": 100}, "queue name"),
        ({"queue": "q", "every_ms": 100, "catch_up": "twice"}, "'catch_up' must be"),
        ({"queue": "q", "every_ms": 100, "content_base64": "!!"}, "not valid base64"),
        ({"queue": "q", "every_ms": 100, "headers": [1]}, "JSON object"),
        ({"queue": "q", "every_ms": 100, "ttl": -1}, "'ttl'"),
    ],
)
def test_bad_schedules_are_refused_with_422_and_a_reason(options: dict, reason: str) -> None:
    core = CoreHarness()
    reply = core.admin("schedule-add", name="s", **options)
    assert reply["error"]["code"] == 422
    assert reason in reply["error"]["reason"]
    assert core.admin("schedule-list") == {"schedules": [], "next_offset": None}


def test_a_too_long_name_is_422() -> None:
    core = CoreHarness()
    reply = core.admin("schedule-add", name="n" * 256, queue="q", every_ms=100)
    assert reply["error"]["code"] == 422
    assert "schedule name" in reply["error"]["reason"]


def test_more_schedules_than_the_limit_is_422_but_replacing_is_not() -> None:
    core = CoreHarness(max_schedules=2)
    for name in ("a", "b"):
        core.admin("schedule-add", name=name, queue="q", every_ms=100, nohaste=True)
    reply = core.admin("schedule-add", name="c", queue="q", every_ms=100)
    assert reply["error"] == {"code": 422, "reason": "the broker has the maximum of 2 schedules"}
    assert core.admin("schedule-add", name="a", queue="q", every_ms=200)["replaced"] is True


# --------------------------------------------------------------------------- delayed sends


def test_a_delayed_send_is_confirmed_at_once_and_invisible_until_due() -> None:
    core = CoreHarness()
    core.send(ALICE, p.Hello({}), p.Consume("q", 5))
    out = core.send(PRODUCER, p.Send("q", b"later", tag=1, delay_ms=2000, ttl=1))
    assert [type(m) for m in out] == [p.Confirm]
    assert core.core.queues["q"].delayed == 1
    tick(core, 1.9)
    assert not core.turn().get(ALICE)
    core.advance(0.1)
    [dispatch] = dispatches(core.turn()[ALICE])
    assert dispatch.content == b"later"
    assert dispatch.ttl == 1  # its TTL counts from when it became visible
    assert core.core.queues["q"].delayed == 0


def test_delayed_sends_count_against_the_queue_length() -> None:
    core = CoreHarness(max_queue_length=2)
    for tag in (1, 2):
        core.send(PRODUCER, p.Hello({}), p.Send("q", b"x", tag=tag, delay_ms=5000))
    [refusal] = errors(core.send(PRODUCER, p.Send("q", b"now", tag=3)))
    assert refusal.code == 429
    [refusal] = errors(core.send(PRODUCER, p.Send("q", b"later", tag=4, delay_ms=10)))
    assert refusal.code == 429
    assert core.core.ctx.held_bytes > 0


# --------------------------------------------------------------------------- durable


def test_a_durable_core_journals_schedules_their_runs_and_delayed_sends() -> None:
    core = CoreHarness(durable=True)
    journal = core.core.journal
    core.admin("schedule-add", name="s", queue="q", every_ms=1000)
    ops = journal.take()
    kinds = [op[0] for op in ops]
    assert kinds[0] == "schedule" and ops[0][1] == "s"
    assert ("ran", "s", core.clock.wall(), 1) in ops
    assert "put" in kinds
    core.admin("schedule-remove", name="s")
    assert journal.take() == [("unschedule", "s")]
    core.send(PRODUCER, p.Send("q", b"x", delay_ms=3000))
    put, delay = journal.take()
    assert put[0] == "put" and put[-2] == pytest.approx(core.clock.wall() + 3)
    assert delay[0] == "delay"


def stored(spec: dict, added: float, last_run: float | None, runs: int) -> tuple:
    parsed = parse_spec({"name": "s", "queue": "q", **spec}, added, 1 << 20)
    return ("s", encode_spec(parsed), last_run, runs)


@pytest.mark.parametrize(("catch_up", "at_start"), [("run-once", 1), ("skip", 0)])
def test_runs_missed_while_down_follow_the_catch_up_policy(catch_up: str, at_start: int) -> None:
    core = CoreHarness()
    now = core.clock.wall()
    spec = {"every_ms": 10_000, "catch_up": catch_up}
    core.core.restore_schedules([stored(spec, now - 100, now - 55, 5)])
    core.turn()
    assert ready(core, "q") == at_start
    entry = listed(core, "s")
    assert entry["runs"] == 5 + at_start
    if catch_up == "skip":  # keeps its phase: due at -55 + 60 s
        assert entry["next_run"] == pytest.approx(now + 5)


def test_a_schedule_not_yet_due_at_start_is_not_run_again() -> None:
    core = CoreHarness()
    now = core.clock.wall()
    core.core.restore_schedules([stored({"every_ms": 10_000}, now - 100, now - 4, 9)])
    core.turn()
    assert ready(core, "q") == 0
    tick(core, 5.9)
    assert ready(core, "q") == 0
    tick(core, 0.1)
    assert ready(core, "q") == 1
    assert listed(core, "s")["runs"] == 10


def test_a_cron_schedule_resumes_from_its_last_run_without_running_twice() -> None:
    core = CoreHarness()
    now = core.clock.wall()  # 2027-01-15 08:00:00 UTC
    spec = {"cron": "0 * * * *"}
    core.core.restore_schedules([stored(spec, now - 7200, now - 3600, 1)])  # ran at 07:00
    core.turn()
    assert ready(core, "q") == 1  # 08:00, due now: one run, whatever the policy
    tick(core, 3599)
    assert ready(core, "q") == 1
    tick(core, 1)
    assert ready(core, "q") == 2
    assert listed(core, "s")["runs"] == 3


def test_a_stored_delayed_send_stays_invisible_after_a_restart_until_its_time() -> None:
    core = CoreHarness(durable=True)
    now = core.clock.wall()
    message_id = b"d7e7f68761d34838494b233148b5486c"
    later = StoredMessage(message_id, "q", 1, b"x", b"", 0.0, 1, 2, visible_wall=now + 3)
    due = StoredMessage(b"0" * 32, "q", 2, b"y", b"", 0.0, 1, 2, visible_wall=now - 1)
    core.core.restore([later, due], [])
    core.send(ALICE, p.Hello({}), p.Consume("q", 5))
    assert core.core.queues["q"].delayed == 1
    core.advance(3)
    [dispatch] = dispatches(core.turn()[ALICE])
    assert dispatch.message_id == message_id


def test_cron_with_a_wildcard_hour_runs_in_both_repeated_hours_as_real_time_passes() -> None:
    runs = cron_runs(datetime(2026, 10, 25, 1, 50, tzinfo=BERLIN), "*/30 * * * *", 3)
    assert [(r.hour, r.minute, r.utcoffset().seconds // 3600) for r in runs[:5]] == [
        (2, 0, 2),
        (2, 30, 2),
        (2, 0, 1),  # the clocks went back: these are 30 real minutes later
        (2, 30, 1),
        (3, 0, 1),
    ]


def test_delayed_sends_count_against_the_queue_length_for_a_publish_too() -> None:
    core = CoreHarness(max_queue_length=1)
    core.admin("queue-bind", queue="q", patterns=["e"])
    core.send(PRODUCER, p.Hello({}), p.Send("q", b"x", tag=1, delay_ms=5000))
    [refusal] = errors(core.send(PRODUCER, p.Publish("e", b"y", tag=2)))
    assert refusal.code == 429
