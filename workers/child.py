"""One worker process of a pool: its own DEALER connection, a weighted pick among its queues,
and the handler called for one message at a time. A sync handler runs on the blocking Client
(`Child`); an `async def` one on the AsyncClient, in one event loop per process (`AsyncChild`).

It reports to the supervisor over a pipe (`("start", id, queue, timeout)` before each job,
`("done", id, outcome)` after) so the supervisor can enforce timeouts by killing it, and it
takes notes from the supervisor (`("note", id, reason)`: this message killed or outlasted a
worker) so that such a message is retried with backoff or dead-lettered with that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import inspect
import logging
import os
import select
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import msgspec

from ..client import (
    AsyncClient,
    AsyncReceivedMessage,
    Client,
    ClientError,
    QueueDeleted,
    ReceivedMessage,
)
from .outcome import Reject, Retry
from .slot import JobSlot

log = logging.getLogger("phpmq.worker")

#: Outcomes reported to the supervisor.
ACKED, RETRIED, DEAD = "acked", "retried", "dead"
#: Notes kept about messages that killed or outlasted a worker.
MAX_NOTES = 10_000
PR_SET_PDEATHSIG = 1
#: How long an orphaned worker may go on with its current job before it exits.
ORPHAN_GRACE_S = 2.0
#: While prefetched messages wait, the settles (acks, replies) of those done go out together,
#: one frame: when none waits any more, before a redelivery (it may be one that kills its
#: worker), or before the next job once the oldest settle's job began this long ago (so a job
#: that took this long is settled at once). A job that hangs meanwhile: the client's heartbeat
#: tick sends them; without heartbeats nothing is held.
SETTLES_WAIT_S = 0.001


class ChildSpec(msgspec.Struct, frozen=True, kw_only=True):
    broker: str
    handler: str
    queues: tuple[tuple[str, int], ...]
    #: Event patterns every queue is bound to by its consume (docs/protocol.md §6.5).
    bind: tuple[str, ...] = ()
    prefetch: int = 1
    timeout: float = 0.0
    max_retries: int = 3
    retry_delay: float = 1.0
    max_retry_delay: float = 300.0
    max_jobs: int = 0
    heartbeat_ms: int = 1000
    liveness: int = 3
    pool: str = "pool"
    index: int = 0


def load_handler(path: str) -> Callable[[ReceivedMessage], Any]:
    """`package.module:function` -> the function.

    Raises:
        ValueError: the path is malformed, or names nothing callable.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"handler must be 'module:function', got {path!r}")
    # The `phpmq` script's sys.path starts at its own bin directory, not where it was run:
    # put the current directory first, as gunicorn and celery do, so `tasks:run` finds
    # ./tasks.py. Spawned workers run this too (they start in the same directory).
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except (ImportError, TypeError, ValueError) as exc:  # TypeError: a relative name
        raise ValueError(f"cannot import {module_name!r}: {exc}") from None
    for part in attribute.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ValueError(f"{module_name!r} has no {attribute!r}")
    if not callable(target):
        raise ValueError(f"{path!r} is not callable")
    return target


def window_sizes(queues: tuple[tuple[str, int], ...], prefetch: int) -> dict[str, int]:
    """Each queue's share of the prefetch, by weight, and at least its weight: the picker can
    only honour weights among messages that are there to pick."""
    total = sum(weight for _, weight in queues)
    return {name: max(weight, round(prefetch * weight / total)) for name, weight in queues}


class WeightedPick:
    """Stride scheduling over the queues that have a message waiting: when every queue is
    busy, each gets a share of the jobs proportional to its weight (docs/workers.md)."""

    def __init__(self, queues: tuple[tuple[str, int], ...]) -> None:
        self.waiting: dict[str, deque[ReceivedMessage]] = {name: deque() for name, _ in queues}
        self._stride = {name: 1.0 / weight for name, weight in queues}
        self._pass = dict.fromkeys(self.waiting, 0.0)
        #: Messages waiting in all queues (asked before every job).
        self._count = 0

    def add(self, message: ReceivedMessage) -> None:
        self.waiting.setdefault(message.queue, deque()).append(message)
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def put_back(self, message: ReceivedMessage) -> None:
        """A picked message that will not run now: first of its queue again."""
        self.waiting.setdefault(message.queue, deque()).appendleft(message)
        self._count += 1

    def forget(self, queue: str) -> None:
        self._count -= len(self.waiting.pop(queue, ()))

    def drain(self) -> list[ReceivedMessage]:
        """Every waiting message, each queue's last-dispatched first (the order that hands
        them back to the head of their queue in their order); none wait after."""
        drained = [message for waiting in self.waiting.values() for message in reversed(waiting)]
        for waiting in self.waiting.values():
            waiting.clear()
        self._count = 0
        return drained

    def pick(self) -> ReceivedMessage | None:
        if not self._count:
            return None
        ready = [name for name, waiting in self.waiting.items() if waiting]
        passes = self._pass
        if len(ready) == 1:  # nothing to weigh it against
            name = ready[0]
            passes[name] += self._stride.get(name, 1.0)
        else:
            name = min(ready, key=passes.__getitem__)
            # A queue that was idle does not bank credit: it starts level with the busy ones.
            floor = min(passes[other] for other in ready)
            passes[name] = max(passes[name], floor) + self._stride.get(name, 1.0)
        self._count -= 1
        return self.waiting[name].popleft()


class Settlement(NamedTuple):
    """How a message ends: the outcome reported, and the message's settle method to call."""

    outcome: str
    method: str
    args: tuple[Any, ...] = ()


class ChildBase:
    """What a worker does whichever client drives it: read the supervisor, decide how each
    message ends. `Child` (sync handlers, the blocking Client) and `AsyncChild` (async
    handlers, the AsyncClient) move the messages."""

    #: The client this kind of worker consumes with.
    client_class: type[Client] | type[AsyncClient] = Client

    def __init__(
        self,
        spec: ChildSpec,
        conn: Connection,
        slot: JobSlot,
        notes: dict[str, tuple[int, str]],
        handler: Callable[[ReceivedMessage], Any],
    ) -> None:
        self.spec = spec
        self.conn = conn
        self.slot = slot
        #: message id -> (delivery count of the run that died, why it died)
        self.notes: dict[str, tuple[int, str]] = dict(notes)
        self.stopping = False
        self.handler = handler
        self.picker = WeightedPick(spec.queues)
        #: Whether the supervisor said something (or hung up): one poll object for the pipe,
        #: kept (the pipe's own `poll` makes a selector per call, twice per job).
        self._supervisor_said = select.poll()
        self._supervisor_said.register(conn.fileno(), select.POLLIN)
        #: Settles are held only where the client's heartbeat tick sends what a hung job
        #: holds back.
        self._hold_settles = spec.heartbeat_ms > 0
        #: When the job of the oldest settle not yet sent began (0.0: none is held).
        self._held_since = 0.0
        self._job_started = 0.0
        self.client = self.client_class(
            spec.broker,
            name=f"{spec.pool}/{spec.index}",
            role="worker",
            heartbeat_ms=spec.heartbeat_ms,
            liveness=spec.liveness,
        )

    def _read_supervisor(self) -> None:
        while self._supervisor_said.poll(0):
            command = self.conn.recv()
            if command[0] == "note":
                if len(self.notes) >= MAX_NOTES:
                    self.notes.pop(next(iter(self.notes)))
                self.notes[command[1]] = (command[2], command[3])
            elif command[0] == "stop":
                self.stopping = True

    def _stop_before(self, message: ReceivedMessage) -> bool:
        """Read the supervisor (a note about this very message, or a stop, may have come
        meanwhile); True if stopping: the message waits again, to go back unstarted."""
        self._read_supervisor()
        if self.stopping:
            self.picker.put_back(message)
        return self.stopping

    def _receive_now(self) -> bool:
        """Whether to read the client before the next job: nothing is waiting, or the held
        settles are due (SETTLES_WAIT_S): a receive that finds nothing sends them."""
        return (
            not self.picker
            or not self._hold_settles
            or (self._held_since != 0.0 and time.monotonic() - self._held_since >= SETTLES_WAIT_S)
        )

    def _settled(self) -> None:
        if self._held_since == 0.0:
            # (A settle made without running the handler is as old as the last job run.)
            self._held_since = self._job_started or time.monotonic()

    def _settlement_before(self, message: ReceivedMessage) -> Settlement | None:
        """The end of a message that must not run again, or None (then `_begin` it)."""
        note = self.notes.get(message.id)
        if note is not None and note[0] + 1 == message.delivery_count:
            # The redelivery right after this message killed or outlasted a worker: that run
            # was a failed attempt. Out of retries: dead-letter it with that reason; else
            # this delivery is the retry.
            failed_run, why = note
            if failed_run > self.spec.max_retries:
                return Settlement(DEAD, "dead_letter", (f"{why} (after {failed_run} deliveries)",))
        return None

    def _begin(self, message: ReceivedMessage) -> None:
        timeout = _message_timeout(message, self.spec.timeout)
        self._job_started = started = time.monotonic()
        self.slot.begin(
            message.id, message.delivery_count, started + timeout if timeout else 0.0, started
        )

    def _settlement_after(
        self, message: ReceivedMessage, failure: Exception | None, result: Any = None
    ) -> Settlement:
        """How a message ends after the handler returned `result` or raised `failure`. A
        request is answered: the result is the reply, an exception other than Retry and
        Reject an error reply (docs/workers.md "Replies")."""
        if message.wants_reply and not isinstance(failure, (Retry, Reject)):
            return _reply(message, failure, result)
        if failure is None:
            return Settlement(ACKED, "ack")
        if isinstance(failure, Reject):
            log.info("%s dead-lettered by the handler: %s", message.id, _reason(failure))
            return Settlement(DEAD, "dead_letter", (_reason(failure),))
        if isinstance(failure, Retry):
            return self._retry_or_bury(message, _reason(failure), failure.delay)
        log.warning(
            "%s failed (delivery %d): %s", message.id, message.delivery_count, _reason(failure)
        )
        return self._retry_or_bury(message, _reason(failure), None)

    def _retry_or_bury(
        self, message: ReceivedMessage, reason: str, delay: float | None
    ) -> Settlement:
        spec = self.spec
        if message.delivery_count > spec.max_retries:
            reason = f"{reason} (after {message.delivery_count} deliveries)"
            return Settlement(DEAD, "dead_letter", (reason,))
        if delay is None:
            delay = spec.retry_delay * 2 ** (message.delivery_count - 1)
        delay = min(max(delay, 0.0), spec.max_retry_delay)
        return Settlement(RETRIED, "requeue", (message.ttl, delay))


class Child(ChildBase):
    """A worker for a sync handler, on the blocking Client."""

    client: Client

    def run(self) -> str:
        """Work until stopped, recycled or orphaned; returns why it ended."""
        parent = os.getppid()
        for queue, window in window_sizes(self.spec.queues, self.spec.prefetch).items():
            self.client.subscribe(queue, window, bind=self.spec.bind)
        jobs = 0
        try:
            while not self.stopping:
                self._read_supervisor()
                if os.getppid() != parent:
                    return "supervisor gone"
                message = self._next_message()
                if message is None or not self._handle(message):
                    continue
                jobs += 1
                if self.spec.max_jobs and jobs >= self.spec.max_jobs:
                    return f"recycled after {jobs} jobs"
            return "stopped"
        except QueueDeleted as exc:
            self.picker.forget(exc.queue)
            return _queue_deleted(exc)
        finally:
            self._leave()

    def _next_message(self) -> ReceivedMessage | None:
        if self._receive_now():
            self._take_in(0 if len(self.picker) else 0.1)
        return self.picker.pick()

    def _take_in(self, timeout: float) -> None:
        """What the broker sent, into the picker; the receive that finds nothing sends the
        held settles."""
        message = self.client.receive(timeout=timeout)
        while message is not None:
            self.picker.add(message)
            message = self.client.receive(timeout=0)
        self._held_since = 0.0

    def _handle(self, message: ReceivedMessage) -> bool:
        """Run the message and settle it; False if a stop came first (it did not run)."""
        if self._stop_before(message):
            return False
        if message.delivery_count > 1 and self._held_since != 0.0:
            self._take_in(0)
        settlement = self._settlement_before(message)
        if settlement is None:
            self._begin(message)
            failure = result = None
            try:
                result = self.handler(message)
            except Exception as exc:
                failure = exc
            settlement = self._settlement_after(message, failure, result)
        getattr(message, settlement.method)(*settlement.args)
        self._settled()
        self.slot.end(settlement.outcome)
        return True

    def _leave(self) -> None:
        """Stop taking work and say goodbye: what was prefetched but not started goes back
        to the head of its queue at once, unstarted (its delivery count as it was)."""
        client = self.client
        with contextlib.suppress(ClientError):
            for queue in self.picker.waiting:
                client.subscribe(queue, 0)
            while (message := client.receive(timeout=0)) is not None:
                self.picker.add(message)
            for message in self.picker.drain():
                message.return_unstarted()
            client.flush()
        client.close()


class AsyncChild(ChildBase):
    """A worker for an `async def` handler, on the AsyncClient: the handler, the client's
    reads and its heartbeats share the process's one event loop."""

    client_class = AsyncClient
    client: AsyncClient

    async def run(self) -> str:
        """Work until stopped, recycled or orphaned; returns why it ended."""
        parent = os.getppid()
        jobs = 0
        try:
            for queue, window in window_sizes(self.spec.queues, self.spec.prefetch).items():
                await self.client.subscribe(queue, window, bind=self.spec.bind)
            while not self.stopping:
                self._read_supervisor()
                if os.getppid() != parent:
                    return "supervisor gone"
                message = await self._next_message()
                if message is None or not await self._handle(message):
                    continue
                jobs += 1
                if self.spec.max_jobs and jobs >= self.spec.max_jobs:
                    return f"recycled after {jobs} jobs"
            return "stopped"
        except QueueDeleted as exc:
            self.picker.forget(exc.queue)
            return _queue_deleted(exc)
        finally:
            await self._leave()

    async def _next_message(self) -> AsyncReceivedMessage | None:
        if self._receive_now():
            await self._take_in(0 if len(self.picker) else 0.1)
        return self.picker.pick()  # type: ignore[return-value]

    async def _take_in(self, timeout: float) -> None:
        """As `Child._take_in`."""
        message = await self.client.receive(timeout=timeout)
        while message is not None:
            self.picker.add(message)
            message = await self.client.receive(timeout=0)
        self._held_since = 0.0

    async def _handle(self, message: AsyncReceivedMessage) -> bool:
        """Run the message and settle it; False if a stop came first (it did not run)."""
        if self._stop_before(message):
            return False
        if message.delivery_count > 1 and self._held_since != 0.0:
            await self._take_in(0)
        settlement = self._settlement_before(message)
        if settlement is None:
            self._begin(message)
            failure = result = None
            try:
                result = await self.handler(message)
            except Exception as exc:
                failure = exc
            settlement = self._settlement_after(message, failure, result)
        await getattr(message, settlement.method)(*settlement.args)
        self._settled()
        self.slot.end(settlement.outcome)
        return True

    async def _leave(self) -> None:
        """As `Child._leave`: prefetched messages go back unstarted, then goodbye."""
        client = self.client
        with contextlib.suppress(ClientError):
            for queue in self.picker.waiting:
                await client.subscribe(queue, 0)
            while (message := await client.receive(timeout=0)) is not None:
                self.picker.add(message)
            for message in self.picker.drain():
                await message.return_unstarted()  # type: ignore[misc]
            await client.flush()
        await client.close()


def _reply(message: ReceivedMessage, failure: Exception | None, result: Any) -> Settlement:
    """The REPLY that answers a request: the handler's result as bytes, or the exception."""
    if failure is None:
        try:
            return Settlement(ACKED, "reply", (reply_body(result, message.headers),))
        except (TypeError, msgspec.EncodeError) as exc:
            failure = exc
    log.warning("%s failed, error reply sent: %s", message.id, _reason(failure))
    return Settlement(ACKED, "reply", (b"", f"{type(failure).__name__}: {failure}"))


def reply_body(result: Any, headers: dict[str, Any]) -> bytes:
    """A handler's return value as reply bytes: bytes as they are, str as UTF-8, None as
    nothing, anything else as JSON, or msgpack when the request's headers say
    `"reply_format": "msgpack"`.

    Raises:
        TypeError, msgspec.EncodeError: the value cannot be encoded.
    """
    if result is None:
        return b""
    if isinstance(result, bytes):
        return result
    if isinstance(result, str):
        return result.encode()
    if headers.get("reply_format") == "msgpack":
        return msgspec.msgpack.encode(result)
    return msgspec.json.encode(result)


def _queue_deleted(exc: QueueDeleted) -> str:
    """A consumed queue was deleted: this worker ends (its prefetched messages go back) and
    the supervisor starts another, whose consumes make the queue again, bound as before."""
    log.warning("%s: this worker starts over", exc)
    return f"queue {exc.queue} deleted"


def _message_timeout(message: ReceivedMessage, default: float) -> float:
    value = message.headers.get("timeout")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return default


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def make_child(
    spec: ChildSpec, conn: Connection, slot: JobSlot, notes: dict[str, tuple[int, str]]
) -> Child | AsyncChild:
    """The worker for the spec's handler: an `async def` one gets the AsyncClient.

    Raises:
        ValueError: the handler cannot be loaded.
        ClientError: the broker address is unusable.
    """
    handler = load_handler(spec.handler)
    if inspect.iscoroutinefunction(handler):
        return AsyncChild(spec, conn, slot, notes, handler)
    return Child(spec, conn, slot, notes, handler)


def child_main(
    spec: ChildSpec,
    conn: Connection,
    slot: JobSlot,
    notes: dict[str, tuple[int, str]],
    log_json: bool,
) -> None:
    """Entry point of a worker process (multiprocessing, spawn)."""
    from .logs import configure_logging

    configure_logging(log_json, f"{spec.pool}/{spec.index}")
    _die_with_parent()
    stop = {"flag": False}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides; Ctrl-C reaches us too
    try:
        child = make_child(spec, conn, slot, notes)
    except (ValueError, ClientError) as exc:
        log.error("cannot start: %s", exc)
        _tell(conn, ("fatal", str(exc)))
        raise SystemExit(3) from None

    supervisor = os.getppid()

    def on_term(*_: object) -> None:
        stop["flag"] = True
        child.stopping = True
        if os.getppid() != supervisor:
            # Orphaned (the supervisor was killed): finish the job briefly, then go; nobody
            # is left to enforce its timeout, and no worker may outlive its pool.
            threading.Timer(ORPHAN_GRACE_S, os._exit, (1,)).start()

    signal.signal(signal.SIGTERM, on_term)
    _tell(conn, ("ready", os.getpid()))
    why = child.run() if isinstance(child, Child) else asyncio.run(child.run())
    _tell(conn, ("exit", why))
    log.debug("worker exits: %s", why)


def _tell(conn: Connection, event: tuple) -> None:
    """A word to the supervisor, who may be gone (then there is no one to tell)."""
    with contextlib.suppress(OSError):
        conn.send(event)


def _die_with_parent() -> None:
    """Linux: get SIGTERM when the supervisor dies, even by kill -9 (no orphans)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
