"""The Python client: a DEALER socket speaking PHPMQ to a phpmq-zmq broker.

    with Client("tcp://127.0.0.1:5555") as client:
        client.send("emails", b"hello", ttl=3600)
        for message in client.consume("emails", window=100, timeout=1.0):
            handle(message.content)
            message.ack()

Acks, requeues and dead letters are buffered and go out together (once half the window is
settled, or before the client next waits), so a consumer acks in batches for free. The client
says HELLO first, so the broker answers its mistakes with ERROR messages; they are logged and
kept in `client.errors`.

Liveness (docs/protocol.md §6.2): the client agrees on a heartbeat interval in HELLO; a
background thread heartbeats while the application is busy elsewhere, so a long handler does
not look dead, but a frozen or killed process does. A broker silent for interval x liveness
is lost: the client reconnects on a new socket with exponential backoff and jitter, says
HELLO again and re-consumes every queue. The application sees an `on_event` callback and a
log line, nothing else; messages it received before the loss are taken back by the broker,
and settling them afterwards is a no-op.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import msgspec
import zmq

from ..protocol import (
    DEFAULT_MAX_CONTENT_BYTES,
    Admin,
    AdminReply,
    Confirm,
    Consume,
    DeadLetter,
    Disconnect,
    Dispatch,
    Error,
    Heartbeat,
    Hello,
    Kbai,
    Requeue,
    Send,
    decode_frame,
    encode,
    encode_ack,
    encode_send,
    queue_packet,
)

log = logging.getLogger("phpmq.client")

DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"
_headers_encoder = msgspec.json.Encoder()
_headers_decoder = msgspec.json.Decoder(dict[str, Any])
#: Outgoing settlements buffered before they are sent without waiting for the next receive.
MAX_BUFFERED_OUT = 512
#: Largest packet the client decodes from a broker that announced a smaller limit.
TRUSTED_PACKET_BYTES = 256 * 1024 * 1024
#: Messages packed into one frame by send_many, and the frame size that closes a batch early.
BATCH_MESSAGES = 512
BATCH_BYTES = 256 * 1024
#: How a client leaves: stop sending me work, forget me (taking back what I did not settle).
#: The broker answers KBAI, which also proves it read everything sent before.
_GOODBYE = encode(Disconnect("client closing")) + encode(Kbai())
_HEARTBEAT = encode(Heartbeat())
#: Reconnect delays: the first retry is quick, then doubling (Paranoid Pirate), with jitter so
#: that a pool of clients does not reconnect in lockstep.
RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 5.0
#: How long a replaced socket may still deliver what was handed to it.
RECONNECT_LINGER_S = 30.0
#: Longest the waiting application thread holds the socket before the heartbeat thread may.
WAIT_SLICE_S = 0.05

#: Events passed to `on_event(event, detail)`.
BROKER_LOST = "broker-lost"  # silent for interval x liveness; reconnecting
RECONNECTED = "reconnected"  # new socket, HELLO and consumes sent again
REJOINED = "rejoined"  # the broker did not know us (it restarted); HELLO sent again
BROKER_LEAVING = "broker-leaving"  # the broker said DISCONNECT (shutting down)


class ClientError(Exception):
    """Raised when the client cannot do what was asked (send timed out, broker refused...)."""


class PartialSend(ClientError):
    """Raised by send_many when some frames were handed to the socket and then one was not:
    `sent` messages (the first ones) went out, the rest did not."""

    def __init__(self, message: str, sent: int) -> None:
        super().__init__(message)
        self.sent = sent


class BrokerRefused(ClientError):
    """Raised when the broker refuses a request (an ADMIN command, a confirmed send)."""

    def __init__(self, error: Error) -> None:
        super().__init__(f"broker refused: {error.code} {error.reason}")
        self.error = error


class Unconfirmed(ClientError):
    """Raised when sends asked for confirms did not all get one. `ids[i]` is the broker's ID
    for message i, or None; `errors` maps the index of each refused message to the broker's
    ERROR. The other Nones got no answer (connection lost, timeout) or were never sent: they
    may or may not be queued, so send them again, with their keys to be safe."""

    def __init__(self, message: str, ids: list[str | None], errors: dict[int, Error]) -> None:
        super().__init__(message)
        self.ids = ids
        self.errors = errors


#: The answer recorded for a tag whose connection was lost before it came.
_LOST = None


class ReceivedMessage:
    """A dispatched message. Settle it exactly once: ack, requeue or dead_letter."""

    __slots__ = (
        "_client",
        "_generation",
        "_headers",
        "_id",
        "content",
        "delivery_count",
        "queue",
        "ttl",
    )

    def __init__(self, client: Client, dispatch: Dispatch, generation: int) -> None:
        self._client = client
        self._generation = generation
        self.queue = dispatch.queue
        self.content = dispatch.content
        #: The ID as the wire carries it: settling sends it back as it came.
        self._id = dispatch.message_id
        #: Remaining time to live in seconds (0: never expires).
        self.ttl = dispatch.ttl or 0
        #: 1 on the first delivery, more after redeliveries.
        self.delivery_count = dispatch.delivery_count or 1
        self._headers = dispatch.headers

    @property
    def id(self) -> str:
        """The broker's message ID (32 hex characters)."""
        return self._id.decode(errors="replace")

    @property
    def headers(self) -> dict[str, Any]:
        """What the producer attached (`send(..., headers=...)`); empty if nothing, or if
        what it attached is not a JSON object."""
        if not self._headers:
            return {}
        try:
            return _headers_decoder.decode(self._headers)
        except (msgspec.DecodeError, UnicodeDecodeError):
            return {}

    def ack(self) -> None:
        client = self._client
        client._settle(encode_ack(client._queue_packet(self.queue), self._id), self._generation)

    def requeue(self, ttl: int = 0, delay: float = 0.0) -> None:
        """Back to the tail of the queue with a new TTL (0: never expires), after `delay`
        seconds out of it (a retry backoff)."""
        delay_ms = round(delay * 1000) or None
        self._client._settle(encode(Requeue(self.queue, self._id, ttl, delay_ms)), self._generation)

    def dead_letter(self, reason: str | None = None) -> None:
        self._client._settle(encode(DeadLetter(self.queue, self._id, reason)), self._generation)

    def __repr__(self) -> str:
        return (
            f"<ReceivedMessage {self.queue}/{self.id} {len(self.content)} bytes"
            f" ttl={self.ttl} delivery={self.delivery_count}>"
        )


class Client:
    """A connection to one broker. Thread-safe for one application thread plus the client's
    own heartbeat thread; share it between application threads only with your own lock."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        name: str = "phpmq-python",
        role: str = "client",
        send_timeout: float = 5.0,
        close_timeout: float = 5.0,
        confirm_timeout: float = 10.0,
        heartbeat_ms: int = 1000,
        liveness: int = 3,
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        self.address = address
        self.send_timeout = send_timeout
        self.close_timeout = close_timeout
        #: How long a confirmed send waits for the broker's answer (per message for send,
        #: without progress for send_many).
        self.confirm_timeout = confirm_timeout
        self.on_event = on_event
        self._hello = encode(
            Hello(
                {
                    "name": name,
                    "role": role,
                    "heartbeat_ms": heartbeat_ms,
                    "liveness": liveness,
                    "version": "phpmq-zmq-python/0.1",
                }
            )
        )
        self._heartbeat_s = heartbeat_ms / 1000
        self._expiry_s = self._heartbeat_s * liveness
        self._lock = threading.RLock()
        self._queue_packets: dict[str, bytes] = {}
        self._out: list[bytes] = []
        self._inbox: deque[ReceivedMessage] = deque()
        self._admin_replies: deque[AdminReply] = deque()
        #: Confirmed sends: tags waiting for an answer, and the answers come (an ID, the
        #: refusing ERROR, or _LOST when the connection they went out on was replaced).
        self._next_tag = 0
        self._awaited: set[int] = set()
        self._answers: dict[int, str | Error | None] = {}
        self._windows: dict[str, int] = {}
        #: Settlements buffered before they are sent without waiting for the next receive.
        self._flush_at = MAX_BUFFERED_OUT
        self._kbai = False
        self.closed = False
        self.broker_info: dict[str, Any] = {}
        self.errors: deque[Error] = deque(maxlen=1000)
        #: ERRORs received in all (the deque keeps the last 1000).
        self.error_count = 0
        #: How often the connection was lost and made again.
        self.reconnects = 0
        #: Messages handed to the socket since the broker was last heard from: what a broker
        #: crash could have taken with it (exact counts need confirms).
        self.sent_since_heard = 0
        #: The broker is trusted: its packets are bounded by its own limit (it says which in
        #: its HELLO answer), so the client only guards against nonsense lengths.
        self._max_content_bytes = max(DEFAULT_MAX_CONTENT_BYTES, TRUSTED_PACKET_BYTES)
        self._generation = 0
        self._reconnect_delay = RECONNECT_FIRST_S
        self._reconnect_at: float | None = None
        self._socket = self._new_socket()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat_ms > 0:
            self._thread = threading.Thread(
                target=self._heartbeat_loop, name=f"phpmq-heartbeat {address}", daemon=True
            )
            self._thread.start()

    # ------------------------------------------------------------------ producing

    def send(
        self,
        queue: str,
        content: bytes | str,
        ttl: int = 0,
        headers: dict[str, Any] | None = None,
        *,
        confirm: bool = False,
        key: str | None = None,
    ) -> str | None:
        """Send one message. `headers` (JSON-able) travel with it to consumers that speak the
        extensions (e.g. `{"timeout": 30}` for a worker pool).

        With `confirm=True` wait for the broker's answer and return the message ID: the
        message is queued (with a `--data-dir` broker: on disk). A `key` makes the send
        idempotent: sent again within the broker's window (2 minutes by default), it is
        confirmed with the first ID instead of being queued twice, so retrying after an
        Unconfirmed is safe.

        Raises:
            ClientError: the socket did not take it within `send_timeout` (no broker).
            BrokerRefused: (confirm) the broker refused it; `.error` says why.
            Unconfirmed: (confirm) no answer within `confirm_timeout`, or the connection was
                lost: it may or may not be queued.
        """
        tag = self._next_tags(1) if confirm else None
        body = _as_bytes(content)
        if headers:
            frame = encode(
                Send(queue, body, ttl, tag=tag, key=key, headers=_headers_encoder.encode(headers))
            )
        else:
            frame = encode_send(self._queue_packet(queue), body, ttl, tag, key)
        with self._lock:
            self._send_messages(frame, 1, () if tag is None else (tag,))
            if tag is None:
                return None
            [answer] = self._await_answers([tag], self.confirm_timeout)
        if isinstance(answer, Error):
            raise BrokerRefused(answer)
        if answer is None:
            raise Unconfirmed(f"no confirm from the broker at {self.address}", [None], {})
        return answer

    def send_many(
        self,
        queue: str,
        contents: Iterable[bytes | str],
        ttl: int = 0,
        *,
        confirm: bool = False,
        keys: Iterable[str] | None = None,
        max_unconfirmed: int = 5_000,
        on_confirm: Callable[[int, str], None] | None = None,
    ) -> int | list[str]:
        """Send many messages to one queue, packed several to a frame. Returns the count, or
        with `confirm=True` the list of message IDs in order. `keys` (one per message) make
        the sends idempotent, as in `send`.

        With `confirm=True` the sends are pipelined: up to `max_unconfirmed` are out before
        the client waits for answers, so the broker's group commit confirms whole batches;
        `on_confirm(index, message_id)` is called as confirms come in (in order).

        Raises:
            PartialSend: a frame was not taken; its `sent` says how many went before it.
            Unconfirmed: (confirm) some were refused or not answered; its `ids` and `errors`
                say which, for the messages read from `contents` so far. Once a refusal
                or a silence is seen nothing more is sent; sends already out (up to
                `max_unconfirmed`) are still answered and reported.
            ValueError: `keys` has fewer entries than `contents`.
        """
        if keys is not None:
            keys = _checked_keys(contents, keys)
        if confirm:
            return self._send_confirmed(queue, contents, ttl, keys, max_unconfirmed, on_confirm)
        packet = self._queue_packet(queue)
        key_iter = iter(keys) if keys is not None else None
        batch: list[bytes] = []
        size = 0
        sent = 0
        try:
            for content in contents:
                key = _next_key(key_iter)
                data = encode_send(packet, _as_bytes(content), ttl, None, key)
                batch.append(data)
                size += len(data)
                if len(batch) >= BATCH_MESSAGES or size >= BATCH_BYTES:
                    sent += self._send_messages(b"".join(batch), len(batch))
                    batch, size = [], 0
            if batch:
                sent += self._send_messages(b"".join(batch), len(batch))
        except ClientError as exc:
            raise PartialSend(str(exc), sent) from None
        return sent

    def _send_confirmed(
        self,
        queue: str,
        contents: Iterable[bytes | str],
        ttl: int,
        keys: Iterable[str] | None,
        max_unconfirmed: int,
        on_confirm: Callable[[int, str], None] | None,
    ) -> list[str]:
        packet = self._queue_packet(queue)
        key_iter = iter(keys) if keys is not None else None
        batch_limit = max(1, min(BATCH_MESSAGES, max_unconfirmed))
        ids: list[str | None] = []
        refused: dict[int, Error] = {}
        #: (tag, message index) sent and not answered yet, oldest first; and of the batch
        #: being built.
        outstanding: deque[tuple[int, int]] = deque()
        batch_tags: list[tuple[int, int]] = []
        batch: list[bytes] = []
        size = 0
        unanswered = 0

        def settle(count: int) -> None:
            nonlocal unanswered
            tags = [outstanding[i][0] for i in range(count)]
            for answer in self._await_answers(tags, self.confirm_timeout):
                _, index = outstanding.popleft()
                if isinstance(answer, Error):
                    refused[index] = answer
                elif answer is None:
                    unanswered += 1
                else:
                    ids[index] = answer
                    if on_confirm is not None:
                        on_confirm(index, answer)

        def send_batch() -> bool:
            """Send the batch once few enough are unconfirmed; False: stop sending."""
            nonlocal size
            over = len(outstanding) + len(batch) - max_unconfirmed
            if over > 0:
                settle(min(over, len(outstanding)))
            if refused or unanswered:
                return False
            self._send_messages(b"".join(batch), len(batch), [tag for tag, _ in batch_tags])
            outstanding.extend(batch_tags)
            batch.clear()
            batch_tags.clear()
            size = 0
            return True

        try:
            for content in contents:
                key = _next_key(key_iter)
                tag = self._next_tags(1)
                batch_tags.append((tag, len(ids)))
                ids.append(None)
                data = encode_send(packet, _as_bytes(content), ttl, tag, key)
                batch.append(data)
                size += len(data)
                if (len(batch) >= batch_limit or size >= BATCH_BYTES) and not send_batch():
                    break
            else:
                if batch:
                    send_batch()
            settle(len(outstanding))
        except BaseException as exc:
            self._forget_tags([tag for tag, _ in outstanding])
            if not isinstance(exc, ClientError):
                raise
            raise Unconfirmed(
                f"{exc}; {_confirmed(ids)} of {len(ids)} messages confirmed", ids, refused
            ) from None
        if refused or unanswered:
            confirmed = _confirmed(ids)
            first = refused[min(refused)] if refused else None
            raise Unconfirmed(
                f"{confirmed} of {len(ids)} messages confirmed, {len(refused)} refused"
                + (f" (first: {first.code} {first.reason})" if first else "")
                + f", {unanswered} without an answer within {self.confirm_timeout:g}s,"
                f" {len(ids) - confirmed - len(refused) - unanswered} not sent",
                ids,
                refused,
            )
        return ids  # type: ignore[return-value]

    def _forget_tags(self, tags: list[int]) -> None:
        with self._lock:
            self._awaited.difference_update(tags)
            for tag in tags:
                self._answers.pop(tag, None)

    def _next_tags(self, count: int) -> int:
        """The next `count` tags (the first is returned); awaited once they are sent."""
        with self._lock:
            first = self._next_tag
            self._next_tag += count
        return first

    def _send_messages(self, frame: bytes, count: int, tags: Iterable[int] = ()) -> int:
        """Send a frame of `count` 001s and await the answers to its tags. Under the lock, so
        a reconnect gives up exactly the tags that went out on the old socket."""
        with self._lock:
            self._send_frame(frame)
            self._awaited.update(tags)
            self.sent_since_heard += count
        return count

    def _await_answers(self, tags: list[int], timeout: float) -> list[str | Error | None]:
        """The answers to `tags`, in that order, reading the socket until they are all in or
        `timeout` seconds pass without a new one (those get None)."""
        answers = self._answers
        with self._lock:
            deadline = time.monotonic() + timeout
            # Answers come mostly in order: tags before `first_missing` are all in.
            first_missing = 0
            while True:
                start = first_missing
                while first_missing < len(tags) and tags[first_missing] in answers:
                    first_missing += 1
                if first_missing == len(tags):
                    break
                if first_missing > start:
                    deadline = time.monotonic() + timeout  # progress: the wait starts over
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                if self._socket.poll(int(min(wait, WAIT_SLICE_S) * 1000) or 1):
                    self._read_available()
                self._tick()
            self._awaited.difference_update(tags)
            return [answers.pop(tag, _LOST) for tag in tags]

    # ------------------------------------------------------------------ consuming

    def subscribe(self, queue: str, window: int = 100) -> None:
        """Ask for at most `window` unacked messages of `queue` at a time (0 stops). The
        subscription is renewed by itself after a reconnect."""
        with self._lock:
            self._windows[queue] = window
            self._send_frame(encode(Consume(queue, window)))
            # Send acks once half the smallest window is settled, so the broker refills the
            # window while the rest is still being handled (pipe benchmark: +10% msgs/s).
            smallest = min((size for size in self._windows.values() if size > 0), default=0)
            self._flush_at = min(MAX_BUFFERED_OUT, max(1, smallest // 2) if smallest else 512)

    def receive(self, timeout: float | None = None) -> ReceivedMessage | None:
        """The next dispatched message, or None if none came within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._inbox:
                    return self._inbox.popleft()
                self._flush_quietly()
                wait = WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
                if self._socket.poll(int(min(wait, WAIT_SLICE_S) * 1000) if wait > 0 else 0):
                    self._read_available()
                self._tick()
                if wait <= 0:
                    return self._inbox.popleft() if self._inbox else None

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
        """Send buffered acks, requeues and dead letters now.

        Raises:
            ClientError: the socket did not take them within `send_timeout`.
        """
        with self._lock:
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
        deadline = time.monotonic() + timeout
        with self._lock:
            self._read_available()
            self._admin_replies.clear()  # late answers to earlier calls that timed out
            self._send_frame(encode(Admin({"command": command, **options})))
            while not self._admin_replies:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise ClientError(
                        f"no answer from the broker at {self.address} within {timeout}s"
                        " (is it running?)"
                    )
                if self._socket.poll(int(min(wait, WAIT_SLICE_S) * 1000) or 1):
                    self._read_available()
                self._tick()
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
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        with self._lock:
            if self.closed:
                return
            try:
                if self._greeting is None:  # something was sent: make sure it all arrived
                    self._out.append(_GOODBYE)
                    self.flush()
                    self._await_kbai()
            except ClientError as exc:
                log.warning("closing %s: %s", self.address, exc)
            finally:
                self.closed = True
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

    # ------------------------------------------------------------------ connection

    def _new_socket(self) -> zmq.Socket:
        """A fresh DEALER whose first frame will be HELLO and a consume per subscription."""
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.linger = 0
        sock.sndtimeo = int(self.send_timeout * 1000)
        sock.sndhwm = 10_000
        # Queue only to a live connection: with no broker, send() blocks for send_timeout and
        # raises instead of parking messages in a socket that may never connect.
        sock.immediate = True
        try:
            sock.connect(self.address)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ClientError(f"invalid broker address {self.address!r}: {exc}") from None
        self._generation += 1
        self._greeting: bytes | None = self._hello + b"".join(
            encode(Consume(queue, window)) for queue, window in self._windows.items() if window
        )
        self._last_heard = self._last_sent = time.monotonic()
        return sock

    def _heartbeat_loop(self) -> None:
        tick = min(max(self._heartbeat_s / 4, 0.01), 0.25)
        while not self._stop.wait(tick):
            with self._lock:
                if self.closed:
                    return
                try:
                    self._read_available()
                    self._tick()
                except zmq.ZMQError as exc:  # the socket was closed under us: we are done
                    log.debug("heartbeat thread stops: %s", exc)
                    return

    def _tick(self) -> None:
        """Liveness duties, run by whichever thread holds the socket: notice a silent broker,
        reconnect when due, and heartbeat when nothing else was sent for an interval."""
        if not self._heartbeat_s:
            return
        now = time.monotonic()
        if self._reconnect_at is not None:
            if now >= self._reconnect_at:
                self._reconnect()
            return
        if self._greeting is not None:
            # Not connected yet (or starting over): the broker's silence counts from HELLO.
            self._try_send(b"")
        elif now - self._last_heard > self._expiry_s:
            self._lost(f"no word from the broker for {now - self._last_heard:.1f}s", now)
        elif now - self._last_sent >= self._heartbeat_s:
            self._try_send(_HEARTBEAT)

    def _lost(self, why: str, now: float) -> None:
        delay = self._reconnect_delay * random.uniform(0.5, 1.5)
        self._reconnect_delay = min(self._reconnect_delay * 2, RECONNECT_MAX_S)
        self._reconnect_at = now + delay
        self._event(
            BROKER_LOST,
            f"{why}; reconnecting in {delay:.2f}s; {self.sent_since_heard} messages sent since"
            " it was last heard may be lost",
        )

    def _reconnect(self) -> None:
        self._reconnect_at = None
        # Linger: frames already handed to the old socket still leave if its connection
        # comes back (a broker that was only frozen), instead of being thrown away.
        self._socket.close(linger=int(RECONNECT_LINGER_S * 1000))
        self._inbox.clear()  # the broker takes these back; settling them is a no-op
        self._out.clear()
        for tag in self._awaited:  # their answers would come on the old socket
            self._answers[tag] = _LOST
        self._socket = self._new_socket()
        self.reconnects += 1
        self._event(RECONNECTED, f"new connection #{self.reconnects}, consuming again")

    def _event(self, event: str, detail: str) -> None:
        log.warning("broker %s: %s: %s", self.address, event, detail)
        if self.on_event is not None:
            try:
                self.on_event(event, detail)
            except Exception:
                log.exception("on_event callback failed")

    # ------------------------------------------------------------------ internals

    def _queue_packet(self, queue: str) -> bytes:
        packet = self._queue_packets.get(queue)
        if packet is None:
            packet = self._queue_packets[queue] = queue_packet(queue)
        return packet

    def _send_frame(self, frame: bytes) -> None:
        """Hand a frame to the socket, blocking up to `send_timeout`; HELLO goes first."""
        if self.closed:
            raise ClientError("client is closed")
        greeting = self._greeting
        try:
            self._socket.send(frame if greeting is None else greeting + frame)
        except zmq.Again:
            raise ClientError(
                f"could not hand the message to the broker at {self.address} within"
                f" {self.send_timeout:g}s: it is not running, not reachable, or not keeping up"
            ) from None
        self._sent(greeting)

    def _try_send(self, frame: bytes) -> bool:
        """Send without blocking (heartbeats, greetings): False if the socket is not ready."""
        greeting = self._greeting
        try:
            self._socket.send(frame if greeting is None else greeting + frame, zmq.NOBLOCK)
        except zmq.Again:
            return False
        self._sent(greeting)
        return True

    def _sent(self, greeting: bytes | None) -> None:
        self._last_sent = time.monotonic()
        if greeting is not None:
            self._greeting = None
            self._last_heard = self._last_sent  # the broker's silence counts from HELLO

    def _settle(self, data: bytes, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return  # received on a lost connection: the broker has taken it back
            self._out.append(data)
            if len(self._out) >= self._flush_at:
                self._flush_quietly()

    def _flush_quietly(self) -> None:
        """Send settlements without blocking; keep them if the socket is not ready (a lost
        broker takes the messages back anyway, so nothing waits on them)."""
        if self._out and self._try_send(b"".join(self._out)):
            self._out.clear()

    def _read_available(self) -> None:
        while True:
            try:
                frame = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._last_heard = time.monotonic()
            self.sent_since_heard = 0
            messages, error = decode_frame(frame, self._max_content_bytes)
            generation = self._generation
            for message in messages:
                if type(message) is Dispatch:
                    self._inbox.append(ReceivedMessage(self, message, generation))
                else:
                    self._on_control(message)
            if error is not None:
                log.error("undecodable frame from broker %s: %s", self.address, error.reason)

    def _on_control(self, message: object) -> None:
        if type(message) is Confirm:
            if message.tag in self._awaited:
                self._answers[message.tag] = message.message_id.decode(errors="replace")
        elif isinstance(message, Error) and message.tag in self._awaited:
            self._answers[message.tag] = message  # raised to the sender, not logged
        elif isinstance(message, Error):
            self.errors.append(message)
            self.error_count += 1
            log.warning("broker error %d: %s", message.code, message.reason)
        elif isinstance(message, AdminReply):
            self._admin_replies.append(message)
        elif isinstance(message, Hello):
            self.broker_info = message.options
            self._reconnect_delay = RECONNECT_FIRST_S
            self._adopt_terms(message.options)
            limit = message.options.get("max_content_bytes")
            if type(limit) is int and limit > self._max_content_bytes:
                self._max_content_bytes = limit
        elif isinstance(message, Kbai):
            self._kbai = True
        elif isinstance(message, Disconnect):
            self._on_disconnect(message.reason or "")

    def _adopt_terms(self, options: dict[str, Any]) -> None:
        """Heartbeat by the interval and liveness the broker agreed to, not the ones asked."""
        heartbeat_ms, liveness = options.get("heartbeat_ms"), options.get("liveness")
        agreed = type(heartbeat_ms) is int and type(liveness) is int
        if self._heartbeat_s and agreed and heartbeat_ms > 0 and liveness > 0:
            self._heartbeat_s = heartbeat_ms / 1000
            self._expiry_s = self._heartbeat_s * liveness

    def _on_disconnect(self, reason: str) -> None:
        if reason.startswith("unknown peer"):
            # The broker restarted (or declared us dead): same socket, start over.
            self._greeting = self._hello + b"".join(
                encode(Consume(queue, window)) for queue, window in self._windows.items() if window
            )
            self._generation += 1
            self._inbox.clear()
            self._out.clear()
            self._event(REJOINED, reason)
        else:
            # Shutting down: keep settling what we hold while it drains; when it is gone,
            # liveness notices and reconnects with backoff.
            self._event(BROKER_LEAVING, reason)


def check_address(address: str) -> None:
    """Raise ClientError if ZeroMQ cannot use `address` (checked before starting processes
    that would each fail on it)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        sock.connect(address)
    except zmq.ZMQError as exc:
        raise ClientError(f"invalid broker address {address!r}: {exc}") from None
    finally:
        sock.close(linger=0)


def _checked_keys(contents: Iterable[bytes | str], keys: Iterable[str]) -> Iterable[str]:
    if isinstance(contents, Sized) and isinstance(keys, Sized) and len(keys) < len(contents):
        raise ValueError(f"{len(keys)} keys for {len(contents)} messages")
    return keys


def _next_key(keys: Iterator[str] | None) -> str | None:
    if keys is None:
        return None
    key = next(keys, None)
    if key is None:
        raise ValueError("fewer keys than messages")
    return key


def _confirmed(ids: list[str | None]) -> int:
    return sum(message_id is not None for message_id in ids)


def _as_bytes(content: bytes | str) -> bytes:
    return content.encode() if isinstance(content, str) else content
