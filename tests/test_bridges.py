"""The bridges (`phpmq bridge KIND ...`) as real subprocesses between a real broker and plain
pyzmq peers: every message moved exactly once where the bridge promises it, backpressure
instead of drops, graceful SIGTERM (exit 0, nothing unacked lost), counters in `phpmq stats`.

The tool side always binds (on port 0) and the bridge connects; waits are bounded.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from harness import REPO, BrokerProcess, read_until, wait_for
from phpmq.client import Client

REPORT_SECONDS = "0.2"


class Broker(BrokerProcess):
    """A broker process with one long-lived admin client for cheap stats."""

    def __init__(self, log_path: Path, *args: str) -> None:
        super().__init__(log_path, "--grace-seconds", "0.5", *args)
        self.admin = Client(self.address, name="test-admin", close_timeout=1)

    def stats(self) -> dict:
        return self.admin.admin("stats")

    def queue(self, name: str) -> dict:
        return self.stats()["queues"].get(name, {"ready": 0, "in_flight": 0, "consumers": 0})

    def bridge_counters(self, name: str) -> dict:
        report = self.stats()["bridges"].get(name)
        return report["counters"] if report else {}

    def stop(self) -> None:
        self.admin.close()
        super().stop()


class Bridge:
    """A `phpmq bridge KIND` subprocess with its log captured to a file."""

    def __init__(self, log_path: Path, broker: Broker, kind: str, *args: str) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "phpmq",
                "bridge",
                kind,
                *args,
                "--broker",
                broker.address,
                "--report-seconds",
                REPORT_SECONDS,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )

    def stop(self) -> int:
        """SIGTERM, wait; the exit status (killed after 15 s: then it is not 0)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    process = Broker(tmp_path / "broker.log")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def start_bridge(tmp_path: Path, broker: Broker) -> Iterator[Callable[..., Bridge]]:
    """Start bridges; every one is SIGTERMed at teardown and must exit 0."""
    started: list[Bridge] = []

    def start(kind: str, *args: str, on: Broker | None = None) -> Bridge:
        bridge = Bridge(tmp_path / f"bridge-{len(started)}.log", on or broker, kind, *args)
        started.append(bridge)
        return bridge

    yield start
    failures = []
    for bridge in started:
        status = bridge.stop()
        if status != 0:
            failures.append(f"{bridge.process.args[4]} exited {status}:\n{bridge.log()}")
    assert not failures, "\n".join(failures)


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


def bound(context: zmq.Context, kind: int, **options: int) -> tuple[zmq.Socket, str]:
    sock = context.socket(kind)
    sock.linger = 0
    for name, value in options.items():
        setattr(sock, name, value)
    sock.bind("tcp://127.0.0.1:0")
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)



def drain(broker: Broker, queue: str, count: int, window: int = 500) -> list:
    """Consume and ack exactly `count` messages; fail if fewer come or more are left."""
    got = []
    with broker.client() as consumer:
        for message in consumer.consume(queue, window=window, timeout=5):
            got.append(message)
            message.ack()
            if len(got) == count:
                break
        assert len(got) == count, f"{len(got)} of {count} in {queue}"
        assert consumer.receive(timeout=0.1) is None, f"more than {count} in {queue}"
    return got


# ----------------------------------------------------------------- pull-in


def test_pull_in_single_part_messages_go_to_the_queue_once(
    broker: Broker, start_bridge, context
) -> None:
    push, address = bound(context, zmq.PUSH, sndtimeo=10_000)
    start_bridge("pull-in", address, "--queue", "jobs", "--name", "pull")
    contents = [b"job-%05d" % i for i in range(2000)]
    for content in contents:
        push.send(content)
    wait_for(lambda: broker.queue("jobs")["ready"] == len(contents), "all queued")
    assert [m.content for m in drain(broker, "jobs", len(contents))] == contents
    wait_for(lambda: broker.bridge_counters("pull").get("sent") == 2000, "bridge counters")
    assert broker.bridge_counters("pull")["refused"] == 0


def test_pull_in_counts_what_a_full_queue_refuses_and_waits_for_room(
    tmp_path: Path, start_bridge, context
) -> None:
    full = Broker(tmp_path / "broker-full.log", "--max-queue-length", "5")
    try:
        push, address = bound(context, zmq.PUSH, sndtimeo=10_000)
        bridge = start_bridge("pull-in", address, "--queue", "jobs", "--name", "full", on=full)
        for i in range(8):
            push.send(b"job-%d" % i)
        wait_for(lambda: full.queue("jobs")["ready"] == 5, "the queue is full")
        # Sent without confirms: the refusals come back as ERRORs the bridge collects.
        wait_for(lambda: full.bridge_counters("full").get("refused") == 3, "3 refused")
        assert full.bridge_counters("full")["sent"] == 5
        assert "the broker refused" in bridge.log() and "429" in bridge.log()
        # The broker paused the bridge on the full queue: the next message waits for room.
        push.send(b"after")
        with full.client() as consumer:
            for message in consumer.consume("jobs", window=5, timeout=2):
                message.ack()
                if message.content == b"after":
                    break
        wait_for(lambda: full.bridge_counters("full").get("sent") == 6, "goes on once resumed")
        assert full.bridge_counters("full")["received"] == 9
    finally:
        full.stop()


def test_pull_in_two_part_messages_name_their_queue(broker: Broker, start_bridge, context) -> None:
    push, address = bound(context, zmq.PUSH, sndtimeo=10_000)
    bridge = start_bridge("pull-in", address, "--name", "pull2")
    expected: dict[str, list[bytes]] = {"q1": [], "q2": []}
    for i in range(600):
        queue = "q1" if i % 3 else "q2"
        expected[queue].append(b"%s-%04d" % (queue.encode(), i))
        push.send_multipart([queue.encode(), expected[queue][-1]])
    push.send(b"one part only")
    push.send_multipart([b"q1", b"three", b"parts"])
    for queue, contents in expected.items():
        count = len(contents)
        wait_for(lambda q=queue, n=count: broker.queue(q)["ready"] == n, queue)
        assert [m.content for m in drain(broker, queue, count)] == contents
    wait_for(lambda: broker.bridge_counters("pull2").get("refused") == 2, "2 refused")
    assert broker.bridge_counters("pull2")["sent"] == 600
    assert "dropping a 1-part message: expected 2 parts (queue, content)" in bridge.log()
    assert "dropping a 3-part message" in bridge.log()
    # A queue name no broker accepts is dropped by the bridge, which goes on.
    push.send_multipart([b"bad queue", b"x"])
    push.send_multipart([b"q1", b"after"])
    wait_for(lambda: broker.bridge_counters("pull2").get("refused") == 3, "3 refused")
    wait_for(lambda: broker.queue("q1")["ready"] == 1, "the bridge still sends")
    assert "queue name contains whitespace" in bridge.log()


def _push_while_broker_paused(
    broker: Broker, push: zmq.Socket, pause: float, stop_at_block: bool
) -> tuple[int, float | None]:
    """SIGSTOP the broker, PUSH numbered 1 KB messages as fast as the socket takes them
    (100 ms send timeout) for `pause` seconds, SIGCONT. Returns (sent, seconds to 1st block)."""
    payload = b"p" * 1000
    sent = 0
    blocked_after = None
    broker.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < pause:
            try:
                push.send(b"%07d" % sent + payload)
                sent += 1
            except zmq.Again:
                if blocked_after is None:
                    blocked_after = elapsed
                    if stop_at_block:
                        time.sleep(0.2)  # stays blocked: nothing dropped meanwhile
                        break
    finally:
        broker.signal(signal.SIGCONT)
    return sent, blocked_after


def test_pull_in_backpressure_while_the_broker_is_paused_loses_nothing(
    broker: Broker, start_bridge, context
) -> None:
    """A paused broker (shorter than the client's liveness, 3 s): the bridge stops reading,
    the PUSH side blocks at its high-water mark, and after SIGCONT everything arrives."""
    push, address = bound(context, zmq.PUSH, sndhwm=10, sndtimeo=100)
    start_bridge("pull-in", address, "--queue", "bp", "--hwm", "10", "--name", "bp")
    push.sndtimeo = 10_000
    push.send(b"warm-up")
    wait_for(lambda: broker.queue("bp")["ready"] == 1, "the bridge is connected")
    push.sndtimeo = 100
    sent, blocked_after = _push_while_broker_paused(broker, push, 1.5, stop_at_block=True)
    print(f"\nPUSH blocked after {blocked_after}s and {sent} messages while the broker was paused")
    assert blocked_after is not None, "the PUSH side never blocked"
    assert sent > 10  # more than the PULL side's high-water mark
    push.sndtimeo = 10_000
    for i in range(sent, sent + 100):  # and it flows again
        push.send(b"%07d" % i)
    total = sent + 100
    wait_for(lambda: broker.queue("bp")["ready"] == total + 1, f"{total + 1} queued", 20)
    got = drain(broker, "bp", total + 1, window=2000)
    assert [m.content[:7] for m in got[1:]] == [b"%07d" % i for i in range(total)]


def test_pull_in_loses_nothing_when_the_broker_pauses_past_the_client_liveness(
    broker: Broker, start_bridge, context
) -> None:
    push, address = bound(context, zmq.PUSH, sndtimeo=10_000)
    start_bridge("pull-in", address, "--queue", "long", "--name", "long")
    push.send(b"warm-up")
    wait_for(lambda: broker.queue("long")["ready"] == 1, "the bridge is connected")
    # 80 MB at the start of a 4.5 s pause: more than the kernel's socket buffers hold, so
    # part of it waits in the bridge's DEALER when the client gives the broker up (~3 s).
    count = 800
    broker.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        for i in range(count):
            push.send(b"%04d" % i + b"z" * 100_000)
        time.sleep(max(0.0, 4.5 - (time.monotonic() - started)))
    finally:
        broker.signal(signal.SIGCONT)
    total = count + 1
    wait_for(lambda: broker.bridge_counters("long").get("sent") == total, "bridge sent", 20)
    # "sent" counts what the bridge's socket took; under load the last of 80 MB may still be
    # on its way to the broker then (from the socket replaced at the reconnect, lingering).
    queued = read_until(
        lambda: broker.queue("long")["ready"], lambda ready: ready == total, timeout=20
    )
    print(f"\nthe bridge counted {total} sent after a 4.5 s broker pause; queued {queued}")
    assert queued == total


# ----------------------------------------------------------------- sub-in


def test_sub_in_maps_topics_to_queues(broker: Broker, start_bridge, context) -> None:
    pub, address = bound(context, zmq.PUB)
    start_bridge("sub-in", address, "--topic", "a=qa", "--topic", "b=qb", "--name", "sub")
    # Slow joiner: publish until the subscription is in place for both topics.
    deadline = time.monotonic() + 10
    while broker.queue("qa")["ready"] == 0 or broker.queue("qb")["ready"] == 0:
        assert time.monotonic() < deadline, "the bridge never got the warm-up messages"
        pub.send_multipart([b"a", b"warm"])
        pub.send_multipart([b"b", b"warm"])
        time.sleep(0.05)
    time.sleep(0.1)  # warm-up messages in flight settle before counting
    warm = {q: broker.queue(q)["ready"] for q in ("qa", "qb")}
    pub.send_multipart([b"a", b"MARK"])
    pub.send_multipart([b"b", b"MARK"])
    expected: dict[str, list[bytes]] = {"qa": [b"MARK"], "qb": [b"MARK"]}
    for i in range(200):
        for topic in (b"a", b"b", b"c"):
            content = b"%s-%03d" % (topic, i)
            pub.send_multipart([topic, content])
            if topic != b"c":
                expected["q" + topic.decode()].append(content)
    pub.send(b"a-one-part")  # one part that starts with its topic: the whole part is content
    expected["qa"].append(b"a-one-part")
    for queue, contents in expected.items():
        total = warm[queue] + len(contents)
        wait_for(lambda q=queue, n=total: broker.queue(q)["ready"] >= n, f"{queue} filled")
        got = [m.content for m in drain(broker, queue, total)]
        assert set(got[: warm[queue]]) == {b"warm"}
        assert got[warm[queue] :] == contents
    queues = broker.stats()["queues"]
    assert set(queues) == {"qa", "qb"}, "topic c must not be queued"


# ----------------------------------------------------------------- push-out


def test_push_out_delivers_a_queue_once(broker: Broker, start_bridge, context) -> None:
    pull, address = bound(context, zmq.PULL)
    contents = [b"out-%05d" % i for i in range(1000)]
    with broker.client() as producer:
        producer.send_many("out", contents)
    start_bridge("push-out", "out", address, "--window", "20", "--name", "push")
    got = []
    while len(got) < len(contents):
        assert pull.poll(5000), f"only {len(got)} of {len(contents)} pushed"
        got.append(pull.recv())
    assert got == contents
    assert not pull.poll(200)
    wait_for(
        lambda: broker.queue("out")["ready"] == broker.queue("out")["in_flight"] == 0,
        "every message acked",
    )
    wait_for(lambda: broker.bridge_counters("push").get("pushed") == 1000, "counters")
    assert broker.stats()["counters"]["acked"] == 1000


def test_push_out_backpressure_from_a_slow_pull_side(broker: Broker, start_bridge, context) -> None:
    window = 10
    pull, address = bound(context, zmq.PULL, rcvhwm=5, rcvbuf=64 * 1024)
    contents = [b"%05d" % i + b"s" * 32_000 for i in range(400)]  # 12.8 MB, more than buffers
    with broker.client() as producer:
        producer.send_many("slow", contents)
    start_bridge(
        "push-out", "slow", address, "--window", str(window), "--hwm", "5", "--name", "slow"
    )
    # Nobody reads: the bridge blocks; the broker holds the rest.
    wait_for(lambda: broker.queue("slow")["consumers"] == 1, "bridge subscribed")
    time.sleep(1.0)
    stalled = broker.queue("slow")
    assert stalled["in_flight"] <= window
    assert stalled["ready"] > 0, "the bridge took everything although nobody reads"
    time.sleep(0.3)
    assert broker.queue("slow")["ready"] == stalled["ready"], "the bridge kept taking"
    # Read slowly: the queue drains, in flight never above the window, nothing lost.
    got = []
    max_in_flight = 0
    while len(got) < len(contents):
        assert pull.poll(5000), f"only {len(got)} of {len(contents)}"
        got.append(pull.recv())
        if len(got) % 40 == 0:
            max_in_flight = max(max_in_flight, broker.queue("slow")["in_flight"])
            time.sleep(0.02)
    print(f"\nready {stalled['ready']} of 400 while stalled; max in flight {max_in_flight}")
    assert max_in_flight <= window
    assert got == contents
    wait_for(lambda: broker.queue("slow")["ready"] == broker.queue("slow")["in_flight"] == 0, "")


def test_push_out_sigterm_leaves_unacked_messages_in_the_queue(
    broker: Broker, start_bridge, context, tmp_path
) -> None:
    pull, address = bound(context, zmq.PULL, rcvhwm=1, rcvbuf=16 * 1024)
    total = 200
    with broker.client() as producer:
        producer.send_many("term", [b"%04d" % i + b"t" * 32_000 for i in range(total)])
    bridge = start_bridge("push-out", "term", address, "--window", "10", "--hwm", "1")
    wait_for(lambda: broker.queue("term")["in_flight"] == 10, "the bridge holds a window")
    time.sleep(0.5)  # blocked on the PULL side that does not read
    assert bridge.stop() == 0
    acked = broker.stats()["counters"]["acked"]
    stats = broker.queue("term")
    assert stats["in_flight"] == 0
    assert stats["ready"] + acked == total
    assert 0 < acked < total
    # What was acked went to the PULL side (or died in the closed bridge's socket buffers:
    # at most once past the bridge); it is not in the queue any more.
    pushed = []
    while pull.poll(300):
        pushed.append(pull.recv()[:4])
    left = [m.content[:4] for m in drain(broker, "term", stats["ready"])]
    assert not set(pushed) & set(left)
    assert len(pushed) <= acked
    assert len(set(pushed)) == len(pushed)
    assert len(set(left)) == len(left) == total - acked
    print(f"\nSIGTERM: {acked} acked ({len(pushed)} reached PULL), {len(left)} back in queue")


# ----------------------------------------------------------------- pub-out


def _warm_up_sub(broker: Broker, sub: zmq.Socket, queue: str) -> int:
    """Send warm-up messages to the queue until the SUB receives one (the PUB's subscription
    has arrived); drain them. Returns how many were sent."""
    deadline = time.monotonic() + 10
    sent = 0
    with broker.client() as producer:
        while True:
            assert time.monotonic() < deadline, "the SUB never got a warm-up message"
            producer.send(queue, b"warm")
            sent += 1
            if sub.poll(100):
                break
    while sub.poll(300):
        assert sub.recv_multipart()[1] == b"warm"
    return sent


def test_pub_out_publishes_queue_and_content(broker: Broker, start_bridge, context) -> None:
    sub, address = bound(context, zmq.SUB)
    sub.subscribe(b"")
    start_bridge("pub-out", "news", address, "--name", "pub")
    _warm_up_sub(broker, sub, "news")
    contents = [b"news-%04d" % i for i in range(500)]
    with broker.client() as producer:
        producer.send_many("news", contents)
    got = []
    while len(got) < len(contents):
        assert sub.poll(5000), f"only {len(got)} of {len(contents)}"
        got.append(sub.recv_multipart())
    assert got == [[b"news", c] for c in contents]
    wait_for(lambda: broker.queue("news")["ready"] == broker.queue("news")["in_flight"] == 0, "")


def test_pub_out_topic_override(broker: Broker, start_bridge, context) -> None:
    sub, address = bound(context, zmq.SUB)
    sub.subscribe(b"custom")
    start_bridge("pub-out", "alerts", address, "--topic", "custom", "--name", "pub-topic")
    _warm_up_sub(broker, sub, "alerts")
    with broker.client() as producer:
        producer.send_many("alerts", [b"a1", b"a2", b"a3"])
    got = []
    while len(got) < 3:
        assert sub.poll(5000)
        got.append(sub.recv_multipart())
    assert got == [[b"custom", b"a1"], [b"custom", b"a2"], [b"custom", b"a3"]]


def test_pub_out_follows_a_live_feed_under_event_topics(
    broker: Broker, start_bridge, context
) -> None:
    sub, address = bound(context, zmq.SUB)
    sub.subscribe(b"order.")
    bridge = start_bridge("pub-out", address, "--events", "order.*", "--name", "pub-live")
    wait_for(lambda: any(q.startswith("live.") for q in broker.stats()["queues"]), "a live feed")
    with broker.client() as producer:
        deadline = time.monotonic() + 10
        while not sub.poll(100):  # until the SUB's subscription reached the PUB
            assert time.monotonic() < deadline, "the SUB never got a warm-up event"
            producer.publish("order.warm", b"warm")
        while sub.poll(300):
            sub.recv_multipart()
        for n in range(3):
            assert producer.publish(f"order.{n}", b"o%d" % n) == 1
        producer.publish("user.1", b"not for the feed")
    got = []
    while len(got) < 3:
        assert sub.poll(5000), f"only {got}"
        got.append(sub.recv_multipart())
    assert got == [[b"order.%d" % n, b"o%d" % n] for n in range(3)]
    assert bridge.stop() == 0
    wait_for(
        lambda: not any(q.startswith("live.") for q in broker.stats()["queues"]),
        "the live feed goes with the bridge",
    )


def test_pub_out_needs_a_queue_or_events(broker: Broker) -> None:
    for args in (["tcp://127.0.0.1:1"], ["q", "tcp://127.0.0.1:1", "--events", "a.*"]):
        result = subprocess.run(
            [sys.executable, "-m", "phpmq", "bridge", "pub-out", "--broker", broker.address, *args],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
        assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
        assert "ADDRESS" in result.stderr


# ----------------------------------------------------------------- req-out


def test_req_out_acks_on_reply_and_queues_replies(broker: Broker, start_bridge, context) -> None:
    rep, address = bound(context, zmq.REP)
    contents = [b"req-%03d" % i for i in range(30)]
    with broker.client() as producer:
        producer.send_many("requests", contents)
    start_bridge(
        "req-out",
        "requests",
        address,
        "--timeout",
        "2",
        "--reply-queue",
        "replies",
        "--name",
        "req",
    )
    for content in contents:
        assert rep.poll(5000), "no request"
        assert rep.recv() == content
        rep.send(b"re:" + content)
    wait_for(lambda: broker.queue("replies")["ready"] == 30, "30 replies queued")
    assert [m.content for m in drain(broker, "replies", 30)] == [b"re:" + c for c in contents]
    wait_for(lambda: broker.bridge_counters("req").get("replies_queued") == 30, "counters")
    counters = broker.bridge_counters("req")
    assert (counters["requests"], counters["timeouts"], counters["requeued"]) == (30, 0, 0)
    assert counters["acked"] == 30
    assert broker.queue("requests")["ready"] == broker.queue("requests")["in_flight"] == 0


def test_req_out_retries_on_a_fresh_socket(broker: Broker, start_bridge, context) -> None:
    """A worker that ignores each message's first request: the bridge times out, retries on a
    new REQ socket (a new identity at the ROUTER), and is answered."""
    router, address = bound(context, zmq.ROUTER)
    contents = [b"flaky-1", b"flaky-2", b"flaky-3"]
    with broker.client() as producer:
        producer.send_many("flaky", contents)
    start_bridge(
        "req-out", "flaky", address, "--timeout", "0.3", "--retries", "2", "--name", "flaky"
    )
    seen: dict[bytes, list[bytes]] = {}
    answered = []
    while len(answered) < len(contents):
        assert router.poll(5000), f"no request after {answered}"
        identity, empty, content = router.recv_multipart()
        assert empty == b""
        seen.setdefault(content, []).append(identity)
        if len(seen[content]) == 2:
            router.send_multipart([identity, b"", b"ok"])
            answered.append(content)
    assert answered == contents
    assert all(ids[0] != ids[1] for ids in seen.values()), "retry on the same socket"
    wait_for(lambda: broker.bridge_counters("flaky").get("acked") == 3, "3 acked")
    counters = broker.bridge_counters("flaky")
    assert (counters["requests"], counters["timeouts"], counters["replies"]) == (6, 3, 3)
    assert counters["requeued"] == 0
    assert broker.queue("flaky")["ready"] == broker.queue("flaky")["in_flight"] == 0


def test_req_out_requeues_after_the_last_retry(tmp_path: Path, context) -> None:
    """A worker that never answers: each delivery is tried 1 + retries times, then requeued;
    the second delivery (delivery count 2) fails the same way and, with --max-deliveries 2,
    the message ends in the dead-letter store with 2 deliveries."""
    broker = Broker(tmp_path / "broker-md.log", "--max-deliveries", "2")
    bridge = None
    try:
        router, address = bound(context, zmq.ROUTER)
        with broker.client() as producer:
            producer.send("silent", b"nobody answers")
        bridge = Bridge(
            tmp_path / "req-silent.log",
            broker,
            "req-out",
            "silent",
            address,
            "--timeout",
            "0.2",
            "--retries",
            "1",
            "--name",
            "silent",
        )
        requests = []
        while len(requests) < 4:
            assert router.poll(5000), f"only {len(requests)} requests"
            requests.append(router.recv_multipart()[2])
        assert requests == [b"nobody answers"] * 4
        wait_for(lambda: broker.stats()["counters"]["dead_lettered"] == 1, "dead-lettered")
        assert not router.poll(500), "a fifth request after max-deliveries"
        wait_for(lambda: broker.bridge_counters("silent").get("requeued") == 2, "counters")
        counters = broker.bridge_counters("silent")
        assert (counters["requests"], counters["timeouts"], counters["acked"]) == (4, 4, 0)
        assert broker.stats()["counters"]["requeued"] == 2
        [entry] = broker.admin.admin("dlq-list", queue="silent")["entries"]
        assert (entry["deliveries"], entry["reason"]) == (2, "max-deliveries")
        assert "(attempt 2 of 2)" in bridge.log_path.read_text()
    finally:
        status = bridge.stop() if bridge is not None else 0
        broker.stop()
    assert status == 0


# ----------------------------------------------------------------- stats


def test_stats_json_lists_every_running_bridge(broker: Broker, start_bridge, context) -> None:
    push, push_address = bound(context, zmq.PUSH, sndtimeo=10_000)
    pull, pull_address = bound(context, zmq.PULL)
    start_bridge("pull-in", push_address, "--queue", "relay", "--name", "in-bridge")
    start_bridge("push-out", "relay", pull_address, "--name", "out-bridge")
    for i in range(50):
        push.send(b"r%d" % i)
    for i in range(50):
        assert pull.poll(5000)
        assert pull.recv() == b"r%d" % i

    def listed() -> dict:
        result = subprocess.run(
            [sys.executable, "-m", "phpmq", "stats", "--json", "--broker", broker.address],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["bridges"]

    wait_for(
        lambda: (
            listed().get("out-bridge", {}).get("counters", {}).get("pushed") == 50
            and listed().get("in-bridge", {}).get("counters", {}).get("sent") == 50
        ),
        "both bridges report 50",
    )
    bridges = listed()
    assert bridges["in-bridge"] == {
        "kind": "pull-in",
        "counters": {
            "received": 50,
            "sent": 50,
            "send_retries": 0,
            "refused": 0,
            "broker_errors": 0,
        },
    }
    assert bridges["out-bridge"] == {
        "kind": "push-out",
        "counters": {"received": 50, "acked": 50, "pushed": 50, "broker_errors": 0},
    }
