"""Where a node's broker processes listen: a shard's (or replica's) endpoint is the node's
address with its port + the process's index (docs/cluster.md)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from ..config import metrics_address, metrics_bind_text


def shard_address(bind: str, index: int) -> str:
    """The endpoint shard `index` binds: the --bind address with its port + index.

    Raises:
        ValueError: not a tcp://host:port address.
    """
    parts = urlsplit(bind)
    if parts.scheme == "tcp" and parts.netloc.endswith(":*"):
        # Every shard is told the whole map before any binds, so no shard can take a port
        # the system picks: the ports are fixed here.
        raise ValueError(
            f"--shards needs a fixed port in --bind (shard i binds port + i), not {bind!r}"
        )
    if parts.scheme != "tcp" or parts.port is None:
        raise ValueError(f"--shards needs a tcp://host:port --bind address, not {bind!r}")
    host = parts.hostname or ""
    return f"tcp://{host}:{parts.port + index}"


def shard_metrics_bind(bind: str, index: int) -> str:
    """Where shard `index` serves /metrics: the --metrics-bind port + index ("": off).

    Raises:
        ValueError: the port + index is past 65535.
    """
    if not bind:
        return ""
    return metrics_bind_text(*metrics_address(bind, index))


def advertised(address: str) -> str:
    """The address clients connect to: a wildcard host becomes this host's name."""
    parts = urlsplit(address)
    if parts.hostname in ("*", "0.0.0.0", "::", ""):
        return f"tcp://{socket.gethostname()}:{parts.port}"
    return address
