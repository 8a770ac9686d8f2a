"""The ZeroMQ ROUTER transport: each frame from a client is one or more concatenated PHPMQ
messages, addressed by the peer's routing id. The peer id the core sees is that routing id.
"""

from __future__ import annotations

import time

import zmq

from ...protocol import RemoteProtocolError
from ..config import BrokerConfig
from ..core import Core, default_profile

MULTIPART_ERROR = RemoteProtocolError(
    "multipart ZeroMQ message: PHPMQ travels in single-part frames (a REQ socket adds an"
    " empty delimiter part; use DEALER)"
)


class RouterTransport:
    def __init__(self, context: zmq.Context, config: BrokerConfig) -> None:
        """Bind the ROUTER socket.

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
        recv = self.socket.recv_multipart
        handle_frame = core.handle_frame
        profile = self.profile
        clock = time.perf_counter
        read = 0
        while read < limit:
            try:
                frames = recv(zmq.NOBLOCK)
            except zmq.Again:
                return read, True
            read += 1
            if len(frames) == 2:
                handle_frame(frames[0], frames[1], profile)
            else:
                # A REQ socket's empty delimiter or extra frames: not our framing.
                core.handle_messages(frames[0], [], MULTIPART_ERROR, profile)
            if clock() >= deadline:
                break
        return read, False

    def has_input(self) -> bool:
        """Whether a frame is waiting to be read (libzmq's own answer, no system call)."""
        return bool(self.socket.get(zmq.EVENTS) & zmq.POLLIN)

    def send(self, peer_id: bytes, frame: bytes, flags: int = 0) -> None:
        """Raises zmq.Again when the peer's queue is full, EHOSTUNREACH when it is gone."""
        self.socket.send_multipart((peer_id, frame), flags)

    def close(self, linger_ms: int) -> None:
        self.socket.close(linger=linger_ms)
