"""The greeting a client owes each new transport, sans-IO (docs/protocol.md §1, §6.2).

HELLO (name, role, the heartbeat terms asked for) and a consume per subscription go in front
of whatever is sent first on a transport. Only the frame built around the greeting, once the
transport took it, proves the greeting went out: a frame built for a send that then failed,
or before a rejoin renewed the greeting, does not.

A broker may refuse the HELLO itself (an ERROR whose packet 19 names 101: too large, a right
missing, ...). The greeting is then owed again, but not at once: it waits a growing back-off,
and after JOIN_ATTEMPTS refusals in a row the client stops asking (`JoinRefusals`).
"""

from __future__ import annotations

from ..protocol import Error, Hello, encode

VERSION = "phpmq-zmq-python/0.1"
#: HELLOs a broker may refuse in a row before the client stops trying; between them it waits
#: JOIN_FIRST_S, then twice as long each time (0.25 + 0.5 + 1 + 2: under 4 s in all).
JOIN_ATTEMPTS = 5
JOIN_FIRST_S = 0.25


class JoinRefusals:
    """The broker's refusals of this client's HELLO in a row, and when to ask again."""

    __slots__ = ("count", "last", "retry_at")

    def __init__(self) -> None:
        self.count = 0
        #: The last refusing ERROR (None: none since the last HELLO answer).
        self.last: Error | None = None
        #: Monotonic seconds before which the greeting waits.
        self.retry_at = 0.0

    def refused(self, error: Error, now: float) -> float | None:
        """One more refusal: the seconds until the greeting goes again, or None (given up)."""
        self.count += 1
        self.last = error
        if self.gave_up:
            return None
        delay = JOIN_FIRST_S * 2 ** (self.count - 1)
        self.retry_at = now + delay
        return delay

    def accepted(self) -> None:
        """The broker answered a HELLO: the refusals are over."""
        self.count = 0
        self.last = None
        self.retry_at = 0.0

    @property
    def gave_up(self) -> bool:
        return self.count >= JOIN_ATTEMPTS

    def why(self) -> str:
        """What the last refusal said, for an error message ("" when there is none)."""
        error = self.last
        if error is None:
            return ""
        return (
            f"the broker refused this client's HELLO {self.count} time(s) in a row:"
            f" {error.code} {error.reason}"
        )


class Greeting:
    __slots__ = ("_framed", "_hello", "owed", "refusals")

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
        #: The broker's refusals of the HELLO in a row.
        self.refusals = JoinRefusals()

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

    def may_go(self, now: float) -> bool:
        """Whether an owed greeting may be sent on its own now (not while a refusal's
        back-off lasts, nor once the client gave up)."""
        refusals = self.refusals
        return not refusals.gave_up and now >= refusals.retry_at
