"""`phpmq schedule add|list|remove` and `phpmq send --delay`, run as subprocesses against a
real broker: what they print, and one-line errors with a non-zero exit for bad input."""

from __future__ import annotations

import os
import re
import time

from harness import BrokerProcess, phpmq


def test_add_list_and_remove_a_schedule(broker: BrokerProcess) -> None:
    """Times are shown with their zone: a cron schedule's in the zone it is read in (issue
    33, item 6: a Europe/Berlin 07:00 showed as a bare 06:00), others in this machine's."""
    address = ["--broker", broker.address]
    utc = {**os.environ, "TZ": "UTC", "COLUMNS": "200"}
    added = phpmq(
        "schedule", "add", *address, "tick", "--every", "200ms", "--queue", "jobs", "hi", env=utc
    )
    assert added.returncode == 0, added.stderr
    assert re.fullmatch(r"added schedule tick; next run [-\d]{10} [:\d]{8} UTC\n", added.stdout)
    cron = phpmq(
        "schedule", "add", *address, "report", "daily", "--cron", "0 7 * * 1-5",
        "--tz", "Europe/Berlin", "--event", "report.daily", "--catch-up", "skip", env=utc,
    )  # fmt: skip
    assert cron.returncode == 0, cron.stderr
    assert re.fullmatch(r"added schedule report; next run [-\d]{10} 07:00:00 CES?T\n", cron.stdout)
    time.sleep(0.5)
    listed = phpmq("schedule", "list", *address, env=utc)
    assert listed.returncode == 0, listed.stderr
    assert "queue jobs" in listed.stdout and "every 200ms" in listed.stdout
    assert "event report.daily" in listed.stdout and "Europe/Berlin" in listed.stdout
    assert re.search(r"07:00:00 CES?T", listed.stdout) and " UTC " in listed.stdout
    removed = phpmq("schedule", "remove", *address, "tick")
    assert (removed.returncode, removed.stdout) == (0, "removed schedule tick\n")
    with broker.client() as client:
        [left] = client.schedules()
        assert left["name"] == "report" and left["catch_up"] == "skip"
        assert client.admin("stats")["queues"]["jobs"]["ready"] >= 2


def test_bad_schedules_fail_with_one_line(broker: BrokerProcess) -> None:
    address = ["--broker", broker.address]
    cases = [
        (["--every", "50ms", "--queue", "q"], "at least 100 ms: '50ms'\n"),  # as written
        (["--cron", "* * *", "--queue", "q"], "bad cron expression"),
        (["--cron", "* * * * *", "--tz", "Mars/Olympus", "--queue", "q"], "unknown time zone"),
        (["--every", "soon", "--queue", "q"], "not a duration"),
        (["--queue", "q"], "give --every or --cron"),
        (["--every", "1s"], "give --queue or --event"),
    ]
    for options, reason in cases:
        result = phpmq("schedule", "add", *address, "s", "m", *options)
        assert result.returncode != 0, options
        assert reason in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    missing = phpmq("schedule", "remove", *address, "nope")
    assert (missing.returncode, missing.stderr) == (1, "phpmq: no schedule named 'nope'\n")


def test_send_with_a_delay_keeps_the_message_invisible_until_then(broker: BrokerProcess) -> None:
    sent = phpmq("send", "--broker", broker.address, "later", "job", "--delay", "1.5s")
    assert sent.returncode == 0, sent.stderr
    assert len(sent.stdout.strip()) == 32  # the confirmed message ID
    # Read at once (not through another CLI run, which took longer than the delay under load).
    queue = broker.stats()["queues"]["later"]
    assert (queue["delayed"], queue["ready"]) == (1, 0)
    time.sleep(1.6)
    assert broker.stats()["queues"]["later"]["ready"] == 1
    bad = phpmq("send", "--broker", broker.address, "later", "job", "--delay", "-1s")
    assert bad.returncode == 2 and "negative" in bad.stderr
