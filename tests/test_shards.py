"""`phpmq broker --shards N` with real processes (docs/cluster.md): every shard is a whole
broker at its own port, HELLO tells the map, the owner of a queue keeps it, a shard killed
with -9 comes back with its durable messages, and SIGTERM stops them all."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterable
from pathlib import Path

import msgspec
import pytest

import phpmq.protocol as p
from harness import BrokerProcess, hello_answer, phpmq, raw_dealer, recv_messages
from phpmq.broker.shell.shards import shard_address, started_pids
from phpmq.client import Client
from phpmq.protocol.cluster import ClusterMap
from phpmq.testing import free_ports, process_state

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


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's parent may be slow to reap it, or never)."""
    return process_state(pid) not in "XZ"


def _start_supervisor(log: Path, address: str, data: Path) -> BrokerProcess:
    """A 2-shard supervisor, returned once both of its own shards listen (the shards of a
    killed supervisor may still answer at these ports for a moment)."""
    supervisor = BrokerProcess(
        log, "--shards", "2", "--grace-seconds", "3", address=address, data_dir=data
    )
    deadline = time.monotonic() + 20
    while supervisor.log().count(" listening on ") < 2:
        assert time.monotonic() < deadline, supervisor.log()
        time.sleep(0.1)
    return supervisor


def _wait_gone(pids: Iterable[int], within: float) -> None:
    deadline = time.monotonic() + within
    while any(_running(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {pids}"
        time.sleep(0.1)


def test_shards_exit_with_their_killed_supervisor_and_a_new_one_starts(tmp_path: Path) -> None:
    """kill -9 of the supervisor, 3 times: its shards follow it within seconds, and the next
    supervisor binds the same ports at its first try, with the shards' durable data."""
    address, data = free_ports(2), tmp_path / "data"
    for cycle in range(3):
        supervisor = _start_supervisor(tmp_path / f"{cycle}.log", address, data)
        try:
            assert "restarting" not in supervisor.log()  # no shard met a taken port
            with Client(address) as client:
                for queue in QUEUES[:4]:
                    client.send(queue, b"cycle %d" % cycle, confirm=True)
            shards = started_pids(supervisor.log()).values()
        finally:
            supervisor.kill()
        _wait_gone(shards, within=5)
    with _start_supervisor(tmp_path / "last.log", address, data) as supervisor:
        merged = phpmq("stats", "--json", "--broker", address)
        assert merged.returncode == 0, merged.stderr
        queues = json.loads(merged.stdout)["queues"]
        assert {q: queues[q]["ready"] for q in QUEUES[:4]} == dict.fromkeys(QUEUES[:4], 3)
    assert supervisor.process.returncode == 0


def test_a_new_supervisor_waits_for_draining_orphans_instead_of_fighting(tmp_path: Path) -> None:
    """The killed supervisor's shards drain (a stock consumer holds a message, for the whole
    grace) while a new supervisor starts on the same ports: it waits for them, then starts
    each shard once, and the held message is back in the new shard's queue."""
    address, data = free_ports(2), tmp_path / "data"
    first = _start_supervisor(tmp_path / "first.log", address, data)
    try:
        mapping = msgspec.convert(hello_answer(address)["cluster"], ClusterMap)
        owner = mapping.owner("held").address
        with Client(address) as client:
            client.send("held", b"unacked", confirm=True)
        with raw_dealer(owner) as consumer:
            consumer.send(p.encode(p.Consume("held", 1)))
            assert recv_messages(consumer)[0].content == b"unacked"
            orphans = started_pids(first.log()).values()
            first.kill()
            second = _start_supervisor(tmp_path / "second.log", address, data)
    finally:
        first.kill()
    with second:
        log = second.log()
        assert "still in use" in log and "restarting" not in log, log
        assert log.count(" started (pid ") == 2, log
        _wait_gone(orphans, within=2)
        with Client(address) as client:
            assert next(client.consume("held", window=1, timeout=5)).content == b"unacked"


def test_a_port_another_program_keeps_stops_the_supervisor_with_one_line() -> None:
    address = free_ports(2)
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    with socket.socket() as squatter:
        squatter.bind((host, int(port) + 1))
        squatter.listen()
        started = time.monotonic()
        result = phpmq("broker", "--shards", "2", "--grace-seconds", "0", "--bind", address)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"phpmq: cannot bind {shard_address(address, 1)}: the address is in use"
    )
    assert time.monotonic() - started < 15  # a wait for draining shards, not a restart loop
