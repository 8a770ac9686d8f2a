"""The Python client for a phpmq-zmq broker (docs/protocol.md).

`Client` (sync.py) is the blocking driver: a ZeroMQ socket, a heartbeat thread, reconnects.
What it says and what the broker's frames mean is decided by the sans-IO `Connection`
(connection.py), which an asyncio driver can share.
"""

from .dealer import check_address
from .errors import BrokerRefused, ClientError, InvalidArgument, PartialSend, Unconfirmed
from .events import BROKER_LEAVING, BROKER_LOST, RECONNECTED, REJOINED
from .message import ReceivedMessage
from .sync import DEFAULT_ADDRESS, Client

__all__ = [
    "BROKER_LEAVING",
    "BROKER_LOST",
    "DEFAULT_ADDRESS",
    "RECONNECTED",
    "REJOINED",
    "BrokerRefused",
    "Client",
    "ClientError",
    "InvalidArgument",
    "PartialSend",
    "ReceivedMessage",
    "Unconfirmed",
    "check_address",
]
