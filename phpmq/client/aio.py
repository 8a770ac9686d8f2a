"""The asyncio client: the same sans-IO `Connection` (connection.py) as the blocking `Client`
(sync.py), moved by a `zmq.asyncio` DEALER, with background tasks instead of a thread.

    async with AsyncClient("tcp://127.0.0.1:5555") as client:
        await client.send("emails", b"hello", ttl=3600)
        async for message in client.consume("emails", window=100, timeout=1.0):
            handle(message.content)
            await message.ack()

Semantics are `Client`'s (docs/client.md): settles are buffered and flushed together, a
background task heartbeats and notices a silent broker, reconnects with backoff and jitter,
and renews every subscription. One task reads the socket and wakes whoever waits (for a
message, a confirm, an admin reply); any number of tasks may send and wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import zmq
import zmq.asyncio

from ..protocol import Error
from .aio_admin import AsyncAdmin
from .aio_backend import NoLock
from .aio_batches import AsyncBatchSends
from .aio_requests import AsyncRequests
from .aio_schedules import AsyncSchedules
from .aio_shards import AsyncShards
from .aio_topics import AsyncTopics
from .connection import Connection
from .curve import Curve, admin_secret_from
from .dealer import SEND_HWM
from .driver import RECONNECT_LINGER_S, Driver
from .errors import BrokerRefused, ClientError
from .events import RECONNECTED
from .message import AsyncReceivedMessage
from .refusals import FlowRefusal
from .schedules import Duration, delay_ms
from .shards import to_owner_async
from .topics import unused_ms

log = logging.getLogger("phpmq.client")


class AsyncClient(
    AsyncRequests, AsyncTopics, AsyncSchedules, AsyncBatchSends, AsyncShards, AsyncAdmin, Driver
):
    """A connection to one broker for one event loop (to a sharded one: to the shard at
    `address` and the owners of the queues it uses, as `Client`). Its coroutines may be
    awaited from many tasks of that loop at once; it is not thread-safe."""

    def __init__(
        self,
        address: str | None = None,
        *,
        name: str = "phpmq-python",
        role: str = "client",
        send_timeout: float = 5.0,
        close_timeout: float = 5.0,
        confirm_timeout: float = 10.0,
        heartbeat_ms: int = 1000,
        liveness: int = 3,
        on_event: Callable[[str, str], None] | None = None,
        curve: Curve | None = None,
        admin_secret: str | None = None,
        _routed_by: Driver | None = None,
    ) -> None:
        """Makes the socket (ZeroMQ connects in the background; ClientError if it cannot use
        `address`); the tasks that read and heartbeat start with `async with` or a first call.
        `_routed_by` is internal: the routing client this one is a link of."""
        self._link_settings: dict[str, Any] = dict(
            name=name, role=role, send_timeout=send_timeout, close_timeout=close_timeout,
            confirm_timeout=confirm_timeout, heartbeat_ms=heartbeat_ms, liveness=liveness,
            on_event=on_event, curve=curve, admin_secret=admin_secret,
        )  # fmt: skip
        super().__init__(
            address,
            Connection(
                name=name,
                role=role,
                heartbeat_ms=heartbeat_ms,
                liveness=liveness,
                settle=self._settle,
                message_type=AsyncReceivedMessage,
                admin_secret=admin_secret_from(admin_secret),
            ),
            send_timeout=send_timeout,
            close_timeout=close_timeout,
            confirm_timeout=confirm_timeout,
            on_event=on_event,
            routed_by=_routed_by,
            curve=curve,
        )
        #: One sender at a time, so the greeting goes first on a new socket and a reconnect
        #: gives up exactly the tags that went out on the old one.
        self._send_lock = asyncio.Lock()
        self._lock = NoLock()
        #: Set and replaced whenever the broker was heard from or the socket was replaced.
        self._news = asyncio.Event()
        self._socket = self._connect()
        self._reader: asyncio.Task[None] | None = None
        self._liveness: asyncio.Task[None] | None = None
        self._init_requests()

    # ------------------------------------------------------------------ producing

    async def send(
        self,
        queue: str,
        content: bytes | str,
        ttl: int = 0,
        headers: dict[str, Any] | None = None,
        *,
        confirm: bool = False,
        key: str | None = None,
        delay: Duration | None = None,
        message_key: bytes | str | None = None,
    ) -> str | None:
        """Send one message; with `confirm=True` return its ID once the broker has it.
        As `Client.send`, with the same exceptions."""
        if self._routing is not None and (link := await self._link_for(queue)) is not None:
            # The hot path's one check, inline: a decorator's *args would cost more.
            return await link.send(
                queue,
                content,
                ttl,
                headers,
                confirm=confirm,
                key=key,
                delay=delay,
                message_key=message_key,
            )
        connection = self._connection
        if connection.refusals.sends:
            self._tell_refused_sends()
        if confirm and not connection.knows_limits:
            await self._await_limits()
        tag = connection.next_tag() if confirm else None
        frame = connection.send(
            queue, content, ttl, headers, tag, key, delay_ms(delay), message_key
        )
        while True:
            await self._wait_while_paused(queue)
            await self._send_frame(frame, 1, () if tag is None else (tag,))
            if tag is None:
                return None
            [answer] = await self._await_answers([tag], self.confirm_timeout)
            if type(answer) is not FlowRefusal:
                return self._one_answer(answer)
            # Refused because the queue filled before the broker's PAUSE reached us: the
            # same send goes again once the pause is over (or Paused after send_timeout).

    async def _wait_while_paused(self, queue: str) -> None:
        """Return once the broker has not paused sends to `queue` (docs/protocol.md §6.4),
        woken by each frame the reader takes in; raise Paused after `send_timeout` without
        a RESUME."""
        connection = self._connection
        if connection.paused(queue) is None:
            return
        self._start()
        started = time.monotonic()
        deadline = started + self.send_timeout
        while (pause := connection.paused(queue)) is not None:
            if self.closed:
                raise ClientError("client is closed")
            self._flush_quietly()  # a producer that also consumes: let its acks go
            now = time.monotonic()
            if now >= deadline:
                raise self._pause_outlasted(queue, pause, now - started)
            await self._news_within(deadline - now)

    async def _await_answers(
        self, tags: list[int], timeout: float
    ) -> list[str | Error | FlowRefusal | None]:
        """The answers to `tags`, in that order, once they are all in or `timeout` seconds
        passed without a new one (those get None)."""
        connection = self._connection
        deadline = time.monotonic() + timeout
        answered = 0
        while True:
            before = answered
            answered = connection.answered(tags, answered)
            if answered == len(tags):
                break
            if answered > before:
                deadline = time.monotonic() + timeout  # progress: the wait starts over
            wait = deadline - time.monotonic()
            if wait <= 0:
                break
            await self._news_within(wait)
        return connection.take_answers(tags)

    # ------------------------------------------------------------------ consuming

    @to_owner_async
    async def subscribe(
        self,
        queue: str,
        window: int = 100,
        *,
        bind: Iterable[str] = (),
        delete_when_unused: float | None = None,
    ) -> None:
        """At most `window` unacked messages of `queue` at a time (0 stops), binding `bind`
        and deleted once unused `delete_when_unused` seconds, as `Client`'s."""
        bind = tuple(bind)
        frame = self._connection.subscribe(queue, window, bind, unused_ms(delete_when_unused))
        await self._send_frame(frame)
        self._remember_subscription(queue, window, bind, delete_when_unused)

    async def receive(self, timeout: float | None = None) -> AsyncReceivedMessage | None:
        """The next dispatched message, or None if none came within `timeout` seconds;
        BrokerRefused for a subscription refused for good, QueueDeleted for a consumed queue
        the broker deleted (see `Client.receive`)."""
        if self._shards is not None and self._shards.links:
            return await self._receive_merged(timeout)
        self._start()
        received = self._connection.received
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            message = self._take_received()
            if message is not None:
                return message
            if deadline is None:
                await self._news_within(None)
                continue
            wait = deadline - time.monotonic()
            if wait <= 0:
                await asyncio.sleep(0)  # one turn of the loop: the reader takes what is there
                return received.popleft() if received else None  # type: ignore[return-value]
            await self._news_within(wait)

    def _take_received(self) -> AsyncReceivedMessage | None:
        """The next message already received (None: none; buffered settles then go), after
        raising what the caller must be told first."""
        connection = self._connection
        if connection.refusals.subscriptions:
            self._tell_refused_subscription()
        if connection.topics.deleted:
            self._tell_deleted()
        if connection.received:
            return connection.received.popleft()  # type: ignore[return-value]
        if self.closed:
            raise ClientError("client is closed")
        connection.raise_if_refused()
        self._flush_quietly()
        return None

    async def consume(
        self,
        queue: str,
        window: int = 100,
        timeout: float | None = None,
        *,
        bind: Iterable[str] = (),
        delete_when_unused: float | None = None,
    ) -> AsyncIterator[AsyncReceivedMessage]:
        """Subscribe to `queue` (as `subscribe`) and yield its messages; stop after
        `timeout` seconds idle. QueueDeleted ends it when the broker deletes the queue."""
        if await self._window_at_owner(queue) != window or bind or delete_when_unused is not None:
            await self.subscribe(queue, window, bind=bind, delete_when_unused=delete_when_unused)
        while True:
            message = await self.receive(timeout)
            if message is None:
                return
            yield message

    async def flush(self) -> None:
        """Send buffered acks, requeues and dead letters now (ClientError: not taken within
        `send_timeout`); BrokerRefused for sends the broker refused (see `Client.flush`)."""
        await self._flush_links()
        payload = self._connection.take_settles()
        if payload:
            await self._send_frame(payload)
        await asyncio.sleep(0)  # let the reader take in what has arrived
        self._tell_refused_sends()

    async def _await_limits(self) -> None:
        """Before the first confirmed send: the broker's HELLO answer (see `Client`)."""
        connection = self._connection
        if not connection.greeted:
            await self._send_frame(b"")
        deadline = time.monotonic() + self.confirm_timeout
        while not connection.knows_limits and (wait := deadline - time.monotonic()) > 0:
            connection.raise_if_refused()
            await self._news_within(wait)

    async def _settle(self, frame: bytes, generation: int) -> None:
        """Where received messages hand their ack, requeue or dead letter."""
        if self._connection.buffer_settle(frame, generation):
            self._flush_quietly()

    def _flush_quietly(self) -> None:
        """Send settlements without waiting; keep them if the socket is busy or not ready (a
        lost broker takes the messages back anyway, so nothing waits on them)."""
        connection = self._connection
        if self._send_lock.locked():
            return  # a sender holds the socket; the next wait flushes
        payload = connection.take_settles()
        if payload and not self._try_send(connection.frame(payload)):
            connection.keep_settles(payload)

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Flush, say goodbye, wait for the broker's answer, and close. Messages received but
        not settled go back to the head of their queue (see `Client.close`); links first."""
        refused_at_link = await self._close_links()
        if self.closed:
            return
        await _cancel(self._liveness)
        self._liveness = None
        try:
            connection = self._connection
            if connection.greeted:  # something was sent: make sure it all arrived
                self._start()
                while (payload := connection.leave_step()) is not None:
                    await self._send_frame(payload)  # settles flushed, telling nothing yet
                    await self._await_goodbye_answer()
        except ClientError as exc:
            log.warning("closing %s: %s", self.address, exc)
        finally:
            self.closed = True
            self._connection.requests.give_up("the client was closed")
            await _cancel(self._reader)
            self._reader = None
            self._socket.close(linger=int(self.close_timeout * 1000))
            self._wake()
        # The goodbye's answer proves the broker read every send: tell what it refused.
        self._tell_refused_sends()
        if refused_at_link is not None:
            raise refused_at_link

    async def _await_goodbye_answer(self) -> None:
        deadline = time.monotonic() + self.close_timeout
        while not self._connection.goodbye_answered:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise ClientError(
                    f"the broker did not answer goodbye within {self.close_timeout}s:"
                    " messages sent just before closing may not have arrived"
                )
            await self._news_within(wait)

    async def __aenter__(self) -> AsyncClient:
        self._start()
        return self

    async def __aexit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is None:
            await self.close()
            return
        try:  # leaving with an error already: do not hide it behind a refusal
            await self.close()
        except BrokerRefused as refused:
            log.warning("closing %s: %s", self.address, refused)

    # ------------------------------------------------------------------ the socket

    def _connect(self) -> zmq.asyncio.Socket:
        """A fresh socket whose first frame will be HELLO and a consume per subscription."""
        sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        sock.linger = 0
        sock.sndtimeo = int(self.send_timeout * 1000)
        sock.sndhwm = SEND_HWM
        sock.immediate = True  # as the sync Dealer: queue only to a live connection
        if self.curve is not None:
            self.curve.apply(sock)
        try:
            sock.connect(self.address)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ClientError(f"invalid broker address {self.address!r}: {exc}") from None
        self._connection.start(time.monotonic())
        return sock

    def _start(self) -> None:
        """Start the reader and liveness tasks on the running loop, if not yet running."""
        if self._reader is None and not self.closed:
            self._reader = asyncio.get_running_loop().create_task(self._read(self._socket))
        if self._liveness is None and not self.closed and self._connection.heartbeat_interval:
            self._liveness = asyncio.get_running_loop().create_task(self._keep_alive())

    async def _send_frame(
        self, payload: bytes, messages: int = 0, tags: Iterable[int] = ()
    ) -> None:
        """Hand `payload` (`messages` 001s, whose `tags` then await answers) to the socket,
        waiting up to `send_timeout`; the greeting goes first if owed."""
        self._start()
        async with self._send_lock:
            if self.closed:
                raise ClientError("client is closed")
            connection = self._connection
            frame = connection.frame(payload)
            if not frame:  # a greeting-only send whose greeting another task sent meanwhile
                return
            try:
                await self._socket.send(frame)
            except zmq.Again:
                raise ClientError(
                    f"could not hand the message to the broker at {self.address} within"
                    f" {self.send_timeout:g}s: it is not running, not reachable, or not"
                    " keeping up"
                ) from None
            connection.sent(frame, time.monotonic(), messages, tags)

    def _try_send(self, frame: bytes) -> bool:
        """Send a framed `frame` without waiting: False if the socket is not ready."""
        sent = self._socket.send(frame, zmq.NOBLOCK)
        if not sent.done():  # queued behind a pending send: not ours to wait for
            sent.cancel()
            return False
        if sent.exception() is not None:  # zmq.Again: the socket is not ready
            return False
        self._connection.sent(frame, time.monotonic())
        return True

    async def _read(self, sock: zmq.asyncio.Socket) -> None:
        """Read the broker's frames from `sock` until it is replaced or closed."""
        connection = self._connection
        try:
            while True:
                frame = await sock.recv()
                for event in connection.receive(frame, time.monotonic()):
                    self._on_event(event)
                self._wake()
        except zmq.ZMQError as exc:  # the socket was closed under us
            log.debug("reader stops: %s", exc)

    def _wake(self) -> None:
        self._news.set()
        self._news = asyncio.Event()
        if self._routed_by is not None:  # one wait of the routing client covers its links
            self._routed_by._wake()  # type: ignore[attr-defined]

    async def _read_available(self) -> None:
        """Nothing: the reader task reads frames as they come (sync.py reads them here)."""

    async def _news_within(self, seconds: float | None) -> None:
        """Wait until the broker is heard from (or the socket replaced), at most `seconds`."""
        news = self._news
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await news.wait()

    # ------------------------------------------------------------------ liveness

    async def _keep_alive(self) -> None:
        tick = min(max(self._connection.heartbeat_interval / 4, 0.01), 0.25)
        while not self.closed:
            await asyncio.sleep(tick)
            await self._tick()

    async def _tick(self) -> None:
        """Notice a silent broker, reconnect when due, send the greeting or a heartbeat when
        owed (sync.py's `_tick`)."""
        connection = self._connection
        now = time.monotonic()
        resubscribes = connection.resubscribes(now)
        if resubscribes and not self._send_lock.locked():
            self._try_send(connection.frame(resubscribes))
        if self._reconnect_at is not None:
            if now >= self._reconnect_at:
                await self._reconnect()
            return
        if connection.broker_lost(now):
            self._lost(f"no word from the broker for {connection.silence(now):.1f}s", now)
            return
        frame = connection.keepalive(now)
        if frame is not None and not self._send_lock.locked():
            self._try_send(frame)

    async def _reconnect(self) -> None:
        async with self._send_lock:
            if self.closed:
                return
            self._reconnect_at = None
            await _cancel(self._reader)
            # Linger: frames already handed to the old socket still leave if its connection
            # comes back (a broker that was only frozen), instead of being thrown away.
            self._socket.close(linger=int(RECONNECT_LINGER_S * 1000))
            self._socket = self._connect()  # the connection gives up the old socket's work
            self._reader = asyncio.get_running_loop().create_task(self._read(self._socket))
            self._reconnected += 1
        self._wake()  # confirms awaited on the old socket are now answered LOST
        self._event(RECONNECTED, f"new connection #{self._reconnected}, consuming again")


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is None or task.done():
        return
    task.cancel()
    await asyncio.wait([task])  # unlike `await task`, our own cancellation still reaches us
