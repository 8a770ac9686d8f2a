"""Protocol errors, named by who is at fault (the h11 split).

`RemoteProtocolError` comes only out of the decoders: the peer sent bytes we refuse. It carries
the `ErrorCode` to put in the ERROR reply. `LocalProtocolError` means our own code tried to
encode something illegal: a bug, so it is loud.
"""

from __future__ import annotations

from .constants import ErrorCode


class ProtocolError(Exception):
    """Base of every error this package raises."""

    def __init__(self, reason: str, code: ErrorCode = ErrorCode.MALFORMED) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        #: The type of the message being decoded, once its header was read (None before).
        self.message_type: int | None = None


class RemoteProtocolError(ProtocolError):
    """Raised when a peer's bytes are not a valid PHPMQ message."""


class TruncatedError(RemoteProtocolError):
    """Raised when the input ends inside a message.

    `needed` is the total number of bytes, counted from the start of the message, that must be
    available before decoding can make progress; stream decoders wait for that many.
    """

    def __init__(self, reason: str, needed: int) -> None:
        super().__init__(reason, ErrorCode.MALFORMED)
        self.needed = needed


class LocalProtocolError(ProtocolError):
    """Raised when our own code asks to encode something the protocol cannot carry."""
