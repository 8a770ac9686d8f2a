# The source of sync.py: tools/unasync.py writes that module from this one.
"""The asyncio client: it moves the bytes a sans-IO `Connection` (connection.py) decides on
through a DEALER socket, and owns the locks, the background work, reconnects and the waits;
what only this driver does (its socket, its background work, how it waits) is in
aio_backend.py.

    async with AsyncClient("tcp://127.0.0.1:5555") as client:
        await client.send("emails", b"hello", ttl=3600)
        async for message in client.consume("emails", window=100, timeout=1.0):
            handle(message.content)
            await message.ack()

Acks, requeues and dead letters are buffered and go out together (once half the window is
settled, or before the client next waits), so a consumer acks in batches for free. The client
says HELLO first, so the broker answers its mistakes with ERROR messages; they are logged and
kept in `client.errors`.

Liveness (docs/protocol.md §6.2): the client agrees on a heartbeat interval in HELLO; its
background work heartbeats while the application is busy elsewhere, so a long handler does
not look dead, but a frozen or killed process does. A broker silent for interval x liveness
is lost: the client reconnects on a new socket with exponential backoff and jitter, says
HELLO again and re-consumes every queue. The application sees an `on_event` callback and a
log line, nothing else; messages it received before the loss are taken back by the broker,
and settling them afterwards is a no-op.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import zmq

from ..protocol import Error
from . import aio_admin, aio_batches, aio_requests, aio_shards, aio_topics
from . import aio_backend as backend
from .batches import HeadersItem
from .connection import Connection
from .curve import Curve, admin_secret_from
from .dealer import not_taken
from .driver import RECONNECT_LINGER_S, Driver
from .errors import BrokerRefused, ClientError
from .events import RECONNECTED
from .message import AsyncReceivedMessage
from .refusals import FlowRefusal
from .schedules import Duration, delay_ms
from .shards import to_owner_async
from .topics import unused_ms

if TYPE_CHECKING:  # apart from the others: its blocking twin's name sorts elsewhere
    from collections.abc import AsyncIterator

log = logging.getLogger("phpmq.client")


class AsyncClient(
    aio_requests.AsyncRequests,
    aio_topics.AsyncTopics,
    aio_batches.AsyncBatchSends,
    aio_shards.AsyncShards,
    aio_admin.AsyncAdmin,
    backend.Background,
    Driver,
):
    """A connection to one broker (to a sharded one: to the shard at `address`, and to the
    owners of the queues it uses, docs/client.md "Sharded brokers"). An asyncio driver's
    coroutines may be awaited from many tasks of one event loop at once (it is not
    thread-safe); a blocking driver is safe for one application thread plus the client's own
    heartbeat threads: share it between application threads only with your own lock."""

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
        follow_leader: bool = True,
        _routed_by: Driver | None = None,
    ) -> None:
        """Makes the socket (ZeroMQ connects in the background; ClientError if it cannot use
        `address`) and the background work (backend.Background). `follow_leader=False`: stay
        at `address` when it is a follower replica (docs/client.md "Replicated shards").
        `_routed_by` is internal: the routing client this one is a link of."""
        settings: dict[str, Any] = dict(
            name=name, role=role, send_timeout=send_timeout, close_timeout=close_timeout,
            confirm_timeout=confirm_timeout, heartbeat_ms=heartbeat_ms, liveness=liveness,
            on_event=on_event, curve=curve, admin_secret=admin_secret,
        )  # fmt: skip
        connection = Connection(
            name=name,
            role=role,
            heartbeat_ms=heartbeat_ms,
            liveness=liveness,
            settle=self._settle,
            ack=self._ack,
            message_type=AsyncReceivedMessage,
            admin_secret=admin_secret_from(admin_secret),
        )
        super().__init__(
            address, connection, settings, routed_by=_routed_by, follow_leader=follow_leader
        )
        self._lock, self._send_lock = backend.client_locks()
        self._admin_lock = backend.admin_lock()
        self._dealer = self._connect()
        self._in_flight = backend.InFlight(self)  # requests (aio_requests.py)
        self._init_background()

    # ------------------------------------------------------------------ producing

    async def send(
        self,
        queue: str,
        content: bytes | str,
        ttl: int = 0,
        headers: HeadersItem = None,
        *,
        confirm: bool = False,
        key: str | None = None,
        delay: Duration | None = None,
        message_key: bytes | str | None = None,
    ) -> str | None:
        """Send one message. `headers` (a JSON-able dict, or a JSON object's bytes, sent as they
        are) travel with it to consumers that speak the extensions (e.g. `{"timeout": 30}`
        for a worker pool), and so does a `message_key` (Kafka's record key: the broker keeps
        it and never reads it).

        With `confirm=True` wait for the broker's answer and return the message ID: the
        message is queued (with a `--data-dir` broker: on disk). A `key` makes the send
        idempotent: sent again within the broker's window (2 minutes by default), it is
        confirmed with the first ID instead of being queued twice, so retrying after an
        Unconfirmed is safe.
        A `delay` (seconds or a timedelta) keeps it invisible to consumers that long: a
        one-off delayed job (it counts against the queue's length from the start).

        Raises:
            ClientError: the socket did not take it within `send_timeout` (no broker); or
                (InvalidArgument, also a ValueError) the queue name or key breaks the
                protocol's rules, the content or headers are over the broker's size limit,
                or headers given as bytes are not a JSON object.
            BrokerRefused: (confirm) the broker refused it; `.error` says why. Without
                confirm: the broker refused an earlier send that asked for no answer (this
                one was not sent); `.refusals` lists every one not told before.
            Unconfirmed: (confirm) no answer within `confirm_timeout`, or the connection was
                lost: it may or may not be queued.
            Paused: (a BrokerRefused) the broker paused sends to the queue and no RESUME
                came within `send_timeout`; this one was not sent (or, confirmed, was
                refused while paused). See "When the broker is full" in docs/client.md.
        """
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
        if confirm or connection.refusals.sends:  # inline: most sends need neither
            await self._before_sends(confirm)
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

    async def _before_sends(self, confirm: bool) -> None:
        """Tell refusals of earlier sends first; before confirmed sends, learn the broker's
        limits (a 413 answers no tag)."""
        if self._connection.refusals.sends:
            self._tell_refused_sends()
        if confirm and not self._connection.knows_limits:
            await self._await_limits()

    async def _wait_while_paused(self, queue: str | None) -> None:
        """Return once the broker has not paused sends to `queue` (None: to all; §6.4),
        waiting for news meanwhile; raise Paused after `send_timeout` without a RESUME."""
        connection = self._connection
        if connection.paused(queue) is None:
            return
        self._start()
        started = time.monotonic()
        deadline = started + self.send_timeout
        while True:
            async with self._lock:
                pause = connection.paused(queue)
                if pause is None:
                    return
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
        async with self._lock:
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
        """Ask for at most `window` unacked messages of `queue` at a time (0 stops). The
        subscription is renewed by itself after a reconnect. `bind` binds the queue to these
        event patterns in the same request; `delete_when_unused` (seconds) has the broker
        delete the queue once it had no consumer that long (docs/client.md "Events"). A
        queue name or pattern the broker would refuse raises InvalidArgument at once."""
        bind = tuple(bind)
        frame = self._connection.subscribe(queue, window, bind, unused_ms(delete_when_unused))
        await self._send_frame(frame)
        self._remember_subscription(queue, window, bind, delete_when_unused)

    async def receive(self, timeout: float | None = None) -> AsyncReceivedMessage | None:
        """The next dispatched message, or None if none came within `timeout` seconds.

        Raises:
            BrokerRefused: the broker refused a subscription for a reason that retrying
                cannot change (422: a window over its maximum); it is dropped. One refused
                for a limit that may lift (429: too many consumers) is asked for again, with
                backoff, and raises nothing.
            QueueDeleted: (a BrokerRefused, code 404) the broker deleted a queue this client
                consumed; that subscription is over. Raised once per deletion.
            (From any shard's connection, on a sharded broker.)
        """
        if self._shards is not None and self._shards.links:
            return await self._receive_merged(timeout)
        message = self._take_received()  # the hot path: one is in already (the loop costs more)
        if message is not None:
            return message
        self._start()  # (the asyncio client's reader: it took in what there was, so it runs)
        received = self._connection.received
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            async with self._lock:
                message = self._take_received()
                if message is not None:
                    return message
                wait = None if deadline is None else deadline - time.monotonic()
                await self._news_within(wait)
                if wait is not None and wait <= 0:
                    return received.popleft() if received else None  # type: ignore[return-value]

    def _take_received(self) -> AsyncReceivedMessage | None:
        """The next message already received (None: none; buffered settles then go), after
        raising what the caller must be told first."""
        connection = self._connection
        received = connection.received
        if received and not connection.refusals.subscriptions and not connection.topics.deleted:
            # The hot path takes no lock: a deque's popleft is atomic, and only a reconnect
            # on another thread (which gives them up) empties it meanwhile.
            try:
                return received.popleft()  # type: ignore[return-value]
            except IndexError:
                pass
        with self._lock:
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
        """Send buffered acks, requeues and dead letters now, and take in what the broker
        sent back.

        Raises:
            ClientError: the socket did not take them within `send_timeout`.
            BrokerRefused: the broker refused sends that asked for no answer.
        """
        for link in self._links():
            await link.flush()
        async with self._lock:
            payload = self._connection.take_settles()
            if payload:
                await self._send_frame(payload)
            await self._read_available()
            self._tell_refused_sends()

    async def _await_limits(self) -> None:
        """Before the first confirmed send: the broker's HELLO answer, so that content over
        its size limit is refused here at once (a 413 answers no tag: the send would wait
        out `confirm_timeout`). Without an answer the send goes ahead and is Unconfirmed."""
        connection = self._connection
        async with self._lock:
            if not connection.greeted:
                await self._send_frame(b"")
            deadline = time.monotonic() + self.confirm_timeout
            while not connection.knows_limits and (wait := deadline - time.monotonic()) > 0:
                connection.raise_if_refused()
                await self._news_within(wait)

    def _settle(self, frame: bytes, generation: int) -> None:
        """Where received messages hand their requeue, dead letter or reply (a plain function
        in both drivers: it awaits nothing, and a coroutine per settle costs)."""
        with self._lock:
            if self._connection.buffer_settle(frame, generation):
                self._flush_quietly()

    def _ack(self, queue: str, message_id: bytes, generation: int) -> None:
        """Where received messages hand their ack (as `_settle`)."""
        with self._lock:
            if self._connection.buffer_ack(queue, message_id, generation):
                self._flush_quietly()

    def _flush_quietly(self) -> None:
        """Send settlements without waiting; keep them if the socket is busy or not ready (a
        lost broker takes the messages back anyway, so nothing waits on them)."""
        if backend.sending(self._send_lock):
            return  # another sender holds the socket; the next wait flushes
        connection = self._connection
        payload = connection.take_settles()
        if payload and not self._try_send(connection.frame(payload)):
            connection.keep_settles(payload)

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Flush, say goodbye, wait for the broker's answer, and close.

        Messages received but not settled go back to the head of their queue (with delivery
        count +1). The wait matters: a ROUTER discards frames it has not read yet when the
        sender's connection closes, so without it the last sends could be lost. The broker's
        KBAI answer proves it has read every frame sent before it.

        On a sharded broker every link is closed first, the same way; a refusal any of
        them tells is raised once all are closed.
        """
        refused_at_link = await self._close_links()
        if self.closed:
            return
        await self._stop_liveness()
        async with self._lock:
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
                await self._stop_reader()
                self._dealer.close(self.close_timeout)
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
        try:
            await self.close()
        except BrokerRefused as refused:
            if exc_type is None:
                raise
            # Leaving with an error already: do not hide it behind a refusal.
            log.warning("closing %s: %s", self.address, refused)

    # ------------------------------------------------------------------ the socket

    def _connect(self) -> backend.Dealer:
        """A fresh socket whose first frame will be HELLO and a consume per subscription."""
        dealer = backend.Dealer(self.address, self.send_timeout, self.curve)
        self._sndtimeo = self.send_timeout  # what the socket has
        self._connection.start(time.monotonic())
        return dealer

    async def _send_frame(
        self, payload: bytes, messages: int = 0, tags: Iterable[int] = ()
    ) -> None:
        """Hand `payload` (`messages` 001s, whose `tags` then wait for answers) to the socket,
        waiting up to `send_timeout`; the greeting goes first if owed."""
        self._start()
        if self._reconnect_at is not None and self._reconnect_due(time.monotonic()):
            await self._reconnect()  # not on a socket already given up on
        async with self._send_lock:
            if self.closed:
                raise ClientError("client is closed")
            connection = self._connection
            frame = connection.frame(payload)
            if not frame:  # a greeting-only send whose greeting went out meanwhile
                return
            timeout = self._send_timeout_now()
            if timeout != self._sndtimeo:
                self._dealer.socket.sndtimeo = int(timeout * 1000)
                self._sndtimeo = timeout
            try:
                await self._dealer.socket.send(frame)
            except zmq.Again:
                refusal = not_taken(self.address, timeout)
                self._untaken(str(refusal))
                raise refusal from None
            connection.sent(frame, time.monotonic(), messages, tags)

    def _try_send(self, frame: bytes) -> bool:
        """Send a framed `frame` without waiting: False if the socket is not ready."""
        if not self._dealer.try_send(frame):
            return False
        self._connection.sent(frame, time.monotonic())
        return True

    # ------------------------------------------------------------------ liveness

    async def _tick(self) -> None:
        """Liveness duties, run by the background work and by waits (backend.Background):
        send the settles held since the caller last read (a worker's handler that runs
        long), notice a silent broker, reconnect when due, and send the greeting or a
        heartbeat when owed."""
        connection = self._connection
        now = time.monotonic()
        resubscribes = connection.resubscribes(now)
        if resubscribes and not backend.sending(self._send_lock):
            self._try_send(connection.frame(resubscribes))
        self._flush_quietly()
        if not connection.heartbeat_interval:
            return
        if self._reconnect_at is not None:
            if now >= self._reconnect_at:
                await self._reconnect()
            return
        if connection.broker_lost(now):
            self._lost(connection.lost_why(now), now)
            return
        frame = connection.keepalive(now)
        if frame is not None and not backend.sending(self._send_lock):
            self._try_send(frame)

    async def _reconnect(self) -> None:
        async with self._send_lock:
            if self.closed:
                return
            self._reconnect_at = None
            await self._stop_reader()
            # Linger: frames already handed to the old socket still leave if its connection
            # comes back (a broker that was only frozen), instead of being thrown away.
            self._dealer.close(RECONNECT_LINGER_S)
            self._dealer = self._connect()  # the connection gives up the old socket's work
            self._start()  # the new socket's reader
            self._reconnected += 1
        self._wake()  # confirms awaited on the old socket are now answered LOST
        self._event(RECONNECTED, f"new connection #{self._reconnected}, consuming again")
