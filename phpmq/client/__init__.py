"""The Python client for a phpmq-zmq broker (docs/protocol.md).

`Client` (sync.py) is the blocking driver: a ZeroMQ socket, a heartbeat thread, reconnects;
`AsyncClient` (aio.py) is the asyncio one, and the source tools/unasync.py writes sync.py from.
What both say and what the broker's frames mean is decided by the sans-IO `Connection`
(connection.py) they share (docs/client.md).
"""

from ..protocol import DEFAULT_ADDRESS
from .aio import AsyncClient
from .curve import Curve, curve_keys
from .dealer import check_address
from .driver import BROKER_VARIABLE
from .errors import (
    BrokerRefused,
    ClientError,
    CurveKeyError,
    InvalidArgument,
    JoinRefused,
    NotTaken,
    PartialSend,
    Paused,
    QueueDeleted,
    ReplyError,
    RequestLost,
    RequestTimeout,
    Unconfirmed,
)
from .events import BROKER_LEAVING, BROKER_LOST, QUEUE_DELETED, RECONNECTED, REJOINED
from .message import AsyncReceivedMessage, ReceivedMessage
from .sync import Client

__all__ = [
    "BROKER_LEAVING",
    "BROKER_LOST",
    "BROKER_VARIABLE",
    "DEFAULT_ADDRESS",
    "QUEUE_DELETED",
    "RECONNECTED",
    "REJOINED",
    "AsyncClient",
    "AsyncReceivedMessage",
    "BrokerRefused",
    "Client",
    "ClientError",
    "Curve",
    "CurveKeyError",
    "InvalidArgument",
    "JoinRefused",
    "NotTaken",
    "PartialSend",
    "Paused",
    "QueueDeleted",
    "ReceivedMessage",
    "ReplyError",
    "RequestLost",
    "RequestTimeout",
    "Unconfirmed",
    "check_address",
    "curve_keys",
]
