"""What the blocking client does its own way, for the modules written once (tools/unasync.py):
its locks, its socket, its background work and how it waits. aio_backend.py is the asyncio
twin, with the same names.

There is no reader: whichever thread waits reads the socket, holding the client's lock, and
does the liveness duties; a heartbeat thread does them while the application is busy
elsewhere, so a long handler does not look dead.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import zmq

from .dealer import Dealer as Dealer
from .errors import ClientError

log = logging.getLogger("phpmq.client")

#: How long one wait for the broker blocks at most before looking again: the waiting thread
#: lets go of the socket this often, so the heartbeat thread keeps its turn.
WAIT_SLICE_S = 0.05
#: Waits do the liveness duties at most this often: a worker looks for news before every job
#: (a wait of 0 s), and the duties' clocks (heartbeats, back-offs) count in 100s of ms.
WAIT_TICK_S = 0.005


def _one_slice(seconds: float | None) -> float:
    """`seconds` (None: no limit) cut to one WAIT_SLICE_S, and to 0 if none is left."""
    return WAIT_SLICE_S if seconds is None else max(0.0, min(seconds, WAIT_SLICE_S))


def client_locks() -> tuple[threading.RLock, threading.RLock]:
    """The client's `_lock`, held around each call so that its threads do not interleave on
    the socket, and `_send_lock`, the same lock: a sender holds it, so the greeting goes first
    on a new socket and a reconnect gives up exactly the tags that went out on the old one."""
    lock = threading.RLock()
    return lock, lock


def admin_lock() -> contextlib.nullcontext[None]:
    """One ADMIN at a time per client: the client's lock, which the command holds, is that
    already."""
    return contextlib.nullcontext()


@contextlib.contextmanager
def admin_turn(
    _admin_lock: object, client_lock: threading.RLock, timeout: float, command: str
) -> Iterator[None]:
    """Holds the client's lock for one command. Waited for more than `timeout` seconds
    (another thread's calls held it), the command is not sent: it would run with no one
    waiting for its answer, and the caller could not tell."""
    if not client_lock.acquire(timeout=min(max(timeout, 0.0), threading.TIMEOUT_MAX)):
        raise ClientError(
            f"{command} was not sent: the client's other calls held it for the whole {timeout}s"
        )
    try:
        yield
    finally:
        client_lock.release()


def sending(send_lock: threading.RLock) -> bool:
    """False: whoever asks holds the lock itself, so no other thread is mid-send."""
    return False


class Background:
    """`Client`'s background work: a heartbeat thread (with heartbeats on) that takes the lock
    every quarter interval to read the socket and do the liveness duties; waits read the
    socket themselves."""

    def _init_background(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: When a wait next does the liveness duties.
        self._wait_tick_at = 0.0
        if self._connection.heartbeat_interval:
            self._thread = threading.Thread(
                target=self._heartbeat_loop, name=f"phpmq-heartbeat {self.address}", daemon=True
            )
            self._thread.start()

    def _start(self) -> None:
        """Nothing: the heartbeat thread started with the client."""

    def _stop_liveness(self) -> None:
        """Closing: the heartbeat thread stops, and waits do no liveness duties from now on."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _stop_reader(self) -> None:
        """Nothing: no thread reads the socket on its own."""

    def _heartbeat_loop(self) -> None:
        tick = min(max(self._connection.heartbeat_interval / 4, 0.01), 0.25)
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

    def _wake(self) -> None:
        """Nothing: each waiting thread reads the socket itself."""

    def _read_available(self) -> None:
        connection = self._connection
        for frame in self._dealer.frames():
            for event in connection.receive(frame, time.monotonic()):
                self._on_event(event)

    def _news_within(self, seconds: float | None) -> None:
        """Read what the broker sends within `seconds` (None: no limit), but at most
        WAIT_SLICE_S, so that the caller lets go of the lock this often and the heartbeat
        thread keeps its turn; then do the liveness duties the heartbeat thread cannot do
        while the caller holds the lock (none once closing; at most every WAIT_TICK_S)."""
        if self._dealer.poll(_one_slice(seconds)):
            self._read_available()
        if not self._stop.is_set():
            now = time.monotonic()
            if now >= self._wait_tick_at:
                self._wait_tick_at = now + WAIT_TICK_S
                self._tick()


class InFlight:
    """`Client`'s requests in flight: each frame goes at once, and its requester reads the
    socket while it waits (one thread makes one request at a time: nothing to wake)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def expect(self, correlation: str) -> None:
        return None

    def forget(self, correlation: str) -> None:
        return None

    def within(self, correlation: str, seconds: float) -> None:
        """Read the socket for news, at most `seconds` (and one WAIT_SLICE_S)."""
        self._client._news_within(seconds)

    def send(self, frame: bytes, tag: int) -> None:
        self._client._send_frame(frame, 1, (tag,))


def news_from_any(routing: Any, clients: list[Any], wait: float | None) -> None:
    """Wait up to `wait` seconds (None: no limit; at most WAIT_SLICE_S at a time) for a frame
    on any of the `clients`' sockets, read what came, and do each one's liveness duties;
    every client's lock is held meanwhile."""
    seconds = _one_slice(wait)
    poller = zmq.Poller()
    with contextlib.ExitStack() as locks:
        for client in clients:
            locks.enter_context(client._lock)
            poller.register(client._dealer.socket, zmq.POLLIN)
        timeout_ms = int(seconds * 1000) or (1 if seconds > 0 else 0)
        ready = dict(poller.poll(timeout_ms))
        for client in clients:
            if client.closed:
                continue
            if client._dealer.socket in ready:
                client._read_available()
            client._tick()
