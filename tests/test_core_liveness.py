"""Liveness, leases and limits in the pure core, with a fake clock."""

from __future__ import annotations

import phpmq.protocol as p
from harness import CoreHarness, dispatches, errors
from phpmq.broker.config import QueueSettings

PRODUCER = b"producer"
CONSUMER = b"consumer"
OTHER = b"other"


def hello(heartbeat_ms: int = 100, liveness: int = 3, **options: object) -> p.Hello:
    return p.Hello({"name": "t", "heartbeat_ms": heartbeat_ms, "liveness": liveness, **options})


def test_hello_agrees_on_heartbeats_within_the_brokers_range() -> None:
    core = CoreHarness(min_heartbeat_ms=50, max_heartbeat_ms=1000)
    [answer] = core.send(CONSUMER, hello(100, 4))
    assert (answer.options["heartbeat_ms"], answer.options["liveness"]) == (100, 4)
    [answer] = core.send(OTHER, hello(1, 99))
    assert (answer.options["heartbeat_ms"], answer.options["liveness"]) == (50, 10)
    [answer] = core.send(b"slow", hello(10**6))
    assert answer.options["heartbeat_ms"] == 1000
    [answer] = core.send(b"quiet", p.Hello({}))
    assert answer.options["heartbeat_ms"] == 0  # no heartbeats: leases protect its messages


def test_a_silent_heartbeating_consumer_is_dead_after_interval_times_liveness() -> None:
    core = CoreHarness()
    core.send(PRODUCER, *[p.Send("jobs", b"%d" % i, 0) for i in range(3)])
    held = dispatches(core.send(CONSUMER, hello(100, 3), p.Consume("jobs", 3))[1:])
    assert len(held) == 3
    core.advance(0.29)
    core.turn()
    assert core.stats("jobs")["in_flight"] == 3
    core.advance(0.02)
    core.turn()
    assert core.stats("jobs") == {"ready": 3, "in_flight": 0, "dead": 0}
    assert core.core.counters.peers_expired == 1
    assert CONSUMER not in core.core.peers
    again = dispatches(core.send(OTHER, hello(), p.Consume("jobs", 5))[1:])
    assert [d.delivery_count for d in again] == [2, 2, 2]
    assert [d.message_id for d in again] == [d.message_id for d in held]


def test_any_message_counts_as_a_heartbeat() -> None:
    core = CoreHarness()
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    core.send(CONSUMER, hello(100, 3), p.Consume("jobs", 1))
    for _ in range(10):
        core.advance(0.2)
        core.send(CONSUMER, p.Consume("jobs", 1))  # not a HEARTBEAT, but traffic
    assert core.stats("jobs")["in_flight"] == 1
    assert core.core.counters.peers_expired == 0


def test_the_broker_heartbeats_a_peer_only_when_otherwise_silent() -> None:
    core = CoreHarness()
    core.send(CONSUMER, hello(100, 3), p.Consume("jobs", 100))
    core.advance(0.1)
    assert core.turn() == {CONSUMER: [p.Heartbeat()]}
    core.advance(0.05)
    assert core.turn() == {}
    core.advance(0.05)
    # A dispatch goes out instead (and the consumer's own heartbeat keeps it alive).
    out = core.turn((PRODUCER, p.Send("jobs", b"x", 0)), (CONSUMER, p.Heartbeat()))
    assert [type(m) for m in out[CONSUMER]] == [p.Dispatch]
    core.advance(0.1)
    assert core.turn() == {CONSUMER: [p.Heartbeat()]}


def test_next_deadline_wakes_the_shell_for_heartbeats_and_expiry() -> None:
    core = CoreHarness()
    core.send(CONSUMER, hello(100, 3))
    now = core.core.now
    assert core.core.next_deadline() == now + 100_000_000


def test_a_heartbeat_from_an_unknown_peer_is_answered_with_disconnect() -> None:
    core = CoreHarness()
    [answer] = core.send(CONSUMER, p.Heartbeat())
    assert isinstance(answer, p.Disconnect)
    assert "HELLO" in (answer.reason or "")


def test_a_silent_stock_consumers_message_comes_back_after_the_lease_and_not_to_it() -> None:
    core = CoreHarness(lease_ms=1000)
    core.send(PRODUCER, p.Send("jobs", b"a"), p.Send("jobs", b"b"))
    [first] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    core.advance(0.99)
    core.turn()
    assert core.stats("jobs")["in_flight"] == 1
    core.advance(0.01)
    out = core.turn()
    # Back at the head; the window has room again, but the consumer said nothing for a whole
    # lease (frozen or gone): it gets nothing new until it speaks.
    assert CONSUMER not in out
    assert core.stats("jobs") == {"ready": 2, "in_flight": 0, "dead": 0}
    assert core.core.counters.lease_expired == 1
    assert core.core.counters.stalled_consumers == 1
    [again] = dispatches(core.send(OTHER, p.Consume("jobs", 1)))
    assert (again.message_id, again.content) == (first.message_id, b"a")
    # It speaks again (a late ack, of a message it no longer holds): it gets work again.
    [second] = dispatches(core.send(CONSUMER, p.Ack("jobs", first.message_id)))
    assert second.content == b"b"
    assert core.core.counters.acked == 0


def test_a_consumer_that_acked_during_the_lease_gets_its_late_message_again() -> None:
    core = CoreHarness(lease_ms=1000)
    core.send(PRODUCER, p.Send("jobs", b"a"), p.Send("jobs", b"b"))
    first, second = dispatches(core.send(CONSUMER, p.Consume("jobs", 2)))
    core.advance(0.5)
    core.send(CONSUMER, p.Ack("jobs", first.message_id))
    core.advance(0.5)
    # Alive (it acked within the lease), only slow with this one: it may have it again.
    [again] = dispatches(core.turn()[CONSUMER])
    assert again.message_id == second.message_id
    assert core.core.counters.stalled_consumers == 0


def test_a_late_ack_after_the_lease_moved_the_message_elsewhere_is_refused() -> None:
    core = CoreHarness(lease_ms=1000)
    core.send(PRODUCER, p.Send("jobs", b"a"))
    [first] = dispatches(core.send(CONSUMER, p.Hello({}), p.Consume("jobs", 1))[1:])
    core.send(CONSUMER, p.Consume("jobs", 0))  # stops; still holds the message
    core.send(OTHER, p.Consume("jobs", 1))
    core.advance(1)
    out = core.turn()
    assert [d.message_id for d in dispatches(out[OTHER])] == [first.message_id]
    [error] = errors(core.send(CONSUMER, p.Ack("jobs", first.message_id)))
    assert error.code == p.ErrorCode.UNKNOWN_MESSAGE
    assert core.stats("jobs") == {"ready": 0, "in_flight": 1, "dead": 0}


def test_a_live_heartbeating_consumer_needs_no_lease() -> None:
    core = CoreHarness(lease_ms=1000, max_heartbeat_ms=60_000)
    core.send(PRODUCER, p.Send("jobs", b"a"))
    core.send(CONSUMER, hello(60_000, 3), p.Consume("jobs", 1))
    core.advance(100)
    core.turn()
    assert core.stats("jobs")["in_flight"] == 1


def test_a_consume_may_set_its_own_lease() -> None:
    core = CoreHarness()
    core.send(PRODUCER, p.Send("jobs", b"a"))
    core.send(CONSUMER, hello(1000, 3), p.Consume("jobs", 1, lease_ms=500))
    core.advance(0.5)
    core.send(CONSUMER, p.Heartbeat())
    assert core.core.counters.lease_expired == 1


def test_max_in_flight_time_applies_to_heartbeating_consumers_too() -> None:
    core = CoreHarness(max_in_flight_ms=2000)
    core.send(PRODUCER, p.Send("jobs", b"a"))
    core.send(CONSUMER, hello(1000, 3), p.Consume("jobs", 1))
    core.advance(1)
    core.send(CONSUMER, p.Heartbeat())
    core.advance(1)
    core.send(CONSUMER, p.Heartbeat())
    assert core.core.counters.lease_expired == 1


def test_a_poison_message_is_dead_lettered_after_max_deliveries() -> None:
    core = CoreHarness(max_deliveries=3)
    core.send(PRODUCER, p.Send("jobs", b"poison", 0))
    seen = []
    out = core.turn((CONSUMER, [hello(), p.Consume("jobs", 1)]))
    for _ in range(5):
        got = dispatches(out.get(CONSUMER, []))
        if not got:
            break
        seen.append(got[0].delivery_count)
        out = core.turn((CONSUMER, p.Requeue("jobs", got[0].message_id, 0)))
    assert seen == [1, 2, 3]
    [entry] = core.core.queues["jobs"].dead
    assert (entry.reason, entry.deliveries) == ("max-deliveries", 3)
    assert core.core.counters.max_deliveries == 1


def test_dead_consumers_count_towards_max_deliveries() -> None:
    core = CoreHarness(max_deliveries=2)
    core.send(PRODUCER, p.Send("jobs", b"kills consumers", 0))
    for consumer in (b"c1", b"c2"):
        assert dispatches(core.send(consumer, p.Consume("jobs", 1)))
        core.core.peer_gone(consumer)
    assert core.stats("jobs") == {"ready": 0, "in_flight": 0, "dead": 1}
    assert core.core.queues["jobs"].dead[0].reason == "max-deliveries"


def test_a_full_queue_rejects_sends_with_429() -> None:
    core = CoreHarness(max_queue_length=2)
    replies = core.send(PRODUCER, p.Hello({}), *[p.Send("jobs", b"%d" % i, 0) for i in range(3)])
    [error] = errors(replies)
    assert error.code == p.ErrorCode.LIMIT_REACHED
    assert "full" in error.reason and error.queue == "jobs"
    assert core.stats("jobs")["ready"] == 2


def test_a_full_drop_oldest_queue_buries_the_oldest() -> None:
    core = CoreHarness(queues={"jobs": QueueSettings(max_length=2, overflow="drop-oldest")})
    core.send(PRODUCER, *[p.Send("jobs", b"%d" % i, 0) for i in range(3)])
    core.send(PRODUCER, p.Send("other", b"x", 0))
    queue = core.core.queues["jobs"]
    assert [(e.content, e.reason) for e in queue.dead] == [(b"0", "overflow")]
    got = dispatches(core.send(CONSUMER, p.Consume("jobs", 5)))
    assert [d.content for d in got] == [b"1", b"2"]
    assert core.core.queues["other"].max_length == 1_000_000  # the default elsewhere


def test_consumers_and_queues_are_bounded() -> None:
    core = CoreHarness(max_consumers=1, max_queues=2)
    core.send(CONSUMER, p.Consume("a", 1))
    [error] = errors(core.send(OTHER, p.Hello({}), p.Consume("a", 1))[1:])
    assert error.code == p.ErrorCode.LIMIT_REACHED and "consumers" in error.reason
    core.send(PRODUCER, p.Send("b", b"x"))
    [error] = errors(core.send(OTHER, p.Send("c", b"x")))
    assert error.code == p.ErrorCode.LIMIT_REACHED and "queues" in error.reason
    assert sorted(core.core.queues) == ["a", "b"]


def test_draining_tells_every_extension_peer_to_go() -> None:
    core = CoreHarness()
    core.send(CONSUMER, hello())
    core.send(PRODUCER, p.Send("jobs", b"x"))  # a stock peer: nothing to tell
    core.core.start_drain()
    out = core.turn()
    assert list(out) == [CONSUMER]
    [message] = out[CONSUMER]
    assert isinstance(message, p.Disconnect) and "shutting down" in (message.reason or "")


def test_a_quiet_extension_peer_without_heartbeats_is_eventually_forgotten() -> None:
    core = CoreHarness(idle_peer_seconds=60)
    core.send(OTHER, p.Hello({}))
    core.advance(59)
    core.turn()
    assert OTHER in core.core.peers
    core.advance(1)
    core.turn()
    assert OTHER not in core.core.peers


def test_ten_thousand_identities_leave_no_state_behind() -> None:
    core = CoreHarness(idle_peer_seconds=1)
    for i in range(10_000):
        peer = b"churn-%d" % i
        core.send(peer, hello(), p.Send("jobs", b"x", 0), p.Kbai())
        core.send(b"stock-%d" % i, p.Send("jobs", b"y"))
    assert core.core.peers == {}
    assert len(core.core.deadlines) < 20_001  # stale timers drain as they come due
    core.advance(1)
    for _ in range(3):  # at most DUE_PER_TURN entries a turn
        core.turn()
    assert len(core.core.deadlines) == 0
    assert core.stats("jobs")["ready"] == 20_000


def test_acked_messages_with_long_ttls_do_not_pile_up_in_the_expiry_heap() -> None:
    core = CoreHarness()
    core.send(CONSUMER, hello(60_000), p.Consume("jobs", 1000))
    for _ in range(200):
        out = core.turn((PRODUCER, [p.Send("jobs", b"x", 3600) for _ in range(1000)]))
        acks = [p.Ack("jobs", d.message_id) for d in dispatches(out[CONSUMER])]
        core.turn((CONSUMER, acks))
    assert core.core.counters.acked == 200_000
    assert len(core.core.deadlines) <= 2 * 65_536


def test_a_fast_stock_consumer_costs_one_lease_timer_per_window() -> None:
    core = CoreHarness(lease_ms=60_000)
    core.send(CONSUMER, p.Consume("jobs", 100))
    for _ in range(100):
        out = core.turn((PRODUCER, [p.Send("jobs", b"x") for _ in range(100)]))
        acks = [p.Ack("jobs", d.message_id) for d in dispatches(out[CONSUMER])]
        core.turn((CONSUMER, acks))
    assert core.core.counters.acked == 10_000
    assert len(core.core.deadlines) == 1


def test_a_hello_after_other_traffic_still_arms_the_heartbeat_expiry() -> None:
    """The reference client's rejoin: HEARTBEAT, DISCONNECT 'unknown peer', then HELLO."""
    core = CoreHarness()
    [answer] = core.send(CONSUMER, p.Heartbeat())
    assert isinstance(answer, p.Disconnect)
    core.send(CONSUMER, hello(100, 3), p.Consume("jobs", 1))
    core.send(PRODUCER, p.Send("jobs", b"x"))
    core.advance(0.31)
    core.turn()
    assert CONSUMER not in core.core.peers
    assert core.stats("jobs") == {"ready": 1, "in_flight": 0, "dead": 0}


def test_a_shorter_lease_set_later_is_enforced_on_time() -> None:
    core = CoreHarness(lease_ms=60_000)
    core.send(PRODUCER, p.Send("jobs", b"a"), p.Send("jobs", b"b"))
    core.send(CONSUMER, p.Consume("jobs", 1))
    core.send(CONSUMER, p.Consume("jobs", 2, lease_ms=1000))
    core.advance(1)
    core.turn()
    assert core.core.counters.lease_expired == 1  # b, under the 1 s lease
    core.advance(59)
    core.turn()
    assert core.core.counters.lease_expired >= 2  # a, under the 60 s one


def test_the_hello_answer_states_the_lease_this_peer_gets() -> None:
    core = CoreHarness(lease_ms=30_000, max_in_flight_ms=10_000, heartbeat_ms=2000)
    [stock_like] = core.send(CONSUMER, p.Hello({}))
    [heartbeating] = core.send(OTHER, hello(100))
    assert stock_like.options["lease_ms"] == 10_000
    assert heartbeating.options["lease_ms"] == 10_000
    assert heartbeating.options["broker_heartbeat_ms"] == 2000
    plain = CoreHarness(lease_ms=30_000)
    [answer] = plain.send(OTHER, hello(100))
    assert answer.options["lease_ms"] == 0


def test_a_delayed_requeue_stays_out_of_the_queue_until_the_delay_is_over() -> None:
    core = CoreHarness()
    core.send(PRODUCER, p.Send("jobs", b"retry me", 0), p.Send("jobs", b"next", 0))
    [first] = dispatches(core.send(CONSUMER, hello(60_000), p.Consume("jobs", 1))[1:])
    [second] = dispatches(core.send(CONSUMER, p.Requeue("jobs", first.message_id, 0, 500)))
    assert second.content == b"next"
    assert core.stats("jobs") == {"ready": 0, "in_flight": 1, "dead": 0}
    assert core.core.queues["jobs"].delayed == 1
    core.send(CONSUMER, p.Ack("jobs", second.message_id))
    core.advance(0.49)
    assert dispatches(core.turn().get(CONSUMER, [])) == []
    core.advance(0.01)
    [again] = dispatches(core.turn()[CONSUMER])
    assert (again.message_id, again.delivery_count) == (first.message_id, 2)
    assert core.core.queues["jobs"].delayed == 0


def test_a_delayed_requeue_counts_towards_max_deliveries() -> None:
    core = CoreHarness(max_deliveries=1)
    core.send(PRODUCER, p.Send("jobs", b"x", 0))
    [first] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    core.send(CONSUMER, p.Requeue("jobs", first.message_id, 0, 1000))
    assert core.core.queues["jobs"].dead[0].reason == "max-deliveries"
    assert core.core.queues["jobs"].delayed == 0


def test_headers_travel_to_extension_consumers_only() -> None:
    core = CoreHarness()
    core.send(
        PRODUCER,
        p.Send("jobs", b"a", 0, headers=b'{"timeout":  3}'),
        p.Send("jobs", b"b", 0, headers=b'{"x": 1}'),
    )
    [with_headers] = dispatches(core.send(CONSUMER, hello(60_000), p.Consume("jobs", 1))[1:])
    assert with_headers.headers == b'{"timeout":  3}'  # the producer's bytes, untouched
    [stock] = dispatches(core.send(OTHER, p.Consume("jobs", 1)))
    assert stock.headers is None and stock.content == b"b"


def test_late_acks_of_a_peer_declared_dead_are_refused_with_errors() -> None:
    """SIGSTOP then SIGCONT: the broker gave up on the consumer; what it says next gets
    ERRORs (not the silence a stock peer gets), and its heartbeat is told to start over."""
    core = CoreHarness()
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    [held] = dispatches(core.send(CONSUMER, hello(100, 3), p.Consume("jobs", 1))[1:])
    core.advance(0.31)
    core.turn()
    [error] = errors(core.send(CONSUMER, p.Ack("jobs", held.message_id)))
    assert error.code == p.ErrorCode.UNKNOWN_MESSAGE
    [answer] = core.send(CONSUMER, p.Heartbeat())
    assert isinstance(answer, p.Disconnect) and answer.reason.startswith("unknown peer")
    assert core.stats("jobs") == {"ready": 1, "in_flight": 0, "dead": 0}
