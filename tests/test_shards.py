"""`phpmq broker --shards N` with real processes (docs/cluster.md): every shard is a whole
broker at its own port, HELLO tells the map, the owner of a queue keeps it, a shard killed
with -9 comes back with its durable messages, and SIGTERM stops them all."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import msgspec

import phpmq.protocol as p
from harness import BrokerProcess, free_port, phpmq, raw_dealer, recv_messages
from phpmq.broker.shards import started_pids
from phpmq.client import Client
from phpmq.protocol.cluster import ClusterMap

QUEUES = [f"q{i}" for i in range(20)]


def shard_address(base: str, index: int) -> str:
    host, port = base.rsplit(":", 1)
    return f"{host}:{int(port) + index}"


def hello_answer(address: str) -> dict:
    with raw_dealer(address) as sock:
        sock.send(p.encode(p.Hello({})))
        [answer] = recv_messages(sock)
        assert isinstance(answer, p.Hello)
        return answer.options


def free_pair() -> str:
    """A loopback address whose port and port + 1 are both free."""
    while True:
        port = free_port()
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port + 1))
            return f"tcp://127.0.0.1:{port}"
        except OSError:
            continue


def test_shards_own_their_queues_and_one_killed_comes_back(tmp_path: Path) -> None:
    address = free_pair()
    data = tmp_path / "data"
    with BrokerProcess(
        tmp_path / "broker.log", "--shards", "2", address=address, data_dir=data
    ) as broker:
        answers = [hello_answer(shard_address(address, i)) for i in range(2)]
        mapping = msgspec.convert(answers[0]["cluster"], ClusterMap)
        assert [s.name for s in mapping.shards] == ["local/0", "local/1"]
        assert [a["shard"] for a in answers] == ["local/0", "local/1"]
        with Client(address) as client:
            client.admin("stats")  # the HELLO answer is in
            assert client.cluster_map == mapping
        owners = {q: mapping.owner(q) for q in QUEUES}
        assert {s.name for s in owners.values()} == {"local/0", "local/1"}
        for queue, shard in owners.items():
            with Client(shard.address) as client:
                client.send(queue, queue.encode(), confirm=True)
        # Each shard holds exactly the queues it owns, in its own store.
        for index in range(2):
            with Client(shard_address(address, index)) as client:
                held = set(client.admin("stats")["queues"])
            assert held == {q for q, s in owners.items() if s.name == f"local/{index}"}
        assert (data / "shard-0").is_dir() and (data / "shard-1").is_dir()
        victim = started_pids(broker.log())["local/1"]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while started_pids(broker.log())["local/1"] == victim:
            assert time.monotonic() < deadline, broker.log()
            time.sleep(0.1)
        back = {q for q, s in owners.items() if s.name == "local/1"}
        got = set()
        with Client(shard_address(address, 1)) as client:  # confirmed: on shard 1's disk
            for queue in back:
                message = next(client.consume(queue, window=1, timeout=10))
                got.add(message.content.decode())
                message.ack()
        assert got == back
        pids = started_pids(broker.log()).values()
    assert broker.process.returncode == 0
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stats_of_a_sharded_broker_cover_every_shard(tmp_path: Path) -> None:
    address = free_pair()
    with BrokerProcess(tmp_path / "broker.log", "--shards", "2", address=address) as broker:
        with Client(address) as client:
            client.admin("stats")
            mapping = client.cluster_map
            assert mapping is not None
        for queue in QUEUES:
            with Client(mapping.owner(queue).address) as client:
                client.send(queue, b"x", confirm=True)
        merged = phpmq("stats", "--json", "--broker", broker.address)
        assert merged.returncode == 0, merged.stderr
        result = json.loads(merged.stdout)
        assert set(result["queues"]) == set(QUEUES)
        assert all(q["shard"] == mapping.owner(n).name for n, q in result["queues"].items())
        assert result["counters"]["received"] == len(QUEUES)
        assert set(result["shards"]) == {"local/0", "local/1"}
        listed = phpmq("queue", "list", "--broker", broker.address)
        assert listed.returncode == 0 and "2 shards" in listed.stdout
