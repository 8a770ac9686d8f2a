"""The raw-TCP endpoint (`phpmq broker --tcp-bind`) with a real broker process and plain Python
`socket` clients that write the stock php-mq client's bytes by hand (reference phpmq.md TV-C,
php_interop.md): any split of the byte stream, several messages per write, pre-TTL 003 by
default, a closed connection as a consumer's death, push-back as ack + resend, malformed
streams closing only their own connection. The last test runs a small PHP script with plain
stream sockets, when `php` is available (in CI it must be).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import phpmq.protocol as p
from harness import REPO, BrokerProcess, wait_for
from phpmq.client import Client

# ----------------------------------------------------------------- the stock client's bytes

QUEUE = "Unit-Test-Queue"
#: TV-C, verbatim: 001 pre-TTL (96 bytes) and 002 with count 5 (88 bytes).
TV_SEND = (
    b"H0100102P0100000000000000000000000000015Unit-Test-Queue"
    b"P0200000000000000000000000000009Unit-Test"
)
TV_CONSUME = (
    b"H0100202P0100000000000000000000000000015Unit-Test-QueueP04000000000000000000000000000015"
)
#: The dispatch a pre-TTL peer must get for TV_SEND: 3 packets, a 32-hex ID.
TV_DISPATCH = re.compile(
    rb"H0100303P0100000000000000000000000000015Unit-Test-Queue"
    rb"P0200000000000000000000000000009Unit-Test"
    rb"P0300000000000000000000000000032([0-9a-f]{32})"
)
#: Pause between the two pieces of a split stream: long enough that they arrive as two reads.
SPLIT_PAUSE_S = 0.01
WARNING_LINE = re.compile(r"WARNING phpmq\.broker: closing TCP connection from 127\.0\.0\.1: .+")


def _packet(kind: int, content: bytes) -> bytes:
    return b"P%02d%029d" % (kind, len(content)) + content


def stock_send(queue: str, content: bytes) -> bytes:
    """001 as the stock client writes it (pre-TTL, 2 packets)."""
    return b"H0100102" + _packet(1, queue.encode()) + _packet(2, content)


def stock_consume(queue: str, count: int) -> bytes:
    return b"H0100202" + _packet(1, queue.encode()) + _packet(4, b"%d" % count)


def stock_ack(queue: str, message_id: bytes) -> bytes:
    """004; with TV-C's queue and a real 32-hex ID it is 119 bytes (TV-C's 99 + 20)."""
    return b"H0100402" + _packet(1, queue.encode()) + _packet(3, message_id)


def test_the_literals_are_the_reference_vectors() -> None:
    assert len(TV_SEND) == 96
    assert stock_send(QUEUE, b"Unit-Test") == TV_SEND
    assert len(TV_CONSUME) == 88
    assert stock_consume(QUEUE, 5) == TV_CONSUME
    assert len(stock_ack(QUEUE, b"Unit-Test-ID")) == 99
    assert len(stock_ack(QUEUE, b"0" * 32) + TV_SEND) == 215


# ----------------------------------------------------------------- helpers


class TcpPeer:
    """A plain TCP client that reads whole PHPMQ messages by their headers, with deadlines."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_split(self, data: bytes, at: int) -> None:
        """Two writes, `data[:at]` then `data[at:]`, with a pause between them."""
        self.sock.sendall(data[:at])
        time.sleep(SPLIT_PAUSE_S)
        self.sock.sendall(data[at:])

    def _fill(self, size: int, deadline: float) -> None:
        while len(self.buffer) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"incomplete message: {len(self.buffer)} of {size} bytes before the deadline"
                    f" ({bytes(self.buffer[:80])!r}...)"
                )
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise AssertionError(f"connection closed by the broker after {self.buffer!r}")
            self.buffer += chunk

    def read_raw(self, timeout: float = 5.0) -> bytes:
        """The bytes of the next whole message: 8-byte header, then each packet by its
        32-byte header's length."""
        deadline = time.monotonic() + timeout
        self._fill(8, deadline)
        header = bytes(self.buffer[:8])
        assert header[:1] == b"H" and header[1:].isdigit(), header
        end = 8
        for _ in range(int(header[6:8])):
            self._fill(end + 32, deadline)
            end += 32 + int(self.buffer[end + 3 : end + 32])
            self._fill(end, deadline)
        raw = bytes(self.buffer[:end])
        del self.buffer[:end]
        return raw

    def read(self, timeout: float = 5.0) -> p.Message:
        messages, error = p.decode_frame(self.read_raw(timeout))
        assert error is None, error
        [message] = messages
        return message

    def read_dispatch(self, timeout: float = 5.0) -> tuple[bytes, p.Dispatch]:
        raw = self.read_raw(timeout)
        messages, error = p.decode_frame(raw)
        assert error is None, error
        [dispatch] = messages
        assert isinstance(dispatch, p.Dispatch), dispatch
        return raw, dispatch

    def nothing_within(self, wait: float) -> bool:
        if self.buffer:
            return False
        self.sock.settimeout(wait)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return True
        self.buffer += chunk
        return False

    def closed_by_broker(self, timeout: float = 5.0) -> bool:
        """True once the broker closed the connection (EOF or reset) within `timeout`."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return False
            except ConnectionResetError:
                return True
            if not chunk:
                return True
        return False

    def close(self, reset: bool = False) -> None:
        if reset:  # SO_LINGER 0: the kernel sends RST instead of FIN
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


class TcpBroker(BrokerProcess):
    """A broker process with the raw-TCP endpoint on a free loopback port."""

    def __init__(self, log_path: Path, *args: str) -> None:
        super().__init__(log_path, *args, tcp=True)
        self.admin = Client(self.address, name="test-admin", close_timeout=1)

    def peer(self) -> TcpPeer:
        assert self.tcp_port is not None
        return TcpPeer(self.tcp_port)

    def stats(self) -> dict:
        return self.admin.admin("stats")

    def queue(self, name: str) -> dict:
        return self.stats()["queues"].get(name, {"ready": 0, "in_flight": 0, "consumers": 0})

    def stop(self) -> None:
        self.admin.close()
        super().stop()



@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TcpBroker]:
    process = TcpBroker(tmp_path / "broker.log", "--grace-seconds", "0.5")
    try:
        yield process
    finally:
        process.stop()


# ----------------------------------------------------------------- 1. every split point


def test_a_send_split_at_every_byte_is_decoded(broker: TcpBroker) -> None:
    producer = broker.peer()
    for at in range(1, len(TV_SEND)):
        producer.send_split(TV_SEND, at)
        wait_for(
            lambda at=at: broker.queue(QUEUE)["ready"] == at,
            f"001 split at byte {at}",
            interval=0.005,
        )
    assert producer.nothing_within(0.05)  # no reply to 001
    producer.close()


def test_a_consume_split_at_every_byte_gets_exact_pre_ttl_dispatches(broker: TcpBroker) -> None:
    splits = len(TV_CONSUME) - 1  # 87
    broker.peer().send(TV_SEND * 5 * splits)
    wait_for(lambda: broker.queue(QUEUE)["ready"] == 5 * splits, "messages queued")
    for at in range(1, splits + 1):
        consumer = broker.peer()
        consumer.send_split(TV_CONSUME, at)
        ids = []
        for _ in range(5):
            raw, dispatch = consumer.read_dispatch()
            match = TV_DISPATCH.fullmatch(raw)
            assert match, f"002 split at {at}: not the pre-TTL 003: {raw!r}"
            assert (dispatch.queue, dispatch.content) == (QUEUE, b"Unit-Test")
            assert (dispatch.ttl, dispatch.delivery_count) == (None, None)
            ids.append(match.group(1))
        assert len(set(ids)) == 5
        if at == 1:
            assert consumer.nothing_within(0.2), "more than the window of 5"
        consumer.send(b"".join(stock_ack(QUEUE, i) for i in ids))
        consumer.close()
    wait_for(lambda: broker.stats()["counters"]["acked"] == 5 * splits, "every dispatch acked")
    assert broker.queue(QUEUE)["ready"] == broker.queue(QUEUE)["in_flight"] == 0


def test_an_ack_split_at_every_byte_is_decoded(broker: TcpBroker) -> None:
    splits = len(stock_ack(QUEUE, b"0" * 32)) - 1  # 118
    broker.peer().send(TV_SEND * (splits + 1))
    wait_for(lambda: broker.queue(QUEUE)["ready"] == splits + 1, "messages queued")
    consumer = broker.peer()
    consumer.send(stock_consume(QUEUE, 1))
    for at in range(1, splits + 1):
        raw, dispatch = consumer.read_dispatch()
        assert TV_DISPATCH.fullmatch(raw), raw
        # Window 1: the next dispatch comes only once this ack was decoded.
        consumer.send_split(stock_ack(QUEUE, dispatch.message_id), at)
    consumer.read_dispatch()
    wait_for(lambda: broker.stats()["counters"]["acked"] == splits, f"{splits} acks counted")
    assert broker.queue(QUEUE)["ready"] == 0
    assert broker.queue(QUEUE)["in_flight"] == 1


def test_a_push_back_split_at_every_byte_requeues_with_a_new_id(broker: TcpBroker) -> None:
    consumer = broker.peer()
    consumer.send(TV_SEND + stock_consume(QUEUE, 1))
    raw, dispatch = consumer.read_dispatch()
    seen = [dispatch.message_id]
    length = len(stock_ack(QUEUE, dispatch.message_id) + TV_SEND)
    assert length == 215
    for at in range(1, length):
        consumer.send_split(stock_ack(QUEUE, seen[-1]) + TV_SEND, at)
        raw, dispatch = consumer.read_dispatch()
        assert TV_DISPATCH.fullmatch(raw), f"push-back split at {at}: {raw!r}"
        assert dispatch.message_id not in seen, f"push-back split at {at}: same ID again"
        seen.append(dispatch.message_id)
    stats = broker.stats()
    assert stats["counters"]["acked"] == length - 1
    assert (stats["queues"][QUEUE]["ready"], stats["queues"][QUEUE]["in_flight"]) == (0, 1)


# ----------------------------------------------------------------- 2. several per write


def test_several_messages_in_one_write(broker: TcpBroker) -> None:
    contents = [b"batch-%02d" % i + b"x" * i for i in range(50)]
    peer = broker.peer()
    peer.send(b"".join(stock_send("batch", c) for c in contents) + stock_consume("batch", 100))
    dispatches = [peer.read_dispatch()[1] for _ in contents]
    assert [d.content for d in dispatches] == contents
    assert len({d.message_id for d in dispatches}) == 50
    assert peer.nothing_within(0.1)
    peer.send(b"".join(stock_ack("batch", d.message_id) for d in dispatches))
    wait_for(lambda: broker.stats()["counters"]["acked"] == 50, "50 acks from one write")
    assert broker.queue("batch")["ready"] == broker.queue("batch")["in_flight"] == 0


# ----------------------------------------------------------------- 3. mixed transports


def test_tcp_producer_to_zeromq_consumer(broker: TcpBroker) -> None:
    contents = [b"tcp-%04d" % i for i in range(300)]
    stream = b"".join(stock_send("mixed", c) for c in contents)
    producer = broker.peer()
    for start in range(0, len(stream), 997):  # writes that cut messages anywhere
        producer.send(stream[start : start + 997])
    producer.close()
    got = []
    with broker.client() as consumer:
        for message in consumer.consume("mixed", window=50, timeout=5):
            got.append(message.content)
            message.ack()
            if len(got) == len(contents):
                break
        assert consumer.receive(timeout=0.2) is None
    assert got == contents
    wait_for(lambda: broker.queue("mixed")["ready"] == 0, "queue empty")


def test_zeromq_producer_to_tcp_consumer(broker: TcpBroker) -> None:
    contents = [b"zmq-%04d" % i for i in range(300)]
    with broker.client() as producer:
        producer.send_many("mixed", contents)
    consumer = broker.peer()
    consumer.send(stock_consume("mixed", 10))
    got, ids = [], set()
    acks = []
    for _ in contents:
        raw, dispatch = consumer.read_dispatch()
        assert raw.startswith(b"H0100303"), raw[:8]
        got.append(dispatch.content)
        ids.add(dispatch.message_id)
        acks.append(stock_ack("mixed", dispatch.message_id))
        if len(acks) == 5:  # the stock client acks a batch at a time
            consumer.send(b"".join(acks))
            acks.clear()
    assert got == contents
    assert len(ids) == len(contents)
    assert consumer.nothing_within(0.2)
    wait_for(
        lambda: broker.queue("mixed")["ready"] == broker.queue("mixed")["in_flight"] == 0,
        "everything acked",
    )


# ----------------------------------------------------------------- 4. consumer's death


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_closing_a_tcp_consumer_redelivers_its_window_at_once(broker: TcpBroker, how) -> None:
    contents = [b"held-%d" % i for i in range(5)]
    with broker.client() as producer:
        producer.send_many("death", contents)
    tcp = broker.peer()
    tcp.send(stock_consume("death", 5))
    held = [tcp.read_dispatch()[1] for _ in contents]
    assert [d.content for d in held] == contents
    with broker.client() as other:
        other.subscribe("death", 10)
        assert other.receive(timeout=0.2) is None  # nothing ready: all 5 are held over TCP
        started = time.monotonic()
        tcp.close(reset=how == "rst")
        got = []
        while len(got) < 5:
            message = other.receive(timeout=5)
            assert message is not None, f"only {len(got)} of 5 redelivered"
            got.append(message)
        elapsed = time.monotonic() - started
        for message in got:
            message.ack()
    print(f"\nTCP consumer closed ({how}): 5 redelivered to a ZeroMQ consumer in {elapsed:.3f}s")
    assert [m.content for m in got] == contents
    assert [m.id for m in got] == [d.message_id.decode() for d in held]
    assert [m.delivery_count for m in got] == [2] * 5
    assert elapsed < 2.0  # the close itself, not a lease (60 s by default)


def test_a_tcp_consumer_given_up_for_not_reading_is_disconnected(broker: TcpBroker) -> None:
    lazy = broker.peer()
    lazy.send(stock_consume("flood", 10_000))
    wait_for(lambda: broker.queue("flood")["consumers"] == 1, "the lazy consumer subscribed")
    with broker.client() as producer:
        for i in range(9_000):  # one frame, so one dispatch frame, per broker turn
            producer.send("flood", b"%05d" % i + b"x" * 4_000)
            time.sleep(0.0002)
            if i % 50 == 0 and "is not reading" in broker.log():
                break
    wait_for(lambda: "is not reading" in broker.log(), "the broker gives the lazy peer up")
    assert broker.queue("flood")["consumers"] == 0  # its window is gone...
    deadline = time.monotonic() + 10
    lazy.sock.settimeout(1)
    while time.monotonic() < deadline:  # ...so its connection must end
        try:
            if not lazy.sock.recv(1 << 20):
                break
        except (TimeoutError, ConnectionResetError):
            break
    assert lazy.closed_by_broker(timeout=0.5), "the given-up TCP connection is still open"


# ----------------------------------------------------------------- 5. push-back


def test_push_back_in_one_write_resends_with_a_new_id(broker: TcpBroker) -> None:
    with broker.client() as producer:
        producer.send("pb", b"pb-one")
    consumer = broker.peer()
    consumer.send(stock_consume("pb", 10))
    _, first = consumer.read_dispatch()
    consumer.send(stock_ack("pb", first.message_id) + stock_send("pb", first.content))
    _, again = consumer.read_dispatch()
    assert again.content == b"pb-one"
    assert again.message_id != first.message_id
    assert again.delivery_count is None
    # Pushed back once more, then the consumer leaves: another consumer gets it.
    consumer.send(stock_ack("pb", again.message_id) + stock_send("pb", again.content))
    consumer.close()
    with broker.client() as other:
        message = next(other.consume("pb", window=1, timeout=5))
        assert message.content == b"pb-one"
        assert message.id.encode() not in (first.message_id, again.message_id)
        message.ack()
        assert other.receive(timeout=0.2) is None
    counters = broker.stats()["counters"]
    assert counters["acked"] == 3


# ----------------------------------------------------------------- 6. malformed streams

MALFORMED = {
    "bad marker": b"X0100202" + TV_CONSUME[8:],
    "36-char packet header": (
        b"H0100202P01000000000000000000000000000000015Unit-Test-Queue"
        b"P040000000000000000000000000000000015"
    ),
    "unknown type": b"H0100702" + _packet(1, b"Foo") + _packet(3, b"x" * 32),
    "version 02": b"H0200102" + TV_SEND[8:],
    "non-digit length": b"H0100102P01000000000000000000000000000x3Foo" + _packet(2, b"x"),
}


@pytest.mark.parametrize("vector", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_stream_closes_only_that_connection(broker: TcpBroker, vector) -> None:
    good = broker.peer()
    good.send(stock_consume("ok", 5))
    bad = broker.peer()
    # It held messages: they go back at once when its connection is closed.
    bad.send(stock_send("held", b"h1") + stock_send("held", b"h2") + stock_consume("held", 2))
    assert {bad.read_dispatch()[1].content for _ in range(2)} == {b"h1", b"h2"}
    bad.send(vector)
    assert bad.closed_by_broker(), "the broker kept a malformed connection open"
    wait_for(lambda: WARNING_LINE.search(broker.log()), "the WARNING line in the broker log")
    assert len(WARNING_LINE.findall(broker.log())) == 1
    wait_for(lambda: broker.queue("held")["ready"] == 2, "the bad peer's messages released")
    # The other TCP client keeps working.
    other = broker.peer()
    other.send(stock_send("ok", b"still here"))
    _, dispatch = good.read_dispatch()
    assert dispatch.content == b"still here"
    good.send(stock_ack("ok", dispatch.message_id))
    wait_for(lambda: broker.stats()["counters"]["acked"] == 1, "the good peer's ack")
    assert broker.process.poll() is None


def test_messages_before_the_malformed_bytes_in_the_same_write_are_kept(
    broker: TcpBroker,
) -> None:
    bad = broker.peer()
    bad.send(stock_send("kept", b"one") + stock_send("kept", b"two") + b"X0100102garbage")
    assert bad.closed_by_broker()
    wait_for(lambda: broker.queue("kept")["ready"] == 2, "the two valid sends queued")
    assert "message header must start with 'H'" in broker.log()


def test_a_well_formed_but_refused_message_keeps_the_connection(broker: TcpBroker) -> None:
    """A client's 003 is framed correctly: refused (no ERROR to a stock peer, counted), but
    the stream is intact, so the connection stays open (php-mq/server would crash)."""
    peer = broker.peer()
    peer.send(b"H0100303" + _packet(1, b"Foo") + _packet(2, b"x") + _packet(3, b"i" * 32))
    peer.send(stock_send("after", b"still framed") + stock_consume("after", 1))
    _, dispatch = peer.read_dispatch()
    assert dispatch.content == b"still framed"
    assert broker.stats()["counters"]["errors"] == 1
    assert not WARNING_LINE.search(broker.log())


# ----------------------------------------------------------------- 7. dialect switch


def test_a_peer_that_speaks_the_ttl_form_gets_ttl_form_dispatches(broker: TcpBroker) -> None:
    ttl_peer, stock_peer = broker.peer(), broker.peer()
    ttl_send = b"H0100103" + _packet(1, b"dia") + _packet(2, b"with ttl") + _packet(5, b"60")
    ttl_peer.send(ttl_send)
    # Queued first: two connections' frames may be read in either order.
    wait_for(lambda: broker.queue("dia")["ready"] == 1, "the TTL-form send queued")
    stock_peer.send(stock_send("dia", b"without ttl"))
    wait_for(lambda: broker.queue("dia")["ready"] == 2, "both sends queued")
    ttl_peer.send(stock_consume("dia", 1))
    raw, dispatch = ttl_peer.read_dispatch()
    assert raw.startswith(b"H0100304"), raw
    assert dispatch.content == b"with ttl"
    assert 58 <= dispatch.ttl <= 60
    assert dispatch.delivery_count is None
    stock_peer.send(stock_consume("dia", 1))
    raw, dispatch = stock_peer.read_dispatch()
    assert raw.startswith(b"H0100303"), raw
    assert dispatch.content == b"without ttl"
    assert dispatch.ttl is None


# ----------------------------------------------------------------- 8. a real PHP client

PHP_SCRIPT = Path(__file__).parent / "php" / "stock_client.php"


def _php() -> str:
    php = shutil.which("php")
    if php is None:
        message = "php (php-cli) is not on PATH; install it with: apt-get install -y php-cli"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{message} (required in CI)")
        pytest.skip(message)
    return php


def test_a_php_stream_socket_client_round_trip(broker: TcpBroker) -> None:
    php = _php()
    contents = ["php-one", "php two", "h\u00e9llo w\u00f6rld"]
    result = subprocess.run(
        [php, str(PHP_SCRIPT), "127.0.0.1", str(broker.tcp_port), "php-q", *contents],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    lines = result.stdout.splitlines()
    assert lines[: len(contents)] == contents
    assert re.fullmatch(r"ids: [0-9a-f]{32}( [0-9a-f]{32}){2}", lines[-1]), lines[-1]
    wait_for(
        lambda: broker.queue("php-q")["ready"] == broker.queue("php-q")["in_flight"] == 0,
        "the PHP client's acks emptied the queue",
    )
    assert broker.stats()["counters"]["acked"] == 3
