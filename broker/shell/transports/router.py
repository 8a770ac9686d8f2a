"""The ZeroMQ ROUTER transport: each frame from a client is one or more concatenated PHPMQ
messages, addressed by the peer's routing id. The peer id the core sees is that routing id.
"""

from __future__ import annotations

import time

import zmq

from ....protocol import RemoteProtocolError
from ...config import BrokerConfig
from ...core import Core, default_profile
from ...guard import Principal
from ..keyring import KeyPair
from .auth import frame_address, frame_user_id, make_curve_server

#: Connections whose identity the router remembers; past it, it starts over (and reads each
#: connection's identity from its next frame again).
MAX_KNOWN_PEERS = 65_536
RCVMORE = zmq.RCVMORE

MULTIPART_ERROR = RemoteProtocolError(
    "multipart ZeroMQ message: PHPMQ travels in single-part frames (a REQ socket adds an"
    " empty delimiter part; use DEALER)"
)


class RouterTransport:
    def __init__(
        self, context: zmq.Context, config: BrokerConfig, curve: KeyPair | None = None
    ) -> None:
        """Bind the ROUTER socket (a CURVE server with these keys, if given).

        Raises:
            zmq.ZMQError: the address cannot be bound (the socket is closed again).
        """
        self.profile = default_profile(config)
        self.socket = socket = context.socket(zmq.ROUTER)
        socket.linger = 0
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone peer raises, not drops
        socket.sndhwm = config.send_hwm
        socket.rcvhwm = config.receive_hwm
        socket.setsockopt(zmq.MAXMSGSIZE, config.max_frame_bytes)
        if curve is not None:
            make_curve_server(socket, curve)
        #: Who each connection is (CURVE key name, address), read from its first frame.
        self._known: dict[bytes, Principal] = {}
        #: With rights in force (CURVE, a permissions file, an admin secret), who a peer is
        #: is read from every frame: a routing id may be reused by another connection once
        #: the first is gone, and must not inherit its rights (about 1 µs a frame). Without
        #: them every peer may do everything and the first frame's word is kept.
        self._every_frame = config.secured()
        try:
            socket.bind(config.bind)
        except zmq.ZMQError:
            socket.close()
            raise
        self.endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def receive(self, core: Core, limit: int, deadline: float) -> tuple[int, bool]:
        """Read up to `limit` frames and hand them to the core, stopping once
        `time.perf_counter()` reaches `deadline`. Returns (frames read, whether the socket
        had nothing more to read)."""
        socket = self.socket
        recv = socket.recv
        more = socket.getsockopt  # more(RCVMORE): the property form costs a lookup per frame
        known = self._known
        handle_frame = core.handle_frame
        profile = self.profile
        clock = time.perf_counter
        every_frame = self._every_frame
        read = 0
        while read < limit:
            try:
                peer_id = recv(zmq.NOBLOCK)
            except zmq.Again:
                return read, True
            read += 1
            principal = known.get(peer_id)
            if principal is None or every_frame:
                frame = recv(copy=False)
                principal = self._identify(peer_id, frame, principal)
                data = frame.bytes
            else:
                data = recv()
            if more(RCVMORE):
                # A REQ socket's empty delimiter or extra frames: not our framing.
                while more(RCVMORE):
                    recv()
                core.handle_messages(peer_id, [], MULTIPART_ERROR, profile, None, principal)
            else:
                handle_frame(peer_id, data, profile, principal)
            if clock() >= deadline:
                break
        return read, False

    def _identify(self, peer_id: bytes, frame: zmq.Frame, known: Principal | None) -> Principal:
        """Who sent the frame: the principal known for its routing id while the frame's
        connection is the same (key and address), else a new one (the core sees a new
        connection and forgets the old one's state)."""
        key, address = frame_user_id(frame), frame_address(frame)
        if known is not None and known.address == address and known.key == key:
            return known
        by_id = self._known
        if len(by_id) >= MAX_KNOWN_PEERS:
            by_id.clear()
        principal = by_id[peer_id] = Principal(key, address, "router")
        return principal

    def has_input(self) -> bool:
        """Whether a frame is waiting to be read (libzmq's own answer, no system call)."""
        return bool(self.socket.get(zmq.EVENTS) & zmq.POLLIN)

    def send(self, peer_id: bytes, frame: bytes, flags: int = 0) -> None:
        """Raises zmq.Again when the peer's queue is full, EHOSTUNREACH when it is gone."""
        self.socket.send_multipart((peer_id, frame), flags)

    def close(self, linger_ms: int) -> None:
        self.socket.close(linger=linger_ms)
