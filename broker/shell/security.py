"""The broker shell's security (docs/security.md): reads the CURVE key files and the
permissions file at start and again on SIGHUP, runs the ZAP handler, and warns about an
endpoint open to the network without CURVE. The core only ever sees names and rights
(broker/guard.py); the crypto is libzmq's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import zmq

from ..config import BrokerConfig, env_variable
from ..core import Core
from ..guard import LINK_KEY_NAME
from ..permissions import Permissions, PermissionsError, load_permissions
from .keyring import KeyFileError, KeyPair, read_allowed, read_key_pair
from .transports.auth import HandshakeWatch

if TYPE_CHECKING:
    from .transports.zap import KeyRingAuthenticator

log = logging.getLogger("phpmq.broker")


class SecurityError(Exception):
    """A key or permissions file that stops the broker at start (file and line named)."""


class Security:
    """What the broker enforces, loaded from its files."""

    def __init__(self, config: BrokerConfig) -> None:
        """Read every file named by the config.

        Raises:
            SecurityError: a file that cannot be used, or CURVE half configured.
        """
        self.config = config
        if bool(config.curve_secret) != bool(config.curve_clients):
            raise SecurityError(
                f"CURVE needs both --curve-secret or {env_variable('curve_secret')} (the"
                f" broker's .key_secret file) and --curve-clients or"
                f" {env_variable('curve_clients')} (a directory or file of allowed client keys)"
            )
        try:
            self.keys: KeyPair | None = (
                read_key_pair(config.curve_secret) if config.curve_secret else None
            )
            self.allowed = read_allowed(config.curve_clients) if config.curve_clients else {}
            self.permissions = self._permissions()
        except (KeyFileError, PermissionsError) as exc:
            raise SecurityError(str(exc)) from None
        self._authenticator: KeyRingAuthenticator | None = None
        self._watch: HandshakeWatch | None = None
        self._core: Core | None = None
        self.reloads = 0

    def _permissions(self) -> Permissions:
        path = self.config.permissions
        return load_permissions(path) if path else Permissions()

    def _ring(self, allowed: dict[bytes, str]) -> dict[bytes, str]:
        """The allowed keys and the broker's own (its shards' links connect with it)."""
        assert self.keys is not None
        return {**allowed, self.keys.public: LINK_KEY_NAME}

    def start(self, context: zmq.Context) -> None:
        """Start the ZAP handler: before the ROUTER binds, or libzmq would let anyone in."""
        if self.keys is None:
            return
        from .transports.zap import KeyRingAuthenticator  # asyncio: only with CURVE

        self._authenticator = KeyRingAuthenticator(context, self._ring(self.allowed))
        self._authenticator.start()

    def watch(self, router: zmq.Socket) -> None:
        """Count the handshakes of `router` that fail before ZAP (a client without a key)."""
        if self.keys is not None:
            self._watch = HandshakeWatch(router)
            self._watch.start()

    def apply(self, core: Core) -> None:
        self._core = core
        core.set_permissions(self.permissions)
        core.admin.stats.add_section("security", self.stats)
        self.warn_if_open(core)

    def warn_if_open(self, core: Core) -> None:
        config = self.config
        if self.keys is None and not config.binds_loopback():
            admin = (
                "admin commands need the admin secret"
                if config.admin_secret
                else "admin commands are refused (no --admin-secret)"
            )
            log.warning(
                "%s is reachable from the network without CURVE: anyone who can reach it may"
                " send and consume (%s). Use --curve-secret/--curve-clients (docs/security.md)",
                config.bind,
                admin,
            )

    def reload(self, core: Core) -> None:
        """SIGHUP: read the client keys and the permissions again; connected peers stay,
        with their rights re-checked. A file that cannot be read keeps the old settings."""
        config = self.config
        try:
            allowed = read_allowed(config.curve_clients) if config.curve_clients else {}
            permissions = self._permissions()
        except (KeyFileError, PermissionsError) as exc:
            log.error("SIGHUP: kept the previous keys and permissions: %s", exc)
            return
        self.allowed, self.permissions = allowed, permissions
        if self._authenticator is not None:
            self._authenticator.replace(self._ring(allowed))
        core.set_permissions(permissions)
        self.reloads += 1
        log.info(
            "SIGHUP: %d client keys allowed, permissions from %s",
            len(allowed),
            config.permissions or "(none: every allowed key may do everything)",
        )

    def stats(self) -> dict[str, Any]:
        authenticator, watch = self._authenticator, self._watch
        denied = (authenticator.denied if authenticator is not None else 0) + (
            watch.failed if watch is not None else 0
        )
        return {
            "curve": self.keys is not None,
            "allowed_keys": len(self.allowed),
            "handshakes_denied": denied,
            "permissions": self.config.permissions or None,
            "reloads": self.reloads,
            "refused": dict(self._core.guard.refused) if self._core is not None else {},
            "quotas": self._core.ctx.quotas.stats() if self._core is not None else {},
        }

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None
