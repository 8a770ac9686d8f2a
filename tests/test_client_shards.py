"""Clients on a sharded broker go straight to each queue's owner (docs/client.md "Sharded
brokers"), with real `phpmq broker --shards N` processes. Shards do not forward here: a
message sent to the wrong shard stays there, so every test below fails if routing does."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

import phpmq.protocol as p
from harness import BrokerProcess, raw_dealer, recv_messages
from phpmq.broker.shell.shards import shard_address, started_pids
from phpmq.client import AsyncClient, BrokerRefused, Client, QueueDeleted, Unconfirmed
from phpmq.client.shards import ShardRouting
from phpmq.protocol.cluster import ClusterMap
from phpmq.testing import free_ports

QUEUES = [f"route-{i}" for i in range(20)]


# Each test runs two or three broker processes: one sharded broker at a time.
pytestmark = pytest.mark.xdist_group("shards")


@pytest.fixture
def three_shards(tmp_path: Path) -> Iterator[str]:
    address = free_ports(3)
    with BrokerProcess(tmp_path / "broker.log", "--shards", "3", address=address):
        yield address


def queues_at_each_shard(address: str, count: int, *, routed: bool = True) -> list[dict[str, dict]]:
    """Each shard's own stats of its queues (admin stays at the shard it is asked at). When
    `routed`, no shard forwarded anything: the clients went to the owners themselves."""
    found = []
    for index in range(count):
        with Client(shard_address(address, index)) as client:
            stats = client.admin("stats")
        assert not routed or stats["cluster"]["forwarded"] == 0, stats["cluster"]
        found.append(stats["queues"])
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


def test_admin_commands_about_a_queue_go_to_its_owner(three_shards: str) -> None:
    with Client(three_shards) as client:
        for queue in QUEUES:
            client.send(queue, b"x", confirm=True)
        for queue in QUEUES:
            taken = client.admin("lease", queue=queue, lease="b/1", max_messages=5, max_bytes=999)
            assert taken["messages"] == 1, (queue, taken)
            assert client.admin("lease-commit", queue=queue, lease="b/1")["acked"] == 1
        owned = owners(client, QUEUES)
    assert_held_at_owners(three_shards, owned, ready=0)


def test_a_schedule_with_a_queue_is_kept_by_the_queues_owner(three_shards: str) -> None:
    queues = QUEUES[:9]
    with Client(three_shards) as client:
        for queue in queues:
            client.schedule(f"every-{queue}", queue, b"tick", every=3600, nohaste=True)
        owned = owners(client, queues)
        assert {s["name"] for s in client.schedules()} == {f"every-{q}" for q in queues}
        for index in range(3):
            with Client(shard_address(three_shards, index)) as shard:
                kept = shard.admin("schedule-list")["schedules"]
            mine = {q for q, owner in owned.items() if owner == f"local/{index}"}
            assert {s["queue"] for s in kept} == mine, f"shard {index}"
        assert client.unschedule(f"every-{queues[0]}")
        assert not client.unschedule(f"every-{queues[0]}")


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


def test_queue_deleted_at_another_shard_reaches_the_receive_loop(three_shards: str) -> None:
    with Client(three_shards) as consumer, Client(shard_address(three_shards, 2)) as admin:
        consumer.admin("stats")  # the HELLO answer is in
        queue = next(q for q in QUEUES if consumer.shard_of(q) == "local/1")
        consumer.subscribe(queue, window=5)
        admin.send(queue, b"doomed", confirm=True)
        message = consumer.receive(timeout=5)
        assert message is not None and message.content == b"doomed"
        admin.delete_queue(queue)
        with pytest.raises(QueueDeleted) as deleted:
            while consumer.receive(timeout=5) is not None:
                pass
        assert deleted.value.queue == queue


def test_a_live_feed_gets_what_its_own_client_publishes(three_shards: str) -> None:
    with Client(shard_address(three_shards, 1)) as client:
        feeds = [client.subscribe_events("order.*", window=10) for _ in range(6)]
        assert {client.shard_of(feed) for feed in feeds} == {"local/1"}
        assert client.publish("order.paid", b"17") == 6
        got = [client.receive(timeout=5) for _ in feeds]
        assert sorted(m.queue for m in got if m is not None) == sorted(feeds)


def cluster_options(epoch: int, names: list[str], home: str | None = None) -> dict:
    shards = [{"name": name, "address": f"tcp://host-{name[-1]}.lan:5555"} for name in names]
    options: dict = {"cluster": {"epoch": epoch, "shards": shards}}
    if home is not None:
        options["shard"] = home
    return options


def test_routing_compares_shards_by_name_and_adopts_only_newer_epochs() -> None:
    routing: ShardRouting[object] = ShardRouting()
    routing.heard(cluster_options(1, ["local/0", "local/1"], home="local/0"), from_home=True)
    assert routing.decided and routing.sharded
    home_queue = next(q for q in QUEUES if routing.shard_of(q) == "local/0")
    assert routing.elsewhere(home_queue) is None  # by name: the map says host-0.lan
    moved = next(q for q in QUEUES if ClusterMap_owner(3, q) == "local/2")
    routing.subscribed(moved, 10, ("order.*",), None)
    routing.heard(cluster_options(3, ["local/0", "local/1", "local/2"]), from_home=False)
    assert routing.moves_due
    routing.heard(cluster_options(2, ["local/0"]), from_home=False)  # older: ignored
    [move] = routing.take_moves()
    assert (move.queue, move.new.name, move.subscription.bind) == (moved, "local/2", ("order.*",))
    again = {"window": 10, "bind": ("order.*",), "delete_when_unused": None}
    assert move.subscribe_options() == again
    assert not routing.moves_due and routing.take_moves() == []


def test_a_merged_receive_starts_one_connection_further_each_time() -> None:
    routing: ShardRouting[str] = ShardRouting()
    assert [routing.in_turn("home") for _ in range(2)] == [["home"], ["home"]]
    routing.links.update({"local/1": "one", "local/2": "two"})
    turns = [routing.in_turn("home") for _ in range(3)]
    assert turns == [["one", "two", "home"], ["two", "home", "one"], ["home", "one", "two"]]


def test_a_live_feeds_name_is_one_the_home_shard_owns() -> None:
    routing: ShardRouting[object] = ShardRouting()
    names = iter(QUEUES)
    assert routing.home_name(lambda: next(names)) == QUEUES[0]  # not sharded: the first
    home = "local/1" if ClusterMap_owner(2, QUEUES[0]) == "local/0" else "local/0"
    routing.heard(cluster_options(1, ["local/0", "local/1"], home=home), from_home=True)
    first_at_home = next(q for q in QUEUES if routing.shard_of(q) == home)
    names = iter(QUEUES)
    assert routing.home_name(lambda: next(names)) == first_at_home != QUEUES[0]


def test_a_single_shard_map_routes_nothing() -> None:
    routing: ShardRouting[object] = ShardRouting()
    routing.heard(cluster_options(1, ["local/0"], home="local/0"), from_home=True)
    assert not routing.sharded and routing.shard_of("q") is None


def ClusterMap_owner(count: int, queue: str) -> str:  # noqa: N802
    names = [f"local/{i}" for i in range(count)]
    return msgspec.convert(cluster_options(1, names)["cluster"], ClusterMap).owner(queue).name


def send_without_routing(address: str, queue: str, content: bytes) -> None:
    """A confirmed send to exactly `address`, by hand (a Client routes by the broker's map)."""
    with raw_dealer(address) as sock:
        sock.send(p.encode(p.Hello({})) + p.encode(p.Send(queue, content, 0, 1)))
        while not any(isinstance(m, p.Confirm) for m in recv_messages(sock)):
            pass


def test_a_newer_map_moves_subscriptions_to_their_new_owners(three_shards: str) -> None:
    """The broker's epoch does not change in a test run, so the newer map is handed to the
    client as a HELLO answer would carry it: shard 2 left, its queues went to 0 and 1."""
    with Client(three_shards) as client:
        client.admin("stats")
        at_two = [q for q in QUEUES if client.shard_of(q) == "local/2"][:3]
        for queue in at_two:
            client.subscribe(queue, window=5)
        two = [{"name": f"local/{i}", "address": shard_address(three_shards, i)} for i in (0, 1)]
        client._map_heard({"cluster": {"epoch": 99, "shards": two}}, from_home=False)
        assert {client.shard_of(q) for q in at_two} <= {"local/0", "local/1"}
        for queue in at_two:
            owner = shard_address(three_shards, int(str(client.shard_of(queue))[-1]))
            send_without_routing(owner, queue, queue.encode())
        got = sorted(client.receive(timeout=5).content.decode() for _ in at_two)
        assert got == sorted(at_two)
    # The map handed over is not the broker's: the shards forwarded to the real owner.
    for queue, stats in queues_at_each_shard(three_shards, 3, routed=False)[2].items():
        assert stats["consumers"] == 0, queue  # cancelled at the old owner


def test_close_raises_what_another_shard_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHPMQ_MAX_QUEUES", "1")  # per shard: a second queue is refused (429)
    address = free_ports(3)
    with BrokerProcess(tmp_path / "broker.log", "--shards", "3", address=address):
        client = Client(address)
        client.admin("stats")
        first, second = [q for q in QUEUES if client.shard_of(q) == "local/1"][:2]
        client.send(first, b"kept")
        client.send(second, b"refused: one queue per shard")
        with pytest.raises(BrokerRefused) as refused:
            client.close()
        assert refused.value.error.code == 429 and refused.value.error.queue == second
        assert client.closed and all(link.closed for link in client._links())


def test_a_link_reconnects_by_itself_when_its_shard_restarts(tmp_path: Path) -> None:
    address = free_ports(3)
    log = tmp_path / "broker.log"
    with (
        BrokerProcess(log, "--shards", "3", address=address) as broker,
        Client(address, heartbeat_ms=100) as client,
    ):
        client.admin("stats")
        queue = next(q for q in QUEUES if client.shard_of(q) == "local/1")
        client.subscribe(queue, window=5)
        victim = started_pids(broker.log())["local/1"]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while client.reconnects == 0 or serving_pid(broker, "local/1") in (None, victim):
            assert time.monotonic() < deadline, broker.log()
            client.receive(timeout=0.1)
        # (the shard serves again: its supervisor wrote the ready file anew, not only
        # "started", after which a confirm could time out under load before it bound). A
        # starved machine can still miss the 0.3 s liveness once more and lose the confirm
        # with that connection: sent again with its key, as an application would.
        while True:
            try:
                client.send(queue, b"after the restart", confirm=True, key="after-restart")
                break
            except Unconfirmed:
                assert time.monotonic() < deadline + 10, broker.log()
        message = client.receive(timeout=10)
        assert message is not None and message.content == b"after the restart"
        message.ack()


def serving_pid(broker: BrokerProcess, shard: str) -> int | None:
    """The pid of `shard` as the supervisor's ready file names it (it is written again once a
    restarted shard serves)."""
    endpoints = broker.ready_endpoints() or {}
    pids = [s["pid"] for s in endpoints.get("shards", []) if s["shard"] == shard]
    return pids[0] if pids else None
