"""CURVE for the ROUTER endpoint (docs/security.md): libzmq encrypts and authenticates; its
ZAP handler (zap.py) asks the key ring which client keys may in.

The handler runs in its own thread: a handshake (good or bad) never runs on the broker's
loop. An allowed client's ZAP User-Id is its key's name, which ZeroMQ attaches to every
frame it sends (frame property `User-Id`); the router reads it once per connection. The key
ring is swapped whole (SIGHUP), so a lookup never sees half of an update.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import zmq

from ..keyring import KeyPair

log = logging.getLogger("phpmq.broker")


#: Failed handshakes that never reach ZAP: a client without a key (the mechanisms differ),
#: or one that encrypted to another public key. ZAP counts the keys it refuses itself.
FAILED_BEFORE_ZAP = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
#: How often the watch looks whether it should stop.
WATCH_POLL_MS = 100


class HandshakeWatch(threading.Thread):
    """Counts and logs the CURVE handshakes that fail before ZAP is asked: libzmq tells them
    only to a socket monitor, read here in a thread of its own, never on the broker's loop."""

    def __init__(self, router: zmq.Socket) -> None:
        super().__init__(name="phpmq-handshake-watch", daemon=True)
        self._monitor = router.get_monitor_socket(FAILED_BEFORE_ZAP)
        self._stopping = threading.Event()
        self.failed = 0

    def run(self) -> None:
        from zmq.utils.monitor import recv_monitor_message  # it loads asyncio: only with CURVE

        monitor = self._monitor
        try:
            while not self._stopping.is_set():
                if monitor.poll(WATCH_POLL_MS):
                    self._count(recv_monitor_message(monitor))
        finally:
            monitor.close(linger=0)

    def _count(self, event: dict[str, Any]) -> None:
        if not event["event"] & FAILED_BEFORE_ZAP:
            return  # MONITOR_STOPPED, when the router closes first
        self.failed += 1
        if self.failed <= 10 or self.failed % 1000 == 0:
            no_key = event["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
            why = "the client has no CURVE key" if no_key else "not encrypted to this broker's key"
            log.warning("refused a CURVE handshake: %s", why)

    def stop(self) -> None:
        self._stopping.set()
        self.join(1)


def make_curve_server(socket: zmq.Socket, keys: KeyPair) -> None:
    """Turn a socket (before bind) into a CURVE server with the broker's keys."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_server = True


def frame_user_id(frame: Any) -> str | None:
    """The ZAP User-Id ZeroMQ attached to a received frame, if any."""
    try:
        value = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return value or None


def frame_address(frame: Any) -> str:
    """Where a received frame came from (`Peer-Address`), or "" if ZeroMQ cannot tell."""
    try:
        return frame.get("Peer-Address") or ""
    except zmq.ZMQError:
        return ""
