"""The Python client: a DEALER socket speaking PHPMQ to a phpmq-zmq broker.

    with Client("tcp://127.0.0.1:5555") as client:
        client.send("emails", b"hello", ttl=3600)
        for message in client.consume("emails", window=100, timeout=1.0):
            handle(message.content)
            message.ack()

Acks, requeues and dead letters are buffered and go out together, before the client next
waits for the broker (or on `flush()`/`close()`), so a consumer acks in batches for free.
The client says HELLO first, so the broker answers its mistakes with ERROR messages; they are
logged and kept in `client.errors`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import zmq

from protocol import (
    DEFAULT_MAX_CONTENT_BYTES,
    Admin,
    AdminReply,
    Consume,
    DeadLetter,
    Disconnect,
    Dispatch,
    Error,
    Hello,
    Kbai,
    Requeue,
    decode_frame,
    encode,
    encode_ack,
    encode_send,
    queue_packet,
)

log = logging.getLogger("phpmq.client")

DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"
#: Outgoing acks buffered before they are sent without waiting for the next receive.
MAX_BUFFERED_OUT = 512
#: Largest packet the client decodes from a broker that announced a smaller limit.
TRUSTED_PACKET_BYTES = 256 * 1024 * 1024
#: Messages packed into one frame by send_many, and the frame size that closes a batch early.
BATCH_MESSAGES = 512
BATCH_BYTES = 256 * 1024
#: How a client leaves: stop sending me work, forget me (taking back what I did not settle).
#: The broker answers KBAI, which also proves it read everything sent before.
_GOODBYE = encode(Disconnect("client closing")) + encode(Kbai())


class ClientError(Exception):
    """Raised when the client cannot do what was asked (send timed out, broker refused...)."""


class BrokerRefused(ClientError):
    """Raised when the broker answers a request with an ERROR message."""

    def __init__(self, error: Error) -> None:
        super().__init__(f"broker refused: {error.code} {error.reason}")
        self.error = error


class ReceivedMessage:
    """A dispatched message. Settle it exactly once: ack, requeue or dead_letter."""

    __slots__ = ("_client", "content", "delivery_count", "id", "queue", "ttl")

    def __init__(self, client: Client, dispatch: Dispatch) -> None:
        self._client = client
        self.queue = dispatch.queue
        self.content = dispatch.content
        self.id = dispatch.message_id
        #: Remaining time to live in seconds (0: never expires).
        self.ttl = dispatch.ttl or 0
        #: 1 on the first delivery, more after redeliveries.
        self.delivery_count = dispatch.delivery_count or 1

    def ack(self) -> None:
        self._client._buffer_out(encode_ack(self._client._queue_packet(self.queue), self.id))

    def requeue(self, ttl: int = 0) -> None:
        self._client._buffer_out(encode(Requeue(self.queue, self.id, ttl)))

    def dead_letter(self, reason: str | None = None) -> None:
        self._client._buffer_out(encode(DeadLetter(self.queue, self.id, reason)))

    def __repr__(self) -> str:
        return (
            f"<ReceivedMessage {self.queue}/{self.id} {len(self.content)} bytes"
            f" ttl={self.ttl} delivery={self.delivery_count}>"
        )


class Client:
    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        name: str = "phpmq-python",
        send_timeout: float = 5.0,
        close_timeout: float = 5.0,
    ) -> None:
        self.address = address
        self.close_timeout = close_timeout
        self._socket = zmq.Context.instance().socket(zmq.DEALER)
        self._socket.linger = 0
        self._socket.sndtimeo = int(send_timeout * 1000)
        self._socket.sndhwm = 10_000
        # Queue only to a live connection: with no broker, send() blocks for send_timeout and
        # raises instead of parking messages in a socket that may never connect.
        self._socket.immediate = True
        self._socket.connect(address)
        self._queue_packets: dict[str, bytes] = {}
        self._out: list[bytes] = []
        self._inbox: deque[ReceivedMessage] = deque()
        self._admin_replies: deque[AdminReply] = deque()
        self._windows: dict[str, int] = {}
        #: Settlements buffered before they are sent without waiting for the next receive.
        self._flush_at = MAX_BUFFERED_OUT
        self._kbai = False
        self.closed = False
        self.broker_info: dict[str, Any] = {}
        #: The broker is trusted: its packets are bounded by its own limit (it says which in
        #: its HELLO answer), so the client only guards against nonsense lengths.
        self._max_content_bytes = max(DEFAULT_MAX_CONTENT_BYTES, TRUSTED_PACKET_BYTES)
        self.errors: deque[Error] = deque(maxlen=1000)
        #: HELLO rides in front of the first frame, so constructing a client never blocks.
        self._greeting: bytes | None = encode(Hello({"name": name, "role": "client"}))

    # ------------------------------------------------------------------ producing

    def send(self, queue: str, content: bytes | str, ttl: int = 0) -> None:
        """Hand one message to the socket.

        Raises:
            ClientError: the socket did not take it within `send_timeout`.
        """
        self._send_frame(encode_send(self._queue_packet(queue), _as_bytes(content), ttl))

    def send_many(self, queue: str, contents: Iterable[bytes | str], ttl: int = 0) -> int:
        """Send many messages to one queue, packed several to a frame. Returns the count."""
        packet = self._queue_packet(queue)
        batch: list[bytes] = []
        size = 0
        sent = 0
        for content in contents:
            data = encode_send(packet, _as_bytes(content), ttl)
            batch.append(data)
            size += len(data)
            if len(batch) >= BATCH_MESSAGES or size >= BATCH_BYTES:
                self._send_frame(b"".join(batch))
                sent += len(batch)
                batch, size = [], 0
        if batch:
            self._send_frame(b"".join(batch))
            sent += len(batch)
        return sent

    # ------------------------------------------------------------------ consuming

    def subscribe(self, queue: str, window: int = 100) -> None:
        """Ask for at most `window` unacked messages of `queue` at a time (0 stops)."""
        self._windows[queue] = window
        self._send_frame(encode(Consume(queue, window)))
        # Send acks once half the smallest window is settled, so the broker refills the window
        # while the rest is still being handled (the pipe benchmark: +10% msgs/s at window 100).
        open_windows = [size for size in self._windows.values() if size > 0]
        self._flush_at = max(
            1, min(MAX_BUFFERED_OUT, min(open_windows, default=2 * MAX_BUFFERED_OUT) // 2)
        )

    def receive(self, timeout: float | None = None) -> ReceivedMessage | None:
        """The next dispatched message, or None if none came within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._inbox:
            self.flush()
            wait_ms = (
                None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            )
            if not self._socket.poll(wait_ms):
                return None
            self._read_available()
        return self._inbox.popleft()

    def consume(
        self, queue: str, window: int = 100, timeout: float | None = None
    ) -> Iterator[ReceivedMessage]:
        """Subscribe to `queue` and yield its messages; stop after `timeout` seconds idle."""
        if self._windows.get(queue) != window:
            self.subscribe(queue, window)
        while True:
            message = self.receive(timeout)
            if message is None:
                return
            yield message

    def flush(self) -> None:
        """Send buffered acks, requeues and dead letters now."""
        if self._out:
            frame = b"".join(self._out)
            self._out.clear()
            self._send_frame(frame)

    # ------------------------------------------------------------------ admin

    def admin(self, command: str, timeout: float = 5.0, **options: Any) -> dict[str, Any]:
        """Run an operator command (stats, dlq-list, dlq-replay, dlq-purge) on the broker.

        Raises:
            BrokerRefused: the broker refused the command (bad command or options).
            ClientError: no answer within `timeout` seconds.
        """
        self._send_frame(encode(Admin({"command": command, **options})))
        deadline = time.monotonic() + timeout
        while not self._admin_replies:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._socket.poll(wait_ms):
                raise ClientError(
                    f"no answer from the broker at {self.address} within {timeout}s"
                    " (is it running?)"
                )
            self._read_available()
        result = self._admin_replies.popleft().options
        refusal = result.get("error")
        if isinstance(refusal, dict):
            raise BrokerRefused(Error(int(refusal.get("code", 0)), str(refusal.get("reason"))))
        return result

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Flush, say goodbye, wait for the broker's answer, and close.

        Messages received but not settled go back to the head of their queue (with delivery
        count +1). The wait matters: a ROUTER discards frames it has not read yet when the
        sender's connection closes, so without it the last sends could be lost. The broker's
        KBAI answer proves it has read every frame sent before it.
        """
        if self.closed:
            return
        self.closed = True
        try:
            if self._greeting is None:  # something was sent: make sure it all arrived
                self._out.append(_GOODBYE)
                self.flush()
                self._await_kbai()
        except ClientError as exc:
            log.warning("closing %s: %s", self.address, exc)
        finally:
            self._socket.close(linger=int(self.close_timeout * 1000))

    def _await_kbai(self) -> None:
        deadline = time.monotonic() + self.close_timeout
        while not self._kbai:
            wait_ms = int((deadline - time.monotonic()) * 1000)
            if wait_ms <= 0 or not self._socket.poll(wait_ms):
                raise ClientError(
                    f"the broker did not answer goodbye within {self.close_timeout}s:"
                    " messages sent just before closing may not have arrived"
                )
            self._read_available()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _queue_packet(self, queue: str) -> bytes:
        packet = self._queue_packets.get(queue)
        if packet is None:
            packet = self._queue_packets[queue] = queue_packet(queue)
        return packet

    def _send_frame(self, frame: bytes) -> None:
        if self._socket.closed:
            raise ClientError("client is closed")
        greeting = self._greeting
        try:
            self._socket.send(frame if greeting is None else greeting + frame)
            self._greeting = None
        except zmq.Again:
            raise ClientError(
                f"could not hand the message to the broker at {self.address} within"
                f" {self._socket.sndtimeo / 1000:g}s: it is not running, not reachable,"
                " or not keeping up"
            ) from None

    def _buffer_out(self, data: bytes) -> None:
        self._out.append(data)
        if len(self._out) >= self._flush_at:
            self.flush()

    def _read_available(self) -> None:
        while True:
            try:
                frame = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            messages, error = decode_frame(frame, self._max_content_bytes)
            for message in messages:
                if type(message) is Dispatch:
                    self._inbox.append(ReceivedMessage(self, message))
                else:
                    self._on_control(message)
            if error is not None:
                log.error("undecodable frame from broker %s: %s", self.address, error.reason)

    def _on_control(self, message: object) -> None:
        if isinstance(message, Error):
            self.errors.append(message)
            log.warning("broker error %d: %s", message.code, message.reason)
        elif isinstance(message, AdminReply):
            self._admin_replies.append(message)
        elif isinstance(message, Hello):
            self.broker_info = message.options
            limit = message.options.get("max_content_bytes")
            if type(limit) is int and limit > self._max_content_bytes:
                self._max_content_bytes = limit
        elif isinstance(message, Kbai):
            self._kbai = True
        elif isinstance(message, Disconnect):
            log.warning("broker at %s is going away: %s", self.address, message.reason or "")


def _as_bytes(content: bytes | str) -> bytes:
    return content.encode() if isinstance(content, str) else content
