"""The pure broker core, driven by a fake clock: no sockets, no sleeps."""

from __future__ import annotations

import re

import pytest

import phpmq.protocol as p
from harness import CoreHarness, dispatches, errors
from phpmq.protocol import queue_name_problem

PRODUCER = b"producer"
CONSUMER = b"consumer"
OTHER = b"other"
HELLO = p.Hello({"name": "test"})


def test_queue_is_created_on_first_send_and_ids_are_32_lowercase_hex(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0), p.Send("jobs", b"b", 0))
    assert core.stats("jobs") == {"ready": 2, "in_flight": 0, "dead": 0}
    got = dispatches(core.send(CONSUMER, p.Consume("jobs", 10)))
    assert [d.content for d in got] == [b"a", b"b"]
    for dispatch in got:
        assert re.fullmatch(rb"[0-9a-f]{32}", dispatch.message_id)
    assert got[0].message_id != got[1].message_id


def test_send_produces_no_reply(core: CoreHarness) -> None:
    assert core.send(PRODUCER, p.Send("jobs", b"a", 0)) == []
    assert core.send(PRODUCER, p.Send("jobs", b"a")) == []


def test_dispatch_carries_the_remaining_ttl(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 3600))
    core.advance(300)
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    assert dispatch.ttl == 3300


def test_remaining_ttl_rounds_up_so_a_live_message_never_reads_zero(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 10))
    core.advance(9.5)
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    assert dispatch.ttl == 1


def test_ttl_zero_never_expires(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0), p.Send("jobs", b"b"))
    core.advance(10 * 365 * 86400)
    got = dispatches(core.send(CONSUMER, p.Consume("jobs", 5)))
    assert [(d.content, d.ttl) for d in got] == [(b"a", 0), (b"b", 0)]


def test_expired_message_is_never_dispatched_wherever_it_sits(core: CoreHarness) -> None:
    core.send(
        PRODUCER,
        p.Send("jobs", b"first", 0),
        p.Send("jobs", b"short", 5),
        p.Send("jobs", b"last", 100),
    )
    core.advance(5)
    core.turn()  # the expiry sweep runs at the end of every turn
    assert core.stats("jobs") == {"ready": 2, "in_flight": 0, "dead": 1}
    got = dispatches(core.send(CONSUMER, p.Consume("jobs", 5)))
    assert [d.content for d in got] == [b"first", b"last"]
    [entry] = core.core.queues["jobs"].dead
    assert (entry.content, entry.reason) == (b"short", "expired")
    assert core.core.counters.expired == 1


def test_messages_expiring_in_the_order_sent_leave_no_tombstones_and_need_no_pass(
    core: CoreHarness,
) -> None:
    """Expired at the head, they are dropped there as they go: the deque is never rebuilt
    (a pass over a million-message queue stops the loop for about 40 ms)."""
    core.send(PRODUCER, *[p.Send("jobs", b"m%d" % n, 1 + n // 100) for n in range(1_000)])
    core.send(PRODUCER, p.Send("jobs", b"kept", 0))
    queue = core.core.queues["jobs"]
    ready = queue.ready
    for _ in range(12):
        core.advance(1)
        core.turn()
    assert queue.ready is ready and list(ready) == [ready[0]] and queue.stale == 0
    assert core.core.counters.expired == 1_000


def test_message_expiring_at_dispatch_time_goes_to_dead_letters(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 1), p.Send("jobs", b"b", 0))
    core.advance(1)
    # Same turn: consume arrives after expiry but before the sweep.
    core.core.begin_turn()
    core.core.handle_frame(CONSUMER, p.encode(p.Consume("jobs", 5)))
    out = core.core.end_turn().frames
    [(_, frame)] = out
    messages, _ = p.decode_frame(frame)
    assert [d.content for d in dispatches(messages)] == [b"b"]
    assert core.core.queues["jobs"].dead[0].reason == "expired"


def test_window_limits_unacked_messages_and_each_ack_frees_a_slot(core: CoreHarness) -> None:
    core.send(PRODUCER, *[p.Send("jobs", b"%d" % i, 0) for i in range(5)])
    first = dispatches(core.send(CONSUMER, p.Consume("jobs", 2)))
    assert [d.content for d in first] == [b"0", b"1"]
    assert core.stats("jobs") == {"ready": 3, "in_flight": 2, "dead": 0}
    nxt = dispatches(core.send(CONSUMER, p.Ack("jobs", first[0].message_id)))
    assert [d.content for d in nxt] == [b"2"]
    assert core.core.counters.acked == 1


def test_consume_count_zero_stops_dispatch_but_held_messages_can_be_acked(
    core: CoreHarness,
) -> None:
    core.send(PRODUCER, *[p.Send("jobs", b"%d" % i, 0) for i in range(4)])
    [held] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    assert core.send(CONSUMER, p.Consume("jobs", 0)) == []
    assert core.send(CONSUMER, p.Ack("jobs", held.message_id)) == []
    assert core.stats("jobs") == {"ready": 3, "in_flight": 0, "dead": 0}
    assert core.core.queues["jobs"].windows == []


def test_a_new_consume_resizes_the_window(core: CoreHarness) -> None:
    core.send(PRODUCER, *[p.Send("jobs", b"%d" % i, 0) for i in range(5)])
    assert len(dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))) == 1
    assert len(dispatches(core.send(CONSUMER, p.Consume("jobs", 3)))) == 2


def test_one_consumer_may_consume_several_queues(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("a", b"1", 0), p.Send("b", b"2", 0))
    got = dispatches(core.send(CONSUMER, p.Consume("a", 5), p.Consume("b", 5)))
    assert sorted((d.queue, d.content) for d in got) == [("a", b"1"), ("b", b"2")]


def test_messages_sent_later_reach_a_waiting_consumer(core: CoreHarness) -> None:
    assert core.send(CONSUMER, p.Consume("jobs", 5)) == []
    out = core.turn((PRODUCER, p.Send("jobs", b"late", 0)))
    assert [d.content for d in dispatches(out[CONSUMER])] == [b"late"]


def test_dispatch_is_fair_across_consumers(core: CoreHarness) -> None:
    consumers = [b"c1", b"c2", b"c3"]
    core.turn(*[(c, p.Consume("jobs", 100)) for c in consumers])
    out = core.turn((PRODUCER, [p.Send("jobs", b"%d" % i, 0) for i in range(30)]))
    assert sorted(len(dispatches(out[c])) for c in consumers) == [10, 10, 10]


def test_fairness_holds_when_windows_are_small(core: CoreHarness) -> None:
    core.turn((b"c1", p.Consume("jobs", 1)), (b"c2", p.Consume("jobs", 1)))
    counts = {b"c1": 0, b"c2": 0}
    out = core.turn((PRODUCER, [p.Send("jobs", b"x", 0) for _ in range(20)]))
    for _ in range(10):
        pending = [(peer, d) for peer, msgs in out.items() for d in dispatches(msgs)]
        for peer, _ in pending:
            counts[peer] += 1
        out = core.turn(*[(peer, p.Ack("jobs", d.message_id)) for peer, d in pending])
    assert counts[b"c1"] == counts[b"c2"] == 10
    assert core.stats("jobs") == {"ready": 0, "in_flight": 0, "dead": 0}


def test_ack_from_a_peer_that_does_not_hold_the_message_is_refused(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    [error] = errors(core.send(OTHER, HELLO, p.Ack("jobs", dispatch.message_id))[1:])
    assert error.code == p.ErrorCode.UNKNOWN_MESSAGE
    assert error.message_id == dispatch.message_id
    assert error.queue == "jobs"
    # The real holder still holds it and can ack it.
    assert core.stats("jobs")["in_flight"] == 1
    core.send(CONSUMER, p.Ack("jobs", dispatch.message_id))
    assert core.stats("jobs")["in_flight"] == 0


def test_stock_peer_gets_no_error_reply_but_the_refusal_is_counted_and_logged(
    core: CoreHarness, caplog: pytest.LogCaptureFixture
) -> None:
    unknown = "d7e7f68761d34838494b233148b5486c"
    assert core.send(OTHER, p.Ack("jobs", unknown)) == []
    assert core.core.counters.errors == 1
    assert unknown in caplog.text


def test_double_ack_is_refused_the_second_time(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    [dispatch] = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    ack = p.Ack("jobs", dispatch.message_id)
    assert errors(core.send(CONSUMER, ack)) == []
    [error] = errors(core.send(CONSUMER, ack))
    assert error.code == p.ErrorCode.UNKNOWN_MESSAGE
    assert core.core.counters.acked == 1


def test_requeue_appends_the_same_id_at_the_tail_with_a_new_ttl(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0), p.Send("jobs", b"b", 0))
    [first] = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    [second] = dispatches(core.send(CONSUMER, p.Requeue("jobs", first.message_id, 60)))
    assert second.content == b"b"
    [again] = dispatches(core.send(CONSUMER, p.Ack("jobs", second.message_id)))
    assert (again.message_id, again.content, again.ttl) == (first.message_id, b"a", 60)
    assert (first.delivery_count, again.delivery_count) == (1, 2)
    assert core.core.counters.requeued == 1


def test_requeued_message_expires_by_its_new_ttl(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    [first] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    core.send(CONSUMER, p.Consume("jobs", 0), p.Requeue("jobs", first.message_id, 2))
    core.advance(3)
    core.turn()
    assert core.stats("jobs") == {"ready": 0, "in_flight": 0, "dead": 1}


def test_dead_letter_removes_the_message_and_keeps_it_with_its_reason(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"poison", 0))
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    core.send(CONSUMER, p.DeadLetter("jobs", dispatch.message_id, "cannot parse"))
    core.send(CONSUMER, p.DeadLetter("jobs", "0" * 32))  # not held: refused, nothing buried
    assert core.stats("jobs") == {"ready": 0, "in_flight": 0, "dead": 1}
    [entry] = core.core.queues["jobs"].dead
    assert (entry.id, entry.content, entry.reason) == (
        dispatch.message_id,
        b"poison",
        "cannot parse",
    )


def test_dead_letter_without_a_reason_is_recorded_as_rejected(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"x", 0))
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    core.send(CONSUMER, p.DeadLetter("jobs", dispatch.message_id))
    assert core.core.queues["jobs"].dead[0].reason == "rejected"


def test_dead_letter_store_is_bounded_and_counts_what_it_drops() -> None:
    core = CoreHarness(dead_letter_limit=3)
    core.send(PRODUCER, *[p.Send("jobs", b"%d" % i, 1) for i in range(5)])
    core.advance(2)
    core.turn()
    queue = core.core.queues["jobs"]
    assert [e.content for e in queue.dead] == [b"2", b"3", b"4"]
    assert queue.dead_dropped == 2


def test_a_departing_consumers_messages_return_to_the_head_in_order(core: CoreHarness) -> None:
    core.send(PRODUCER, *[p.Send("jobs", b"%d" % i, 0) for i in range(5)])
    held = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 3)))
    assert [d.content for d in held] == [b"0", b"1", b"2"]
    core.send(CONSUMER, p.Kbai())
    assert core.core.counters.redelivered == 3
    got = dispatches(core.send(OTHER, HELLO, p.Consume("jobs", 10)))
    assert [d.content for d in got] == [b"0", b"1", b"2", b"3", b"4"]
    assert [d.delivery_count for d in got] == [2, 2, 2, 1, 1]
    assert [d.message_id for d in got[:3]] == [d.message_id for d in held]


def test_peer_gone_releases_its_messages(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    core.send(CONSUMER, p.Consume("jobs", 1))
    core.core.peer_gone(CONSUMER)
    assert core.stats("jobs") == {"ready": 1, "in_flight": 0, "dead": 0}
    assert CONSUMER not in core.core.peers


def test_late_ack_after_redelivery_is_refused(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    [dispatch] = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    core.core.peer_gone(CONSUMER)
    [redelivered] = dispatches(core.send(OTHER, p.Consume("jobs", 1)))
    assert redelivered.message_id == dispatch.message_id
    [error] = errors(core.send(CONSUMER, HELLO, p.Ack("jobs", dispatch.message_id))[1:])
    assert error.code == p.ErrorCode.UNKNOWN_MESSAGE
    assert core.stats("jobs")["in_flight"] == 1


def test_disconnect_answers_kbai_stops_dispatch_and_lets_held_work_finish(
    core: CoreHarness,
) -> None:
    core.send(PRODUCER, *[p.Send("jobs", b"%d" % i, 0) for i in range(4)])
    held = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 2)))
    reply = core.send(CONSUMER, p.Disconnect())
    assert [type(m) for m in reply] == [p.Kbai]
    # Acks still count and free no new work for the departing peer.
    assert dispatches(core.send(CONSUMER, p.Ack("jobs", held[0].message_id))) == []
    assert dispatches(core.send(CONSUMER, p.Consume("jobs", 5))) == []
    assert core.stats("jobs") == {"ready": 2, "in_flight": 1, "dead": 0}
    core.send(CONSUMER, p.Kbai())
    assert core.stats("jobs") == {"ready": 3, "in_flight": 0, "dead": 0}


def test_hello_is_answered_with_the_brokers_limits(core: CoreHarness) -> None:
    [reply] = core.send(CONSUMER, p.Hello({"name": "x", "role": "consumer"}))
    assert isinstance(reply, p.Hello)
    assert reply.options["broker"] == "phpmq-zmq"
    assert reply.options["max_window"] == core.core.config.max_window


# ------------------------------------------------------------------------ dialects


def test_zeromq_default_dialect_dispatches_the_ttl_form(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a"))
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    assert dispatch.ttl == 0
    assert dispatch.delivery_count is None  # only extension peers get the count


def test_pre_ttl_endpoint_dispatches_the_stock_3_packet_form() -> None:
    core = CoreHarness(ttl_form_default=False)
    core.send(PRODUCER, p.Send("jobs", b"a", 30))
    core.core.begin_turn()
    core.core.handle_frame(CONSUMER, p.encode(p.Consume("jobs", 1)))
    [(_, frame)] = core.core.end_turn().frames
    assert frame.startswith(b"H0100303")
    [dispatch] = p.decode_frame(frame)[0]
    assert dispatch.ttl is None


def test_a_peer_that_sends_a_ttl_form_message_is_switched_to_the_ttl_form() -> None:
    core = CoreHarness(ttl_form_default=False)
    core.send(CONSUMER, p.Send("other", b"x", 0), p.Consume("jobs", 1))
    [dispatch] = dispatches(core.turn((PRODUCER, p.Send("jobs", b"a")))[CONSUMER])
    assert dispatch.ttl == 0


def test_a_peer_that_speaks_an_extension_is_switched_to_the_ttl_form() -> None:
    core = CoreHarness(ttl_form_default=False)
    core.send(CONSUMER, p.Heartbeat(), p.Consume("jobs", 1))
    [dispatch] = dispatches(core.turn((PRODUCER, p.Send("jobs", b"a")))[CONSUMER])
    assert (dispatch.ttl, dispatch.delivery_count) == (0, 1)


# ------------------------------------------------------------------------ bad input


def test_valid_messages_before_a_bad_one_in_a_frame_are_processed(core: CoreHarness) -> None:
    frame = p.encode(HELLO) + p.encode(p.Send("jobs", b"ok", 0)) + b"H0100799garbage"
    reply = core.turn((CONSUMER, frame))[CONSUMER]
    [error] = errors(reply)
    assert error.code == p.ErrorCode.UNSUPPORTED_TYPE
    assert "007" in error.reason
    assert core.stats("jobs")["ready"] == 1


def test_client_sent_dispatch_is_refused(core: CoreHarness) -> None:
    bogus = p.Dispatch("jobs", b"x", "d7e7f68761d34838494b233148b5486c", 0)
    [error] = errors(core.send(CONSUMER, HELLO, bogus))
    assert error.code == p.ErrorCode.UNSUPPORTED_TYPE


def test_oversized_content_is_refused_with_413() -> None:
    core = CoreHarness(max_content_bytes=100)
    [error] = errors(core.send(CONSUMER, HELLO, p.Send("jobs", b"x" * 101, 0)))
    assert error.code == p.ErrorCode.TOO_LARGE
    assert "jobs" not in core.core.queues


def test_window_over_the_maximum_is_refused() -> None:
    core = CoreHarness(max_window=10)
    [error] = errors(core.send(CONSUMER, HELLO, p.Consume("jobs", 11)))
    assert error.code == p.ErrorCode.INVALID_VALUE
    assert "10" in error.reason


@pytest.mark.parametrize("name", ["", "has space", "tab\there", "nul\x00", "x" * 256, "é" * 128])
def test_bad_queue_names_are_refused(core: CoreHarness, name: str) -> None:
    assert queue_name_problem(name) is not None
    [error] = errors(core.send(CONSUMER, HELLO, p.Send(name, b"x", 0)))
    assert error.code == p.ErrorCode.INVALID_VALUE
    assert core.core.queues == {}


@pytest.mark.parametrize("name", ["emails", "a.b-c_d:e/f", "é" * 127, "x" * 255, "Unit-Test-Queue"])
def test_good_queue_names_are_accepted(name: str) -> None:
    assert queue_name_problem(name) is None


def test_a_stock_producer_leaves_no_peer_state_behind(core: CoreHarness) -> None:
    for i in range(1000):
        core.send(b"peer-%d" % i, p.Send("jobs", b"x"))
    assert core.core.peers == {}
    assert core.stats("jobs")["ready"] == 1000


# ------------------------------------------------------------------------ draining


def test_draining_refuses_sends_and_stops_dispatch_but_takes_acks(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0), p.Send("jobs", b"b", 0))
    [held] = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    core.core.start_drain()
    [error] = errors(core.send(CONSUMER, p.Send("jobs", b"c", 0)))
    assert error.code == p.ErrorCode.SHUTTING_DOWN
    assert dispatches(core.send(CONSUMER, p.Ack("jobs", held.message_id))) == []
    assert core.core.in_flight == 0
    assert core.core.ready == 1


# ------------------------------------------------------------------------ admin


def test_stats_reports_queues_and_counters(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0), p.Send("jobs", b"b", 0))
    core.send(CONSUMER, p.Consume("jobs", 1))
    stats = core.admin("stats")
    assert stats["queues"]["jobs"] == {
        "ready": 1,
        "in_flight": 1,
        "delayed": 0,
        "consumers": 1,
        "dead_letters": 0,
        "leased": 0,
        "leases": 0,
        "oldest_sent_at": 1_800_000_000.0,
        "refused": 0,
        "totals": {
            "published": 2,
            "delivered": 1,
            "acked": 0,
            "requeued": 0,
            "expired": 0,
            "dead_lettered": 0,
        },
        "paused_producers": 0,
        "bindings": [],
        "binding_count": 0,
        "delete_when_unused_ms": None,
        "settings": {"max_deliveries": 20, "max_length": 1_000_000, "overflow": "reject"},
    }
    assert stats["counters"]["received"] == 2


def test_dead_letters_can_be_listed_replayed_and_purged(core: CoreHarness) -> None:
    core.send(PRODUCER, *[p.Send("jobs", b"%d" % i, 1) for i in range(3)])
    core.advance(2)
    core.turn()
    listed = core.admin("dlq-list", queue="jobs", limit=2)
    assert listed["total"] == 3
    assert [e["reason"] for e in listed["entries"]] == ["expired", "expired"]
    keep = listed["entries"][0]["id"]
    replayed = core.admin("dlq-replay", queue="jobs", ids=[keep])
    assert replayed == {"queue": "jobs", "replayed": 1}
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("jobs", 5)))
    assert (dispatch.message_id.decode(), dispatch.content, dispatch.ttl) == (keep, b"0", 0)
    assert core.admin("dlq-purge", queue="jobs") == {"queue": "jobs", "purged": 2}
    assert core.admin("dlq-list", queue="jobs")["total"] == 0


def test_bad_admin_commands_are_answered_with_an_error_reply(core: CoreHarness) -> None:
    error = core.admin("explode")["error"]
    assert error["code"] == p.ErrorCode.INVALID_VALUE
    assert "explode" in error["reason"]
    assert "nope" in core.admin("dlq-list", queue="nope")["error"]["reason"]
    core.send(PRODUCER, p.Send("x", b"x"))
    assert "limit" in core.admin("dlq-list", queue="x", limit=True)["error"]["reason"]


# ------------------------------------------------------------------------ review fixes


def test_messages_after_kbai_in_the_same_frame_start_a_fresh_peer(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0), p.Send("jobs", b"b", 0))
    held = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    assert len(held) == 1
    again = dispatches(core.send(CONSUMER, p.Kbai(), p.Consume("jobs", 5)))
    assert [d.content for d in again] == [b"a", b"b"]
    # The fresh peer is known, so its window is released when it leaves.
    core.core.peer_gone(CONSUMER)
    assert core.stats("jobs") == {"ready": 2, "in_flight": 0, "dead": 0}


def test_requeue_and_dead_letter_switch_a_pre_ttl_peer_to_the_ttl_form() -> None:
    core = CoreHarness(ttl_form_default=False)
    core.send(PRODUCER, p.Send("jobs", b"a"), p.Send("jobs", b"b"))
    [first] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    assert first.ttl is None
    [second] = dispatches(core.send(CONSUMER, p.DeadLetter("jobs", first.message_id)))
    assert second.ttl == 0


def test_consume_zero_for_an_unknown_queue_creates_nothing(core: CoreHarness) -> None:
    assert core.send(CONSUMER, p.Consume("never", 0)) == []
    assert core.core.queues == {}
    assert core.core.peers == {}


def test_dead_letter_entries_count_the_deliveries_made(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"never", 1), p.Send("jobs", b"twice", 0))
    core.advance(2)
    [first] = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    [second] = dispatches(core.send(CONSUMER, p.Requeue("jobs", first.message_id, 0)))
    assert second.delivery_count == 2
    core.send(CONSUMER, p.DeadLetter("jobs", second.message_id, "bad"))
    entries = {e.content: e.deliveries for e in core.core.queues["jobs"].dead}
    assert entries == {b"never": 0, b"twice": 2}
    core.send(CONSUMER, p.Consume("jobs", 0))
    core.admin("dlq-replay", queue="jobs", ids=[second.message_id.decode()])
    [replayed] = dispatches(core.send(CONSUMER, p.Consume("jobs", 2)))
    assert replayed.delivery_count == 3


def test_extension_types_clients_may_not_send_still_opt_the_peer_in(core: CoreHarness) -> None:
    [error] = errors(core.send(OTHER, p.AdminReply({})))
    assert error.code == p.ErrorCode.UNSUPPORTED_TYPE


def test_dlq_list_stays_under_the_packet_limit_and_says_it_was_cut() -> None:
    core = CoreHarness(max_content_bytes=10_000)
    core.send(PRODUCER, *[p.Send("big", b"x" * 2000, 1) for _ in range(10)])
    core.advance(2)
    core.turn()
    listed = core.admin("dlq-list", queue="big")
    assert listed["total"] == 10
    assert listed["truncated"] is True
    assert 0 < len(listed["entries"]) < 10
    assert len(p.encode(p.AdminReply(listed))) < 10_000


def test_every_error_names_the_type_of_the_message_it_refuses() -> None:
    core = CoreHarness(max_queue_length=1, max_window=10, max_content_bytes=100)
    [full] = errors(core.send(PRODUCER, HELLO, p.Send("q", b"a", 0), p.Send("q", b"b", 0)))
    [window] = core.send(CONSUMER, HELLO, p.Consume("q", 11))[1:]
    [unheld] = core.send(CONSUMER, p.Ack("q", b"f" * 32))
    [too_large] = core.send(PRODUCER, p.Send("q", b"x" * 101, 0))
    assert [(e.code, e.refused) for e in (full, window, unheld, too_large)] == [
        (429, p.MessageType.SEND),
        (422, p.MessageType.CONSUME),
        (404, p.MessageType.ACK),
        (413, p.MessageType.SEND),
    ]


def test_a_closable_peer_given_up_on_outside_a_turn_is_handed_out_for_closing_at_once() -> None:
    """The server gives up on a peer while sending (not reading, unreachable): its connection
    must close in that same turn, or bytes read next turn would make it a new peer holding
    messages it already got."""
    from phpmq.broker.core import PeerProfile

    core = CoreHarness()
    tcp = PeerProfile("tcp", ttl_form=False, closable=True)
    core.core.begin_turn()
    core.core.handle_frame(b"tcp-peer", p.encode(p.Consume("jobs", 5)), tcp)
    core.core.end_turn()
    assert core.core.peer_gone(b"tcp-peer") == 0
    assert core.core.take_closes() == [b"tcp-peer"]
    assert core.core.take_closes() == []
    assert core.core.end_turn().close == []  # handed out once
