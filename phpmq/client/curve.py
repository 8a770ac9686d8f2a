"""CURVE for clients (docs/security.md): the client's key pair and the broker's public key,
given to `Client(curve=...)` or, for every client of a process (the CLI, workers, bridges,
Spark tasks), by the environment:

    PHPMQ_CURVE_SECRET   the client's NAME.key_secret file (`phpmq keys generate NAME`)
    PHPMQ_CURVE_SERVER   the broker's public key: its .key file, or the 40 Z85 characters

The files are read with pyzmq's `zmq.auth`; libzmq does the crypto.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import zmq
from zmq.auth import load_certificate

from .errors import CurveKeyError

SECRET_VARIABLE = "PHPMQ_CURVE_SECRET"
ADMIN_SECRET_VARIABLE = "PHPMQ_ADMIN_SECRET"
SERVER_VARIABLE = "PHPMQ_CURVE_SERVER"
Z85_KEY_LENGTH = 40


class Curve(NamedTuple):
    """A client's CURVE keys and the broker's public key, Z85-encoded."""

    public: bytes
    secret: bytes
    server: bytes

    def apply(self, socket: zmq.Socket) -> None:
        """Make `socket` (before it connects) a CURVE client of the broker."""
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret
        socket.curve_serverkey = self.server


def curve_keys(secret_file: str | Path, server_key: str | Path) -> Curve:
    """Keys from the client's `.key_secret` file and the broker's `.key` file (or its key).

    Raises:
        CurveKeyError: a file that cannot be read or holds no usable key.
    """
    public, secret = _load(secret_file)
    if secret is None:
        raise CurveKeyError(f"{secret_file}: no secret key (give the .key_secret file)")
    server = str(server_key)
    if len(server) == Z85_KEY_LENGTH and not Path(server).exists():
        return Curve(public, secret, server.encode())
    return Curve(public, secret, _load(server)[0])


def curve_from_environment() -> Curve | None:
    """The keys PHPMQ_CURVE_SECRET and PHPMQ_CURVE_SERVER name (None: neither is set).

    Raises:
        CurveKeyError: only one of them is set, or a file is unusable.
    """
    secret, server = os.environ.get(SECRET_VARIABLE), os.environ.get(SERVER_VARIABLE)
    if not secret and not server:
        return None
    if not (secret and server):
        raise CurveKeyError(f"CURVE needs both {SECRET_VARIABLE} and {SERVER_VARIABLE}")
    return curve_keys(secret, server)


def _load(path: str | Path) -> tuple[bytes, bytes | None]:
    try:
        public, secret = load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveKeyError(f"{path}: not a usable CURVE key file: {exc}") from None
    return public, secret


def admin_secret_from(given: str | None) -> str:
    """The broker's admin secret to offer in HELLO: given, or PHPMQ_ADMIN_SECRET ("" none)."""
    return given if given is not None else os.environ.get(ADMIN_SECRET_VARIABLE, "")
