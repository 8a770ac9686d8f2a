"""Events with both clients against a real broker (docs/protocol.md §6.5, docs/client.md
"Events"): publish to bound queues, bindings over admin, live feeds, cancel, and a queue
deleted under its consumer. Skipped while the broker does not route events yet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from driven import Connect

from harness import BrokerProcess, free_port, read_until, wait_until
from phpmq.client import BrokerRefused, InvalidArgument, QueueDeleted


@pytest.fixture
def events_broker(broker: BrokerProcess) -> BrokerProcess:
    if "published" not in broker.stats()["counters"]:
        pytest.skip("this broker does not route events yet (docs/protocol.md §6.5)")
    return broker


def test_a_publish_reaches_every_bound_queue_once_with_its_event(
    events_broker: BrokerProcess, connect: Connect
) -> None:
    with connect(events_broker.address) as client:
        assert client.bind("billing", "order.*", "order.paid") == ["order.*", "order.paid"]
        assert client.bind("audit", "#") == ["#"]
        assert client.publish("order.paid", b"17", ttl=60, headers={"by": "shop"}) == 2
        assert client.publish("user.created", b"ada") == 1
        assert client.publish("order.paid", b"again", confirm=False) is None
        got = {}
        for message in client.consume("billing", window=10, timeout=5):
            got[message.content] = message
            message.ack()
            if len(got) == 2:
                break
        assert got[b"17"].event == "order.paid" and got[b"17"].headers == {"by": "shop"}
        assert 55 <= got[b"17"].ttl <= 60
        assert set(got) == {b"17", b"again"}
    stats = events_broker.stats()
    assert stats["queues"]["audit"]["ready"] == 3
    assert stats["counters"]["published"] == 3 and stats["counters"]["routed"] == 5


def test_bindings_change_by_unbind_and_rebind_and_bad_input_raises(
    events_broker: BrokerProcess, connect: Connect
) -> None:
    with connect(events_broker.address) as client:
        client.bind("q", "order.paid", "order.*", "user.#")
        assert client.unbind("q", "user.#") == ["order.paid", "order.*"]
        assert client.rebind("q", remove_mask=["order.*"], add=["audit.#"]) == ["audit.#"]
        assert client.rebind("q", replace=["a.b", "c.*"]) == ["a.b", "c.*"]
        assert client.bindings("q") == ["a.b", "c.*"]
        with pytest.raises(InvalidArgument):
            client.bind("q", "a..b")
        with pytest.raises(InvalidArgument):
            client.publish("order.*", b"x")
        with pytest.raises(BrokerRefused) as missing:
            client.bindings("no-such-queue")
        assert missing.value.error.code == 404
        assert client.publish("nothing.bound", b"x") == 0


def test_a_consume_binds_in_the_same_request(
    events_broker: BrokerProcess, connect: Connect
) -> None:
    with connect(events_broker.address) as client:
        client.subscribe("mail", 5, bind=["user.*.created"])
        assert client.publish("user.42.created", b"hi") == 1
        message = client.receive(5)
        assert message is not None and message.event == "user.42.created"
        message.ack()
        assert client.bindings("mail") == ["user.*.created"]


def test_a_live_feed_gets_events_and_goes_away_with_its_subscriber(
    events_broker: BrokerProcess, connect: Connect
) -> None:
    with connect(events_broker.address) as subscriber:
        feed = subscriber.subscribe_events("metric.#", window=10)
        assert feed.startswith("live.")
        with connect(events_broker.address) as publisher:
            assert publisher.publish("metric.cpu", b"0.5") == 1
        message = subscriber.receive(5)
        assert message is not None and message.queue == feed and message.event == "metric.cpu"
        message.ack()
        assert subscriber.cancel(feed) == 0
    queues = read_until(lambda: events_broker.stats()["queues"], lambda queues: feed not in queues)
    assert feed not in queues


def test_cancel_gives_back_what_the_client_held(
    events_broker: BrokerProcess, connect: Connect
) -> None:
    with connect(events_broker.address) as client:
        client.send_many("jobs", [b"a", b"b", b"c"], confirm=True)
        client.subscribe("jobs", 3)
        first = client.receive(5)
        assert first is not None
        first.ack()
        assert client.cancel("jobs") == 2
        assert client.receive(0.3) is None
        assert events_broker.stats()["queues"]["jobs"]["ready"] == 2
        assert client.purge("jobs") == 2


def test_a_queue_deleted_under_its_consumer_raises_queue_deleted(
    events_broker: BrokerProcess, connect: Connect
) -> None:
    with connect(events_broker.address) as consumer, connect(events_broker.address) as admin:
        consumer.send_many("doomed", [b"a", b"b"], confirm=True)
        consumer.subscribe("doomed", 1, bind=["doom.*"])
        assert consumer.receive(5) is not None
        deleted = admin.delete_queue("doomed")
        assert deleted["queue"] == "doomed" and deleted["in_flight"] == 1
        assert deleted["purged"] == 1 and deleted["bindings"] == 1
        with pytest.raises(QueueDeleted) as raised:
            for _ in range(20):
                consumer.receive(0.25)
        assert raised.value.queue == "doomed" and raised.value.count == 1
        assert raised.value.error.code == 404
        assert consumer.receive(0.3) is None  # told once; the subscription is over
    assert "doomed" not in events_broker.stats()["queues"]



def test_a_live_feed_is_bound_again_by_a_restarted_broker(tmp_path: Path, connect: Connect) -> None:
    """The feed's consume carries its patterns in every greeting: a broker that lost the
    queue (an in-memory restart) makes it again, bound, when the client comes back."""
    address = f"tcp://127.0.0.1:{free_port()}"
    options = {"heartbeat_ms": 100, "liveness": 3, "send_timeout": 2}
    first = BrokerProcess(tmp_path / "a.log", "--grace-seconds", "0", address=address)
    second = None
    try:
        subscriber = connect(address, **options)
        feed = subscriber.subscribe_events("tick.#", window=10)
        _publish_until_routed(connect(address, **options), "tick.one", b"1")
        first.kill()
        second = BrokerProcess(tmp_path / "b.log", address=address)
        _publish_until_routed(connect(address, **options), "tick.two", b"2")
        contents = []
        while (message := subscriber.receive(5)) is not None:
            assert message.queue == feed
            contents.append(message.content)
            message.ack()
            if b"2" in contents:
                break
        assert b"2" in contents
        subscriber.close()
    finally:
        first.kill()
        if second is not None:
            second.stop()


def _publish_until_routed(client: Any, event: str, content: bytes) -> None:
    """Publish until a queue is bound to take it (a consume is on its way), then close."""
    with client:
        wait_until(lambda: client.publish(event, content), interval=0.05)
