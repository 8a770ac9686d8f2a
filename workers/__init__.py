"""The consumer side: the Python client runtime (and, later, the worker pool launcher)."""

from workers.client import BrokerRefused, Client, ClientError, ReceivedMessage

__all__ = ["BrokerRefused", "Client", "ClientError", "ReceivedMessage"]
