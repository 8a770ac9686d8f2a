"""The ZAP handler of a CURVE endpoint: pyzmq's `zmq.auth` thread, asking the key ring which
client keys may in (docs/security.md). A module of its own, imported only when CURVE is on:
`zmq.auth.thread` loads asyncio, a sixth of a plain broker's start-up imports."""

from __future__ import annotations

import logging

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

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
