"""A replicated cluster of real broker processes on loopback, for the replication tests
(docs/cluster.md "Replicated queues"): three nodes on 127.0.0.1-3, each a supervisor with
one process per replica it holds, and a producer and a checker that speak raw PHPMQ.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import zmq

import phpmq.protocol as p
from harness import BrokerProcess, raw_dealer, recv_messages, wait_for
from phpmq.broker.shell.cluster_file import Replica, read_cluster_file
from phpmq.broker.shell.shards import shard_address, started_pids
from phpmq.protocol.cluster import ClusterMap, Shard

NODES = ("a", "b", "c")
RAFT_OFFSET = 1000
LINK_SECRET = "replication-tests"


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_base(count: int) -> int:
    """A port free with the `count - 1` after it, and their Raft ports, on 127.0.0.1-3."""
    while True:
        port = random.randint(20_000, 30_000)
        if all(
            _bindable(f"127.0.0.{host}", port + offset + raft)
            for host in (1, 2, 3)
            for offset in range(count)
            for raft in (0, RAFT_OFFSET)
        ):
            return port


class ReplicatedCluster:
    """Three nodes, `replicas` replicas of each node's one shard."""

    def __init__(self, directory: Path, replicas: int = 3) -> None:
        self.directory = directory
        self.port = free_base(len(NODES))
        self.file = directory / "cluster.toml"
        lines = [f"replicas = {replicas}", f"raft_port_offset = {RAFT_OFFSET}"]
        for index, node in enumerate(NODES, start=1):
            lines += ["[[nodes]]", f'name = "{node}"']
            lines.append(f'address = "tcp://127.0.0.{index}:{self.port}"')
        self.file.write_text("\n".join(lines) + "\n")
        cluster = read_cluster_file(str(self.file))
        self.replica_sets: dict[str, list[Replica]] = cluster.replica_sets(shard_address)
        self.map = ClusterMap(1, tuple(Shard(name, "") for name in self.replica_sets))
        self.nodes: dict[str, BrokerProcess] = {}

    def address(self, node: str) -> str:
        return f"tcp://127.0.0.{NODES.index(node) + 1}:{self.port}"

    def start(self, node: str) -> None:
        self.nodes[node] = BrokerProcess(
            self.directory / f"{node}.log",
            "--cluster-file",
            str(self.file),
            "--node",
            node,
            "--grace-seconds",
            "1",
            address=self.address(node),
            data_dir=self.directory / node,
            start_timeout=60,
        )

    def stop(self) -> None:
        for broker in self.nodes.values():
            with contextlib.suppress(Exception):
                broker.stop()

    def log(self, node: str) -> str:
        return (self.directory / f"{node}.log").read_text()

    def queue_of(self, shard: str, index: int = 0) -> str:
        """The `index`-th queue name that `shard` owns."""
        names = (f"q{i}" for i in range(10_000))
        return [name for name in names if self.map.owner(name).name == shard][index]

    # ------------------------------------------------------------------ replicas

    def role(self, replica: Replica) -> str | None:
        """What the replica says it is ("leader", "follower"), None: no answer."""
        with raw_dealer(replica.address) as sock:
            sock.send(p.encode(p.Admin({"command": "stats", "here": True})))
            if not sock.poll(2000):
                return None
            [reply] = recv_messages(sock)
        return reply.options.get("replication", {}).get("role")

    def leader(self, shard: str) -> Replica | None:
        for replica in self.replica_sets[shard]:
            if self.role(replica) == "leader":
                return replica
        return None

    def wait_for_leaders(self, timeout: float = 60) -> dict[str, Replica]:
        leaders: dict[str, Replica] = {}

        def every_shard_led() -> bool:
            for shard in self.replica_sets:
                leader = self.leader(shard)
                if leader is None:
                    return False
                leaders[shard] = leader
            return True

        wait_for(every_shard_led, "every shard to have a leader", timeout=timeout)
        return leaders

    def pid(self, replica: Replica) -> int:
        return started_pids(self.log(replica.node))[replica.shard]

    def kill(self, replica: Replica) -> None:
        """kill -9 the replica's process (its supervisor starts it again, as a follower)."""
        self.signal(replica, signal.SIGKILL)

    def signal(self, replica: Replica, signum: int) -> None:
        os.kill(self.pid(replica), signum)


class Producer:
    """Confirmed, keyed sends over a raw DEALER (as a stock client with the extensions),
    retried with the same key until confirmed: what it records is what the broker
    confirmed."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.confirmed: dict[str, bytes] = {}  # key -> message ID
        self.retries = 0
        self._tag = 0

    def send(self, queue: str, key: str, deadline: float, wait: float = 2.0) -> bool:
        """Send until confirmed or `deadline`; whether it was confirmed."""
        with raw_dealer(self.address) as sock:
            sock.send(p.encode(p.Hello({})))
            while time.monotonic() < deadline:
                self._tag += 1
                tag = self._tag
                sock.send(p.encode(p.Send(queue, key.encode(), tag=tag, key=key)))
                answer = _answer(sock, tag, wait)
                if isinstance(answer, p.Confirm):
                    self.confirmed[key] = answer.message_id
                    return True
                self.retries += 1
                time.sleep(0.1)
        return False


def _answer(sock: zmq.Socket, tag: int, wait: float) -> p.Message | None:
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        if not sock.poll(int(left * 1000) + 1):
            return None
        messages, _ = p.decode_frame(sock.recv())
        for message in messages:
            if isinstance(message, (p.Confirm, p.Error)) and message.tag == tag:
                return message
    return None


def drain(address: str, queues: list[str], idle: float = 3.0) -> list[bytes]:
    """Every message the queues hold, consumed and acked through `address`."""
    contents: list[bytes] = []
    with raw_dealer(address) as sock:
        sock.send(p.encode(p.Hello({})))
        for queue in queues:
            sock.send(p.encode(p.Consume(queue, 500)))
        while sock.poll(int(idle * 1000)):
            messages, _ = p.decode_frame(sock.recv())
            acks = []
            for message in messages:
                if isinstance(message, p.Dispatch):
                    contents.append(message.content)
                    acks.append(p.Ack(message.queue, message.message_id))
            if acks:
                sock.send(b"".join(p.encode(ack) for ack in acks))
    return contents


@contextlib.contextmanager
def replicated_cluster(directory: Path, replicas: int = 3) -> Iterator[ReplicatedCluster]:
    cluster = ReplicatedCluster(directory, replicas)
    before = os.environ.get("PHPMQ_LINK_SECRET")
    os.environ["PHPMQ_LINK_SECRET"] = LINK_SECRET  # what the nodes' processes inherit
    try:
        for node in NODES:
            cluster.start(node)
        yield cluster
    finally:
        cluster.stop()
        if before is None:
            del os.environ["PHPMQ_LINK_SECRET"]
        else:
            os.environ["PHPMQ_LINK_SECRET"] = before
