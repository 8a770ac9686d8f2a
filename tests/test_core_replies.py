"""Requests and replies in the pure core (docs/protocol.md §6.6), driven by a fake clock."""

from __future__ import annotations

import msgspec
import pytest

import phpmq.protocol as p
from harness import CoreHarness, dispatches, errors

ASKER = b"asker"
WORKER = b"worker"
OTHER = b"other-worker"
HELLO = p.Hello({})


def request(content: bytes, correlation: str, reply_to: str = "", tag: int | None = None) -> p.Send:
    return p.Send("jobs", content, 0, tag, None, None, reply_to, correlation)


def replies(messages: list) -> list[p.Reply]:
    return [m for m in messages if isinstance(m, p.Reply)]


def test_a_reply_reaches_its_requester_by_correlation(core: CoreHarness) -> None:
    core.send(ASKER, HELLO, request(b"2+2", "c1"), request(b"3+3", "c2"))
    got = dispatches(core.send(WORKER, HELLO, p.Consume("jobs", 10)))
    assert [(d.content, d.reply_to, d.correlation) for d in got] == [
        (b"2+2", "", "c1"),
        (b"3+3", "", "c2"),
    ]
    out = core.turn(
        (
            WORKER,
            [p.Reply(b"6", "jobs", got[1].message_id), p.Reply(b"4", "jobs", got[0].message_id)],
        )
    )
    assert [(r.correlation, r.content, r.message_id) for r in replies(out[ASKER])] == [
        ("c2", b"6", got[1].message_id),
        ("c1", b"4", got[0].message_id),
    ]
    assert WORKER not in out  # a reply settles the request like an ack: nothing to say
    assert core.stats("jobs") == {"ready": 0, "in_flight": 0, "dead": 0}
    counters = core.core.counters
    assert (counters.requests, counters.replied, counters.acked) == (2, 2, 2)


def test_an_error_reply_carries_code_and_reason(core: CoreHarness) -> None:
    core.send(ASKER, HELLO, request(b"x", "c1"))
    [job] = dispatches(core.send(WORKER, HELLO, p.Consume("jobs", 1)))
    out = core.turn((WORKER, p.Reply(b"", "jobs", job.message_id, None, 500, "ValueError: bad x")))
    assert WORKER not in out
    [reply] = replies(out[ASKER])
    assert (reply.code, reply.reason) == (500, "ValueError: bad x")


def test_only_the_first_reply_counts(core: CoreHarness) -> None:
    """A worker whose lease ran out lost the request; its late reply is refused (404) and
    the requester gets the one reply of the worker that got the request again."""
    core = CoreHarness(lease_ms=1000)
    core.send(ASKER, HELLO, request(b"x", "c1"))
    [first] = dispatches(core.send(WORKER, p.Consume("jobs", 1, 1000)))
    core.advance(1.5)
    [again] = dispatches(core.send(OTHER, HELLO, p.Consume("jobs", 1)))
    assert again.message_id == first.message_id and again.delivery_count == 2
    out = core.turn((OTHER, p.Reply(b"from other", "jobs", again.message_id)))
    assert [r.content for r in replies(out[ASKER])] == [b"from other"]
    out = core.turn((WORKER, [HELLO, p.Reply(b"late", "jobs", first.message_id)]))
    [late] = errors(out[WORKER])
    assert late.code == 404
    assert ASKER not in out
    assert core.core.counters.replies_dropped == 1


def test_a_requester_that_left_costs_a_count(core: CoreHarness) -> None:
    core.send(ASKER, HELLO, request(b"x", "c1"))
    core.send(ASKER, p.Disconnect(), p.Kbai())
    [job] = dispatches(core.send(WORKER, HELLO, p.Consume("jobs", 1)))
    out = core.turn((WORKER, p.Reply(b"nobody listens", "jobs", job.message_id)))
    assert ASKER not in out and WORKER not in out
    assert core.core.counters.replies_dropped == 1
    assert core.stats("jobs")["in_flight"] == 0  # the request is settled all the same


def test_a_reply_queue_gets_the_reply_with_its_correlation(core: CoreHarness) -> None:
    core.send(ASKER, HELLO, request(b"x", "c7", reply_to="answers"))
    [job] = dispatches(core.send(WORKER, HELLO, p.Consume("jobs", 1)))
    assert job.reply_to == "answers"
    core.send(WORKER, p.Reply(b"ok", "jobs", job.message_id, None, 500, "boom", b'{"k":1}'))
    [answer] = dispatches(core.send(ASKER, p.Consume("answers", 1)))
    assert (answer.content, answer.correlation, answer.reply_to) == (b"ok", "c7", None)
    assert msgspec.json.decode(answer.headers) == {"k": 1, "error": {"code": 500, "reason": "boom"}}


def test_a_reply_to_a_message_that_asked_none_is_refused_and_it_stays_held(
    core: CoreHarness,
) -> None:
    core.send(ASKER, p.Send("jobs", b"plain", 0))
    [job] = dispatches(core.send(WORKER, HELLO, p.Consume("jobs", 1)))
    [error] = errors(core.send(WORKER, p.Reply(b"?", "jobs", job.message_id)))
    assert error.code == 422 and "asked for no reply" in error.reason
    assert core.stats("jobs")["in_flight"] == 1


@pytest.mark.parametrize(
    ("send", "reason"),
    [
        (p.Send("jobs", b"x", 0, None, None, None, "", None), "both REPLY_TO"),
        (p.Send("jobs", b"x", 0, None, None, None, None, "c"), "both REPLY_TO"),
        (p.Send("jobs", b"x", 0, None, None, None, "", ""), "correlation id is empty"),
        (p.Send("jobs", b"x", 0, None, None, None, "", "c" * 256), "longer than 255"),
        (p.Send("jobs", b"x", 0, None, None, None, "bad queue", "c"), "reply queue"),
    ],
)
def test_bad_requests_are_refused_with_422(core: CoreHarness, send: p.Send, reason: str) -> None:
    [error] = errors(core.send(ASKER, send))
    assert error.code == 422 and reason in error.reason
    assert "jobs" not in core.core.queues


def test_a_reply_without_queue_and_id_is_refused(core: CoreHarness) -> None:
    [error] = errors(core.send(WORKER, p.Reply(b"x")))
    assert error.code == 422


def test_requests_and_their_routes_are_journaled() -> None:
    core = CoreHarness(durable=True)
    core.send(ASKER, HELLO, request(b"x", "c1", reply_to="answers"))
    [put] = [op for op in core.core.journal.take() if op[0] == "put"]
    assert put[9:11] == ("answers", "c1")


def test_a_delayed_request_keeps_its_route(core: CoreHarness) -> None:
    delayed = p.Send("jobs", b"later", 0, None, None, None, "", "c9", 500)
    core.send(ASKER, HELLO, delayed)
    assert dispatches(core.send(WORKER, HELLO, p.Consume("jobs", 1))) == []
    core.advance(0.6)
    [job] = dispatches(core.turn()[WORKER])
    assert (job.content, job.correlation) == (b"later", "c9")
    out = core.turn((WORKER, p.Reply(b"done", "jobs", job.message_id)))
    assert [r.correlation for r in replies(out[ASKER])] == ["c9"]


def test_a_request_back_to_its_sender_gets_no_confirm_one_into_a_queue_does(
    core: CoreHarness,
) -> None:
    assert core.send(ASKER, HELLO, request(b"x", "c1", tag=1))[1:] == []  # the HELLO answer
    [confirm] = core.send(ASKER, request(b"y", "c2", reply_to="answers", tag=2))
    assert isinstance(confirm, p.Confirm) and confirm.tag == 2
