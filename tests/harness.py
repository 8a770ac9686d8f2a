"""Test helpers shared by the suite: a core driven by a fake clock, and a real broker process.

Import them from test modules (`from harness import CoreHarness`); pytest puts tests/ on the
path.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

import phpmq.protocol as p
from phpmq.broker.clock import FakeClock
from phpmq.broker.config import BrokerConfig
from phpmq.broker.core import Core
from phpmq.broker.journal import Journal
from phpmq.client import Client

REPO = Path(__file__).resolve().parent.parent


class CoreHarness:
    """A Core with a FakeClock; `frame()` runs one loop turn and returns what it sent,
    decoded, per peer."""

    def __init__(
        self, ttl_form_default: bool = True, durable: bool = False, **config: object
    ) -> None:
        self.clock = FakeClock()
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class BrokerProcess:
    """A `phpmq broker` subprocess on a free loopback port, with its log captured to a file."""

    def __init__(self, log_path: Path, *args: str, address: str | None = None) -> None:
        self.address = address or f"tcp://127.0.0.1:{free_port()}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "phpmq", "broker", "--bind", self.address, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        self.wait_ready()

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited at start-up:\n{self.log()}")
            with Client(self.address, send_timeout=1, close_timeout=0.2) as client:
                try:
                    client.admin("stats", timeout=0.5)
                    return
                except Exception:
                    time.sleep(0.05)
        raise RuntimeError(f"broker did not answer within {timeout}s:\n{self.log()}")

    def client(self, **kwargs: object) -> Client:
        return Client(self.address, **kwargs)  # type: ignore[arg-type]

    def stats(self) -> dict:
        with self.client(close_timeout=1) as client:
            return client.admin("stats")

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 20.0) -> int:
        return self.process.wait(timeout)

    def wait_draining(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.stats()["draining"]:
            if time.monotonic() > deadline:
                raise AssertionError("the broker did not start draining")
            time.sleep(0.02)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


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


def nothing_received(sock: zmq.Socket, wait: float = 0.3) -> bool:
    return not sock.poll(int(wait * 1000))
