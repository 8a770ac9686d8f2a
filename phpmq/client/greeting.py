"""The greeting a client owes each new transport, sans-IO (docs/protocol.md §1, §6.2).

HELLO (name, role, the heartbeat terms asked for) and a consume per subscription go in front
of whatever is sent first on a transport. Only the frame built around the greeting, once the
transport took it, proves the greeting went out: a frame built for a send that then failed,
or before a rejoin renewed the greeting, does not.
"""

from __future__ import annotations

from ..protocol import Hello, encode

VERSION = "phpmq-zmq-python/0.1"


class Greeting:
    __slots__ = ("_framed", "_hello", "owed")

    def __init__(
        self, name: str, role: str, heartbeat_ms: int, liveness: int, admin_secret: str = ""
    ) -> None:
        options: dict[str, object] = {"name": name, "role": role, "heartbeat_ms": heartbeat_ms}
        if admin_secret:  # the broker's admin right without CURVE (docs/security.md)
            options["admin_secret"] = admin_secret
        self._hello = encode(Hello({**options, "liveness": liveness, "version": VERSION}))
        #: What goes in front of the next frame (None: it went out on this transport).
        self.owed: bytes | None = None
        #: The last frame built around `owed`.
        self._framed: bytes | None = None

    def renew(self, consumes: bytes) -> None:
        """A new transport or a rejoin: HELLO and `consumes` are owed."""
        self.owed = self._hello + consumes
        self._framed = None

    def frame(self, payload: bytes) -> bytes:
        """`payload`, behind the greeting if it is owed."""
        owed = self.owed
        if owed is None:
            return payload
        frame = self._framed = owed + payload
        return frame

    def went_out(self, frame: bytes) -> bool:
        """The transport took `frame`: True if that is what carried the owed greeting."""
        # Identity: equal bytes built before a renewal are not this transport's greeting.
        if frame is self._framed and self.owed is not None:
            self.owed = self._framed = None
            return True
        return False
