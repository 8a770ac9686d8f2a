"""Schedules and delayed sends against real broker processes (docs/protocol.md §6.7): an
interval schedule's runs over time, unschedule stopping it, `send(delay=)`, and a durable
broker killed with -9 that keeps its schedules and delayed sends and neither skips nor
doubles a run beyond each schedule's catch-up policy."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from driven import Connect

from harness import BrokerProcess, free_port
from phpmq.client import BrokerRefused, Client, InvalidArgument


def ready(broker: BrokerProcess, queue: str) -> int:
    found = broker.stats()["queues"].get(queue)
    return 0 if found is None else found["ready"]


def test_an_interval_schedule_runs_the_expected_number_of_times(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address) as client:
        started = time.monotonic()
        reply = client.schedule("tick", "jobs", "beat", every=0.2)
        assert reply["replaced"] is False
        time.sleep(2.0)
        assert client.unschedule("tick") is True
        elapsed = time.monotonic() - started
        runs = ready(broker, "jobs")
        expected = int(elapsed / 0.2) + 1  # one at once, then one per interval
        assert expected - 2 <= runs <= expected
        time.sleep(0.5)  # removed: no more runs
        assert ready(broker, "jobs") == runs
        assert client.schedules() == []
        assert client.unschedule("tick") is False
        message = next(iter(client.consume("jobs", window=1, timeout=5)))
        assert message.content == b"beat"
        message.ack()


def test_schedules_are_listed_and_bad_ones_refused(broker: BrokerProcess, connect: Connect) -> None:
    with connect(broker.address) as client:
        client.schedule("b", event="clock.beat", every=timedelta(minutes=5), nohaste=True)
        client.schedule("a", "jobs", b"\x00", cron="*/5 * * * *", tz="Europe/Berlin")
        listed = client.schedules()
        assert [s["name"] for s in listed] == ["a", "b"]
        assert listed[0]["cron"] == "*/5 * * * *" and listed[0]["last_run"] is None
        assert listed[1]["event"] == "clock.beat" and listed[1]["every_ms"] == 300_000
        assert listed[1]["next_run"] == pytest.approx(time.time() + 300, abs=5)
        with pytest.raises(InvalidArgument, match="at least 100 ms"):
            client.schedule("c", "jobs", every=0.05)
        with pytest.raises(InvalidArgument, match="queue or an event"):
            client.schedule("c", every=1)
        with pytest.raises(BrokerRefused, match="422 bad cron expression"):
            client.schedule("c", "jobs", cron="* * *")
        with pytest.raises(BrokerRefused, match="422 unknown time zone"):
            client.schedule("c", "jobs", cron="* * * * *", tz="Mars/Olympus")


def test_a_delayed_send_reaches_a_consumer_only_after_its_delay(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address) as client:
        sent = time.monotonic()
        assert client.send("later", b"job", delay=0.6, confirm=True)
        client.send("later", b"now", confirm=True)
        got = []
        for message in client.consume("later", window=5, timeout=5):
            got.append((message.content, time.monotonic() - sent))
            message.ack()
            if len(got) == 2:
                break
        assert [content for content, _ in got] == [b"now", b"job"]
        assert got[1][1] >= 0.55
        with pytest.raises(InvalidArgument):
            client.send("later", b"x", delay=-1)


def test_a_durable_broker_killed_with_9_keeps_its_schedules_and_catch_up(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    address = f"tcp://127.0.0.1:{free_port()}"
    with BrokerProcess(tmp_path / "first.log", "--data-dir", str(data), address=address) as first:
        with Client(address) as client:
            client.schedule("hourly", "h", "x", every=3600)  # ran once; not due again
            client.schedule("catch", "c", "x", every=5)
            client.schedule("skip", "s", "x", every=5, catch_up="skip")
            added = time.monotonic()
            assert client.send("later", b"job", delay=6.5, confirm=True)
            assert [s["runs"] for s in client.schedules()] == [1, 1, 1]
        first.kill()
    time.sleep(max(0.0, 5.5 - (time.monotonic() - added)))  # every 5 s one run was missed
    second = BrokerProcess(tmp_path / "second.log", "--data-dir", str(data), address=address)
    with second, Client(address) as client:
        runs = {s["name"]: s["runs"] for s in client.schedules()}
        assert time.monotonic() - added < 10, "restarted too slowly to tell skip from catch-up"
        assert runs == {"catch": 2, "hourly": 1, "skip": 1}
        queues = second.stats()["queues"]
        assert (queues["c"]["ready"], queues["h"]["ready"], queues["s"]["ready"]) == (2, 1, 1)
        assert queues["later"]["delayed"] + queues["later"]["ready"] == 1
        message = next(iter(client.consume("later", window=1, timeout=10)))
        assert message.content == b"job"
        assert time.monotonic() - added >= 6.4
        message.ack()
