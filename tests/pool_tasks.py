"""Handlers run by the worker pools of tests/test_pool.py (`pool_tasks:NAME`).

Each appends one JSON line per call to the file named by POOL_OUT: the event, the worker's
pid and parent pid, the message's id, queue, content and delivery count. The file is opened
in append mode for every line, so lines of concurrent workers do not interleave.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import time
from typing import Any

from phpmq.workers import ReceivedMessage, Reject, Retry

#: What the leaking handler keeps alive for the life of its worker.
_leaked: list[bytes] = []
LEAK_BYTES = 20 * 1024 * 1024


def _record(message: ReceivedMessage, event: str = "handled", **extra: Any) -> None:
    line = {
        "event": event,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "id": message.id,
        "queue": message.queue,
        "content": message.content.decode(),
        "delivery": message.delivery_count,
        "time": time.time(),
        **extra,
    }
    with open(os.environ["POOL_OUT"], "a") as out:
        out.write(json.dumps(line) + "\n")


def _sleep_seconds() -> float:
    return float(os.environ.get("POOL_SLEEP", "0.3"))


def record(message: ReceivedMessage) -> None:
    """Record and ack."""
    _record(message)


def outcomes(message: ReceivedMessage) -> None:
    """By content: 'fail...' always raises ValueError, 'retry...' asks for a retry on its
    first delivery, 'reject...' rejects; anything else acks."""
    _record(message)
    content = message.content.decode()
    if content.startswith("fail"):
        raise ValueError(f"cannot handle {content}")
    if content.startswith("retry") and message.delivery_count == 1:
        raise Retry("not yet", delay=0.1)
    if content.startswith("reject"):
        raise Reject(f"{content} is unwanted")


def spin(message: ReceivedMessage) -> None:
    """Never returns, and never gives the interpreter a chance to stop politely."""
    _record(message, "start")
    while True:
        pass


def abort(message: ReceivedMessage) -> None:
    """Die by SIGABRT, as a segfaulting C extension would (no core file)."""
    _record(message, "start")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.abort()


def die_mid_publish(message: ReceivedMessage) -> None:
    """On the first delivery, die as a worker killed (OOM killer, kill -9) in the middle of
    writing its job slot would: the slot's sequence number left odd. Later deliveries ack."""
    if message.delivery_count > 1:
        _record(message)
        return
    _record(message, "start")
    import gc

    from phpmq.workers.slot import _SEQ, SEQ, JobSlot

    slot = next(o for o in gc.get_objects() if isinstance(o, JobSlot))
    _SEQ.pack_into(memoryview(slot._memory).cast("B"), 0, slot._record[SEQ] + 1)
    os.kill(os.getpid(), signal.SIGKILL)


def leak(message: ReceivedMessage) -> None:
    """Keep 20 MB (really touched, so it counts in RSS) for every message handled."""
    _leaked.append(b"\x01" * LEAK_BYTES)
    time.sleep(_sleep_seconds())
    _record(message, rss_mb=_rss_mb())


def slow(message: ReceivedMessage) -> None:
    """Record a start, sleep POOL_SLEEP seconds, record an end."""
    _record(message, "start")
    time.sleep(_sleep_seconds())
    _record(message, "end")


def paced(message: ReceivedMessage) -> None:
    """Record, then take a few milliseconds (so the broker refills every window)."""
    _record(message)
    time.sleep(0.005)


async def async_record(message: ReceivedMessage) -> None:
    """An async handler: awaits, then records."""
    await asyncio.sleep(0.01)
    _record(
        message,
        loop=type(asyncio.get_running_loop()).__name__,
        message_type=type(message).__name__,
    )


async def async_answer(message: ReceivedMessage) -> str:
    """`answer`'s plain case as an async handler that awaits once, without recording."""
    await asyncio.sleep(0)
    return message.content.decode().upper()


async def async_slow(message: ReceivedMessage) -> None:
    """`slow` as an async handler: the worker's event loop runs while it sleeps."""
    _record(message, "start")
    await asyncio.sleep(_sleep_seconds())
    _record(message, "end")


async def async_outcomes(message: ReceivedMessage) -> None:
    """`outcomes` as an async handler."""
    await asyncio.sleep(0)
    outcomes(message)


def _rss_mb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def answer(message: ReceivedMessage) -> Any:
    """Answers requests (tests/test_requests.py), by content: 'fail...' raises ValueError,
    'sleep...' records a start and sleeps POOL_SLEEP seconds, 'json...' returns a dict;
    anything else is returned upper-cased (str), after recording the call."""
    content = message.content.decode()
    _record(message, reply_to=message.reply_to, correlation=message.correlation)
    if content.startswith("fail"):
        raise ValueError(f"cannot answer {content}")
    if content.startswith("sleep"):
        time.sleep(_sleep_seconds())
    if content.startswith("json"):
        return {"echo": content, "pid": os.getpid()}
    return content.upper()
