"""Publisher confirms against a durable broker killed with SIGKILL at random moments.

The producer and the consumer are real clients (threads of this process) that never learn of
the kills except through their connections: they ride out each restart by themselves.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from driven import Connect

from harness import BrokerProcess, free_port, wait_until
from phpmq.client import RECONNECTED, REJOINED, Client, ClientError, Unconfirmed

QUEUE = "crash"
CYCLES = 20
#: Messages the producer tries to get confirmed in all (it stops early when told to).
MESSAGES = 1_000_000
CHUNK = 200
#: Pause between chunks: the producer keeps sending through all the kills.
CHUNK_PAUSE_S = 0.02


def start_broker(tmp_path: Path, address: str, data: Path, cycle: int) -> BrokerProcess:
    return BrokerProcess(tmp_path / f"broker-{cycle}.log", "--data-dir", str(data), address=address)


class Producer(threading.Thread):
    """Sends m0, m1, ... with keys m0, m1, ..., confirmed, in chunks; retries what a chunk
    did not get confirmed (same keys) until it is, so a crash never costs a message."""

    def __init__(self, address: str, total: int, pause: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.total = total
        self.pause = pause
        self.confirmed: dict[int, str] = {}
        self.retries = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with Client(
            self.address, name="producer", heartbeat_ms=200, send_timeout=2, confirm_timeout=2
        ) as client:
            next_index = 0
            while next_index < self.total and not self.stop.is_set():
                chunk = list(range(next_index, min(next_index + CHUNK, self.total)))
                while chunk and not self.stop.is_set():
                    chunk = self._send(client, chunk)
                next_index += CHUNK
                time.sleep(self.pause)

    def _send(self, client: Client, indexes: list[int]) -> list[int]:
        """Send; return the indexes still unconfirmed."""
        try:
            ids = client.send_many(
                QUEUE,
                [b"m%d" % i for i in indexes],
                confirm=True,
                keys=[f"m{i}" for i in indexes],
            )
        except (Unconfirmed, ClientError) as exc:
            ids = getattr(exc, "ids", [])
            ids = ids + [None] * (len(indexes) - len(ids))
            self.retries += 1
            time.sleep(0.05)
        for index, message_id in zip(indexes, ids, strict=True):
            if message_id is not None:
                self.confirmed[index] = message_id
        return [i for i, message_id in zip(indexes, ids, strict=True) if message_id is None]


class Consumer(threading.Thread):
    """Acks everything, and keeps track of which acks are known to be on disk.

    Every 100 messages it flushes its acks and asks for stats. The answer leaves the broker
    after the commit of a turn at or after the one that took the acks (frames of one peer are
    handled in order), so the acks are on disk if they reached that broker and it took them.
    They did if the client's current session (from its last HELLO: start, reconnect or rejoin
    after a restart) began after that broker started: then the messages came from it and the
    acks went to it. Otherwise they may have gone to the broker killed, or been refused by
    the new one as acks of messages this peer does not hold (silently: until it says HELLO
    again it is a stock peer there), and they stay unknown.
    """

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.deliveries: Counter[bytes] = Counter()
        #: Deliveries the broker counted as a message's first: more than one for a message
        #: would mean it was queued twice (a retried keyed send), not redelivered.
        self.first_deliveries: Counter[bytes] = Counter()
        #: Message -> how many deliveries it had when its ack was known to be on disk.
        self.persisted_at: dict[bytes, int] = {}
        self.came_back_after_persisted_ack: list[bytes] = []
        self.session_started = time.monotonic()
        self.sessions = 1
        self.stop = threading.Event()

    def _on_event(self, event: str, detail: str) -> None:
        if event in (REJOINED, RECONNECTED):  # the inbox is cleared: later messages are new
            self.session_started = time.monotonic()
            self.sessions += 1

    def run(self) -> None:
        acked: list[bytes] = []
        with Client(
            self.address,
            name="consumer",
            heartbeat_ms=200,
            send_timeout=2,
            on_event=self._on_event,
        ) as client:
            client.subscribe(QUEUE, window=50)
            session = self.sessions
            while not self.stop.is_set():
                message = client.receive(timeout=0.2)
                if self.sessions != session:  # acks of the old session prove nothing
                    acked.clear()
                    session = self.sessions
                if message is not None:
                    content = message.content
                    self.deliveries[content] += 1
                    if message.delivery_count == 1:
                        self.first_deliveries[content] += 1
                    if content in self.persisted_at:
                        self.came_back_after_persisted_ack.append(content)
                    message.ack()
                    acked.append(content)
                if len(acked) >= 100 or (message is None and acked):
                    self._confirm_acks(client, acked, session)

    def _confirm_acks(self, client: Client, acked: list[bytes], session: int) -> None:
        try:
            client.flush()
            uptime = client.admin("stats", timeout=1)["uptime_seconds"]
        except ClientError:
            uptime = 0.0
        # The broker started before `now - uptime` (the answer took time to arrive).
        broker_started = time.monotonic() - uptime
        if session == self.sessions and self.session_started > broker_started:
            for content in acked:
                self.persisted_at.setdefault(content, self.deliveries[content])
        acked.clear()


def test_confirmed_messages_survive_20_kills_and_persisted_acks_never_come_back(
    tmp_path: Path,
) -> None:
    rng = random.Random(20261122)
    data = tmp_path / "data"
    address = f"tcp://127.0.0.1:{free_port()}"
    broker = start_broker(tmp_path, address, data, 0)
    producer = Producer(address, MESSAGES, CHUNK_PAUSE_S)
    consumer = Consumer(address)
    producer.start()
    consumer.start()
    try:
        for cycle in range(1, CYCLES + 1):
            time.sleep(rng.uniform(0.1, 0.6))
            broker.kill()
            broker = start_broker(tmp_path, address, data, cycle)
        producer.stop.set()
        producer.join(30)
        confirmed = {b"m%d" % i for i in producer.confirmed}
        wait_until(lambda: confirmed <= set(consumer.deliveries), 60, 0.2)
        consumer.stop.set()
        consumer.join(30)
    finally:
        broker.stop()
    duplicates = sum(n - 1 for n in consumer.deliveries.values())
    print(
        f"\n{CYCLES} kills: {len(confirmed)} messages confirmed, {producer.retries} chunks"
        f" retried, {sum(consumer.deliveries.values())} deliveries of"
        f" {len(consumer.deliveries)} messages, {duplicates} duplicate deliveries,"
        f" {len(consumer.persisted_at)} acks known on disk, {consumer.sessions} consumer"
        " sessions"
    )
    assert len(confirmed) > 5_000, "the producer barely got anything confirmed"
    lost = confirmed - set(consumer.deliveries)
    assert not lost, f"{len(lost)} confirmed messages never delivered, e.g. {sorted(lost)[:5]}"
    assert not consumer.came_back_after_persisted_ack, (
        f"{len(consumer.came_back_after_persisted_ack)} messages came back after their ack"
        f" was on disk, e.g. {consumer.came_back_after_persisted_ack[:5]}"
    )
    # Keys: a message delivered twice was redelivered (held unacked at a kill, delivery count
    # 2 or more), never queued twice by a producer retrying it.
    queued_twice = [c for c, n in consumer.first_deliveries.items() if n > 1]
    assert not queued_twice, f"queued more than once: {queued_twice[:5]}"


def test_a_keyed_producer_retrying_across_kills_queues_each_message_once(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    address = f"tcp://127.0.0.1:{free_port()}"
    broker = start_broker(tmp_path, address, data, 0)
    producer = Producer(address, 3_000)
    producer.start()
    try:
        for cycle in range(1, 6):
            time.sleep(0.3)
            broker.kill()
            broker = start_broker(tmp_path, address, data, cycle)
        producer.join(120)
        assert not producer.is_alive(), "the producer did not finish"
        assert len(producer.confirmed) == 3_000
        got = []
        with Client(address) as client:
            for message in client.consume(QUEUE, window=1_000, timeout=1):
                got.append(message.content)
                message.ack()
    finally:
        broker.stop()
    counts = Counter(got)
    print(
        f"\n5 kills: {producer.retries} chunks retried; {len(got)} messages in the queue,"
        f" {sum(n - 1 for n in counts.values())} duplicates"
    )
    assert len(got) == 3_000 and set(counts.values()) == {1}


def test_a_send_to_a_frozen_broker_is_unconfirmed_and_its_key_makes_the_retry_safe(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "b.log", "--data-dir", str(tmp_path / "d"))
    try:
        with broker.client(confirm_timeout=0.5, heartbeat_ms=0) as client:
            client.send(QUEUE, b"connected", confirm=True)
            broker.signal(signal.SIGSTOP)
            started = time.monotonic()
            try:
                client.send(QUEUE, b"order", confirm=True, key="order-1")
                raise AssertionError("a frozen broker confirmed a send")
            except Unconfirmed as exc:
                assert exc.ids == [None] and not exc.errors
            assert 0.5 <= time.monotonic() - started < 3
            broker.signal(signal.SIGCONT)
            first = client.send(QUEUE, b"order", confirm=True, key="order-1")  # the retry
            again = client.send(QUEUE, b"order", confirm=True, key="order-1")
            assert first == again
            assert broker.stats()["queues"][QUEUE]["ready"] == 2
    finally:
        broker.signal(signal.SIGCONT)
        broker.stop()


def test_a_confirmed_send_gives_up_at_once_when_the_broker_restarts_under_it(
    tmp_path: Path, connect: Connect
) -> None:
    """The broker is killed holding an unread confirmed send and is back on its address
    before the client finds it silent (liveness 10 s): the client learns it on its next
    heartbeat ("unknown peer") and the send raises Unconfirmed then, not after the whole
    confirm_timeout; sent again with its key it is queued once."""
    data, address = tmp_path / "d", f"tcp://127.0.0.1:{free_port()}"
    first = start_broker(tmp_path, address, data, 0)
    restarted: list[BrokerProcess] = []

    def restart() -> None:
        time.sleep(0.3)
        first.kill()  # the send it never read is lost with it
        restarted.append(start_broker(tmp_path, address, data, 1))

    restarter = threading.Thread(target=restart)
    try:
        client = connect(address, confirm_timeout=10, liveness=10)
        client.send(QUEUE, b"connected", confirm=True)
        first.signal(signal.SIGSTOP)
        restarter.start()
        started = time.monotonic()
        with pytest.raises(Unconfirmed):
            client.send(QUEUE, b"order", confirm=True, key="order-1")
        waited = time.monotonic() - started
        restarter.join()
        assert waited < 5, f"waited {waited:.1f}s for an answer the dead broker owed"
        retried = client.send(QUEUE, b"order", confirm=True, key="order-1")
        assert client.send(QUEUE, b"order", confirm=True, key="order-1") == retried
        assert restarted[0].stats()["queues"][QUEUE]["ready"] == 2
    finally:
        first.kill()
        if restarter.is_alive():
            restarter.join()
        for broker in restarted:
            broker.stop()
