"""Batch leases in the pure core (docs/protocol.md §6.9): taken from a queue's head within a
count and a byte budget, the same for the same name, read by position, committed (acked),
released or timed out back to the head, dropped with their queue; and browsing by position."""

from __future__ import annotations

import base64

import pytest

import phpmq.protocol as p
from harness import CoreHarness, dispatches

PRODUCER = b"producer"
CONSUMER = b"consumer"


def fill(core: CoreHarness, count: int, size: int = 10, queue: str = "q") -> None:
    core.send(PRODUCER, *[p.Send(queue, b"%0*d" % (size, i), 0) for i in range(count)])


def leased(core: CoreHarness) -> int:
    return core.admin("stats")["queues"]["q"]["leased"]


def contents(reply: dict) -> list[bytes]:
    return [base64.b64decode(entry["content"]) for entry in reply["entries"]]


@pytest.fixture
def core() -> CoreHarness:
    return CoreHarness()


def test_a_lease_takes_the_head_within_its_count_and_is_the_same_when_asked_again(
    core: CoreHarness,
) -> None:
    fill(core, 10)
    first = core.admin("lease", queue="q", lease="r/1", max_messages=4, max_bytes=10**6)
    assert (first["messages"], first["created"], first["ready"]) == (4, True, 6)
    again = core.admin("lease", queue="q", lease="r/1", max_messages=9, max_bytes=10**6)
    assert (again["messages"], again["created"], again["ready"]) == (4, False, 6)
    read = core.admin("lease-read", queue="q", lease="r/1", offset=1, limit=2)
    assert read["messages"] == 4
    assert contents(read) == [b"0000000001", b"0000000002"]
    entry = read["entries"][0]
    assert entry["deliveries"] == 1 and entry["sent_at"] == pytest.approx(core.clock.wall())
    # Leased messages are not dispatched to consumers.
    got = dispatches(core.send(CONSUMER, p.Consume("q", 100)))
    assert [d.content for d in got] == [b"%010d" % i for i in range(4, 10)]
    assert leased(core) == 4


def test_the_byte_budget_bounds_a_lease_but_one_oversized_message_goes_alone(
    core: CoreHarness,
) -> None:
    core.send(PRODUCER, p.Send("q", b"x" * 5000, 0), p.Send("q", b"y" * 10, 0))
    alone = core.admin("lease", queue="q", lease="big", max_messages=10, max_bytes=100)
    assert alone["messages"] == 1
    fill(core, 10, size=100)
    bounded = core.admin("lease", queue="q", lease="small", max_messages=10, max_bytes=700)
    # Each message counts its content plus a fixed overhead (model.record_bytes).
    assert 1 <= bounded["messages"] < 10 and bounded["bytes"] <= 700


def test_commit_acks_and_is_idempotent_release_returns_to_the_head(core: CoreHarness) -> None:
    fill(core, 6)
    core.admin("lease", queue="q", lease="a", max_messages=2, max_bytes=10**6)
    core.admin("lease", queue="q", lease="b", max_messages=2, max_bytes=10**6)
    assert core.admin("lease-commit", queue="q", lease="a")["acked"] == 2
    assert core.admin("lease-commit", queue="q", lease="a")["acked"] == 0
    assert core.admin("lease-release", queue="q", lease="b")["released"] == 2
    got = dispatches(core.send(CONSUMER, p.Hello({}), p.Consume("q", 100)))
    assert [(d.content, d.delivery_count) for d in got] == [
        (b"0000000002", 2),
        (b"0000000003", 2),
        (b"0000000004", 1),
        (b"0000000005", 1),
    ]
    stats = core.admin("stats")
    assert stats["counters"]["lease_committed"] == 2
    assert stats["counters"]["lease_released"] == 2
    assert stats["queues"]["q"]["leased"] == 0


def test_an_unknown_lease_is_404_and_bad_options_are_422(core: CoreHarness) -> None:
    fill(core, 1)
    gone = core.admin("lease-read", queue="q", lease="nope")
    assert gone["error"]["code"] == 404 and "without --data-dir" in gone["error"]["reason"]
    for options in (
        {"queue": "q", "lease": "", "max_messages": 1, "max_bytes": 1},
        {"queue": "q", "lease": "x", "max_messages": 0, "max_bytes": 1},
        {"queue": "q", "lease": "x", "max_messages": 1, "max_bytes": "1"},
        {"queue": "q", "lease": "x", "max_messages": 10**6, "max_bytes": 1},
    ):
        assert core.admin("lease", **options)["error"]["code"] == 422, options


def test_an_empty_or_unknown_queue_makes_no_lease(core: CoreHarness) -> None:
    reply = core.admin("lease", queue="none", lease="x", max_messages=5, max_bytes=99)
    assert (reply["messages"], reply["created"]) == (0, False)
    assert core.admin("leases")["leases"] == []


def test_a_lease_untouched_for_its_timeout_comes_back(core: CoreHarness) -> None:
    fill(core, 3)
    core.admin("lease", queue="q", lease="t", max_messages=3, max_bytes=10**6, timeout_ms=2000)
    core.advance(1.5)
    core.admin("lease-read", queue="q", lease="t")  # a touch starts the timeout again
    core.advance(1.5)
    core.turn()
    assert leased(core) == 3
    core.advance(1.0)
    core.turn()
    assert leased(core) == 0 and core.admin("stats")["queues"]["q"]["ready"] == 3
    assert core.admin("stats")["counters"]["leases_timed_out"] == 1


def test_too_many_leases_is_429() -> None:
    core = CoreHarness(max_leases=2)
    fill(core, 5)
    for name in ("a", "b"):
        core.admin("lease", queue="q", lease=name, max_messages=1, max_bytes=99)
    refused = core.admin("lease", queue="q", lease="c", max_messages=1, max_bytes=99)
    assert refused["error"]["code"] == 429


def test_deleting_the_queue_drops_its_leases() -> None:
    core = CoreHarness(max_leases=1)
    fill(core, 3)
    core.admin("lease", queue="q", lease="x", max_messages=2, max_bytes=10**6)
    deleted = core.admin("queue-delete", queue="q")
    assert deleted["leased"] == 2 and deleted["purged"] == 1
    assert core.admin("leases")["leases"] == []
    assert core.core.ctx.held_bytes == 0
    fill(core, 1)  # the dropped lease no longer counts against max_leases
    assert core.admin("lease", queue="q", lease="y", max_messages=1, max_bytes=99)["created"]


def test_keys_and_headers_travel_to_leases_peeks_dispatch_and_dead_letters(
    core: CoreHarness,
) -> None:
    core.send(PRODUCER, p.Send("q", b"a", 0, headers=b'{"h":"1"}', message_key=b"k1"))
    [peeked] = core.admin("queue-peek", queue="q")["entries"]
    assert base64.b64decode(peeked["key"]) == b"k1" and peeked["headers"] == '{"h":"1"}'
    core.send(CONSUMER, p.Hello({}))
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("q", 1)))
    assert dispatch.message_key == b"k1" and dispatch.headers == b'{"h":"1"}'
    core.send(CONSUMER, p.DeadLetter("q", dispatch.message_id, "bad"))
    [dead] = core.admin("dlq-list", queue="q")["entries"]
    assert base64.b64decode(dead["key"]) == b"k1" and dead["reason"] == "bad"
    assert p.sent_at(dead["id"]) == dead["sent_at"]


def test_peek_and_dead_letters_page_by_position(core: CoreHarness) -> None:
    fill(core, 7)
    first = core.admin("queue-peek", queue="q", limit=3)
    second = core.admin("queue-peek", queue="q", offset=first["next_offset"], limit=3)
    rest = core.admin("queue-peek", queue="q", offset=second["next_offset"], end=7, limit=9)
    pages = contents(first) + contents(second) + contents(rest)
    assert pages == [b"%010d" % i for i in range(7)]
    assert core.admin("stats")["queues"]["q"]["ready"] == 7  # nothing taken
    bounded = core.admin("queue-peek", queue="q", limit=9, max_bytes=1)
    assert len(bounded["entries"]) == 1 and bounded["truncated"]


def test_a_queue_deleted_when_unused_waits_for_its_leases(core: CoreHarness) -> None:
    fill(core, 2)
    core.admin("lease", queue="q", lease="x", max_messages=1, max_bytes=10**6)
    core.send(CONSUMER, p.Hello({}), p.Consume("q", 1, unused_ms=1000))
    core.send(CONSUMER, p.Cancel("q"))
    core.advance(2)
    core.turn()
    assert leased(core) == 1  # still there
    core.admin("lease-commit", queue="q", lease="x")
    core.advance(2)
    core.turn()
    assert "q" not in core.admin("stats")["queues"]
