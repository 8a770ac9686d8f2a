"""Clients on a sharded broker go straight to each queue's owner (docs/client.md "Sharded
brokers"), with real `phpmq broker --shards N` processes. Shards do not forward here: a
message sent to the wrong shard stays there, so every test below fails if routing does."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import BrokerProcess, free_port
from phpmq.client import AsyncClient, Client

QUEUES = [f"route-{i}" for i in range(20)]


def free_ports(count: int) -> str:
    """A loopback address whose port and the `count - 1` after it are all free."""
    while True:
        port = free_port()
        try:
            for offset in range(1, count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + offset))
            return f"tcp://127.0.0.1:{port}"
        except OSError:
            continue


def shard_address(base: str, index: int) -> str:
    host, port = base.rsplit(":", 1)
    return f"{host}:{int(port) + index}"


@pytest.fixture
def three_shards(tmp_path: Path) -> Iterator[str]:
    address = free_ports(3)
    with BrokerProcess(tmp_path / "broker.log", "--shards", "3", address=address):
        yield address


def queues_at_each_shard(address: str, count: int) -> list[dict[str, dict]]:
    """Each shard's own stats of its queues (admin stays at the shard it is asked at)."""
    found = []
    for index in range(count):
        with Client(shard_address(address, index)) as client:
            found.append(client.admin("stats")["queues"])
    return found


def owners(client: Client | AsyncClient, queues: list[str]) -> dict[str, str]:
    owned = {queue: client.shard_of(queue) for queue in queues}
    assert all(owned.values())
    return owned  # type: ignore[return-value]


def assert_held_at_owners(address: str, owned: dict[str, str], ready: int) -> None:
    """Every queue has `ready` messages at its owner, and no other shard has heard of it."""
    for index, queues in enumerate(queues_at_each_shard(address, 3)):
        mine = {q for q, shard in owned.items() if shard == f"local/{index}"}
        assert set(queues) & set(owned) == mine, f"shard {index}: {sorted(queues)}"
        assert all(queues[q]["ready"] == ready for q in mine)


def test_sends_land_at_each_queues_owner(three_shards: str) -> None:
    with Client(three_shards) as client:
        for queue in QUEUES:
            client.send(queue, b"fire-and-forget")
            assert client.send(queue, b"confirmed", confirm=True)
        owned = owners(client, QUEUES)
        assert set(owned.values()) == {"local/0", "local/1", "local/2"}
    assert_held_at_owners(three_shards, owned, ready=2)


def test_one_receive_loop_gets_every_queue_once_and_acks_settle(three_shards: str) -> None:
    queues = QUEUES[:8]
    with Client(shard_address(three_shards, 1)) as producer:
        for queue in queues:
            producer.send_many(queue, [f"{queue}/{n}" for n in range(10)], confirm=True)
    got: list[str] = []
    with Client(three_shards) as consumer:
        for queue in queues:
            consumer.subscribe(queue, window=5)
        assert len({consumer.shard_of(q) for q in queues}) > 1
        while len(got) < 80:
            message = consumer.receive(timeout=5)
            assert message is not None, f"only {len(got)} messages"
            got.append(message.content.decode())
            message.ack()
        assert consumer.receive(timeout=0.3) is None
        consumer.flush()
    assert sorted(got) == sorted(f"{q}/{n}" for q in queues for n in range(10))
    for shard in queues_at_each_shard(three_shards, 3):
        assert all(q["in_flight"] == 0 and q["ready"] == 0 for q in shard.values()), shard


def test_send_many_to_queues_of_different_shards_returns_ids_in_order(
    three_shards: str,
) -> None:
    with Client(three_shards) as client:
        by_queue = {}
        for queue in QUEUES[:6]:
            by_queue[queue] = client.send_many(
                queue, [f"{queue}/{n}" for n in range(50)], confirm=True
            )
        assert len({client.shard_of(q) for q in by_queue}) > 1
        for queue, ids in by_queue.items():
            assert len(ids) == 50 and len(set(ids)) == 50
            received = list(client.consume(queue, 50, timeout=0.5))
            assert [m.content.decode() for m in received] == [f"{queue}/{n}" for n in range(50)]
            assert [m.id for m in received] == ids  # the confirms' IDs, in the order sent
            for message in received:
                message.ack()


def test_request_reaches_a_worker_homed_at_another_shard(three_shards: str) -> None:
    queue = next(q for q in QUEUES if Client_owner(three_shards, q) == "local/2")
    stop = threading.Event()

    def work() -> None:
        with Client(shard_address(three_shards, 1)) as worker:
            worker.subscribe(queue, window=10)
            while not stop.is_set():
                message = worker.receive(timeout=0.1)
                if message is not None:
                    message.reply(b"done " + message.content)

    thread = threading.Thread(target=work)
    thread.start()
    try:
        with Client(three_shards) as requester:
            assert requester.request(queue, b"job-1", timeout=10) == b"done job-1"
            assert requester.request(queue, b"job-2", timeout=10) == b"done job-2"
    finally:
        stop.set()
        thread.join(10)


def Client_owner(address: str, queue: str) -> str | None:  # noqa: N802
    with Client(address) as client:
        client.admin("stats")
        return client.shard_of(queue)


def test_async_client_sends_and_consumes_at_each_owner(three_shards: str) -> None:
    queues = QUEUES[:9]

    async def run() -> tuple[dict[str, str], list[str]]:
        async with AsyncClient(shard_address(three_shards, 2)) as client:
            for queue in queues:
                await client.send(queue, f"{queue}/a")
                await client.send(queue, f"{queue}/b", confirm=True)
            owned = owners(client, queues)
        got = []
        async with AsyncClient(three_shards) as consumer:
            for queue in queues:
                await consumer.subscribe(queue, window=3)
            while len(got) < 2 * len(queues):
                message = await consumer.receive(timeout=5)
                assert message is not None, f"only {len(got)} messages"
                got.append(message.content.decode())
                await message.ack()
        return owned, got

    owned, got = asyncio.run(run())
    assert set(owned.values()) == {"local/0", "local/1", "local/2"}
    assert sorted(got) == sorted(f"{q}/{x}" for q in queues for x in "ab")
    for shard in queues_at_each_shard(three_shards, 3):
        assert all(q["in_flight"] == 0 and q["ready"] == 0 for q in shard.values()), shard


def test_unsharded_broker_makes_no_links(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "broker.log") as broker, Client(broker.address) as client:
        for queue in QUEUES:
            client.send(queue, b"x", confirm=True)
        assert client.shard_of(QUEUES[0]) is None
        assert client._routing is None and not client._links()
        assert client.admin("stats")["queues"][QUEUES[0]]["ready"] == 1
