"""phpmq-zmq: a PHPMQ message broker on ZeroMQ for LAN deployments.

The names users touch, importable from here:

    from phpmq import AsyncClient, Client, Retry, Reject, curve_keys

Parts: `phpmq.protocol` (the sans-IO codec), `phpmq.broker` (the broker), `phpmq.client`
(the Python client), `phpmq.workers` (the worker pool), `phpmq.bridges`, `phpmq.pipeline`
(Spark), `phpmq.bench`. The names below load their module on first use, so that importing
`phpmq.protocol` does not also load ZeroMQ.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .client import (
        AsyncClient,
        BrokerRefused,
        Client,
        ClientError,
        InvalidArgument,
        JoinRefused,
        NotTaken,
        PartialSend,
        Paused,
        QueueDeleted,
        ReceivedMessage,
        ReplyError,
        RequestLost,
        RequestTimeout,
        Unconfirmed,
        curve_keys,
    )
    from .workers.outcome import Reject, Retry

#: Public name -> the module that defines it.
_LAZY = {
    "AsyncClient": ".client",
    "BrokerRefused": ".client",
    "Client": ".client",
    "ClientError": ".client",
    "InvalidArgument": ".client",
    "JoinRefused": ".client",
    "NotTaken": ".client",
    "PartialSend": ".client",
    "Paused": ".client",
    "QueueDeleted": ".client",
    "ReceivedMessage": ".client",
    "ReplyError": ".client",
    "RequestLost": ".client",
    "RequestTimeout": ".client",
    "Unconfirmed": ".client",
    "Reject": ".workers.outcome",
    "Retry": ".workers.outcome",
    "curve_keys": ".client",
}

__all__ = [
    "AsyncClient",
    "BrokerRefused",
    "Client",
    "ClientError",
    "InvalidArgument",
    "JoinRefused",
    "NotTaken",
    "PartialSend",
    "Paused",
    "QueueDeleted",
    "ReceivedMessage",
    "Reject",
    "ReplyError",
    "RequestLost",
    "RequestTimeout",
    "Retry",
    "Unconfirmed",
    "__version__",
    "curve_keys",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'phpmq' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
