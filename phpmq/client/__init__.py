"""The Python client for a phpmq-zmq broker (docs/protocol.md)."""

from .sync import (
    BROKER_LEAVING,
    BROKER_LOST,
    DEFAULT_ADDRESS,
    RECONNECTED,
    REJOINED,
    BrokerRefused,
    Client,
    ClientError,
    PartialSend,
    ReceivedMessage,
    Unconfirmed,
    check_address,
)

__all__ = [
    "BROKER_LEAVING",
    "BROKER_LOST",
    "DEFAULT_ADDRESS",
    "RECONNECTED",
    "REJOINED",
    "BrokerRefused",
    "Client",
    "ClientError",
    "PartialSend",
    "ReceivedMessage",
    "Unconfirmed",
    "check_address",
]
