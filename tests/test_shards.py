"""`phpmq broker --shards N` with real processes (docs/cluster.md): every shard is a whole
broker at its own port, HELLO tells the map, the owner of a queue keeps it, a shard killed
with -9 comes back with its durable messages, and SIGTERM stops them all."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import msgspec
import pytest

from harness import BrokerProcess, hello_answer, phpmq
from phpmq.broker.shards import shard_address, started_pids
from phpmq.client import Client
from phpmq.protocol.cluster import ClusterMap
from phpmq.testing import free_ports

QUEUES = [f"q{i}" for i in range(20)]


# Each test runs two or three broker processes: one sharded broker at a time.
pytestmark = pytest.mark.xdist_group("shards")


def test_shards_need_a_fixed_port_and_say_so_in_one_line() -> None:
    result = phpmq("broker", "--shards", "2", "--bind", "tcp://127.0.0.1:*")
    assert result.returncode == 1
    assert result.stderr.startswith("phpmq: --shards needs a fixed port in --bind")
    assert len(result.stderr.splitlines()) == 1


def test_shards_own_their_queues_and_one_killed_comes_back(tmp_path: Path) -> None:
    address = free_ports(2)
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
    address = free_ports(2)
    with BrokerProcess(
        tmp_path / "broker.log", "--shards", "2", "--metrics-bind", "127.0.0.1:0", address=address
    ) as broker:
        shards = broker.endpoints["shards"]
        assert [(s["shard"], s["bind"]) for s in shards] == [
            ("local/0", address),
            ("local/1", shard_address(address, 1)),
        ]
        metrics = {s["metrics_bind"] for s in shards}  # port 0: each shard got one of its own
        assert len(metrics) == 2 and "127.0.0.1:0" not in metrics
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
