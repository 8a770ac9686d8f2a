"""A replicated cluster of real broker processes on loopback, for the replication tests
(docs/cluster.md "Replicated queues"): three nodes on 127.0.0.1-3 (phpmq.testing's
LocalCluster), and a producer and a checker that speak raw PHPMQ.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import zmq

import phpmq.protocol as p
from harness import raw_dealer
from phpmq import ClientError
from phpmq.broker.shell.cluster_file import Replica
from phpmq.testing import LocalCluster

NODES = ("a", "b", "c")
T = TypeVar("T")


def until_done(call: Callable[[], T], within: float = 60.0) -> T:
    """`call()` again after a ClientError (503 while a shard elects, Unconfirmed), as an
    application would, for at most `within` seconds; what it returned."""
    deadline = time.monotonic() + within
    while True:
        try:
            return call()
        except ClientError:
            assert time.monotonic() < deadline, "never done"
            time.sleep(0.2)


class ReplicatedCluster(LocalCluster):
    """phpmq.testing's LocalCluster of three nodes, with the tests' kill."""

    def kill(self, replica: Replica) -> None:
        """kill -9 the replica's process (its supervisor starts it again, as a follower)."""
        self.signal(replica, signal.SIGKILL)


class Producer:
    """Confirmed, keyed sends over a raw DEALER (as a stock client with the extensions),
    retried with the same key until confirmed: what it records is what the broker
    confirmed."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.confirmed: dict[str, bytes] = {}  # key -> message ID
        self.retries = 0
        self._tag = 0

    def send(
        self, queue: str, key: str, deadline: float, wait: float = 2.0, padding: bytes = b""
    ) -> bool:
        """Send until confirmed or `deadline`; whether it was confirmed. The content is the
        key, and `padding` after it."""
        with raw_dealer(self.address) as sock:
            sock.send(p.encode(p.Hello({})))
            while time.monotonic() < deadline:
                self._tag += 1
                tag = self._tag
                content = key.encode() + padding
                sock.send(p.encode(p.Send(queue, content, tag=tag, key=key)))
                answer = answer_to(sock, tag, wait)
                if isinstance(answer, p.Confirm):
                    self.confirmed[key] = answer.message_id
                    return True
                self.retries += 1
                time.sleep(0.1)
        return False


def answer_to(sock: zmq.Socket, tag: int, wait: float) -> p.Message | None:
    """The CONFIRM or ERROR of the send tagged `tag`, within `wait` seconds (None: none)."""
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        if not sock.poll(int(left * 1000) + 1):
            return None
        messages, _ = p.decode_frame(sock.recv())
        for message in messages:
            if isinstance(message, (p.Confirm, p.Error)) and message.tag == tag:
                return message
    return None


def drain(
    address: str, queues: list[str], idle: float = 3.0, expect: int = 0, deadline: float = 60.0
) -> list[bytes]:
    """Every message the queues hold, consumed and acked through `address`: until `idle`
    seconds pass without one once at least `expect` came (or `deadline`). A consume refused
    (a shard between leaders answers 503) is asked again."""
    contents: list[bytes] = []
    give_up = time.monotonic() + deadline
    with raw_dealer(address) as sock:
        sock.send(p.encode(p.Hello({})))
        consume = b"".join(p.encode(p.Consume(queue, 500)) for queue in queues)
        sock.send(consume)
        while time.monotonic() < give_up:
            if not sock.poll(int(idle * 1000)):
                if len(contents) >= expect:
                    break
                sock.send(consume)  # nothing for a while and some missing: ask again
                continue
            messages, _ = p.decode_frame(sock.recv())
            acks = []
            for message in messages:
                if isinstance(message, p.Dispatch):
                    contents.append(message.content)
                    acks.append(p.Ack(message.queue, message.message_id))
                elif isinstance(message, p.Error) and message.tag is None:
                    time.sleep(0.5)
                    sock.send(consume)
            if acks:
                sock.send(b"".join(p.encode(ack) for ack in acks))
    return contents


def replicated_cluster(
    directory: Path, replicas: int = 3, flags: tuple[str, ...] = ("--grace-seconds", "1")
) -> ReplicatedCluster:
    return ReplicatedCluster(directory, nodes=len(NODES), replicas=replicas, flags=flags)
