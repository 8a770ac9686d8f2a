"""The pool supervisor: N worker processes over a set of queues, kept at N.

    phpmq workers myapp.tasks:send_email --queue emails --processes 8

The supervisor holds no broker connection of its own: each worker has its own DEALER and
settles its own messages, so a dead worker's messages are redelivered by the broker's
liveness. What the supervisor adds: timeouts that really stop a job (it kills the worker and
starts another), recycling (--max-jobs-per-child, --max-memory-mb), restart with backoff when
workers crash, graceful shutdown (SIGTERM/SIGINT; a second signal kills), code reload
(SIGHUP: workers replaced one by one), and a periodic summary line.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

import msgspec

from .child import ChildSpec, child_main
from .slot import ACKED, DEAD, DEADLINE, DELIVERIES, MESSAGE_ID, RETRIED, STARTED, JobSlot

log = logging.getLogger("phpmq.pool")

#: How often the supervisor looks at its workers (timeouts are enforced this precisely).
TICK_S = 0.05
#: Restart delays for workers that keep crashing: 0.1 s doubling to 10 s.
RESTART_FIRST_S = 0.1
RESTART_MAX_S = 10.0
#: A worker that lived this long resets the crash backoff.
STABLE_AFTER_S = 10.0
MEMORY_CHECK_S = 1.0
#: Notes about messages that killed a worker, kept for workers started later.
MAX_NOTES = 10_000


class PoolSpec(msgspec.Struct, frozen=True, kw_only=True):
    child: ChildSpec
    processes: int = 1
    max_memory_mb: int = 0
    grace_seconds: float = 30.0
    summary_seconds: float = 10.0
    log_json: bool = False


@dataclass
class Worker:
    index: int
    process: BaseProcess
    conn: Connection
    slot: JobSlot
    started: float
    #: (message id, delivery count, deadline or 0, started at) of the job it runs now.
    job: tuple[str, int, float, float] | None = None
    #: Outcome counts (acked, retried, dead) as last read from its slot.
    seen: tuple[int, int, int] = (0, 0, 0)
    stopping: bool = False
    killed_for: str = ""


@dataclass
class Counters:
    done: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    timeouts: int = 0
    crashes: int = 0
    recycled: int = 0
    restarts: int = 0
    rate_window: deque[tuple[float, int]] = field(default_factory=deque)


class Pool:
    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.counters = Counters()
        self.workers: dict[int, Worker] = {}
        self.notes: dict[str, tuple[int, str]] = {}
        self._context = mp.get_context("spawn")
        self._signals: list[int] = []
        self._restart_delay = RESTART_FIRST_S
        self._restart_at: dict[int, float] = {}
        self._reload_queue: list[int] = []
        self._next_memory_check = 0.0
        self._next_summary = 0.0
        #: The signal that asked for the graceful stop (None: none yet).
        self.stopped_by: int | None = None

    # ------------------------------------------------------------------ running

    def run(self) -> int:
        """Supervise until stopped. Returns the exit status: 0 after a graceful stop."""
        self._install_signals()
        queues = ", ".join(f"{name} (weight {weight})" for name, weight in self.spec.child.queues)
        log.info(
            "pool %s: %d workers running %s on %s from %s",
            self.spec.child.pool,
            self.spec.processes,
            self.spec.child.handler,
            queues,
            self.spec.child.broker,
        )
        for index in range(self.spec.processes):
            self._start(index)
        self._next_summary = time.monotonic() + self.spec.summary_seconds
        while True:
            if self._signals:
                status = self._on_signals()
                if status is not None:
                    return status
            self._tick()

    def _tick(self) -> None:
        conns = [worker.conn for worker in self.workers.values()]
        ready = wait(conns, timeout=TICK_S) if conns else time.sleep(TICK_S)
        now = time.monotonic()
        for conn in ready or ():
            self._read(conn, now)
        for worker in self.workers.values():
            self._read_slot(worker)
        self._enforce_timeouts(now)
        self._reap(now)
        self._restart_due(now)
        if now >= self._next_memory_check and self.spec.max_memory_mb:
            self._check_memory()
            self._next_memory_check = now + MEMORY_CHECK_S
        if self._reload_queue:
            self._continue_reload()
        if now >= self._next_summary:
            self._summary(now)
            self._next_summary = now + self.spec.summary_seconds

    # ------------------------------------------------------------------ workers

    def _start(self, index: int) -> None:
        parent_conn, child_conn = self._context.Pipe()
        child = msgspec.structs.replace(self.spec.child, index=index)
        slot = JobSlot(self._context)
        process = self._context.Process(
            target=child_main,
            args=(child, child_conn, slot, dict(self.notes), self.spec.log_json),
            name=f"{self.spec.child.pool}/{index}",
        )
        process.start()
        child_conn.close()
        self.workers[index] = Worker(index, process, parent_conn, slot, time.monotonic())

    def _read(self, conn: Connection, now: float) -> None:
        worker = next((w for w in self.workers.values() if w.conn is conn), None)
        if worker is None:
            return
        try:
            while conn.poll():
                self._on_event(worker, conn.recv(), now)
        except (EOFError, OSError):
            pass  # it died; _reap deals with it

    def _read_slot(self, worker: Worker) -> None:
        record = worker.slot.read()
        message_id = record[MESSAGE_ID].rstrip(b"\0").decode()
        worker.job = (
            (message_id, record[DELIVERIES], record[DEADLINE], record[STARTED])
            if message_id
            else None
        )
        seen = (record[ACKED], record[RETRIED], record[DEAD])
        acked, retried, dead = (new - old for new, old in zip(seen, worker.seen, strict=True))
        worker.seen = seen
        counters = self.counters
        counters.done += acked
        counters.retried += retried
        counters.dead += dead
        counters.failed += retried + dead

    def _on_event(self, worker: Worker, event: tuple, now: float) -> None:
        kind = event[0]
        if kind == "fatal":
            log.error("worker %d cannot start: %s", worker.index, event[1])
        elif kind == "exit":
            log.debug("worker %d exits: %s", worker.index, event[1])
            if str(event[1]).startswith("recycled"):
                self.counters.recycled += 1

    def _enforce_timeouts(self, now: float) -> None:
        for worker in self.workers.values():
            job = worker.job
            if job is None or not job[2] or now < job[2] or worker.killed_for:
                continue
            message_id, _, deadline, started = job
            worker.killed_for = f"timeout after {deadline - started:g}s"
            self.counters.timeouts += 1
            log.warning(
                "worker %d: job %s ran past its timeout (%.1fs): killing the worker",
                worker.index,
                message_id,
                deadline - started,
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, signal.SIGKILL)  # type: ignore[arg-type]

    def _reap(self, now: float) -> None:
        for index, worker in list(self.workers.items()):
            if worker.process.exitcode is None:
                continue
            self._read(worker.conn, now)  # its last words
            self._read_slot(worker)  # what it ran when it died, and its last outcomes
            worker.conn.close()
            del self.workers[index]
            self._after_exit(worker, now)

    def _after_exit(self, worker: Worker, now: float) -> None:
        code = worker.process.exitcode
        if worker.job is not None:
            message_id, deliveries, _, _ = worker.job
            why = worker.killed_for or f"worker died ({_describe_exit(code)}) while running it"
            self._note(message_id, deliveries, why)
            if not worker.killed_for:
                self.counters.crashes += 1
            log.warning(
                "worker %d died running %s (%s): the broker redelivers it; retry policy applies",
                worker.index,
                message_id,
                why,
            )
        elif code not in (0, None) and not worker.stopping:
            self.counters.crashes += 1
            log.warning("worker %d exited unexpectedly (%s)", worker.index, _describe_exit(code))
        if self._stopping:
            return
        crashed = code != 0 and not worker.killed_for and not worker.stopping
        if crashed and now - worker.started < STABLE_AFTER_S:
            delay = self._restart_delay
            self._restart_delay = min(self._restart_delay * 2, RESTART_MAX_S)
        else:
            delay = 0.0
            if now - worker.started >= STABLE_AFTER_S:
                self._restart_delay = RESTART_FIRST_S
        self._restart_at[worker.index] = now + delay

    def _restart_due(self, now: float) -> None:
        for index, when in list(self._restart_at.items()):
            if now >= when and not self._stopping:
                del self._restart_at[index]
                self.counters.restarts += 1
                self._start(index)

    def _note(self, message_id: str, deliveries: int, why: str) -> None:
        """Tell every worker (and those started later) why this message's run ended."""
        if len(self.notes) >= MAX_NOTES:
            self.notes.pop(next(iter(self.notes)))
        self.notes[message_id] = (deliveries, why)
        for worker in self.workers.values():
            with contextlib.suppress(OSError):
                worker.conn.send(("note", message_id, deliveries, why))

    def _check_memory(self) -> None:
        limit_kb = self.spec.max_memory_mb * 1024
        for worker in self.workers.values():
            rss_kb = _rss_kb(worker.process.pid)
            if rss_kb > limit_kb and not worker.stopping:
                log.info(
                    "worker %d uses %d MiB (limit %d): recycling it after its current job",
                    worker.index,
                    rss_kb // 1024,
                    self.spec.max_memory_mb,
                )
                self.counters.recycled += 1
                self._stop_worker(worker)

    def _stop_worker(self, worker: Worker) -> None:
        worker.stopping = True
        with contextlib.suppress(OSError):
            worker.conn.send(("stop",))

    # ------------------------------------------------------------------ signals

    @property
    def _stopping(self) -> bool:
        return getattr(self, "_stop_deadline", None) is not None

    def _install_signals(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda signum, _frame: self._signals.append(signum))

    def _on_signals(self) -> int | None:
        signals, self._signals = self._signals, []
        for signum in signals:
            if signum == signal.SIGHUP:
                log.info("SIGHUP: replacing workers one by one with freshly imported code")
                self._reload_queue = sorted(self.workers)
                continue
            if self._stopping:
                log.warning("second stop signal: killing the workers now")
                self._kill_all()
                return 1
            log.info(
                "stopping: workers finish their current job (up to %.0fs), then exit",
                self.spec.grace_seconds,
            )
            self.stopped_by = signum
            self._stop_deadline = time.monotonic() + self.spec.grace_seconds
            self._restart_at.clear()
            for worker in self.workers.values():
                self._stop_worker(worker)
        if self._stopping:
            return self._finish_stop()
        return None

    def _finish_stop(self) -> int:
        while self.workers:
            if self._signals:
                status = self._on_signals()
                if status is not None:
                    return status
            if time.monotonic() >= self._stop_deadline:
                log.warning("grace period over: killing %d workers", len(self.workers))
                self._kill_all()
                return 1
            self._tick()
        self._summary(time.monotonic())
        log.info("pool stopped")
        return 0

    def _kill_all(self) -> None:
        for worker in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, signal.SIGKILL)  # type: ignore[arg-type]
        for worker in self.workers.values():
            worker.process.join(5)

    def _continue_reload(self) -> None:
        """One worker at a time: stop it (it finishes its job), then its slot restarts."""
        if any(worker.stopping for worker in self.workers.values()) or self._restart_at:
            return
        index = self._reload_queue.pop(0)
        worker = self.workers.get(index)
        if worker is not None:
            self._stop_worker(worker)

    # ------------------------------------------------------------------ reporting

    def _summary(self, now: float) -> None:
        c = self.counters
        c.rate_window.append((now, c.done))
        while len(c.rate_window) > 2 and now - c.rate_window[0][0] > 60:
            c.rate_window.popleft()
        then, done_then = c.rate_window[0]
        rate = (c.done - done_then) / (now - then) if now > then else 0.0
        running = sum(1 for worker in self.workers.values() if worker.job is not None)
        fields = {
            "done": c.done,
            "failed": c.failed,
            "retried": c.retried,
            "dead_lettered": c.dead,
            "timeouts": c.timeouts,
            "crashes": c.crashes,
            "recycled": c.recycled,
            "running": running,
            "workers": len(self.workers),
            "rate_per_s": round(rate, 1),
        }
        log.info(
            "done %d, failed %d (retried %d, dead-lettered %d), timeouts %d, crashes %d,"
            " recycled %d; running %d/%d; %.1f jobs/s",
            c.done,
            c.failed,
            c.retried,
            c.dead,
            c.timeouts,
            c.crashes,
            c.recycled,
            running,
            len(self.workers),
            rate,
            extra={"fields": fields},
        )


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _rss_kb(pid: int | None) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0
