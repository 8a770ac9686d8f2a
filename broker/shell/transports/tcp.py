"""The raw-TCP endpoint for stock PHPMQ clients: a ZeroMQ STREAM socket in the broker's
poller, feeding the same core as the ROUTER.

A TCP connection is a byte stream, so each one gets an incremental decoder: messages may
arrive split at any byte, several in one read. A connection's peer id in the core is the
STREAM routing id behind a prefix no ROUTER identity can have, so the two endpoints never mix
up their peers; the core itself never reads ids, it gets this transport's peer profile.
Closing the connection is a consumer's death: its messages go back to their queues at once.
A malformed stream closes the connection with a log line naming the peer and the reason;
nothing else is affected.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Sequence

import zmq

from ....protocol import ProtocolError, StreamDecoder
from ...core import Core
from ...guard import Principal
from ...model import PeerProfile

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

log = logging.getLogger("phpmq.broker")

#: Peer ids of raw-TCP connections: the STREAM routing id behind two zero bytes, a prefix no
#: ROUTER identity has (libzmq refuses custom identities starting with a zero byte, and its
#: own are 5 bytes long).
TCP_PEER_PREFIX = b"\x00\x00tcp:"


class TcpEndpoint:
    def __init__(
        self,
        context: zmq.Context,
        address: str,
        max_content_bytes: int,
        ttl_form: bool,
        networks: Sequence[IPNetwork] = (),
    ) -> None:
        #: Stock clients speak the pre-TTL form unless configured otherwise; the broker
        #: closes the connection of a peer it gives up on.
        self.profile = PeerProfile("tcp", ttl_form=ttl_form, closable=True)
        self.socket = context.socket(zmq.STREAM)
        self.socket.linger = 0
        self.max_content_bytes = max_content_bytes
        try:
            self.socket.bind(address)
        except zmq.ZMQError:
            self.socket.close()
            raise
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        #: The client networks served (docs/security.md); other connections are closed.
        self.networks = list(networks)
        #: Connections closed because their address is not in `networks`.
        self.refused_connections = 0
        #: routing id -> (decoder, who) for each open connection.
        self._connections: dict[bytes, tuple[StreamDecoder, Principal]] = {}
        self._pending_closes: set[bytes] = set()

    @staticmethod
    def owns(peer_id: bytes) -> bool:
        return peer_id.startswith(TCP_PEER_PREFIX)

    def receive(self, core: Core, limit: int, deadline: float) -> tuple[int, bool]:
        """Read up to `limit` chunks and hand what decodes to the core, stopping once
        `time.perf_counter()` reaches `deadline`. Returns (chunks read, whether the socket
        had nothing more to read)."""
        recv = self.socket.recv_multipart
        clock = time.perf_counter
        read = 0
        while read < limit:
            try:
                routing_id, chunk = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return read, True
            read += 1
            self._on_chunk(core, routing_id.bytes, chunk)
            if clock() >= deadline:
                break
        return read, False

    def has_input(self) -> bool:
        """Whether a chunk is waiting to be read."""
        return bool(self.socket.get(zmq.EVENTS) & zmq.POLLIN)

    def _on_chunk(self, core: Core, routing_id: bytes, chunk: zmq.Frame) -> None:
        data = chunk.bytes
        connection = self._connections.get(routing_id)
        if connection is None:
            if not data:  # a new connection
                self._accept(routing_id, _peer_address(chunk))
            return
        peer_id = TCP_PEER_PREFIX + routing_id
        if not data:  # the client closed the connection: a consumer's death
            del self._connections[routing_id]
            core.peer_gone(peer_id)
            return
        decoder, principal = connection
        decoder.receive_data(data)
        messages = []
        error: ProtocolError | None = None
        try:
            while (message := decoder.next_message()) is not None:
                messages.append(message)
        except ProtocolError as exc:
            error = exc
        if messages:
            core.handle_messages(peer_id, messages, None, self.profile, None, principal)
        if error is not None:
            log.warning("closing TCP connection from %s: %s", principal.address, error.reason)
            self.close(routing_id)
            core.peer_gone(peer_id)

    def _accept(self, routing_id: bytes, address: str) -> None:
        """A new connection: served if its address is in an allowed network, else closed."""
        if not self._allowed(address):
            self.refused_connections += 1
            if self.refused_connections <= 10 or self.refused_connections % 1000 == 0:
                log.warning(
                    "closing TCP connection from %s: not in tcp_allow (%d refused so far)",
                    address,
                    self.refused_connections,
                )
            self.close(routing_id)
            return
        decoder = StreamDecoder(self.max_content_bytes)
        self._connections[routing_id] = (decoder, Principal(None, address))

    def _allowed(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def send(self, peer_id: bytes, frame: bytes, flags: int = 0) -> None:
        """Write a frame (every message in it whole) to a connection.

        Raises:
            zmq.ZMQError: the connection is gone (EHOSTUNREACH) or full (Again).
        """
        self.socket.send_multipart((peer_id[len(TCP_PEER_PREFIX) :], frame), flags)

    def close_peer(self, peer_id: bytes) -> None:
        """Close the connection of a core peer id (one the broker gave up on)."""
        self.close(peer_id[len(TCP_PEER_PREFIX) :])

    def close(self, routing_id: bytes) -> None:
        """Close a connection. Behind a full send buffer the close waits its turn: it is
        retried (`retry_closes`) until the frames before it have left."""
        self._connections.pop(routing_id, None)
        try:
            self.socket.send_multipart((routing_id, b""), zmq.NOBLOCK)
        except zmq.Again:
            self._pending_closes.add(routing_id)
        except zmq.ZMQError:
            pass  # already gone

    def retry_closes(self) -> None:
        pending, self._pending_closes = self._pending_closes, set()
        for routing_id in pending:
            self.close(routing_id)

    def shutdown(self) -> None:
        self.socket.close(linger=0)


def _peer_address(frame: zmq.Frame) -> str:
    try:
        return frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):
        return "an unknown address"
