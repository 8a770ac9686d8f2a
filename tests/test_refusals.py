"""Every refusal reaches the caller, with both clients: refused sends that asked for no answer
are raised at the next call, on flush or on close; a subscription refused for good raises, one
refused for a limit or for a shard that cannot be reached now is asked for again until it is
taken; content over the broker's limit is refused at once. Real broker processes on loopback
(and a scripted one for a refusal that only a cluster in an election makes)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
import zmq
from driven import Connect, DrivenClient

import phpmq.protocol as p
from harness import BrokerProcess, wait_until
from phpmq.client import BrokerRefused, InvalidArgument
from phpmq.protocol import ErrorCode, MessageType


@pytest.fixture
def small_broker(tmp_path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path / "broker.log",
        "--max-queue-length",
        "1",
        "--max-window",
        "10",
        "--max-content-bytes",
        "1000",
        "--grace-seconds",
        "0",
    )
    yield process
    process.stop()


def fill(broker: BrokerProcess) -> None:
    """Fill the queue "full" (length 1) from another producer."""
    with broker.client() as producer:
        producer.send("full", b"first", confirm=True)


def wait_for_refusal(client: DrivenClient, timeout: float = 5.0) -> None:
    """Let the client read until the broker's ERROR for a fire-and-forget send is in."""
    deadline = time.monotonic() + timeout
    while client.error_count == 0 and time.monotonic() < deadline:
        client.receive(timeout=0.05)


def test_a_refused_fire_and_forget_send_is_raised_at_the_next_send(
    small_broker: BrokerProcess, connect: Connect
) -> None:
    fill(small_broker)  # by another producer: the queue's PAUSE would make this one wait
    with connect(small_broker.address) as client:
        client.send("full", b"over the length limit")  # returns: nothing asked for an answer
        wait_for_refusal(client)
        with pytest.raises(BrokerRefused) as refused:
            client.send("full", b"not sent")
        assert refused.value.error.code == ErrorCode.LIMIT_REACHED
        assert refused.value.error.queue == "full"
        client.send("other", b"told once: the next send goes")
    assert small_broker.stats()["queues"]["full"]["ready"] == 1


def test_flush_tells_the_refusals_that_came_back(
    small_broker: BrokerProcess, connect: Connect
) -> None:
    with connect(small_broker.address) as client:
        client.send_many("full", [b"1", b"2", b"3"])
        deadline = time.monotonic() + 5
        while True:
            try:
                client.flush()
            except BrokerRefused as refused:
                assert [e.code for e in refused.refusals] == [429, 429]
                assert "and 1 more refusals" in str(refused)
                break
            assert time.monotonic() < deadline, "no refusal came back"
            time.sleep(0.05)


def test_close_tells_a_refusal_the_caller_has_not_seen(
    small_broker: BrokerProcess, connect: Connect
) -> None:
    fill(small_broker)
    client = connect(small_broker.address)
    client.send("full", b"refused")
    with pytest.raises(BrokerRefused, match="429"):
        client.close()  # the goodbye's answer proves the broker read both sends
    # Leaving a `with` block by an exception does not hide it behind a refusal.
    with pytest.raises(KeyError), connect(small_broker.address) as other:
        other.send("full", b"refused too")
        raise KeyError("the application's own error")


def test_a_subscription_refused_for_good_raises_from_consume(
    small_broker: BrokerProcess, connect: Connect
) -> None:
    with connect(small_broker.address) as client:
        started = time.monotonic()
        with pytest.raises(BrokerRefused) as refused:
            list(client.consume("jobs", window=11, timeout=5))
        assert refused.value.error.code == ErrorCode.INVALID_VALUE
        assert time.monotonic() - started < 4  # at once, not after the idle timeout
        # The refused window is not asked for again; a valid one works.
        client.send("jobs", b"x")
        [message] = list(client.consume("jobs", window=5, timeout=1))
        message.ack()


def test_a_subscription_refused_for_a_limit_is_retried_until_taken(
    tmp_path, connect: Connect
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("max_consumers = 1\n")
    broker = BrokerProcess(tmp_path / "b.log", "--config", str(config))
    try:
        first = connect(broker.address)
        first.subscribe("jobs", window=1)
        assert wait_until(lambda: broker.stats()["queues"].get("jobs", {}).get("consumers"))
        with connect(broker.address) as second:
            second.subscribe("jobs", window=1)  # refused: the queue has its one consumer
            wait_for_refusal(second)  # reads (an asyncio client reads only inside calls)
            assert second.error_count > 0
            first.close()  # room again: the retry takes it
            with broker.client() as producer:
                producer.send("jobs", b"for the second", confirm=True)
            message = second.receive(timeout=10)
            assert message is not None and message.content == b"for the second"
            message.ack()
    finally:
        broker.stop()


def test_a_subscription_refused_while_its_shard_cannot_be_reached_is_retried(
    connect: Connect,
) -> None:
    """A follower replica that knows no leader yet (an election) refuses a CONSUME with 503:
    the subscription is asked for again, as for a limit, not dropped for good."""
    refusal = p.Error(
        int(ErrorCode.SHUTTING_DOWN),
        "queue 'jobs' lives on shard b/0, which cannot be reached: no leader of shard b/0 is"
        " known yet",
        queue="jobs",
        refused=int(MessageType.CONSUME),
    )
    answers = [refusal, p.Dispatch("jobs", b"taken", b"1" * 16)]
    with _scripted_broker(answers) as address, connect(address, close_timeout=0.2) as client:
        client.subscribe("jobs", window=5)
        message = client.receive(timeout=5)
        assert message is not None and message.content == b"taken"
        assert not answers, "the dispatch went out without a second CONSUME"


#: A broker's answer to HELLO, as `phpmq broker` gives it.
HELLO_ANSWER = {
    "broker_heartbeat_ms": 1000,
    "heartbeat_ms": 1000,
    "liveness": 3,
    "max_content_bytes": 16_777_216,
    "max_window": 100_000,
}


@contextlib.contextmanager
def _scripted_broker(answers: list[p.Message]) -> Iterator[str]:
    """A broker that answers HELLOs and each CONSUME with the next of `answers`, in a thread
    (a client waits for the greeting's answer within subscribe)."""
    broker = zmq.Context.instance().socket(zmq.ROUTER)
    broker.linger = 0
    port = broker.bind_to_random_port("tcp://127.0.0.1")
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            if not broker.poll(20):
                continue
            peer, frame = broker.recv_multipart()
            for message in p.decode_frame(frame)[0]:
                if type(message) is p.Hello:
                    broker.send_multipart([peer, p.encode(p.Hello(HELLO_ANSWER))])
                elif type(message) is p.Consume and answers:
                    broker.send_multipart([peer, p.encode(answers.pop(0))])

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        done.set()
        thread.join()
        broker.close(linger=0)


def test_content_over_the_brokers_limit_is_refused_at_once(
    small_broker: BrokerProcess, connect: Connect
) -> None:
    with connect(small_broker.address) as client:
        started = time.monotonic()
        with pytest.raises(InvalidArgument) as refused:
            client.send("jobs", b"x" * 1001, confirm=True)  # the first send: limits unknown
        assert refused.value.code == ErrorCode.TOO_LARGE and "1001 bytes" in str(refused.value)
        with pytest.raises(InvalidArgument, match="413"):
            client.send_many("jobs", [b"ok", b"y" * 1001])
        assert time.monotonic() - started < 2  # not the 10 s confirm timeout
        assert client.send("jobs", b"x" * 1000, confirm=True)
