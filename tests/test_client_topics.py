"""The client's events, sans-IO (phpmq/client/topics.py through the Connection): publish,
consumes carrying patterns and unused time (also in every greeting), cancel, and the broker's
unasked CANCEL of a deleted queue. Plain bytes and plain numbers, as in
test_client_connection.py.
"""

from __future__ import annotations

import pytest

import phpmq.protocol as p
from phpmq.client import InvalidArgument
from phpmq.client.connection import Connection
from phpmq.client.events import SubscriptionEnded
from phpmq.client.topics import LIVE_PREFIX, live_queue_name, rebind_options, unused_ms

QUEUE = "orders"


def decoded(frame: bytes) -> list[p.Message]:
    messages, error = p.decode_frame(frame)
    assert error is None, error
    return messages


def greeted() -> Connection:
    connection = Connection()
    connection.start(0.0)
    connection.sent(connection.frame(b""), 0.0)
    return connection


def dispatch(queue: str, message_id: bytes, event: bytes = b"") -> bytes:
    return p.encode(p.Dispatch(queue, b"x", message_id, 0, 1, None, event or None))


def test_a_publish_carries_event_ttl_tag_key_and_headers() -> None:
    connection = greeted()
    frame = connection.publish("order.paid", "17", 60, {"a": 1}, tag=3, key="k-17")
    assert decoded(frame) == [p.Publish("order.paid", b"17", 60, 3, "k-17", b'{"a":1}')]
    assert decoded(connection.publish("a.b", b"x")) == [p.Publish("a.b", b"x", 0)]


@pytest.mark.parametrize("event", ["", "order.*", "a..b", "has space", "audit.#"])
def test_an_event_name_the_broker_would_refuse_raises_before_sending(event: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        greeted().publish(event, b"x")
    assert raised.value.code == 422 and isinstance(raised.value, ValueError)


def test_a_publish_confirm_says_how_many_queues_got_a_copy() -> None:
    connection = greeted()
    connection.sent(connection.publish("a.b", b"x", tag=0), 1.0, 1, [0])
    connection.sent(connection.publish("a.b", b"x", tag=1, key="k"), 1.0, 1, [1])
    confirms = p.encode(p.Confirm(b"a" * 32, 0, 3)) + p.encode(p.Confirm(b"a" * 32, 1))
    connection.receive(confirms, 2.0)
    assert connection.take_answers([0, 1]) == ["a" * 32, "a" * 32]
    assert connection.publish_count(0) == 3
    assert connection.publish_count(1) == 0  # a repeated key: nothing copied again


def test_an_unconfirmed_publish_refusal_is_kept_for_the_caller() -> None:
    connection = greeted()
    refusal = p.Error(503, "draining", refused=p.MessageType.PUBLISH)
    connection.receive(p.encode(refusal), 1.0)
    assert connection.refusals.take_sends() == [refusal]


def test_a_consume_carries_its_patterns_and_unused_time_in_every_greeting() -> None:
    connection = greeted()
    frame = connection.subscribe(QUEUE, 10, ["order.*", "audit.#"], 0)
    expected = p.Consume(QUEUE, 10, patterns="order.* audit.#", unused_ms=0)
    assert decoded(frame) == [expected]
    connection.start(5.0)  # a new transport
    assert decoded(connection.frame(b""))[1:] == [expected]
    assert decoded(connection.subscribe(QUEUE, 0)) == [p.Consume(QUEUE, 0)]
    connection.start(6.0)
    assert decoded(connection.frame(b""))[1:] == []


def test_a_single_pattern_string_is_one_pattern_and_bad_ones_raise() -> None:
    connection = greeted()
    assert decoded(connection.subscribe(QUEUE, 1, "order.*")) == [
        p.Consume(QUEUE, 1, patterns="order.*")
    ]
    for bad in (["a b"], ["user*"], [""], [7]):
        with pytest.raises(InvalidArgument):
            connection.subscribe(QUEUE, 1, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        unused_ms(-1)
    assert unused_ms(None) is None and unused_ms(1.5) == 1500


def test_rebind_options_are_checked_and_replace_only_when_given() -> None:
    assert rebind_options(None, ["a"], ["b.*"], ["c.#"]) == {
        "remove": ["a"],
        "remove_mask": ["b.*"],
        "add": ["c.#"],
    }
    assert rebind_options([], (), (), ())["replace"] == []
    with pytest.raises(InvalidArgument):
        rebind_options(None, ["a..b"], (), ())


def test_live_queue_names_are_the_prefix_and_16_hex_digits() -> None:
    name = live_queue_name()
    assert name.startswith(LIVE_PREFIX) and len(name) == len(LIVE_PREFIX) + 16
    int(name[len(LIVE_PREFIX) :], 16)
    assert live_queue_name() != name


def test_dispatches_carry_the_event_they_were_published_as() -> None:
    connection = greeted()
    connection.receive(dispatch(QUEUE, b"a" * 32, b"order.paid") + dispatch(QUEUE, b"b" * 32), 1)
    published, sent = connection.received
    assert published.event == "order.paid" and "event=order.paid" in repr(published)
    assert sent.event is None


def test_cancel_stops_the_subscription_and_drops_what_was_not_handed_out() -> None:
    connection = greeted()
    connection.subscribe(QUEUE, 10, ["order.*"])
    connection.subscribe("other", 10)
    connection.receive(dispatch(QUEUE, b"a" * 32) + dispatch("other", b"b" * 32), 1.0)
    assert decoded(connection.cancel(QUEUE)) == [p.Cancel(QUEUE)]
    assert [m.queue for m in connection.received] == ["other"]
    assert connection.topics.take_cancelled(QUEUE) is None  # not answered yet
    # A delivery sent before the broker read the cancel: it took that one back too.
    late = dispatch(QUEUE, b"c" * 32) + p.encode(p.Cancel(QUEUE, "cancelled", 2))
    assert connection.receive(late, 2.0) == ()
    assert [m.queue for m in connection.received] == ["other"]
    assert connection.topics.take_cancelled(QUEUE) == 2
    assert connection.window(QUEUE) is None
    connection.start(3.0)
    assert decoded(connection.frame(b""))[1:] == [p.Consume("other", 10)]


def test_a_cancel_awaited_when_the_transport_is_replaced_is_done() -> None:
    connection = greeted()
    connection.subscribe(QUEUE, 1)
    connection.cancel(QUEUE)
    connection.start(1.0)
    assert connection.topics.take_cancelled(QUEUE) == 0


def test_a_deleted_queue_ends_its_subscription_and_is_kept_for_the_caller() -> None:
    connection = greeted()
    connection.subscribe(QUEUE, 10, ["order.*"], 0)
    connection.receive(dispatch(QUEUE, b"a" * 32), 1.0)
    deleted = p.Cancel(QUEUE, "queue deleted", 1)
    assert connection.receive(p.encode(deleted), 2.0) == [SubscriptionEnded(deleted)]
    assert not connection.received
    assert connection.topics.deleted == {QUEUE: deleted}
    connection.start(3.0)
    assert decoded(connection.frame(b""))[1:] == []  # not consumed again
    connection.subscribe(QUEUE, 10)  # subscribed anew: the old news is dropped
    assert connection.topics.deleted == {}


def test_a_cancel_for_a_queue_not_consumed_is_no_news() -> None:
    connection = greeted()
    connection.subscribe(QUEUE, 0)
    assert connection.receive(p.encode(p.Cancel(QUEUE, "queue deleted", 0)), 1.0) == ()
    assert connection.receive(p.encode(p.Cancel("x", "cancelled", 0)), 1.0) == ()
    assert connection.topics.deleted == {}
