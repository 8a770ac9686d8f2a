"""What every bridge shares: a broker client, counters, a periodic log line (also reported to
the broker, so `phpmq stats` lists the bridge), and a graceful stop on SIGTERM/SIGINT.

A bridge is an ordinary client of the broker in a process of its own: it owns one ZeroMQ
socket facing the existing tool and one `workers.Client` facing the broker.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterable

import zmq

from ..client import BrokerRefused, Client, ClientError
from ..protocol import admin_commands as cmd

log = logging.getLogger("phpmq.bridge")

#: How long a bridge waits in one poll before it looks at its stop flag and timers.
POLL_MS = 100


class Bridge:
    """Subclasses implement `step()`: do one bounded piece of work, return when idle."""

    kind = "bridge"

    def __init__(
        self, broker: str, name: str, report_seconds: float, counter_names: Iterable[str]
    ) -> None:
        self.context = zmq.Context.instance()
        self.client = Client(broker, name=name, role="bridge")
        self.name = name
        self.counters = dict.fromkeys(counter_names, 0)
        self.report_seconds = report_seconds
        #: The socket facing the tool, closed with the bridge (subclasses set it).
        self.sock: zmq.Socket | None = None
        self._stop = threading.Event()
        self._next_report = time.monotonic() + report_seconds

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stop())

    def run(self) -> int:
        log.info("%s bridge %s started", self.kind, self.name)
        try:
            while not self.stopping:
                self.step()
                if time.monotonic() >= self._next_report:
                    self.report()
            return 0
        finally:
            self.close()
            self.report()
            log.info("%s bridge %s stopped", self.kind, self.name)

    def step(self) -> None:
        raise NotImplementedError

    def report(self) -> None:
        self._next_report = time.monotonic() + self.report_seconds
        # Refusals (full queue, draining, storage down) arrive as ERRORs: without publisher
        # confirms they are counted here, not retried; a flush collects those come back.
        if not self.client.closed:
            try:
                self.client.flush()
            except BrokerRefused as refused:
                self.refused_by_broker(refused)
            except ClientError as exc:
                log.debug("could not flush: %s", exc)
        self.counters["broker_errors"] = self.client.error_count
        log.info(
            "%s %s: %s",
            self.kind,
            self.name,
            ", ".join(f"{key} {value}" for key, value in self.counters.items()),
        )
        if self.client.closed:
            return
        try:
            self.client.admin(cmd.REPORT, timeout=1.0, kind=self.kind, counters=self.counters)
        except (ClientError, BrokerRefused) as exc:
            log.debug("could not report to the broker: %s", exc)

    #: The counter of messages handed to the broker, which a later refusal takes back.
    handed_over = "sent"

    def refused_by_broker(self, refused: BrokerRefused) -> None:
        """Messages handed to the broker earlier were refused (a full queue, a draining
        broker): they are lost to the tool, so count and log them."""
        counters = self.counters
        counters["refused"] = counters.get("refused", 0) + len(refused.refusals)
        if self.handed_over in counters:
            counters[self.handed_over] -= len(refused.refusals)
        log.warning("the broker refused %d messages: %s", len(refused.refusals), refused)

    def close(self) -> None:
        """Close the tool's socket, then say goodbye: every message the client received but
        did not settle goes back to the broker's queue."""
        if self.sock is not None:
            self.sock.close(linger=0)
        try:
            self.client.close()
        except BrokerRefused as refused:
            self.refused_by_broker(refused)


def open_socket(
    context: zmq.Context, kind: int, address: str, bind: bool, hwm: int = 1000
) -> zmq.Socket:
    sock = context.socket(kind)
    sock.linger = 0
    sock.sndhwm = sock.rcvhwm = hwm
    if bind:
        sock.bind(address)
    else:
        sock.connect(address)
    return sock
