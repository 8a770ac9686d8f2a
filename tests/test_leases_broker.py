"""Batch leases, message keys and sent_at against a real broker process: a lease of a durable
broker survives kill -9 with the same messages in the same order, keys and headers included,
and commits after the restart; the reference client sends and receives keys."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest

import phpmq.protocol as p
from harness import BrokerProcess, free_port

# Their checks measure time (heartbeat gaps, redelivery and lease bounds): one at a time.
pytestmark = pytest.mark.xdist_group("timing")


def test_a_lease_survives_kill_9_of_a_durable_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    address = f"tcp://127.0.0.1:{free_port()}"
    first = BrokerProcess(tmp_path / "1.log", "--data-dir", str(data), address=address)
    try:
        with first.client() as client:
            for i in range(10):
                client.send("q", b"m%d" % i, headers={"n": str(i)}, message_key=b"k%d" % i)
            client.send("q", b"last", confirm=True)
            taken = client.admin(
                "lease", queue="q", lease="query/7", max_messages=4, max_bytes=10**6
            )
            before = client.admin("lease-read", queue="q", lease="query/7")
        first.kill()
        second = BrokerProcess(tmp_path / "2.log", "--data-dir", str(data), address=address)
        try:
            with second.client() as client:
                after = client.admin("lease-read", queue="q", lease="query/7")
                again = client.admin(
                    "lease", queue="q", lease="query/7", max_messages=9, max_bytes=10**6
                )
                stats = client.admin("stats")["queues"]["q"]
                committed = client.admin("lease-commit", queue="q", lease="query/7")
                rest = [m.content for m in client.consume("q", window=100, timeout=1)]
        finally:
            second.stop()
    finally:
        first.stop()
    assert taken["messages"] == 4 and taken["created"]
    assert after["entries"] == before["entries"]
    assert [base64.b64decode(e["content"]) for e in after["entries"]] == [
        b"m0",
        b"m1",
        b"m2",
        b"m3",
    ]
    assert [base64.b64decode(e["key"]) for e in after["entries"]] == [b"k0", b"k1", b"k2", b"k3"]
    assert after["entries"][2]["headers"] == '{"n":"2"}'
    assert (again["messages"], again["created"]) == (4, False)
    assert (stats["leased"], stats["leases"], stats["ready"]) == (4, 1, 7)
    assert committed["acked"] == 4
    assert rest == [b"m%d" % i for i in range(4, 10)] + [b"last"]


def test_the_client_sends_and_receives_message_keys_and_sent_at(broker: BrokerProcess) -> None:
    with broker.client() as client:
        started = time.time()
        client.send("keys", b"a", message_key="user-1", confirm=True)
        client.publish("nothing.bound", b"b", message_key=b"k")  # accepted, routed nowhere
        [message] = list(client.consume("keys", window=1, timeout=1))
        message.ack()
    assert message.message_key == b"user-1"
    assert message.sent_at is not None and abs(message.sent_at - started) < 5
    assert p.sent_at(message.id) == message.sent_at
