"""The console's users: a TOML file of names, roles and argon2 password hashes.

    [users.alice]
    role = "admin"        # everything the console does
    password = "$argon2id$v=19$m=65536,t=3,p=4$..."   # `phpmq web --hash-password`

    [users.bob]
    role = "read"         # looks, peeks, and changes nothing

Passwords are checked with argon2-cffi; a name that is not in the file costs the same check,
so the answer's time does not tell which names exist.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

ADMIN = "admin"
READ = "read"
ROLES = (ADMIN, READ)

_hasher = PasswordHasher()
#: Checked against when the name is unknown, so that it takes as long as a known one.
_UNKNOWN_USER_HASH = _hasher.hash("no such user")


class UsersFileError(ValueError):
    """The users file cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password_hash: str

    @property
    def may_change(self) -> bool:
        """May this user act on the broker (send, purge, delete, replay, schedule)?"""
        return self.role == ADMIN


#: Who acts on a console that has no users (on loopback, or off it with --insecure).
NOBODY = User("(no login)", ADMIN, "")


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def load_users(path: Path) -> dict[str, User]:
    """The users of the file at `path`, by name."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsersFileError(f"cannot read the users file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsersFileError(f"the users file {path} is not TOML: {exc}") from None
    table = document.get("users")
    if not isinstance(table, dict) or not table:
        raise UsersFileError(f"the users file {path} has no [users.NAME] table")
    return {name: _user(path, name, entry) for name, entry in table.items()}


def _user(path: Path, name: str, entry: object) -> User:
    where = f"the users file {path}, user {name!r}"
    if not isinstance(entry, dict):
        raise UsersFileError(f"{where}: not a table")
    role = entry.get("role", READ)
    if role not in ROLES:
        raise UsersFileError(f"{where}: role must be one of {', '.join(ROLES)}, not {role!r}")
    password = entry.get("password")
    if not isinstance(password, str) or not password.startswith("$argon2"):
        raise UsersFileError(
            f"{where}: 'password' must be an argon2 hash (make one with phpmq web --hash-password)"
        )
    return User(name, role, password)


def verify(users: dict[str, User], name: str, password: str) -> User | None:
    """The user if `password` is theirs, else None."""
    user = users.get(name)
    try:
        _hasher.verify(user.password_hash if user else _UNKNOWN_USER_HASH, password)
    except (VerificationError, InvalidHashError):
        return None
    return user
