"""The blocking client's socket: one DEALER connected to the broker, and the pyzmq details
both clients rely on (send timeout, queue only to a live connection, linger on close); the
asyncio client's `Dealer` (aio_backend.py) is this one, made by zmq.asyncio."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import zmq

from .curve import Curve
from .errors import ClientError, NotTaken

#: Frames the socket queues for the broker before a send blocks (then times out).
SEND_HWM = 10_000


class Dealer:
    """A fresh DEALER per connection: a reconnect closes this one and makes another."""

    #: Whose instance makes the socket (the asyncio client's Dealer: zmq.asyncio's).
    context: type[zmq.Context[Any]] = zmq.Context

    def __init__(self, address: str, send_timeout: float, curve: Curve | None = None) -> None:
        """Raises ClientError if ZeroMQ cannot use `address`. A send blocks up to
        `send_timeout` (then zmq.Again: `not_taken` says it to the caller)."""
        #: The DEALER: the client sends on it, and polls it with others' (sync_backend.py).
        self.socket: Any = dealer_socket(self.context.instance(), address, send_timeout, curve)
        #: Made once: `socket.poll` makes a Poller per call, and a worker polls before every
        #: job; asking it is also cheaper than a receive that raises zmq.Again.
        self._readable = zmq.Poller()
        self._readable.register(self.socket, zmq.POLLIN)

    def try_send(self, frame: bytes) -> bool:
        """Hand `frame` to the socket without blocking: False if it is not ready."""
        try:
            self.socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def poll(self, seconds: float) -> bool:
        """Wait up to `seconds` (at least 1 ms unless 0) for a frame to read."""
        return bool(self._readable.poll(int(seconds * 1000) or (1 if seconds > 0 else 0)))

    def frames(self) -> Iterator[bytes]:
        """The frames that can be read without waiting."""
        recv = self.socket.recv
        readable = self._readable.poll
        while readable(0):
            try:
                yield recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def close(self, linger_s: float) -> None:
        """Close; frames handed over may still leave for `linger_s` seconds."""
        self.socket.close(linger=int(linger_s * 1000))


def dealer_socket(
    context: zmq.Context[Any], address: str, send_timeout: float, curve: Curve | None
) -> Any:
    """A DEALER of `context` connected to `address` (ClientError if ZeroMQ cannot use it)."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = int(send_timeout * 1000)
    sock.sndhwm = SEND_HWM
    # Queue only to a live connection: with no broker, a send waits for send_timeout and
    # fails instead of parking messages in a socket that may never connect.
    sock.immediate = True
    if curve is not None:
        curve.apply(sock)
    try:
        sock.connect(address)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ClientError(f"invalid broker address {address!r}: {exc}") from None
    return sock


def not_taken(address: str, send_timeout: float) -> NotTaken:
    """What a send raises when the socket did not take its frame within `send_timeout`."""
    return NotTaken(
        f"could not hand the message to the broker at {address} within {send_timeout:g}s:"
        " it is not running, not reachable, or not keeping up"
    )


def check_address(address: str) -> None:
    """Raise ClientError if ZeroMQ cannot use `address` (checked before starting processes
    that would each fail on it)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        sock.connect(address)
    except zmq.ZMQError as exc:
        raise ClientError(f"invalid broker address {address!r}: {exc}") from None
    finally:
        sock.close(linger=0)
