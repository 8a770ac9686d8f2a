"""The ZeroMQ shell: a real broker process on loopback, real DEALER sockets."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import phpmq.protocol as p
from harness import (
    BrokerProcess,
    errors,
    nothing_received,
    phpmq,
    raw_dealer,
    recv_messages,
    wait_for,
)
from phpmq.client import BrokerRefused, Client, ClientError

#: The signals a broker handles (its tests restore this process's handlers).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The stock php-mq client's pre-TTL 001 (reference TV-B).
STOCK_SEND = (
    b"H0100102P0100000000000000000000000000003Foo"  # header, queue packet
    b"P0200000000000000000000000000011Hello World"  # content packet
)


def test_messages_move_from_a_producer_to_a_consumer(broker: BrokerProcess) -> None:
    with broker.client() as producer:
        producer.send("emails", b"hello", ttl=3600)
        producer.send("emails", "world")
    with broker.client() as consumer:
        got = []
        for message in consumer.consume("emails", window=10, timeout=5):
            got.append(message)
            message.ack()
            if len(got) == 2:
                break
    assert [m.content for m in got] == [b"hello", b"world"]
    assert 3595 <= got[0].ttl <= 3600
    assert got[1].ttl == 0
    assert [m.delivery_count for m in got] == [1, 1]
    stats = broker.stats()
    assert stats["queues"]["emails"] == {
        "ready": 0,
        "in_flight": 0,
        "delayed": 0,
        "consumers": 0,
        "dead_letters": 0,
        "leased": 0,
        "leases": 0,
        "oldest_sent_at": None,
        "refused": 0,
        "totals": {
            "published": 2,
            "delivered": 2,
            "acked": 2,
            "requeued": 0,
            "expired": 0,
            "dead_lettered": 0,
        },
        "paused_producers": 0,
        "bindings": [],
        "binding_count": 0,
        "delete_when_unused_ms": None,
        "settings": {"max_deliveries": 20, "max_length": 1_000_000, "overflow": "reject"},
    }
    assert stats["counters"]["acked"] == 2


def test_send_many_packs_frames_and_loses_nothing(broker: BrokerProcess) -> None:
    contents = [b"%06d" % i for i in range(5000)]
    with broker.client() as producer:
        assert producer.send_many("bulk", contents) == 5000
    received = []
    with broker.client() as consumer:
        for message in consumer.consume("bulk", window=500, timeout=5):
            received.append(message.content)
            message.ack()
            if len(received) == len(contents):
                break
    assert received == contents
    assert broker.stats()["queues"]["bulk"]["ready"] == 0


def test_binary_content_survives_the_round_trip(broker: BrokerProcess) -> None:
    content = bytes(range(256)) * 1000 + b"H0100102P01"
    with broker.client() as client:
        client.send("bin", content)
        message = next(client.consume("bin", window=1, timeout=5))
        assert message.content == content
        message.ack()


def test_unacked_messages_of_a_closed_consumer_go_to_another(broker: BrokerProcess) -> None:
    with broker.client() as producer:
        producer.send_many("jobs", [b"a", b"b", b"c"])
    first = broker.client()
    held = next(iter(first.consume("jobs", window=3, timeout=5)))
    # DISCONNECT, KBAI: the broker takes back what it held; what came but was never handed
    # out goes back unstarted, with its delivery count as it was (docs/protocol.md §3.6).
    first.close()
    with broker.client() as second:
        got = []
        for message in second.consume("jobs", window=10, timeout=5):
            got.append(message)
            message.ack()
            if len(got) == 3:
                break
    assert [m.content for m in got] == [b"a", b"b", b"c"]
    assert [m.delivery_count for m in got] == [2, 1, 1]
    assert got[0].id == held.id


def test_dead_letters_requeue_and_expiry_through_a_real_broker(broker: BrokerProcess) -> None:
    with broker.client() as client:
        client.send_many("work", [b"keep", b"poison"])
        stream = client.consume("work", window=2, timeout=5)
        keep, poison = next(stream), next(stream)
        poison.dead_letter("bad input")
        keep.requeue(ttl=60)
        again = next(stream)
        assert (again.id, again.delivery_count, again.content) == (keep.id, 2, b"keep")
        again.ack()
        client.flush()
        listed = client.admin("dlq-list", queue="work")
    assert [(e["id"], e["reason"]) for e in listed["entries"]] == [(poison.id, "bad input")]


def test_a_stock_dealer_speaks_plain_phpmq(broker: BrokerProcess) -> None:
    """No HELLO: pre-TTL 001 in, TTL-form 003 out (the ZeroMQ endpoint's default dialect)."""
    with raw_dealer(broker.address) as sock:
        sock.send(STOCK_SEND)
        sock.send(b"H0100202P0100000000000000000000000000003FooP04000000000000000000000000000015")
        [dispatch] = recv_messages(sock)
        assert isinstance(dispatch, p.Dispatch)
        assert (dispatch.queue, dispatch.content, dispatch.ttl) == ("Foo", b"Hello World", 0)
        assert dispatch.delivery_count is None
        sock.send(p.encode(p.Ack("Foo", dispatch.message_id)))
        # An ack of something it does not hold gets no reply: stock peers get no ERROR.
        sock.send(p.encode(p.Ack("Foo", "0" * 32)))
        assert nothing_received(sock)
    stats = broker.stats()
    assert stats["counters"]["acked"] == 1
    assert stats["counters"]["errors"] == 1


def test_bad_bytes_get_an_error_and_do_not_disturb_other_clients(broker: BrokerProcess) -> None:
    with broker.client() as good, raw_dealer(broker.address) as bad:
        bad.send(p.encode(p.Hello({"name": "bad"})))
        assert isinstance(recv_messages(bad)[0], p.Hello)
        vectors = [
            b"X0100202",
            b"H0200202P0100000000000000000000000000003Foo",
            b"H0100799",
            b"H0100203P0100000000000000000000000000003FooP04000000000000000000000000000015",
            b"H0100202P01000000000000000000000000000000003Foo",
            b"\x00" * 100,
            b"",
        ]
        for vector in vectors:
            bad.send(vector)
            [error] = errors(recv_messages(bad))
            assert error.code in (400, 405, 505), error
        bad.send_multipart([b"", b"H0100202"])  # REQ-style envelope: not our framing
        [error] = errors(recv_messages(bad))
        assert "multipart" in error.reason
        good.send("ok", b"still here")
        message = next(good.consume("ok", window=1, timeout=5))
        assert message.content == b"still here"
        message.ack()
    assert broker.process.poll() is None


def test_refusals_reach_a_python_client_as_errors(broker: BrokerProcess) -> None:
    with broker.client() as client:
        with pytest.raises(BrokerRefused, match="422 unknown admin command"):
            client.admin("explode")
        # A queue name no broker accepts is refused before it is sent (protocol.rules)...
        with pytest.raises(ClientError, match="422 queue name contains whitespace"):
            client.send("bad queue name", b"x")
        # ...what only the broker can judge (its max_window) comes back as an ERROR, raised
        # by the consume it refuses.
        with pytest.raises(BrokerRefused, match=r"422 consume count .* maximum window"):
            list(client.consume("ok", window=10**9, timeout=5))
        assert any(e.code == 422 and "maximum window" in e.reason for e in client.errors)


def test_a_consumer_that_vanishes_without_goodbye_is_noticed_on_send(
    broker: BrokerProcess,
) -> None:
    """ROUTER_MANDATORY: a send to a peer whose connection is gone releases its messages."""
    with raw_dealer(broker.address, identity=b"ghost") as sock:
        sock.send(p.encode(p.Consume("ghostq", 5)))
    # The ghost's socket is closed; its window remains until a send fails.
    with broker.client() as producer:
        producer.send_many("ghostq", [b"1", b"2"])
    with broker.client() as consumer:
        got = []
        for message in consumer.consume("ghostq", window=5, timeout=5):
            got.append(message.content)
            message.ack()
            if len(got) == 2:
                break
    assert sorted(got) == [b"1", b"2"]


def test_sigterm_drains_waits_for_acks_then_exits(broker: BrokerProcess) -> None:
    with broker.client() as producer:
        producer.send_many("drain", [b"held", b"ready"])
    consumer = broker.client()
    held = next(iter(consumer.consume("drain", window=1, timeout=5)))
    broker.signal(signal.SIGTERM)
    broker.wait_draining()
    # While draining: sends are refused (told at the latest when the client closes), acks
    # are taken.
    late = broker.client()
    late.send("drain", b"refused")
    assert list(late.consume("nothing", window=1, timeout=0.5)) == []
    assert any(e.code == 503 for e in late.errors)
    with pytest.raises(BrokerRefused, match="503 broker is shutting down"):
        late.close()
    held.ack()
    consumer.flush()
    assert broker.wait(10) == 0
    consumer.close()
    log = broker.log()
    assert "stopping: no new sends" in log
    assert "exiting with 1 ready and 0 unacked messages in memory: they are lost" in log


def test_second_signal_exits_at_once(tmp_path) -> None:
    broker = BrokerProcess(tmp_path / "b.log", "--grace-seconds", "60")
    try:
        consumer = broker.client()
        with broker.client() as producer:
            producer.send("q", b"x")
        next(iter(consumer.consume("q", window=1, timeout=5)))  # held: the drain would wait
        broker.signal(signal.SIGTERM)
        broker.wait_draining()  # both pending at once, Python would handle SIGINT first
        broker.signal(signal.SIGINT)
        assert broker.wait(10) == 0  # stopped by SIGTERM: 0 (SIGINT first: 130)
        assert "second stop signal" in broker.log()
        consumer.close()
    finally:
        broker.stop()


def serve_until_stopped(
    stop: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch, signals: bool = False
) -> float:
    """Run a broker's loop in this (the main) thread, its idle poll a minute long, and have
    another thread call `stop(server)` once it serves; how long the loop ran after that.
    `signals`: with the broker's signal handlers (this process's are restored after)."""
    from phpmq.broker.config import BrokerConfig
    from phpmq.broker.shell import server as shell

    monkeypatch.setattr(shell, "MAX_POLL_MS", 60_000)
    server = shell.BrokerServer(BrokerConfig(bind="tcp://127.0.0.1:*", grace_seconds=0))
    serving = threading.Event()
    stopped_at: list[float] = []

    def stop_once_serving() -> None:
        serving.wait(10)
        time.sleep(0.2)  # the loop is in its poll
        stopped_at.append(time.monotonic())
        stop(server)

    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    stopper = threading.Thread(target=stop_once_serving)
    try:
        if signals:
            server.install_signal_handlers()
        stopper.start()
        server.run(on_ready=lambda _: serving.set())
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    stopper.join(10)
    return time.monotonic() - stopped_at[0]


def test_a_stop_request_from_another_thread_wakes_the_loop_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As when a shard's supervisor is gone (its watcher thread asks for the stop)."""
    assert serve_until_stopped(lambda server: server.request_stop(), monkeypatch) < 5


def test_a_sigterm_that_lands_in_another_thread_wakes_the_loop_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel hands a process's signal to any of its threads that does not block it (the
    ZAP thread, Raft's): the loop's poll must end all the same, not at its timeout (0.25 s
    then, paid by every test that stops a broker)."""

    def sigterm_to_this_thread(_: Any) -> None:
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    assert serve_until_stopped(sigterm_to_this_thread, monkeypatch, signals=True) < 5


def test_broker_refuses_to_start_on_a_taken_address(broker: BrokerProcess) -> None:
    second = subprocess.run(
        [sys.executable, "-m", "phpmq", "broker", "--bind", broker.address],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 1
    assert f"cannot bind {broker.address}" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1


def test_the_ready_file_says_where_the_broker_got_its_ports_until_it_exits(tmp_path) -> None:
    ready = tmp_path / "ready.json"
    ready.write_text(json.dumps({"pid": 1, "bind": "tcp://127.0.0.1:1"}))  # an earlier run's
    anywhere = "tcp://127.0.0.1:*"
    broker = subprocess.Popen(
        [sys.executable, "-m", "phpmq", "broker", "--bind", anywhere, "--tcp-bind", anywhere,
         "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        def written_by_this_broker() -> dict | None:
            with contextlib.suppress(FileNotFoundError):
                written = json.loads(ready.read_text())
                return written if written["pid"] == broker.pid else None
            return None

        written = wait_for(written_by_this_broker, "the ready file", timeout=20)
        assert set(written) == {"pid", "bind", "tcp_bind"}
        assert written["pid"] == broker.pid
        prefix = "tcp://127.0.0.1:"
        ports = {int(written[name].removeprefix(prefix)) for name in ("bind", "tcp_bind")}
        assert len(ports) == 2 and 0 not in ports
        with Client(written["bind"]) as client:
            assert client.admin("stats")["queues"] == {}
    finally:
        broker.terminate()
        assert broker.wait(20) == 0
    assert not ready.exists()


def test_a_ready_file_that_cannot_be_written_stops_the_start_with_one_line(tmp_path) -> None:
    missing = tmp_path / "no-such-folder" / "ready.json"
    result = phpmq("broker", "--bind", "tcp://127.0.0.1:*", "--ready-file", str(missing))
    assert result.returncode == 1
    assert result.stderr == (
        f"phpmq: cannot write the ready file {missing}: {missing.parent} is not a writable"
        " folder\n"
    )


def test_send_without_a_broker_raises_instead_of_losing(tmp_path) -> None:
    from harness import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    with (
        Client(address, send_timeout=0.3, close_timeout=0.1) as client,
        pytest.raises(ClientError, match="could not hand the message to the broker"),
    ):
        client.send("q", b"x")


def test_many_producers_at_once_lose_nothing(broker: BrokerProcess) -> None:
    per_thread = 2000

    def produce(index: int) -> None:
        with broker.client() as client:
            client.send_many("multi", [b"%d-%d" % (index, i) for i in range(per_thread)])

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    seen = set()
    with broker.client() as consumer:
        for message in consumer.consume("multi", window=1000, timeout=5):
            seen.add(message.content)
            message.ack()
            if len(seen) == 4 * per_thread:
                break
    assert len(seen) == 4 * per_thread
    assert broker.stats()["counters"]["received"] == 4 * per_thread


def test_router_socket_is_mandatory_and_bounded(broker: BrokerProcess) -> None:
    """A DEALER that never reads gets at most its window; the broker keeps serving others."""
    with broker.client() as producer:
        producer.send_many("flood", [b"x" * 100] * 3000)
    with raw_dealer(broker.address) as lazy:
        lazy.rcvhwm = 1
        lazy.send(p.encode(p.Consume("flood", 1000)))
        with broker.client() as other:
            other.send("side", b"y")
            message = next(other.consume("side", window=1, timeout=5))
            assert message.content == b"y"
            message.ack()
        stats = broker.stats()["queues"]["flood"]
        assert stats["in_flight"] == 1000
        assert stats["ready"] == 2000


def test_each_xdist_worker_picks_ports_from_its_own_slice(monkeypatch) -> None:
    """Two workers never race for a port: a broker killed and started again on its port once
    found it taken by another worker's pick."""
    from itertools import pairwise

    from phpmq.testing import _picked_range, free_ports

    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    slices = []
    for worker in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        slices.append(_picked_range(3))
        first = int(free_ports(3).rpartition(":")[2])
        assert slices[-1][0] <= first <= slices[-1][1]
    for (_, high), (low, _) in pairwise(slices):
        assert high + 3 <= low  # a run of three from one slice ends before the next begins
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert _picked_range(1)[0] == slices[0][0]  # one process: the whole range
