"""Overload with real broker processes: a flood costs its sender one ERROR per frame and does
not starve a calm pair, the consumer slots of vanished stock peers are freed, and a frozen
(SIGSTOPped) stock consumer's messages go to another consumer within one lease and are not
given back to it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import phpmq.protocol as p
from harness import BrokerProcess, phpmq, raw_dealer, recv_messages
from phpmq import Client
from phpmq.bench.flood import run_flood_benchmark
from phpmq.bench.measure import MB

# Their checks measure time (heartbeat gaps, redelivery and lease bounds): one at a time.
pytestmark = pytest.mark.xdist_group("timing")

LEASE_MS = 1000


def test_a_flooding_peer_gets_one_error_per_refused_frame(tmp_path: Path) -> None:
    frames, per_frame, limit = 20, 256, 100
    with (
        BrokerProcess(tmp_path / "broker.log", "--max-queue-length", str(limit)) as broker,
        raw_dealer(broker.address) as sock,
    ):
        sock.send(p.encode(p.Hello({"name": "flooder"})))
        [hello] = recv_messages(sock)
        assert isinstance(hello, p.Hello)
        frame = p.encode_all([p.Send("flood", b"x" * 100, 0) for _ in range(per_frame)])
        for _ in range(frames):
            sock.send(frame)
        replies: list = []
        deadline = time.monotonic() + 10
        while sum(e.count or 1 for e in replies if isinstance(e, p.Error)) < (
            frames * per_frame - limit
        ):
            assert time.monotonic() < deadline, f"only {replies} came back"
            replies += recv_messages(sock)
        errors = [m for m in replies if isinstance(m, p.Error)]
        assert len(errors) == frames  # the first frame filled the queue, then was refused too
        assert {(e.code, e.queue, e.refused) for e in errors} == {(429, "flood", 1)}
        pauses = [m for m in replies if isinstance(m, p.Pause)]
        assert [(m.code, m.queue) for m in pauses] == [(429, "flood")]
        stats = broker.stats()
        assert stats["queues"]["flood"]["refused"] == frames * per_frame - limit
        assert stats["queues"]["flood"]["paused_producers"] == 1
        table = phpmq("stats", "--broker", broker.address).stdout
        assert "clients refused, paused or stalled" in table
        assert re.search(rf"flooder .* {frames * per_frame - limit} .* flood", table), table
        assert "held in messages of" in table


def test_two_flooders_into_a_full_queue_do_not_starve_a_one_message_per_frame_pair() -> None:
    """Finding 10 of issue 27, as `phpmq bench --flood` runs it: two raw DEALERs send frames of
    256 sends into a full queue, never reading; a stock pair sending (and acking) one message
    per frame at 2,000 msg/s keeps moving. Before, each refused frame cost a decode per
    message, the pair got one frame read per two of theirs, and its latency grew by most of
    a second every second (15-18 s p99 in 20 s runs). The target (p99 50 ms) is for an
    otherwise idle machine (`phpmq bench --flood` prints it); this test runs beside the rest
    of the suite on 2 cores, so its bound is generous, and still one the old broker missed by
    seconds."""
    # The limit holds for the calm queue too: 10,000 lets the calm consumer fall 5 s behind on
    # a loaded machine (the p99 bound below is 3 s) before the calm queue refuses anything.
    figures = run_flood_benchmark(seconds=3.0, flooders=2, queue_limit=10_000)
    assert figures["missing"] == 0 and figures["duplicates"] == 0
    assert figures["received"] > 5_000
    assert figures["p99"] < 3_000, figures["p99"]
    assert figures["rss_peak"] < 512 * MB
    assert figures["stats"]["counters"]["overflowed"] > 100_000


def test_a_vanished_stock_consumers_window_frees_its_slot(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("max_consumers = 2\n")
    flags = ("--config", str(config), "--lease-ms", str(LEASE_MS))
    with BrokerProcess(tmp_path / "broker.log", *flags) as broker:
        for _ in range(2):  # stock consumers that subscribe and vanish without a word
            with raw_dealer(broker.address) as gone:
                gone.send(p.encode(p.Consume("jobs", 1)))
                time.sleep(0.1)
        assert broker.stats()["queues"]["jobs"]["consumers"] == 2
        time.sleep(LEASE_MS / 1000 + 0.2)  # silent past their lease: they do not count
        with Client(broker.address, name="late") as consumer, broker.client() as producer:
            # Subscribed before anything is sent: no failed dispatch frees a slot first.
            consumer.subscribe("jobs", 1)
            consumer.receive(timeout=0.3)
            producer.send("jobs", b"for the live one", confirm=True)
            message = consumer.receive(timeout=5)
            assert message is not None and message.content == b"for the live one"
            message.ack()
        stats = broker.stats()
        assert stats["counters"]["consumers_reclaimed"] == 1


STOCK_TCP_CONSUMER = textwrap.dedent(
    """
    import socket, sys
    from phpmq.protocol import StreamDecoder
    port, queue, window = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    packet = lambda kind, content: b"P%02d%029d" % (kind, len(content)) + content
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"H0100202" + packet(1, queue.encode()) + packet(4, b"%d" % window))
    decoder = StreamDecoder()
    while True:
        data = sock.recv(65536)
        if not data:
            break
        decoder.receive_data(data)
        while (message := decoder.next_message()) is not None:
            print("got", message.message_id.decode(), flush=True)
    """
)


def test_a_frozen_stock_tcp_consumers_messages_go_elsewhere_within_one_lease(
    tmp_path: Path,
) -> None:
    count = 10
    flags = ("--lease-ms", str(LEASE_MS))
    with BrokerProcess(tmp_path / "broker.log", *flags, tcp=True) as broker:
        with broker.client() as producer:
            producer.send_many("jobs", [b"%d" % i for i in range(count)], confirm=True)
        frozen = subprocess.Popen(
            [sys.executable, "-c", STOCK_TCP_CONSUMER, str(broker.tcp_port), "jobs", str(count)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            got = [frozen.stdout.readline().split()[1] for _ in range(count)]  # type: ignore[union-attr]
            assert len(set(got)) == count
            frozen.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            with Client(broker.address, name="healthy") as healthy:
                healthy.subscribe("jobs", count)
                received = []
                while len(received) < count:
                    message = healthy.receive(timeout=LEASE_MS / 1000 + 3)
                    assert message is not None, f"only {len(received)} came back"
                    received.append(message.id)
                    message.ack()
                took = time.monotonic() - stopped_at
                assert sorted(received) == sorted(got)
                assert took < LEASE_MS / 1000 + 2, f"the last one took {took:.1f}s"
                stats = broker.stats()
            [peer] = [c for c in stats["clients"] if c["transport"] == "tcp"]
            assert peer["stalled"] is True and peer["held"] == 0
            assert stats["counters"]["stalled_consumers"] == 1
            assert stats["counters"]["lease_expired"] == count
        finally:
            frozen.send_signal(signal.SIGCONT)
            frozen.kill()
            frozen.wait(5)
