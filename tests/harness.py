"""Test helpers shared by the suite: a core driven by a fake clock, a real broker process
(phpmq.testing's), raw DEALER sockets.

Import them from test modules (`from harness import CoreHarness`); pytest puts tests/ on the
path.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import zmq

import phpmq.protocol as p
from phpmq import testing
from phpmq.broker.clock import FakeClock
from phpmq.broker.config import BrokerConfig
from phpmq.broker.core import Core
from phpmq.broker.journal import Journal
from phpmq.testing import free_port as free_port

REPO = Path(__file__).resolve().parent.parent


class CoreHarness:
    """A Core with a FakeClock; `frame()` runs one loop turn and returns what it sent,
    decoded, per peer."""

    def __init__(
        self,
        ttl_form_default: bool = True,
        durable: bool = False,
        clock: FakeClock | None = None,
        **config: object,
    ) -> None:
        self.clock = clock or FakeClock()
        config.setdefault("dialect", "ttl" if ttl_form_default else "pre-ttl")
        journal = Journal() if durable else None
        self.core = Core(BrokerConfig(**config), self.clock, journal=journal)

    def turn(self, *inputs: tuple[bytes, bytes | p.Message | list[p.Message]]) -> dict[bytes, list]:
        """Feed (peer, frame-or-messages) pairs in one turn; return decoded output per peer."""
        self.core.begin_turn()
        for peer, data in inputs:
            self.core.handle_frame(peer, _as_frame(data))
        out: dict[bytes, list] = {}
        for peer, frame in self.core.end_turn().frames:
            messages, error = p.decode_frame(frame)
            assert error is None, f"the core sent an undecodable frame: {error}"
            out.setdefault(peer, []).extend(messages)
        return out

    def send(self, peer: bytes, *messages: p.Message) -> list:
        """One turn with messages from one peer; what that peer received."""
        return self.turn((peer, list(messages))).get(peer, [])

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def stats(self, queue: str) -> dict:
        queue_record = self.core.queues[queue]
        return {
            "ready": queue_record.ready_count,
            "in_flight": queue_record.in_flight,
            "dead": len(queue_record.dead),
        }


def _as_frame(data: bytes | p.Message | list[p.Message]) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, list):
        return p.encode_all(data)
    return p.encode(data)


def dispatches(messages: list) -> list[p.Dispatch]:
    return [m for m in messages if isinstance(m, p.Dispatch)]


def errors(messages: list) -> list[p.Error]:
    return [m for m in messages if isinstance(m, p.Error)]


# --------------------------------------------------------------------------- real processes


class BrokerProcess(testing.BrokerProcess):
    """phpmq.testing's broker called the suite's way: the log file first, then the flags."""

    def __init__(self, log_path: Path, *flags: str, **options: Any) -> None:
        super().__init__(*flags, log_path=log_path, **options)


@contextmanager
def raw_dealer(address: str, identity: bytes | None = None) -> Iterator[zmq.Socket]:
    """A bare DEALER socket, as a client that speaks PHPMQ bytes by hand would use."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    if identity is not None:
        sock.identity = identity
    sock.connect(address)
    try:
        yield sock
    finally:
        sock.close(linger=0)


def recv_messages(sock: zmq.Socket, timeout: float = 5.0) -> list:
    """Decode the next frame the socket receives; fail instead of hanging."""
    if not sock.poll(int(timeout * 1000)):
        raise AssertionError(f"nothing received within {timeout}s")
    messages, error = p.decode_frame(sock.recv())
    assert error is None, error
    return messages


def phpmq(
    *args: str, stdin: str | None = None, timeout: float = 30, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The `phpmq` command line, run to its end in the repository (with `env`, if given)."""
    return subprocess.run(
        [sys.executable, "-m", "phpmq", *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def nothing_received(sock: zmq.Socket, wait: float = 0.3) -> bool:
    return not sock.poll(int(wait * 1000))
