"""A handler that does nothing: the worker pool benchmark measures the pool, not the work."""

from ..client import ReceivedMessage


def handle(message: ReceivedMessage) -> None:
    return None


def echo(message: ReceivedMessage) -> bytes:
    """Answers a request with its own content (the RPC benchmark's trivial handler)."""
    return message.content
