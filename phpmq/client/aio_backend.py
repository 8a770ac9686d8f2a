"""What the asyncio client does its own way, for the modules written once (tools/unasync.py):
its locks, its socket, its background work and how it waits. sync_backend.py is the blocking
twin, with the same names.

One task reads the socket and wakes whoever waits (for a message, a confirm, an admin reply);
another does the liveness duties. Any number of tasks of the loop may send and wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from . import dealer
from .errors import ClientError

log = logging.getLogger("phpmq.client")


def client_locks() -> tuple[contextlib.nullcontext[None], asyncio.Lock]:
    """The client's `_lock` and `_send_lock`. `_lock` locks nothing: the blocking client's
    lock keeps its threads from interleaving on the socket, but the asyncio client's tasks may
    run many calls at once, and a lock held while one of them waits for the broker would queue
    all the others (blocks that await nothing take it with a plain `with`, which costs less).
    `_send_lock` lets one sender at a time, so the greeting goes first on a new socket and a
    reconnect gives up exactly the tags that went out on the old one."""
    return contextlib.nullcontext(), asyncio.Lock()


def admin_lock() -> asyncio.Lock:
    """One ADMIN at a time per client: a connection awaits one reply, the one with the ref
    of its last command, so two tasks' commands at once would each drop the other's."""
    return asyncio.Lock()


@contextlib.asynccontextmanager
async def admin_turn(
    admin_lock: asyncio.Lock, _client_lock: object, timeout: float, command: str
) -> AsyncIterator[None]:
    """Holds `admin_lock` for one command. Waited for more than `timeout` seconds (another
    task's commands held it), the command is not sent: it would run with no one waiting for
    its answer, and the caller could not tell."""
    try:
        # A free lock is taken without waiting, however short the timeout; one that looks free
        # but has a woken waiter is waited for like a held one.
        async with asyncio.timeout(max(timeout, 0.0)):
            await admin_lock.acquire()
    except TimeoutError:
        raise _admin_not_sent(command, timeout) from None
    try:
        yield
    finally:
        admin_lock.release()


def _admin_not_sent(command: str, timeout: float) -> ClientError:
    return ClientError(
        f"{command} was not sent: the client's other admin commands held it for the whole"
        f" {timeout}s"
    )


def sending(send_lock: asyncio.Lock) -> bool:
    """Whether another task is handing a frame to the socket now (a send that would not wait
    leaves it to the next wait)."""
    return send_lock.locked()


class Dealer(dealer.Dealer):
    """The asyncio client's socket: dealer.py's, made by zmq.asyncio (its sends and receives
    are awaited; `poll` and `frames` are only for the blocking client's)."""

    context = zmq.asyncio.Context

    def try_send(self, frame: bytes) -> bool:
        """Hand `frame` to the socket without waiting: False if it is not ready."""
        sent = self.socket.send(frame, zmq.NOBLOCK)
        if not sent.done():  # queued behind a pending send: not ours to wait for
            sent.cancel()
            return False
        return sent.exception() is None  # zmq.Again: the socket is not ready


class Background:
    """`AsyncClient`'s background work: a task that reads the socket and wakes the waiters
    through an event, and a liveness task; both start on the running loop with `async with`
    or a first call."""

    def _init_background(self) -> None:
        #: Set and replaced whenever the broker was heard from or the socket was replaced.
        self._news = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._liveness: asyncio.Task[None] | None = None

    def _start(self) -> None:
        """Start the reader and liveness tasks on the running loop, if not yet running (the
        liveness task not again once `_stop_liveness` stopped it)."""
        if self._reader is None and not self.closed:
            self._reader = asyncio.get_running_loop().create_task(self._read(self._dealer))
        if self._liveness is None and not self.closed and self._connection.heartbeat_interval:
            self._liveness = asyncio.get_running_loop().create_task(self._keep_alive())

    async def _stop_liveness(self) -> None:
        """Closing: no liveness duties while saying goodbye."""
        await _cancel(self._liveness)

    async def _stop_reader(self) -> None:
        """The socket is closed or replaced: its reader stops (`_start` makes the next one)."""
        await _cancel(self._reader)
        self._reader = None

    async def _read(self, dealer: Dealer) -> None:
        """Read the broker's frames from `dealer` until it is replaced or closed."""
        connection = self._connection
        recv = dealer.socket.recv
        try:
            while True:
                frame = await recv()
                for event in connection.receive(frame, time.monotonic()):
                    self._on_event(event)
                self._wake()
        except zmq.ZMQError as exc:  # the socket was closed under us
            log.debug("reader stops: %s", exc)

    def _wake(self) -> None:
        self._news.set()
        self._news = asyncio.Event()
        if self._routed_by is not None:  # one wait of the routing client covers its links
            self._routed_by._wake()

    async def _read_available(self) -> None:
        """One turn of the loop: the reader task takes in what has arrived."""
        await asyncio.sleep(0)

    async def _news_within(self, seconds: float | None) -> None:
        """Wait until the broker is heard from (or the socket replaced), at most `seconds`
        (None: no limit); with no time left, one turn of the loop, so that the reader takes
        what is there."""
        if seconds is not None and seconds <= 0:
            await asyncio.sleep(0)
            return
        news = self._news
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await news.wait()

    async def _keep_alive(self) -> None:
        tick = min(max(self._connection.heartbeat_interval / 4, 0.01), 0.25)
        while not self.closed:
            await asyncio.sleep(tick)
            await self._tick()


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is None or task.done():
        return
    task.cancel()
    await asyncio.wait([task])  # unlike `await task`, our own cancellation still reaches us


class InFlight:
    """`AsyncClient`'s requests in flight. Each waits on its own future, which the connection's
    `notify` resolves when that request's outcome came: a reply wakes its one requester, not
    every task that waits, so many requests may be in flight at once. Requests made in the same
    turn of the event loop leave in one frame: one socket send, one broker turn."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._waiters: dict[str, asyncio.Future[None]] = {}
        #: The (frame, tag) of each request of this turn of the loop, sent by the first of
        #: them, and done once they went out (or with the exception that kept them from it).
        self._batch: list[tuple[bytes, int]] | None = None
        self._batch_sent: asyncio.Future[None] | None = None
        client._connection.requests.notify = self._outcome_came

    def expect(self, correlation: str) -> None:
        self._waiters[correlation] = asyncio.get_running_loop().create_future()

    def forget(self, correlation: str) -> None:
        self._waiters.pop(correlation, None)

    async def within(self, correlation: str, seconds: float) -> None:
        """Wait until the request's outcome came, at most `seconds`."""
        waiter = self._waiters[correlation]
        time_up = asyncio.get_running_loop().call_later(seconds, _wake, waiter)
        try:
            await waiter
        finally:
            time_up.cancel()

    async def send(self, frame: bytes, tag: int) -> None:
        """Hand the request's `frame` to the socket together with those of the other
        requests made in this turn of the loop: the first of them sends them all."""
        if self._batch is not None:
            self._batch.append((frame, tag))
            await asyncio.shield(self._batch_sent)  # type: ignore[arg-type]
            return
        batch = self._batch = [(frame, tag)]
        sent = self._batch_sent = asyncio.get_running_loop().create_future()
        try:
            await asyncio.sleep(0)  # the other requests of this turn join the batch
            self._batch = None
            frames, tags = zip(*batch, strict=True)
            await self._client._send_frame(b"".join(frames), len(tags), tags)
        except BaseException as exc:
            if self._batch is batch:
                self._batch = None
            if len(batch) > 1:  # the others are told; this one raises it itself
                sent.set_exception(exc if isinstance(exc, Exception) else _not_sent())
            raise
        sent.set_result(None)

    def _outcome_came(self, correlation: str) -> None:
        waiter = self._waiters.get(correlation)
        if waiter is not None:
            _wake(waiter)


def _not_sent() -> ClientError:
    """What the requests of a batch raise when the one to send it was cancelled first."""
    return ClientError("request not sent: the request sending it with others was cancelled")


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def news_from_any(routing: Any, clients: list[Any], wait: float | None) -> None:
    """Wait up to `wait` seconds (None: no limit) for news from any of the `clients`, each
    link's reader started: its news wakes `routing` too. With no time left, one turn of the
    loop, so that the readers take what is there."""
    for client in clients:
        client._start()
    await routing._news_within(wait)
