"""Who may do what (docs/security.md): rights per client key, per endpoint, and the file they
come from. Pure data and matching; the guard (broker/guard.py) applies them to messages.

A right is a list of patterns over queue (or event) names, with the binding syntax of §6.5:
`*` one dot-separated segment, `#` any number. `send` covers 001 to a queue (and a request's
reply queue), `publish` 108 of an event, `consume` 002 and reading a queue (leases,
`queue-peek`, `dlq-list`), `bind` which queues may be bound (a 002 with patterns and the
`queue-*bind` commands), `subscribe` which events a binding may receive (each pattern bound
must lie within one of these), `delete` which queues may be deleted (delete-when-unused, the
`queue-delete` command); `admin` (true/false) every other admin command, among them those that
change what others see (purge, dead-letter replay and purge, schedules), which need it.

The file (TOML):

    [keys.orders-service]          # a client key, by its name (its .key file's stem)
    send = ["orders.*"]
    consume = ["replies.#"]
    bind = ["replies.#"]
    subscribe = ["order.paid"]

    [keys.ops]
    admin = true

    [anonymous]                    # ZeroMQ peers when CURVE is off
    send = ["#"]
    consume = ["#"]

    [tcp]                          # stock PHPMQ clients on the raw TCP endpoint
    send = ["legacy.#"]
    consume = ["legacy.#"]
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from ..protocol.rules import pattern_problem
from .routing import mask_matches, pattern_covers

PATTERN_RIGHTS = ("send", "publish", "consume", "bind", "subscribe", "delete")
#: Matches remembered per set of rights before the cache starts over.
MAX_CACHED = 4_096


class PermissionsError(ValueError):
    """A permissions file that cannot be used; the message names the file and the entry."""


class Rights:
    """What one key (or endpoint) may do."""

    __slots__ = (
        "_cache",
        "admin",
        "bind",
        "consume",
        "delete",
        "name",
        "publish",
        "send",
        "subscribe",
    )

    def __init__(
        self,
        name: str,
        send: tuple[str, ...] = (),
        publish: tuple[str, ...] = (),
        consume: tuple[str, ...] = (),
        bind: tuple[str, ...] = (),
        admin: bool = False,
        subscribe: tuple[str, ...] = (),
        delete: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.send = send
        self.publish = publish
        self.consume = consume
        self.bind = bind
        self.subscribe = subscribe
        self.delete = delete
        self.admin = admin
        self._cache: dict[tuple[str, str], bool] = {}

    def with_admin(self) -> Rights:
        """The same rights and the admin right (the admin secret was given)."""
        return Rights(
            self.name,
            self.send,
            self.publish,
            self.consume,
            self.bind,
            True,
            self.subscribe,
            self.delete,
        )

    def is_everything(self) -> bool:
        return self.admin and all("#" in getattr(self, right) for right in PATTERN_RIGHTS)

    def allows(self, right: str, target: str) -> bool:
        """Whether `right` (one of PATTERN_RIGHTS) covers the queue or event; for `subscribe`
        the target is a binding pattern, covered when every event it matches is."""
        key = (right, target)
        allowed = self._cache.get(key)
        if allowed is None:
            patterns: tuple[str, ...] = getattr(self, right)
            matches = pattern_covers if right == "subscribe" else mask_matches
            allowed = any(matches(pattern, target) for pattern in patterns)
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
            self._cache[key] = allowed
        return allowed


#: No right at all: what a peer has before the guard identifies it (a missing record never
#: means "allowed").
NOTHING = Rights("unidentified")


def everything(name: str, admin: bool = True) -> Rights:
    """All rights (admin as told): an allowed key without a permissions file."""
    return Rights(name, ("#",), ("#",), ("#",), ("#",), admin, ("#",), ("#",))


class Permissions:
    """The rights of every named key, and of the two kinds of peers without a key."""

    __slots__ = ("anonymous", "keys", "source", "tcp")

    def __init__(
        self,
        keys: dict[str, Rights] | None = None,
        anonymous: Rights | None = None,
        tcp: Rights | None = None,
        source: str = "",
    ) -> None:
        #: None: no file; every allowed key may do everything.
        self.keys = keys
        self.anonymous = anonymous
        self.tcp = tcp
        self.source = source

    def for_key(self, name: str) -> Rights:
        if self.keys is None:
            return everything(name)
        return self.keys.get(name) or Rights(name)


def load_permissions(path: str | Path) -> Permissions:
    """Read a permissions file.

    Raises:
        PermissionsError: unreadable, not TOML, or an entry of the wrong shape.
    """
    source = Path(path)
    try:
        document = tomllib.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PermissionsError(f"{source}: cannot read the permissions file: {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PermissionsError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(document) - {"keys", "anonymous", "tcp"}
    if unknown:
        raise PermissionsError(
            f"{source}: unknown section {sorted(unknown)[0]!r}; known: keys.NAME, anonymous, tcp"
        )
    keys_table = document.get("keys", {})
    if not isinstance(keys_table, dict):
        raise PermissionsError(f"{source}: [keys] must hold one table per key name")
    keys = {
        name: _rights(source, f"keys.{name}", name, table) for name, table in keys_table.items()
    }
    anonymous, tcp = document.get("anonymous"), document.get("tcp")
    return Permissions(
        keys,
        _rights(source, "anonymous", "anonymous", anonymous) if anonymous is not None else None,
        _rights(source, "tcp", "tcp", tcp) if tcp is not None else None,
        str(source),
    )


def _rights(source: Path, where: str, name: str, table: Any) -> Rights:
    if not isinstance(table, dict):
        raise PermissionsError(f"{source}: [{where}] must be a table")
    unknown = set(table) - {*PATTERN_RIGHTS, "admin"}
    if unknown:
        known = ", ".join((*PATTERN_RIGHTS, "admin"))
        raise PermissionsError(
            f"{source}: [{where}] has an unknown right {sorted(unknown)[0]!r}; known: {known}"
        )
    admin = table.get("admin", False)
    if not isinstance(admin, bool):
        raise PermissionsError(f"{source}: [{where}] admin must be true or false")
    lists = {
        right: _patterns(source, where, right, table.get(right, [])) for right in PATTERN_RIGHTS
    }
    return Rights(name, admin=admin, **lists)


def _patterns(source: Path, where: str, right: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise PermissionsError(f"{source}: [{where}] {right} must be a list of patterns")
    for pattern in value:
        problem = pattern_problem(pattern)
        if problem is not None:
            raise PermissionsError(f"{source}: [{where}] {right}: {problem}")
    return tuple(value)
