"""Flow control from the producer's side, with both clients (docs/protocol.md §6.4,
docs/client.md "When the broker is full"): a producer the broker paused waits for the RESUME
instead of being refused, loses nothing when it uses confirms, and gives up with `Paused` when
nobody makes room within `send_timeout`. Real broker processes on loopback."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from driven import Connect

from harness import BrokerProcess
from phpmq.client import BrokerRefused, Client, PartialSend, Paused, Unconfirmed
from phpmq.protocol import ErrorCode

# Their checks measure time (heartbeat gaps, redelivery and lease bounds): one at a time.
pytestmark = pytest.mark.xdist_group("timing")

LENGTH = 100


@pytest.fixture
def short_queues(tmp_path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path / "broker.log", "--max-queue-length", str(LENGTH), "--grace-seconds", "0"
    )
    yield process
    process.stop()


class SlowConsumer(threading.Thread):
    """Consumes `expected` messages of `queue` with its own client, `delay` seconds each
    (after waiting `start_after`), and keeps their contents."""

    def __init__(
        self, address: str, queue: str, expected: int, delay: float, start_after: float = 0.0
    ) -> None:
        super().__init__(daemon=True)
        self.address, self.queue, self.expected = address, queue, expected
        self.delay, self.start_after = delay, start_after
        self.contents: list[bytes] = []

    def run(self) -> None:
        time.sleep(self.start_after)
        with Client(self.address, name="slow-consumer") as client:
            deadline = time.monotonic() + 30
            for message in client.consume(self.queue, window=10, timeout=5):
                self.contents.append(message.content)
                message.ack()
                if len(self.contents) >= self.expected or time.monotonic() > deadline:
                    break
                time.sleep(self.delay)

    def every_one_once(self, contents: list[bytes]) -> None:
        self.join(20)
        assert not self.is_alive(), "the consumer did not finish"
        counts = collections.Counter(self.contents)
        assert [c for c, n in counts.items() if n > 1] == [], "consumed twice"
        assert set(counts) == set(contents), f"{len(set(contents) - set(counts))} lost"


def paused_and_resumed(broker: BrokerProcess) -> dict[str, int]:
    counters = broker.stats()["counters"]
    assert counters["pauses"] > 0 and counters["resumes"] > 0, counters
    return counters


@pytest.mark.parametrize("how", ["send_many", "send"])
def test_a_producer_five_times_over_the_limit_pauses_resumes_and_loses_nothing(
    short_queues: BrokerProcess, connect: Connect, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    contents = [b"m%d" % i for i in range(5 * LENGTH)]
    # The consumer starts a moment late: however slow a loaded machine makes the producer's
    # sends, the queue fills and the broker pauses it (the pause is what is tested).
    consumer = SlowConsumer(
        short_queues.address, "jobs", len(contents), delay=0.002, start_after=0.5
    )
    consumer.start()
    caplog.set_level(logging.INFO, logger="phpmq.client")
    with connect(short_queues.address, send_timeout=10) as producer:
        if how == "send_many":
            ids = producer.send_many("jobs", contents, confirm=True)
        else:
            ids = [producer.send("jobs", content, confirm=True) for content in contents]
        assert len(set(ids)) == len(contents) and all(ids)
    consumer.every_one_once(contents)
    counters = paused_and_resumed(short_queues)
    if how == "send_many":  # one frame of 500: 400 refused under the pause, all sent again
        assert counters["errors"] >= 4 * LENGTH
    assert "paused sends to queue 'jobs'" in caplog.text
    assert "resumed sends to queue 'jobs'" in caplog.text


def test_a_pause_nobody_lifts_raises_paused_within_send_timeout(
    short_queues: BrokerProcess, connect: Connect
) -> None:
    with connect(short_queues.address, send_timeout=1.0) as producer:
        producer.send_many("jobs", [b"x"] * LENGTH, confirm=True)  # at 90%: paused
        started = time.monotonic()
        with pytest.raises(Paused) as paused:
            producer.send("jobs", b"no room", confirm=True)
        assert 0.9 < time.monotonic() - started < 3
        assert isinstance(paused.value, BrokerRefused)
        assert paused.value.error.code == ErrorCode.LIMIT_REACHED
        assert paused.value.error.queue == "jobs"
        assert "nearly full" in paused.value.error.reason
        # It says how long it waited: send_timeout, and more on a busy machine.
        assert "paused sends to queue 'jobs'" in str(paused.value)
        assert 1.0 <= paused.value.waited < 3
        assert f"within {paused.value.waited:.1f}s (send_timeout)" in str(paused.value)
        # send_many keeps its counts: it is also a PartialSend and an Unconfirmed.
        with pytest.raises(PartialSend) as partial:
            producer.send_many("jobs", [b"a", b"b"])
        assert isinstance(partial.value, Paused) and partial.value.sent == 0
        with pytest.raises(Unconfirmed) as unconfirmed:
            producer.send_many("jobs", [b"a", b"b"], confirm=True)
        assert isinstance(unconfirmed.value, Paused) and unconfirmed.value.ids == [None, None]
        # Another queue is not paused.
        assert producer.send("other", b"fine", confirm=True)
    assert short_queues.stats()["queues"]["jobs"]["ready"] == LENGTH


def test_a_producer_is_paused_broker_wide_at_max_memory_and_resumes_when_drained(
    tmp_path, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    broker = BrokerProcess(tmp_path / "broker.log", "--max-memory", "200KB")
    contents = [b"%05d" % i + b"." * 1000 for i in range(400)]  # ~1.2 KB held each: ~480 KB
    try:
        # Nobody drains at first: the producer fills memory to 90% and is paused there.
        consumer = SlowConsumer(broker.address, "big", len(contents), delay=0, start_after=1.0)
        consumer.start()
        caplog.set_level(logging.INFO, logger="phpmq.client")
        with connect(broker.address, send_timeout=10) as producer:
            ids = producer.send_many("big", contents, confirm=True, max_unconfirmed=50)
            assert len(ids) == len(contents) and all(ids)
        consumer.every_one_once(contents)
        counters = paused_and_resumed(broker)
        # Sends that went out before the PAUSE were refused for memory and sent again.
        assert counters["refused_memory"] > 0
        assert broker.stats()["memory"]["alarm"] is False
        assert "paused sends to every queue" in caplog.text, counters
        assert "resumed sends to every queue" in caplog.text
    finally:
        broker.stop()
