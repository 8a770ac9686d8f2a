"""A real broker for tests and benchmarks: `phpmq broker` in a subprocess on a free port.

    from phpmq import Client
    from phpmq.testing import BrokerProcess

    def test_orders_are_queued(tmp_path):
        with BrokerProcess("--max-window", "100", log_path=tmp_path / "broker.log") as broker:
            with Client(broker.address) as client:
                client.send("orders", b"order 17")
            assert broker.stats()["queues"]["orders"]["ready"] == 1

The broker is this Python's `python -m phpmq broker`, bound to a free loopback port (found by
binding port 0) and is returned only once it answers a stats request. Its stdout and stderr go
to `log_path` (by default a temporary file, read back into memory and removed when the broker
stops), and a broker that exits at start-up or does not answer raises BrokerStartError with
its log. Leaving the `with` block stops it: SIGTERM, then SIGKILL after `stop_timeout`.
Needs no test framework.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from .client import Client, ClientError, Curve

__all__ = ["BrokerProcess", "BrokerStartError", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS's pick for port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> str:
    """A loopback address whose port and the `count - 1` after it are all free (for a
    sharded broker: shard i binds port + i)."""
    while True:
        port = free_port()
        try:
            for offset in range(1, count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + offset))
            return f"tcp://127.0.0.1:{port}"
        except OSError:
            continue


class BrokerStartError(RuntimeError):
    """Raised when the broker exits during start-up or does not answer in time; the message
    ends with the broker's log (for a bad flag: its one-line error)."""


class BrokerProcess:
    """A `phpmq broker` subprocess on a free loopback port, answering when constructed.

    Args:
        *flags: more `phpmq broker` flags, e.g. "--grace-seconds", "0".
        log_path: file for the broker's stdout and stderr; default: a temporary file.
        address: the ZeroMQ address to bind; default: tcp://127.0.0.1 on a free port.
        tcp: also listen for stock PHPMQ clients on plain TCP (`--tcp-bind`) on a free port:
            see `tcp_port` and `tcp_address`.
        data_dir: keep messages in this directory (`--data-dir`); default: in memory.
        start_timeout: seconds the broker has to answer a stats request.
        curve: keys for a broker started with `--curve-secret` (its readiness check and
            `client()` use them).
        stop_timeout: seconds `stop()` waits after SIGTERM before it kills.

    Raises:
        BrokerStartError: the broker exited at start-up or did not answer in time (it is
            killed, and the error carries its log).
    """

    def __init__(
        self,
        *flags: str,
        log_path: str | Path | None = None,
        address: str | None = None,
        tcp: bool = False,
        data_dir: str | Path | None = None,
        start_timeout: float = 20.0,
        stop_timeout: float = 10.0,
        curve: Curve | None = None,
    ) -> None:
        self.address = address or f"tcp://127.0.0.1:{free_port()}"
        self.curve = curve
        self.tcp_port = free_port() if tcp else None
        self.tcp_address = f"tcp://127.0.0.1:{self.tcp_port}" if tcp else None
        self.stop_timeout = stop_timeout
        self._temporary_log = log_path is None
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="phpmq-broker-", suffix=".log")
            os.close(handle)
            log_path = name
        self.log_path = Path(log_path)
        self._final_log: str | None = None
        command = [sys.executable, "-m", "phpmq", "broker", "--bind", self.address]
        if self.tcp_address is not None:
            command += ["--tcp-bind", self.tcp_address]
        if data_dir is not None:
            command += ["--data-dir", str(data_dir)]
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [*command, *flags], stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self._wait_until_answering(start_timeout)
        except BaseException:
            self.kill()
            raise

    def _wait_until_answering(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise BrokerStartError(
                    f"the broker exited at start-up (status {code}); its log:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"the broker did not answer within {timeout}s; its log:\n{self.log()}"
                )
            with Client(
                self.address,
                name="phpmq-testing",
                send_timeout=1,
                close_timeout=0.2,
                curve=self.curve,
            ) as client:
                try:
                    client.admin("stats", timeout=0.5)
                    return
                except ClientError:
                    pass
            time.sleep(0.05)

    def client(self, **options: Any) -> Client:
        """A new client of this broker; `options` are Client's keyword arguments."""
        return Client(self.address, **{"curve": self.curve, **options})

    def stats(self) -> dict[str, Any]:
        """The broker's `stats` answer, through a client opened for this call."""
        with self.client(name="phpmq-testing", close_timeout=1) as client:
            return client.admin("stats")

    def wait_draining(self, timeout: float = 5.0) -> None:
        """Wait until the broker reports that it is draining (after a first SIGTERM)."""
        deadline = time.monotonic() + timeout
        while not self.stats()["draining"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the broker did not start draining within {timeout}s")
            time.sleep(0.02)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 20.0) -> int:
        """Wait for the broker to exit by itself; its exit status."""
        return self.process.wait(timeout)

    def log(self) -> str:
        """Everything the broker wrote so far."""
        if self._final_log is not None:
            return self._final_log
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM (the broker drains), SIGKILL after `stop_timeout`; its exit status.

        Stopping a stopped broker does nothing more."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._forget_temporary_log()
        return self.process.returncode

    def kill(self) -> int:
        """SIGKILL, as a crash: no drain, nothing flushed; its exit status."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._forget_temporary_log()
        return self.process.returncode

    def _forget_temporary_log(self) -> None:
        if self._temporary_log and self._final_log is None:
            self._final_log = self.log_path.read_text(errors="replace")
            self.log_path.unlink()

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<BrokerProcess {self.address} pid={self.process.pid}>"
