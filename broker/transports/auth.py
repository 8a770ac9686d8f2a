"""CURVE for the ROUTER endpoint (docs/security.md): libzmq encrypts and authenticates; this
is its ZAP handler, pyzmq's `zmq.auth` thread, asking the key ring which client keys may in.

The handler runs in its own thread: a handshake (good or bad) never runs on the broker's
loop. An allowed client's ZAP User-Id is its key's name, which ZeroMQ attaches to every
frame it sends (frame property `User-Id`); the router reads it once per connection. The key
ring is swapped whole (SIGHUP), so a lookup never sees half of an update.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from ..keyring import KeyPair

log = logging.getLogger("phpmq.broker")


class KeyRingAuthenticator(ThreadAuthenticator):
    """Lets in the client keys of the current key ring, named as the ring names them."""

    def __init__(self, context: zmq.Context, allowed: dict[bytes, str]) -> None:
        super().__init__(context, log=logging.getLogger("phpmq.broker.zap"))
        self._ring = dict(allowed)  # Z85 public key -> name
        #: Handshakes refused (no key, a key not allowed), for stats.
        self.denied = 0
        self.configure_curve_callback("*", self)

    def replace(self, allowed: dict[bytes, str]) -> None:
        """The new allow-list (SIGHUP): new handshakes only; connected peers stay."""
        self._ring = dict(allowed)

    def callback(self, domain: str, key: bytes) -> bool:
        """zmq.auth's credentials provider: `key` is the client's Z85 public key."""
        allowed = key in self._ring
        if not allowed:
            self.denied += 1
            if self.denied <= 10 or self.denied % 1000 == 0:
                log.warning("refused a CURVE handshake: key %s is not allowed", key.decode()[:8])
        return allowed

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self._ring.get(z85.encode(client_public_key), "?")


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
