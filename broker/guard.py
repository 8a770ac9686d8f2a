"""The guard: applies rights (broker/permissions.py) to what peers send, and writes the audit
log of admin actions (docs/security.md).

Transports tell the core who a peer is (its CURVE key's name, its address) with each frame;
the guard turns that into the peer's rights once. A peer whose rights are everything keeps
`rights = None`, so the hot path pays one `is not None` check per message. A refusal is a
403 naming the right, counted, and logged with the key's name.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from typing import Any, NamedTuple

import msgspec

from ..protocol import (
    Ack,
    Admin,
    AdminReply,
    Cancel,
    Consume,
    DeadLetter,
    Disconnect,
    ErrorCode,
    Forward,
    Heartbeat,
    Hello,
    Kbai,
    Message,
    Publish,
    Reply,
    Requeue,
    Send,
)
from ..protocol import admin_commands as cmd
from .context import Context
from .model import Peer, PeerProfile
from .permissions import NOTHING, Permissions, Rights, everything

log = logging.getLogger("phpmq.broker.audit")

#: The HELLO role of a shard's link to another shard.
LINK_ROLE = "link"
#: The name the broker's own CURVE key goes by (its shards' links connect with it).
LINK_KEY_NAME = "phpmq-shard-link"

#: Admin commands anyone may run; those that read a queue need `consume`, those that bind
#: need `bind`; every other command needs `admin` and is audited.
OPEN_COMMANDS = frozenset(
    (cmd.STATS, cmd.REPORT, cmd.LEASES, cmd.SCHEDULE_LIST, cmd.QUEUE_BINDINGS, cmd.KEY_HOLDS)
)
#: A writer's key-hold commands need what its sends need: `send` on the queue they name (or
#: `publish` on the event), not `admin`; not audited (every task and batch sends one).
WRITER_COMMANDS = frozenset((cmd.KEY_HOLD, cmd.KEY_COMMIT))
#: Commands that need `delete` on their queue (or `admin`).
DELETE_COMMANDS = frozenset((cmd.QUEUE_DELETE,))
#: Commands whose patterns need `subscribe`, whoever runs them.
SUBSCRIBING_COMMANDS = frozenset((cmd.QUEUE_BIND, cmd.QUEUE_REBIND))
#: Messages that name only what the peer already holds (settles) or are control: no right.
SETTLES = frozenset((Ack, Requeue, DeadLetter, Reply, Cancel))
UNCHECKED = frozenset((Hello, Heartbeat, Disconnect, Kbai, Forward))
CONSUME_COMMANDS = frozenset(
    (cmd.LEASE, cmd.LEASE_READ, cmd.LEASE_COMMIT, cmd.LEASE_RELEASE, cmd.QUEUE_PEEK, cmd.DLQ_LIST)
)
BIND_COMMANDS = frozenset((cmd.QUEUE_BIND, cmd.QUEUE_UNBIND, cmd.QUEUE_REBIND))
#: Options the audit log leaves out (a schedule's content may be large or private).
UNLOGGED_OPTIONS = frozenset(("command", "content", "content_base64"))


class Principal(NamedTuple):
    """Who a peer is, as its transport knows it."""

    #: The name of its CURVE key (None: no CURVE).
    key: str | None
    #: Where it connects from (`host:port`, or "" if the transport cannot tell).
    address: str
    #: The transport it came in on ("router", "tcp"; "" the profile's). A peer forwarded by
    #: a link without a principal is UNKNOWN_TRANSPORT: it may do nothing.
    transport: str = ""


UNKNOWN_TRANSPORT = "unknown"
#: Who a peer forwarded without a principal is: nobody, with no right at all.
UNKNOWN = Principal(None, "", UNKNOWN_TRANSPORT)
#: A principal in a FORWARD: [key or null, address, transport, admin granted].
_WIRE = tuple[str | None, str, str, bool]
#: Principals decoded from FORWARDs remembered before the cache starts over.
MAX_DECODED_PRINCIPALS = 4_096


class Guard:
    __slots__ = (
        "_admin_secret",
        "_ctx",
        "_decoded",
        "_link_secret",
        "admin_open",
        "permissions",
        "refused",
    )

    def __init__(self, ctx: Context, permissions: Permissions, admin_open: bool) -> None:
        self._ctx = ctx
        self.permissions = permissions
        #: Whether peers without a key may run admin commands (a loopback-only broker).
        self.admin_open = admin_open
        self._admin_secret = ctx.config.admin_secret.encode()
        self._link_secret = ctx.config.link_secret.encode()
        self._decoded: dict[bytes, tuple[Principal, bool]] = {}
        #: 403s by right, for stats.
        self.refused: dict[str, int] = {}

    # ----------------------------------------------------------------- who

    def identify(self, peer: Peer, principal: Principal) -> None:
        """The peer's rights from who it is (its transport's word, or its shard's)."""
        peer.principal = principal
        peer.principal_wire = None
        peer.owner = _owner_of(principal)
        if principal.key == LINK_KEY_NAME:
            peer.link = True  # (a link proven by its secret stays one: identify never unproves)
        peer.rights = self._rights_of(principal, peer.profile, peer.admin_granted)

    def _rights_of(
        self, principal: Principal, profile: PeerProfile, admin_granted: bool
    ) -> Rights | None:
        permissions = self.permissions
        transport = principal.transport or profile.transport
        if principal.key == LINK_KEY_NAME:
            return None  # another shard: it forwards its peers' principals with their messages
        if transport == UNKNOWN_TRANSPORT:
            return NOTHING
        if principal.key is not None:
            rights = permissions.for_key(principal.key)
        elif transport == "tcp":
            rights = permissions.tcp or everything("tcp", admin=False)
        else:
            rights = permissions.anonymous or everything("anonymous", admin=self.admin_open)
        if admin_granted and not rights.admin:
            rights = rights.with_admin()
        return None if rights.is_everything() else rights

    def reload(self, permissions: Permissions, peers: list[Peer]) -> list[tuple[Peer, str]]:
        """New rights for everyone connected (SIGHUP); nobody is disconnected. Returns the
        windows (peer, queue) whose peer may no longer consume them: the caller closes them."""
        self.permissions = permissions
        revoked: list[tuple[Peer, str]] = []
        for peer in peers:
            if peer.principal is None:
                continue
            self.identify(peer, peer.principal)
            rights = peer.rights
            if rights is None:
                continue
            revoked.extend(
                (peer, queue) for queue in peer.windows if not rights.allows("consume", queue)
            )
        return revoked

    def on_hello(self, peer: Peer, options: dict[str, Any]) -> None:
        """HELLO: the admin secret gives the admin right (no CURVE), for this HELLO's
        connection only (a HELLO without it takes it back); role "link" is believed only
        with the broker's own key or the cluster's link secret."""
        offered = options.get("admin_secret")
        granted = isinstance(offered, str) and self._proves(offered, self._admin_secret)
        if isinstance(offered, str) and not granted:
            self._count("admin_secret")
            self._ctx.log_limited(f"refused: {describe(peer)} gave a wrong admin secret", "403")
        if granted != peer.admin_granted:
            peer.admin_granted = granted
            if peer.principal is not None:
                self.identify(peer, peer.principal)
        if options.get("role") == LINK_ROLE and not peer.link:
            secret = options.get("link_secret")
            if isinstance(secret, str) and self._proves(secret, self._link_secret):
                peer.link = True
            else:
                self._count("link")
                self._ctx.log_limited(
                    f"refused: {describe(peer)} says it is a shard link without the broker's"
                    " key or link secret",
                    "403-link",
                )

    @staticmethod
    def _proves(offered: str, secret: bytes) -> bool:
        return bool(secret) and hmac.compare_digest(offered.encode(), secret)

    def forwarded_principal(self, wire: bytes | None) -> tuple[Principal, bool]:
        """(principal, admin granted) of a peer behind a link, from its FORWARD's packet;
        UNKNOWN (no rights) when there is none or it cannot be read."""
        if wire is None:
            return UNKNOWN, False
        decoded = self._decoded.get(wire)
        if decoded is None:
            try:
                key, address, transport, granted = msgspec.json.decode(wire, type=_WIRE)
            except (msgspec.DecodeError, UnicodeDecodeError):  # msgspec's word for bad UTF-8
                return UNKNOWN, False
            decoded = (Principal(key, address, transport or "router"), granted)
            if len(self._decoded) >= MAX_DECODED_PRINCIPALS:
                self._decoded.clear()
            self._decoded[wire] = decoded
        return decoded

    @staticmethod
    def principal_wire(peer: Peer) -> bytes:
        """The peer's principal as a FORWARD carries it (encoded once per peer)."""
        wire = peer.principal_wire
        if wire is None:
            principal = peer.principal or UNKNOWN
            transport = principal.transport or peer.profile.transport
            wire = peer.principal_wire = msgspec.json.encode(
                (principal.key, principal.address, transport, peer.admin_granted)
            )
        return wire

    # ----------------------------------------------------------------- what

    def allows(self, peer: Peer, message: Message) -> bool:
        """Whether the peer (whose rights are not everything) may do this; refused if not."""
        rights = peer.rights
        assert rights is not None
        kind = type(message)
        if peer.over_quota is not None:
            return self._over_quota(peer, message)
        if kind is Send:
            queue = message.queue  # type: ignore[union-attr]
            if not rights.allows("send", queue):
                # The like sends that follow in its frame (protocol/runs.py) go with it.
                repeats = self._ctx.take_repeats()
                return self._refuse(peer, "send", queue, message, None, 1 + repeats)
            reply_to = message.reply_to  # type: ignore[union-attr]
            return not reply_to or self._check(peer, rights, "send", reply_to, message)
        if kind is Publish:
            return self._check(peer, rights, "publish", message.event, message)  # type: ignore[union-attr]
        if kind is Consume:
            return self._consume_allowed(peer, rights, message)  # type: ignore[arg-type]
        if kind is Admin:
            return self._admin_allowed(peer, rights, message.options)  # type: ignore[union-attr]
        if kind in SETTLES or kind in UNCHECKED:
            return True  # a settle names only what the peer holds; control is not an action
        return self._refuse(peer, "admin", kind.__name__, message, None)

    def _consume_allowed(self, peer: Peer, rights: Rights, message: Consume) -> bool:
        queue = message.queue
        if message.patterns:
            if not self._check(peer, rights, "bind", queue, message):
                return False
            for pattern in message.patterns.split(" "):
                if pattern and not self._check(peer, rights, "subscribe", pattern, message):
                    return False
        if message.unused_ms is not None and not self._check(
            peer, rights, "delete", queue, message
        ):
            return False
        return message.count == 0 or self._check(peer, rights, "consume", queue, message)

    def _admin_allowed(self, peer: Peer, rights: Rights, options: dict[str, Any]) -> bool:
        command = options.get("command")
        if not isinstance(command, str) or command in OPEN_COMMANDS:
            return True  # an unknown command is refused by the admin part itself
        queue = options.get("queue")
        target = queue if isinstance(queue, str) else ""
        if command in SUBSCRIBING_COMMANDS:
            for pattern in _patterns_bound(options):
                if not self._check(peer, rights, "subscribe", pattern, None, options):
                    return False
        if command == cmd.SCHEDULE_ADD and not self._target_allowed(peer, rights, options):
            return False
        if command in WRITER_COMMANDS:
            return self._target_allowed(peer, rights, options)
        if rights.admin:
            return True
        if command in CONSUME_COMMANDS or command in BIND_COMMANDS or command in DELETE_COMMANDS:
            right = (
                "consume"
                if command in CONSUME_COMMANDS
                else "bind"
                if command in BIND_COMMANDS
                else "delete"
            )
            return self._check(peer, rights, right, target, None, options)
        return self._refuse(peer, "admin", command, None, options)

    def _target_allowed(self, peer: Peer, rights: Rights, options: dict[str, Any]) -> bool:
        """The right to send to the command's queue (or publish its event): a schedule sends
        as its adder would (besides `admin`); a key hold keeps what its writer sends there."""
        event = options.get("event")
        if isinstance(event, str):
            return self._check(peer, rights, "publish", event, None, options)
        queue = options.get("queue")
        target = queue if isinstance(queue, str) else ""
        return self._check(peer, rights, "send", target, None, options)

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

    def _over_quota(self, peer: Peer, message: Message) -> bool:
        """A peer past its key's quota of connections: whatever it sends is refused (429)."""
        reason = peer.over_quota or ""
        if type(message) is Admin:
            self._ctx.counters.errors += 1
            error = {"code": int(ErrorCode.LIMIT_REACHED), "reason": reason}
            self._ctx.reply(peer, AdminReply(cmd.answering(message.options, {"error": error})))
        else:
            queue = getattr(message, "queue", None)
            tag = getattr(message, "tag", None)
            self._ctx.refuse(peer, ErrorCode.LIMIT_REACHED, reason, None, queue, tag)
        return False

    def _count(self, right: str) -> None:
        self.refused[right] = self.refused.get(right, 0) + 1

    def _refuse(
        self,
        peer: Peer,
        right: str,
        target: str,
        message: Message | None,
        admin_options: dict[str, Any] | None,
        count: int = 1,
    ) -> bool:
        ctx = self._ctx
        self.refused[right] = self.refused.get(right, 0) + count
        who = describe(peer)
        on = f" on {target!r}" if right != "admin" else f" ({target})"
        reason = f"forbidden: {who} has no {right} right{on}"
        ctx.log_limited(f"refused: {reason}", f"403:{who}")
        if admin_options is not None:  # every ADMIN gets one ADMIN_REPLY, never an ERROR
            ctx.counters.errors += 1
            peer.refused += 1
            error = {"code": int(ErrorCode.FORBIDDEN), "reason": reason}
            ctx.reply(peer, AdminReply(cmd.answering(admin_options, {"error": error})))
        else:
            queue = getattr(message, "queue", None)
            tag = getattr(message, "tag", None)
            ctx.refuse(peer, ErrorCode.FORBIDDEN, reason, None, queue, tag, count)
        return False

    # ----------------------------------------------------------------- audit

    def audit(self, peer: Peer, options: dict[str, Any]) -> None:
        """Admin actions are logged with who ran them."""
        command = options.get("command")
        if not isinstance(command, str) or command in OPEN_COMMANDS:
            return
        if command in CONSUME_COMMANDS or command in WRITER_COMMANDS:
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


def _owner_of(principal: Principal) -> str:
    """Whom a peer's quotas count against: its key, else its host (without the port); ""
    (only the broker-wide limits) for this host's own peers without a key (loopback, ipc,
    inproc): they are the operator's, as trusted as the admin commands they may run."""
    if principal.key is not None:
        return f"key {principal.key!r}"
    host = principal.address.rsplit(":", 1)[0] if principal.address else ""
    if not host or _is_loopback(host):
        return ""
    return f"host {host}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _patterns_bound(options: dict[str, Any]) -> list[str]:
    """The patterns a bind or rebind command would bind (those it adds or replaces with)."""
    bound: list[str] = []
    for name in ("patterns", "replace", "add"):
        value = options.get(name)
        if isinstance(value, list):
            bound.extend(item if isinstance(item, str) else "" for item in value)
    return bound
