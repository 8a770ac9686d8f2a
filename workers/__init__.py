"""The consumer side: the Python client runtime and the worker pool launcher."""

from workers.client import BrokerRefused, Client, ClientError, ReceivedMessage
from workers.outcome import Reject, Retry

__all__ = ["BrokerRefused", "Client", "ClientError", "ReceivedMessage", "Reject", "Retry"]
