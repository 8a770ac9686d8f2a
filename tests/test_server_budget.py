"""The server loop under a flood (docs/architecture.md, "The server"): each turn reads within
its budget, so heartbeats, admin answers and other peers are served while producers that never
read push frames as fast as they can; and the loop's own figures appear in `stats`."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

import phpmq.protocol as p
from harness import BrokerProcess, raw_dealer, wait_for

# Their checks measure time (heartbeat gaps, redelivery and lease bounds): one at a time.
pytestmark = pytest.mark.xdist_group("timing")

#: A stock producer (no HELLO, never reads) sending frames of 256 pre-TTL sends as fast as
#: libzmq takes them.
FLOODER = """
import sys, zmq
import phpmq.protocol as p
frame = b"".join(p.encode_send(p.queue_packet(sys.argv[2]), b"x" * 32, None) for _ in range(256))
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.linger = 0
sock.connect(sys.argv[1])
while True:
    sock.send(frame)
"""

HEARTBEAT_MS = 500
LIVENESS = 3
FLOOD_SECONDS = 6.0


@pytest.fixture
def flooders() -> Iterator[list[subprocess.Popen]]:
    """Flooding processes started by the test; each is killed (by its own pid) at the end."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait(5)


def flood(started: list[subprocess.Popen], address: str, queue: str, count: int) -> None:
    for _ in range(count):
        started.append(subprocess.Popen([sys.executable, "-c", FLOODER, address, queue]))


def test_a_flooded_broker_keeps_its_heartbeats_and_answers_stats(
    tmp_path: Path, flooders: list[subprocess.Popen]
) -> None:
    broker = BrokerProcess(
        tmp_path / "broker.log", "--max-queue-length", "1000", "--grace-seconds", "0"
    )
    with broker, broker.client(heartbeat_ms=HEARTBEAT_MS, liveness=LIVENESS) as client:
        client.send("calm", b"before")
        with raw_dealer(broker.address) as watcher:
            watcher.send(p.encode(p.Hello({"heartbeat_ms": HEARTBEAT_MS, "liveness": LIVENESS})))
            assert watcher.poll(5000), "no answer to HELLO"
            watcher.recv()
            flood(flooders, broker.address, "flood", 2)
            # Wait until the flood is on: the queue is full and refusals are counted.
            wait_for(
                lambda: broker.stats()["queues"].get("flood", {}).get("ready", 0) >= 1000,
                "the flood started",
                interval=0.1,
            )

            gaps, stats_seconds = [], []
            last_heard = last_said = started = time.monotonic()
            while (now := time.monotonic()) - started < FLOOD_SECONDS:
                if now - last_said >= HEARTBEAT_MS / 2000:
                    watcher.send(p.encode(p.Heartbeat()))
                    last_said = now
                if watcher.poll(20):
                    while watcher.poll(0):
                        watcher.recv()
                    now = time.monotonic()
                    gaps.append(now - last_heard)
                    last_heard = now
                if len(stats_seconds) < 3 and now - started > 2 * (len(stats_seconds) + 1):
                    asked = time.monotonic()
                    client.admin("stats", timeout=5)
                    stats_seconds.append(time.monotonic() - asked)
            gaps.append(time.monotonic() - last_heard)
            stats = client.admin("stats", timeout=5)
        for process in flooders:
            assert process.poll() is None, "a flooder stopped by itself"
        # The heartbeating client was served throughout: nothing made it reconnect.
        assert client.reconnects == 0
        client.send("calm", b"after")
        assert client.admin("stats", timeout=5)["queues"]["calm"]["ready"] == 2

    interval = HEARTBEAT_MS / 1000
    print(f"longest silence {max(gaps):.3f}s, stats in {stats_seconds}, {stats['server']}")
    assert max(gaps) < 2 * interval, f"the broker fell silent for {max(gaps):.3f}s"
    assert max(stats_seconds) < 1.0, f"stats took {stats_seconds}"
    assert stats["counters"]["peers_expired"] == 0
    server = stats["server"]
    assert server["turns_cut_by_budget"] > 0, server
    assert server["longest_turn_recent_ms"] < 500, server


def test_stats_show_the_loops_figures(broker: BrokerProcess) -> None:
    with broker.client() as client:
        client.send("q", b"x")
    server = broker.stats()["server"]
    assert server["turns"] > 0
    assert server["turn_budget_ms"] == 5.0
    assert server["longest_turn_ms"] >= server["longest_turn_recent_ms"] >= 0
    # A turn of a process the starved machine paused past its 5 ms budget is cut, and what
    # it did not read waits for the next turn: counted, so present, not necessarily zero.
    for name in ("turns_cut_by_budget", "backlog_peers", "backlog_frames", "backlog_bytes"):
        assert isinstance(server[name], int) and server[name] >= 0, name
    for name in ("backlog_frames_dropped", "peers_unreadable"):  # nothing lost, nobody given up
        assert server[name] == 0, name
    assert isinstance(server["input_pending"], bool)


def test_a_consumer_that_reads_nothing_is_given_up_past_max_backlog_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHPMQ_SEND_HWM", "1")
    monkeypatch.setenv("PHPMQ_MAX_BACKLOG_BYTES", str(1024 * 1024))
    broker = BrokerProcess(tmp_path / "broker.log", "--grace-seconds", "0")
    content = b"x" * 100_000
    with broker, raw_dealer(broker.address) as stuck:
        stuck.rcvhwm = 1
        stuck.setsockopt(zmq.RCVBUF, 4096)
        stuck.send(p.encode(p.Consume("big", 10_000)))  # then never reads
        with broker.client() as producer:
            for _ in range(20):  # each in a turn of its own: one frame of 2 MB each
                producer.send_many("big", [content] * 20)
                producer.flush()
                time.sleep(0.05)
        deadline = time.monotonic() + 10
        while (server := broker.stats()["server"])["peers_unreadable"] == 0:
            assert time.monotonic() < deadline, (server, broker.stats()["queues"])
            time.sleep(0.1)
        stats = broker.stats()
    assert server["backlog_frames_dropped"] >= 1
    assert stats["server"]["backlog_bytes"] <= 1024 * 1024 + 4 * 100_100
    # What it held went back to the queue for others.
    assert stats["queues"]["big"]["in_flight"] == 0
    assert stats["queues"]["big"]["ready"] == 400
    assert "is not reading" in broker.log()
