"""The consumer side: the Python client runtime and the worker pool launcher."""

from ..client import BrokerRefused, Client, ClientError, ReceivedMessage
from .outcome import Reject, Retry

__all__ = ["BrokerRefused", "Client", "ClientError", "ReceivedMessage", "Reject", "Retry"]
