"""The broker's transports: each reads frames from its socket, hands the core the decoded
messages with the peer profile of the transport, and writes what the core returns.

- router.py: the ZeroMQ ROUTER socket for PHPMQ-framed clients (one message or more per frame);
- tcp.py: a raw TCP endpoint (ZeroMQ STREAM) for the stock PHP client.
"""

from .router import RouterTransport
from .tcp import TcpEndpoint

__all__ = ["RouterTransport", "TcpEndpoint"]
