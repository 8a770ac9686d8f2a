"""Forwarding between shards with real processes (docs/cluster.md "Forwarding"): the stock
PHP client over raw TCP and a plain DEALER talk to one shard and reach queues of the other;
an owner killed with -9 makes only its queues fail (503 naming it) and comes back with its
durable messages and its forwarded consumers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import msgspec
import pytest
import zmq
from test_tcp_endpoint import PHP_SCRIPT, _php

import phpmq.protocol as p
from harness import (
    REPO,
    BrokerProcess,
    hello_answer,
    raw_dealer,
    recv_messages,
    wait_for,
)
from phpmq.broker.shell.shards import shard_address, started_pids
from phpmq.client import Client
from phpmq.protocol.cluster import ClusterMap
from phpmq.testing import free_ports

# Each test runs two or three broker processes: one sharded broker at a time.
pytestmark = pytest.mark.xdist_group("shards")


def cluster(address: str) -> ClusterMap:
    return msgspec.convert(hello_answer(address)["cluster"], ClusterMap)


def owned_by(mapping: ClusterMap, shard: str, count: int, prefix: str = "q") -> list[str]:
    names = (f"{prefix}{i}" for i in range(10_000))
    return [n for n in names if mapping.owner(n).name == shard][:count]


def queue_stats(address: str) -> dict[str, dict]:
    with Client(address, close_timeout=1) as client:
        return client.admin("stats")["queues"]



def test_the_stock_php_client_over_tcp_reaches_a_queue_of_another_shard(tmp_path: Path) -> None:
    php = _php()
    address = free_ports(2)
    with BrokerProcess(
        tmp_path / "broker.log", "--shards", "2", address=address, tcp=True
    ) as broker:
        [queue] = owned_by(cluster(address), "local/1", 1, "php-")
        contents = ["one", "two", "h\u00e9llo"]
        result = subprocess.run(
            [php, str(PHP_SCRIPT), "127.0.0.1", str(broker.tcp_port), queue, *contents],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
        assert result.returncode == 0, result.stderr + result.stdout
        assert result.stdout.splitlines()[: len(contents)] == contents
        owner = shard_address(address, 1)
        wait_for(
            lambda: (
                queue_stats(owner)[queue]["ready"] == queue_stats(owner)[queue]["in_flight"] == 0
            ),
            "the PHP client's acks reached the owner",
            timeout=10,
        )
        assert queue not in queue_stats(address), "the shard it talked to kept nothing"


def test_a_plain_dealer_at_one_shard_uses_the_queues_of_both(tmp_path: Path) -> None:
    address = free_ports(2)
    with BrokerProcess(tmp_path / "broker.log", "--shards", "2", address=address):
        mapping = cluster(address)
        queues = owned_by(mapping, "local/0", 5) + owned_by(mapping, "local/1", 5)
        with raw_dealer(shard_address(address, 1)) as sock:
            sock.send(p.encode_all([p.Send(q, q.encode()) for q in queues]))
            sock.send(p.encode_all([p.Consume(q, 10) for q in queues]))
            got: list[p.Dispatch] = []
            while len(got) < len(queues):
                got += recv_messages(sock)
            assert sorted(m.content.decode() for m in got) == sorted(queues)
            assert all(m.content == m.queue.encode() for m in got)
            sock.send(p.encode_all([p.Ack(m.queue, m.message_id) for m in got]))
            for index in range(2):
                here = shard_address(address, index)
                mine = [q for q in queues if mapping.owner(q).name == f"local/{index}"]
                wait_for(
                    lambda here=here, mine=mine: all(
                        queue_stats(here).get(q, {}).get("in_flight", 1) == 0
                        and queue_stats(here)[q]["ready"] == 0
                        for q in mine
                    ),
                    f"shard {index} holds its queues, every message acked",
                    timeout=10,
                )
                assert set(queue_stats(here)) == set(mine)


def test_a_killed_owner_fails_only_its_queues_and_comes_back_whole(tmp_path: Path) -> None:
    address = free_ports(2)
    with BrokerProcess(
        tmp_path / "broker.log", "--shards", "2", address=address, data_dir=tmp_path / "data"
    ) as broker:
        mapping = cluster(address)
        [remote] = owned_by(mapping, "local/1", 1)
        [local] = owned_by(mapping, "local/0", 1)
        with raw_dealer(address) as sock:
            sock.send(p.encode(p.Hello({"confirm": True})))
            assert type(recv_messages(sock)[0]) is p.Hello
            sock.send(p.encode(p.Send(remote, b"kept", tag=1)))
            [confirm] = recv_messages(sock)
            assert type(confirm) is p.Confirm and confirm.tag == 1, confirm
            sock.send(p.encode(p.Consume(remote, 1)))
            [first] = recv_messages(sock)
            assert type(first) is p.Dispatch and first.content == b"kept"
            victim = started_pids(broker.log())["local/1"]
            # Frozen (as a host cut off would be): once the link notices, sends to its queues
            # are refused with 503 naming it, and the other shard's queues keep working.
            os.kill(victim, signal.SIGSTOP)
            try:
                refused = refused_send(sock, local, remote, broker)
            finally:
                os.kill(victim, signal.SIGCONT)
            assert refused.code == 503 and "local/1" in refused.reason, refused
            assert "silent" in refused.reason
            # Thawed, it takes sends again through the same shard.
            wait_for(lambda: confirmed(sock, remote), "the owner answers again", 15)
            # Killed with -9 and restarted: the confirmed message was on its disk, and the
            # forwarded consumer gets it again (delivery count 2) without asking.
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: started_pids(broker.log())["local/1"] != victim, "a restart", 20)
            again = None
            deadline = time.monotonic() + 20
            while again is None:
                assert time.monotonic() < deadline, broker.log()
                for message in recv_messages(sock, 20):
                    if type(message) is p.Dispatch and message.content == b"kept":
                        again = message
            assert again.delivery_count is not None and again.delivery_count >= 2
        assert re.search(r"shard local/1 lost: silent", broker.log())


def test_an_admin_command_forwarded_to_a_shard_lost_before_it_answers_gets_503(
    tmp_path: Path,
) -> None:
    """A dlq-list about a queue of a frozen shard is forwarded there and never answered: once
    the link is lost, the shard that forwarded it answers 503 (before it, the client waited
    out its own timeout, told nothing)."""
    address = free_ports(2)
    with BrokerProcess(tmp_path / "broker.log", "--shards", "2", address=address) as broker:
        remote, other = owned_by(cluster(address), "local/1", 2)
        victim = started_pids(broker.log())["local/1"]
        with raw_dealer(address) as sock:
            sock.send(p.encode(p.Admin({"command": "dlq-list", "queue": remote})))
            [answered] = recv_messages(sock)  # by the owner: the queue is not there yet
            assert type(answered) is p.AdminReply and answered.options["error"]["code"] == 404
            os.kill(victim, signal.SIGSTOP)
            try:
                asked = time.monotonic()
                sock.send(p.encode(p.Admin({"command": "dlq-list", "queue": remote})))
                [lost] = recv_messages(sock, 15)
                waited = time.monotonic() - asked
            finally:
                os.kill(victim, signal.SIGCONT)
            # Thawed, the owner answers the first command after all: that answer is dropped,
            # so the next command's answer is the next the peer gets.
            time.sleep(1)
            wait_for(lambda: confirmed(sock, other), "the owner answers again", 15)
            sock.send(p.encode(p.Admin({"command": "dlq-list", "queue": other})))
            [next_answer] = recv_messages(sock)
            assert next_answer.options.get("queue") == other, next_answer
            assert not sock.poll(500), recv_messages(sock)
        assert type(lost) is p.AdminReply, lost
        error = lost.options["error"]
        assert error["code"] == 503 and "local/1 was lost before it answered" in error["reason"]
        assert waited < 10, waited  # the link's silence (3 s), not the client's patience
        with Client(address, close_timeout=1) as client:
            figures = client.admin("stats")["cluster"]
        assert figures["admins_awaiting_answers"] == 0 and figures["admins_untracked"] == 0


def refused_send(sock: zmq.Socket, local: str, remote: str, broker: BrokerProcess) -> p.Error:
    """Send to both queues until a send to `remote` is refused; every send to `local` must be
    confirmed meanwhile."""
    deadline = time.monotonic() + 15
    tag = 100
    while True:
        assert time.monotonic() < deadline, broker.log()
        sock.send(p.encode(p.Send(local, b"here", tag=tag)))
        sock.send(p.encode(p.Send(remote, b"there", tag=tag + 1)))
        tag += 2
        for message in recv_messages(sock):
            if type(message) is p.Error and message.queue == remote:
                return message
            assert type(message) is not p.Error, message
        time.sleep(0.1)


def confirmed(sock: zmq.Socket, queue: str) -> bool:
    sock.send(p.encode(p.Send(queue, b"probe", tag=9999)))
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        if not sock.poll(100):
            continue
        for message in p.decode_frame(sock.recv())[0]:
            if type(message) is p.Confirm and message.tag == 9999:
                return True
    return False
