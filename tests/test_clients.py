"""The clients' behaviour against a real broker, once with `Client` and once with `AsyncClient`.

Tests drive either client the blocking way through the `connect` fixture (tests/driven.py).
The asyncio-only tests at the end use the loop directly.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq
from driven import Connect

from harness import BrokerProcess, configured_broker, free_port
from phpmq.client import (
    RECONNECTED,
    REJOINED,
    AsyncClient,
    BrokerRefused,
    Unconfirmed,
)

MESSAGE_ID = re.compile(r"^[0-9a-f]{32}$")


def test_send_consume_ack_round_trip_carries_headers(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address) as producer:
        producer.send("emails", b"hello", ttl=3600, headers={"timeout": 30})
        producer.send("emails", "world")
    got = []
    with connect(broker.address) as consumer:
        for message in consumer.consume("emails", window=10, timeout=5):
            got.append(message)
            message.ack()
            if len(got) == 2:
                break
    assert [m.content for m in got] == [b"hello", b"world"]
    assert got[0].headers == {"timeout": 30} and got[1].headers == {}
    assert 3595 <= got[0].ttl <= 3600 and got[1].ttl == 0
    stats = broker.stats()
    assert stats["counters"]["acked"] == 2
    assert stats["queues"]["emails"]["ready"] == stats["queues"]["emails"]["in_flight"] == 0


def test_a_client_given_no_address_connects_to_the_broker_phpmq_broker_names(
    broker: BrokerProcess, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHPMQ_BROKER", broker.address)
    with connect() as client:
        assert client.address == broker.address
        client.send("emails", b"addressed by the environment", confirm=True)
    assert broker.stats()["queues"]["emails"]["ready"] == 1
    monkeypatch.delenv("PHPMQ_BROKER")
    assert connect(send_timeout=0.2).address == "tcp://127.0.0.1:5555"


def test_requeue_redelivers_and_dead_letter_keeps_the_reason(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address) as client:
        client.send("jobs", b"flaky")
        first = next(client.consume("jobs", window=1, timeout=5))
        first.requeue()
        second = client.receive(5)
        assert second is not None and second.content == b"flaky"
        assert second.delivery_count == 2
        second.dead_letter("gave up")
        client.flush()
        dead = client.admin("dlq-list", queue="jobs")
    assert broker.stats()["queues"]["jobs"]["dead_letters"] == 1
    assert "gave up" in str(dead)


def test_a_confirmed_send_returns_the_id_the_consumer_sees(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address) as client:
        message_id = client.send("orders", b"order 17", confirm=True)
        assert message_id is not None and MESSAGE_ID.match(message_id)
        message = next(client.consume("orders", window=1, timeout=5))
        assert message.id == message_id
        message.ack()


def test_send_many_confirms_in_order_and_a_repeated_key_confirms_the_first_id(
    broker: BrokerProcess, connect: Connect
) -> None:
    confirmed: list[tuple[int, str]] = []
    with connect(broker.address) as client:
        ids = client.send_many(
            "orders",
            [b"a", b"b", b"c"],
            confirm=True,
            keys=["k-a", "k-b", "k-c"],
            on_confirm=lambda index, message_id: confirmed.append((index, message_id)),
        )
        assert len(ids) == 3 and len(set(ids)) == 3
        assert confirmed == list(enumerate(ids))
        assert client.send_many("orders", [b"b again"], confirm=True, keys=["k-b"]) == [ids[1]]
        assert client.send("orders", b"c again", confirm=True, key="k-c") == ids[2]
        assert client.send_many("orders", [b"x", b"y"]) == 2
    assert broker.stats()["queues"]["orders"]["ready"] == 5


def test_a_refused_confirmed_send_raises_broker_refused_with_the_code(
    tmp_path: Path, connect: Connect
) -> None:
    # A limit no PAUSE covers (a full queue pauses its producer: tests/test_flow_control.py).
    broker = configured_broker(tmp_path, "max_queues = 1\n")
    with broker, connect(broker.address) as client:
        client.send("small", b"fits", confirm=True)
        with pytest.raises(BrokerRefused) as refused:
            client.send("second", b"one queue too many", confirm=True)
        assert refused.value.error.code == 429
        with pytest.raises(Unconfirmed) as unconfirmed:
            client.send_many("second", [b"a", b"b"], confirm=True)
        assert unconfirmed.value.ids == [None, None]
        assert {error.code for error in unconfirmed.value.errors.values()} == {429}


def test_admin_answers_stats_and_refuses_an_unknown_command(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address) as client:
        client.send("stats-q", b"one")
        stats = client.admin("stats")
        assert stats["queues"]["stats-q"]["ready"] == 1
        with pytest.raises(BrokerRefused):
            client.admin("no-such-command")


def test_the_window_bounds_unacked_messages(broker: BrokerProcess, connect: Connect) -> None:
    with connect(broker.address) as producer:
        producer.send_many("windowed", [b"%d" % i for i in range(10)])
    with connect(broker.address) as consumer:
        consumer.subscribe("windowed", 3)
        held = [consumer.receive(5) for _ in range(3)]
        assert all(message is not None for message in held)
        assert consumer.receive(0.3) is None, "a fourth message came past a window of 3"
        assert broker.stats()["queues"]["windowed"]["in_flight"] == 3
        held[0].ack()
        consumer.flush()
        fourth = consumer.receive(5)
        assert fourth is not None and fourth.content == b"3"


def test_a_clean_close_returns_unacked_messages_to_the_queue(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address) as producer:
        producer.send_many("held", [b"a", b"b", b"c"])
    consumer = connect(broker.address)
    consumer.subscribe("held", 2)
    held = [consumer.receive(5), consumer.receive(5)]
    assert [message.content for message in held] == [b"a", b"b"]
    consumer.close()
    queue = broker.stats()["queues"]["held"]
    assert queue["ready"] == 3 and queue["in_flight"] == 0
    with connect(broker.address) as second:
        again = next(second.consume("held", window=1, timeout=5))
        assert again.content == b"a" and again.delivery_count == 2


def test_consuming_goes_on_across_a_broker_restart(tmp_path: Path, connect: Connect) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    events: list[str] = []
    options = {"heartbeat_ms": 100, "liveness": 3, "send_timeout": 2}
    first = BrokerProcess(tmp_path / "a.log", "--grace-seconds", "0", address=address)
    second = None
    try:
        consumer = connect(address, on_event=lambda event, _: events.append(event), **options)
        with connect(address, **options) as producer:
            producer.send("restart", b"before", confirm=True)
        message = next(consumer.consume("restart", window=10, timeout=5))
        assert message.content == b"before"
        message.ack()
        consumer.flush()
        first.kill()
        second = BrokerProcess(tmp_path / "b.log", address=address)
        with connect(address, **options) as producer:
            producer.send("restart", b"after", confirm=True)
        message = consumer.receive(10)
        assert message is not None and message.content == b"after"
        assert {REJOINED, RECONNECTED} & set(events), events
        message.ack()
        consumer.flush()
    finally:
        first.kill()
        if second is not None:
            second.stop()


def test_a_broker_that_never_answers_leaves_a_confirmed_send_unconfirmed(connect: Connect) -> None:
    silent = zmq.Context.instance().socket(zmq.ROUTER)
    silent.linger = 0
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        client = connect(f"tcp://127.0.0.1:{port}", confirm_timeout=0.5, close_timeout=0.2)
        started = time.monotonic()
        with pytest.raises(Unconfirmed) as raised:
            client.send("void", b"into the void", confirm=True)
        assert raised.value.ids == [None]
        assert 0.5 <= time.monotonic() - started < 3
        with pytest.raises(Unconfirmed):
            client.send_many("void", [b"a", b"b"], confirm=True)
        assert silent.poll(1000), "the client's frames never reached the socket"
    finally:
        silent.close(linger=0)


# --------------------------------------------------------------------------- asyncio only


def test_concurrent_confirmed_sends_from_many_tasks_get_distinct_ids(broker: BrokerProcess) -> None:
    async def main() -> list[str | None]:
        async with AsyncClient(broker.address) as client:

            async def producer(number: int) -> list[str | None]:
                return [
                    await client.send("many", b"%d-%d" % (number, i), confirm=True)
                    for i in range(20)
                ]

            batches = await asyncio.wait_for(asyncio.gather(*(producer(n) for n in range(10))), 30)
            return [message_id for batch in batches for message_id in batch]

    ids = asyncio.run(main())
    assert len(ids) == 200 and len(set(ids)) == 200
    assert all(message_id is not None and MESSAGE_ID.match(message_id) for message_id in ids)
    assert broker.stats()["queues"]["many"]["ready"] == 200


def test_a_cancelled_consume_loop_leaves_the_client_usable(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with AsyncClient(broker.address) as client:
            got: list[bytes] = []

            async def consume() -> None:
                async for message in client.consume("cancel", window=5):
                    got.append(message.content)
                    await message.ack()

            task = asyncio.create_task(consume())
            await client.send("cancel", b"first", confirm=True)
            await asyncio.wait_for(_until(lambda: got == [b"first"]), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await client.send("cancel", b"second", confirm=True)
            message = await client.receive(5)
            assert message is not None and message.content == b"second"
            await message.ack()
            assert (await client.admin("stats"))["counters"]["acked"] >= 1

    asyncio.run(asyncio.wait_for(main(), 30))
    assert broker.stats()["queues"]["cancel"]["ready"] == 0


def test_async_client_is_exported_from_phpmq() -> None:
    import phpmq

    assert phpmq.AsyncClient is AsyncClient


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)
