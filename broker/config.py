"""The broker's configuration: one msgspec Struct, filled (later wins) from its defaults, an
optional TOML file, PHPMQ_* environment variables, and command-line flags."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from protocol import DEFAULT_MAX_CONTENT_BYTES

ENV_PREFIX = "PHPMQ_"
DIALECTS = ("ttl", "pre-ttl")


class ConfigError(Exception):
    """Raised when a configuration source holds an unknown key or a bad value."""


class BrokerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Where the ROUTER socket binds. Loopback by default: opening to the LAN is a choice.
    bind: str = "tcp://127.0.0.1:5555"
    #: The form of 003 sent to a peer until it speaks the TTL form itself: "ttl" (the
    #: README's 4-packet dispatch) or "pre-ttl" (the stock php-mq client's 3 packets).
    dialect: str = "ttl"
    #: Largest packet content accepted (bytes); bigger sends get a 413 error.
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES
    #: Largest ZeroMQ frame accepted (bytes); libzmq drops the connection of a peer that sends
    #: more (ZMQ_MAXMSGSIZE), so a frame of garbage cannot make us allocate without bound.
    max_frame_bytes: int = 64 * 1024 * 1024
    #: Largest consume window (count in 002) a consumer may ask for.
    max_window: int = 10_000
    #: Dead letters kept per queue; beyond it the oldest is dropped (and counted).
    dead_letter_limit: int = 10_000
    #: Frames queued per peer in libzmq before a send reports EAGAIN (then the broker keeps
    #: them itself; what it sends a consumer is bounded by the consumer's window anyway).
    send_hwm: int = 10_000
    #: Frames queued per peer on receive before libzmq stops reading that peer's TCP socket,
    #: which pushes back on a producer that outruns the broker.
    receive_hwm: int = 10_000
    #: Frames read per loop turn before the turn's dispatches are sent.
    batch_frames: int = 2_000
    #: On SIGTERM/SIGINT: seconds to wait for outstanding acks before exiting.
    grace_seconds: float = 5.0
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        positive = (
            "max_content_bytes",
            "max_frame_bytes",
            "max_window",
            "dead_letter_limit",
            "send_hwm",
            "receive_hwm",
            "batch_frames",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}")
        if self.grace_seconds < 0:
            raise ValueError("grace_seconds cannot be negative")


FIELDS = BrokerConfig.__struct_fields__


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    return {
        name: environ[ENV_PREFIX + name.upper()]
        for name in FIELDS
        if ENV_PREFIX + name.upper() in environ
    }


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """Merge defaults < TOML file < environment < overrides (None values are ignored).

    Raises:
        ConfigError: a file that cannot be read, an unknown key, or a bad value.
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values.update(tomllib.loads(Path(path).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
    values.update(_from_env(os.environ if environ is None else environ))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return msgspec.convert(values, BrokerConfig, strict=False)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
