"""The guard: applies rights (broker/permissions.py) to what peers send, and writes the audit
log of admin actions (docs/security.md).

Transports tell the core who a peer is (its CURVE key's name, its address) with each frame;
the guard turns that into the peer's rights once. A peer whose rights are everything keeps
`rights = None`, so the hot path pays one `is not None` check per message. A refusal is a
403 naming the right, counted, and logged with the key's name.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, NamedTuple

from ..protocol import Admin, AdminReply, Consume, ErrorCode, Hello, Message, Publish, Send
from .context import Context
from .keyring import LINK_KEY_NAME
from .model import Peer, PeerProfile
from .permissions import PATTERN_RIGHTS, Permissions, Rights, everything

log = logging.getLogger("phpmq.broker.audit")

#: Admin commands anyone may run; those that read a queue need `consume`, those that bind
#: need `bind`; every other command needs `admin` and is audited.
OPEN_COMMANDS = frozenset(("stats", "report", "leases", "schedule-list", "queue-bindings"))
CONSUME_COMMANDS = frozenset(
    ("lease", "lease-read", "lease-commit", "lease-release", "queue-peek", "dlq-list")
)
BIND_COMMANDS = frozenset(("queue-bind", "queue-unbind", "queue-rebind"))
#: Options the audit log leaves out (a schedule's content may be large or private).
UNLOGGED_OPTIONS = frozenset(("command", "content", "content_base64"))


class Principal(NamedTuple):
    """Who a peer is, as its transport knows it."""

    #: The name of its CURVE key (None: no CURVE).
    key: str | None
    #: Where it connects from (`host:port`, or "" if the transport cannot tell).
    address: str


class Guard:
    __slots__ = ("_admin_secret", "_ctx", "admin_open", "permissions", "refused")

    def __init__(self, ctx: Context, permissions: Permissions, admin_open: bool) -> None:
        self._ctx = ctx
        self.permissions = permissions
        #: Whether peers without a key may run admin commands (a loopback-only broker).
        self.admin_open = admin_open
        self._admin_secret = ctx.config.admin_secret.encode()
        #: 403s by right, for stats.
        self.refused: dict[str, int] = {}

    # ----------------------------------------------------------------- who

    def identify(self, peer: Peer, principal: Principal) -> None:
        peer.principal = principal
        peer.rights = self._rights_of(principal, peer.profile)

    def _rights_of(self, principal: Principal, profile: PeerProfile) -> Rights | None:
        permissions = self.permissions
        if principal.key == LINK_KEY_NAME:  # another shard: it checked its peers' rights
            return None
        if principal.key is not None:
            rights = permissions.for_key(principal.key)
        elif profile.transport == "tcp":
            rights = permissions.tcp or everything("tcp", admin=False)
        else:
            rights = permissions.anonymous or everything("anonymous", admin=self.admin_open)
        return None if _is_everything(rights) else rights

    def reload(self, permissions: Permissions, peers: list[Peer]) -> None:
        """New rights for everyone connected (SIGHUP); nobody is disconnected."""
        self.permissions = permissions
        for peer in peers:
            if peer.principal is not None:
                self.identify(peer, peer.principal)

    # ----------------------------------------------------------------- what

    def allows(self, peer: Peer, message: Message) -> bool:
        """Whether the peer (whose rights are not everything) may do this; refused if not."""
        rights = peer.rights
        assert rights is not None
        kind = type(message)
        if kind is Send:
            return self._check(peer, rights, "send", message.queue, message)  # type: ignore[union-attr]
        if kind is Publish:
            return self._check(peer, rights, "publish", message.event, message)  # type: ignore[union-attr]
        if kind is Consume:
            queue = message.queue  # type: ignore[union-attr]
            if message.patterns and not self._check(peer, rights, "bind", queue, message):  # type: ignore[union-attr]
                return False
            return message.count == 0 or self._check(peer, rights, "consume", queue, message)  # type: ignore[union-attr]
        if kind is Admin:
            return self._admin_allowed(peer, rights, message.options)  # type: ignore[union-attr]
        if kind is Hello:
            self._take_admin_secret(peer, rights, message.options)  # type: ignore[union-attr]
        return True

    def _admin_allowed(self, peer: Peer, rights: Rights, options: dict[str, Any]) -> bool:
        command = options.get("command")
        if command in OPEN_COMMANDS or not isinstance(command, str) or rights.admin:
            return True  # an unknown command is refused by the admin part itself
        queue = options.get("queue")
        if command in CONSUME_COMMANDS or command in BIND_COMMANDS:
            right = "consume" if command in CONSUME_COMMANDS else "bind"
            target = queue if isinstance(queue, str) else ""
            return self._check(peer, rights, right, target, None, options)
        return self._refuse(peer, "admin", command, None, options)

    def _check(
        self,
        peer: Peer,
        rights: Rights,
        right: str,
        target: str,
        message: Message | None,
        admin_options: dict[str, Any] | None = None,
    ) -> bool:
        if rights.allows(right, target):
            return True
        return self._refuse(peer, right, target, message, admin_options)

    def _refuse(
        self,
        peer: Peer,
        right: str,
        target: str,
        message: Message | None,
        admin_options: dict[str, Any] | None,
    ) -> bool:
        ctx = self._ctx
        self.refused[right] = self.refused.get(right, 0) + 1
        who = describe(peer)
        on = f" on {target!r}" if right != "admin" else f" ({target})"
        reason = f"forbidden: {who} has no {right} right{on}"
        ctx.log_limited(f"refused: {reason}", f"403:{who}")
        if admin_options is not None:  # every ADMIN gets one ADMIN_REPLY, never an ERROR
            ctx.counters.errors += 1
            peer.refused += 1
            ctx.reply(
                peer, AdminReply({"error": {"code": int(ErrorCode.FORBIDDEN), "reason": reason}})
            )
        else:
            queue = getattr(message, "queue", None)
            ctx.refuse(
                peer, ErrorCode.FORBIDDEN, reason, None, queue, getattr(message, "tag", None)
            )
        return False

    def _take_admin_secret(self, peer: Peer, rights: Rights, options: dict[str, Any]) -> None:
        """A HELLO with the broker's admin secret gives the admin right (no CURVE)."""
        offered = options.get("admin_secret")
        if not isinstance(offered, str) or rights.admin or peer.principal is None:
            return
        if self._admin_secret and hmac.compare_digest(offered.encode(), self._admin_secret):
            granted = Rights(
                rights.name, rights.send, rights.publish, rights.consume, rights.bind, True
            )
            peer.rights = None if _is_everything(granted) else granted
        else:
            self.refused["admin_secret"] = self.refused.get("admin_secret", 0) + 1
            self._ctx.log_limited(f"refused: {describe(peer)} gave a wrong admin secret", "403")

    # ----------------------------------------------------------------- audit

    def audit(self, peer: Peer, options: dict[str, Any]) -> None:
        """Admin actions are logged with who ran them."""
        command = options.get("command")
        if not isinstance(command, str) or command in OPEN_COMMANDS:
            return
        if command in CONSUME_COMMANDS:
            return
        details = {
            k: v for k, v in options.items() if k not in ("command", "content", "content_base64")
        }
        log.info("admin %s by %s: %s", command, describe(peer), details)


def describe(peer: Peer) -> str:
    """A peer as the logs name it: its key's name and its address, as far as known."""
    principal = peer.principal
    name = peer.name or peer.id.hex()
    if principal is None:
        return f"peer {name}"
    if principal.key is not None:
        return f"key {principal.key!r} ({principal.address or name})"
    return f"peer {principal.address or name}"


def _is_everything(rights: Rights) -> bool:
    return rights.admin and all("#" in getattr(rights, right) for right in PATTERN_RIGHTS)
