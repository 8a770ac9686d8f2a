"""CURVE key files (docs/security.md): the broker's own key pair, and the client public keys it
lets in, each with a name. The files are those `zmq.auth.create_certificates` writes
(`phpmq keys generate`); they are read here, rather than by `zmq.auth.load_certificate`, so
that a malformed file stops the broker with the file and the line named.

Allowed clients come from a directory (every `NAME.key` in it: the key's name is NAME) or a
file with one `NAME PUBLIC-KEY` per line (a line starting with `#` is a comment). No crypto
happens here: libzmq does it, and the ZAP handler (broker/shell/transports/zap.py) asks this ring.
"""

from __future__ import annotations

import re
from pathlib import Path

from zmq.utils import z85

#: A key in a certificate: `public-key = "40 Z85 characters"` (or secret-key).
_KEY_LINE = re.compile(r'^\s*(public-key|secret-key)\s*=\s*"([^"]*)"\s*$')
KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$")
Z85_KEY_LENGTH = 40


class KeyFileError(ValueError):
    """A key file that cannot be used; the message names the file (and the line)."""


class KeyPair:
    """The broker's (or a client's) CURVE keys, Z85-encoded as libzmq takes them."""

    __slots__ = ("public", "secret")

    def __init__(self, public: bytes, secret: bytes) -> None:
        self.public = public
        self.secret = secret


def read_certificate(path: Path) -> dict[str, bytes]:
    """The keys a certificate file holds ({"public-key": ..., "secret-key": ...}).

    Raises:
        KeyFileError: unreadable, a malformed key line, or no public key.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot read the key file: {exc}") from None
    keys: dict[str, bytes] = {}
    for number, line in enumerate(lines, start=1):
        if "-key" not in line or line.lstrip().startswith("#"):
            continue
        match = _KEY_LINE.match(line)
        if match is None:
            raise KeyFileError(f'{path}:{number}: expected `public-key = "…"`: {line.strip()!r}')
        kind, value = match.groups()
        keys[kind] = _z85_key(value, f"{path}:{number}")
    if "public-key" not in keys:
        raise KeyFileError(f"{path}: no public-key line (not a CURVE certificate?)")
    return keys


def read_key_pair(secret_file: str | Path) -> KeyPair:
    """A key pair from a `NAME.key_secret` file.

    Raises:
        KeyFileError: the file is missing, malformed, or holds no secret key.
    """
    path = Path(secret_file)
    keys = read_certificate(path)
    if "secret-key" not in keys:
        raise KeyFileError(f"{path}: no secret-key line: give the .key_secret file, not .key")
    return KeyPair(keys["public-key"], keys["secret-key"])


def read_allowed(source: str | Path) -> dict[bytes, str]:
    """The client public keys allowed in, by key, with their names.

    Raises:
        KeyFileError: a missing source, a malformed file or line, a name used twice.
    """
    path = Path(source)
    if path.is_dir():
        found = {}
        for cert in sorted(path.glob("*.key")):
            found[cert.stem] = read_certificate(cert)["public-key"]
        return _by_key(found, path)
    if not path.is_file():
        raise KeyFileError(f"{path}: no such directory or file of client keys")
    return _by_key(_read_key_list(path), path)


def _read_key_list(path: Path) -> dict[str, bytes]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot read the key list: {exc}") from None
    if any(_KEY_LINE.match(line) for line in lines):  # one certificate, not a list
        return {path.stem: read_certificate(path)["public-key"]}
    found: dict[str, bytes] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):  # Z85 keys may hold '#': whole lines only
            continue
        parts = text.split()
        if len(parts) != 2:
            raise KeyFileError(f"{path}:{number}: expected `NAME PUBLIC-KEY`: {text!r}")
        name, key = parts
        if name in found:
            raise KeyFileError(f"{path}:{number}: the name {name!r} is used twice")
        found[name] = _z85_key(key, f"{path}:{number}")
    return found


def _by_key(by_name: dict[str, bytes], source: Path) -> dict[bytes, str]:
    by_key: dict[bytes, str] = {}
    for name, key in by_name.items():
        if KEY_NAME.match(name) is None:
            raise KeyFileError(
                f"{source}: key name {name!r} must be 1-100 letters, digits, '.', '_', '@' or"
                " '-', starting with a letter or digit"
            )
        if key in by_key:
            raise KeyFileError(f"{source}: {name!r} and {by_key[key]!r} have the same key")
        by_key[key] = name
    return by_key


def _z85_key(value: str, where: str) -> bytes:
    raw = value.encode("ascii", errors="replace")
    if len(raw) != Z85_KEY_LENGTH:
        raise KeyFileError(f"{where}: a key is {Z85_KEY_LENGTH} Z85 characters, not {len(raw)}")
    try:
        z85.decode(raw)
    except (ValueError, KeyError, TypeError):
        raise KeyFileError(f"{where}: not a Z85-encoded key: {value!r}") from None
    return raw
