"""A shard's links to the other shards of its cluster (docs/cluster.md "Forwarding"): one
DEALER per other shard, speaking the ordinary client protocol (HELLO with role "link",
heartbeats both ways) and carrying 113 FORWARDs.

A link is lost when its shard is silent for interval x liveness: its queues are refused with
503 (naming the shard) until it answers HELLO again on a new socket. A shard that answers
with another map is refused as a link (the two disagree on the cluster) and logged. Frames
the socket will not take yet wait in a bounded backlog; past it the link is treated as lost.

A replicated shard (docs/cluster.md "Replicated queues") has several endpoints, one per
replica: the link goes to the one its shard's replicas name as the leader (a follower's
HELLO answer says `standby` and `leader`), and to the next replica when the one it has is
silent or knows no leader.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque

import msgspec
import zmq

from ....protocol import (
    Disconnect,
    Forward,
    Heartbeat,
    Hello,
    Kbai,
    decode_frame,
    encode,
)
from ....protocol.cluster import ClusterMap, Shard
from ...config import BrokerConfig
from ...core import Core
from ...guard import LINK_ROLE
from ..keyring import KeyPair

log = logging.getLogger("phpmq.links")

#: The heartbeat a link asks for, and how many missed ones make its shard lost.
LINK_HEARTBEAT_MS = 1000
LINK_LIVENESS = 3
#: Frames a link holds while its socket will not take them; past it the link is lost.
MAX_LINK_BACKLOG = 10_000
#: A follower that knows no leader yet (an election) is asked again after this long, at the
#: next replica.
FOLLOWER_RETRY_S = 0.5


class _Link:
    __slots__ = (
        "answered",
        "backlog",
        "disagrees",
        "dropped",
        "last_heard",
        "last_sent",
        "lost",
        "retry_at",
        "shard",
        "socket",
        "target",
        "targets",
    )

    def __init__(self, shard: Shard, own_endpoint: str) -> None:
        self.shard = shard
        #: Where the shard may be reached (each of its replicas but this broker), and which
        #: one the link uses now.
        self.targets = [
            address for address in shard.replicas or (shard.address,) if address != own_endpoint
        ]
        self.target = 0
        #: A follower without a leader answered: try the next replica then (0: not waiting).
        self.retry_at = 0.0
        self.socket: zmq.Socket | None = None
        self.last_heard = 0.0
        self.last_sent = 0.0
        #: Its shard answered HELLO on the current socket.
        self.answered = False
        #: Silent too long, or not taking frames: its queues are refused meanwhile.
        self.lost = False
        #: Why it is refused as a link (another map), or "".
        self.disagrees = ""
        self.backlog: deque[bytes] = deque()
        #: Frames thrown away with a backlog that overflowed (the link was lost then).
        self.dropped = 0


class Links:
    def __init__(
        self, context: zmq.Context, config: BrokerConfig, core: Core, curve: KeyPair | None = None
    ) -> None:
        """`curve`: the broker's key pair, which every shard of a CURVE cluster shares; the
        links connect with it."""
        forwarding = core.forwarding
        assert forwarding is not None
        self._context = context
        self._curve = curve
        self._config = config
        self._core = core
        self._forwarding = forwarding
        self._map = msgspec.json.decode(config.cluster.encode(), type=ClusterMap)
        # A follower replica links to its own shard too: to its leader.
        self._links = {
            shard.name: _Link(shard, config.bind)
            for shard in self._map.shards
            if shard.name != config.shard or (shard.replicas and len(shard.replicas) > 1)
        }
        self._by_socket: dict[zmq.Socket, _Link] = {}
        #: Other epochs of the map that links answered with, each logged once.
        self._epochs_seen: set[int] = set()
        self.interval = LINK_HEARTBEAT_MS / 1000
        #: Set when sockets were replaced: the server polls the new ones.
        self.sockets_changed = True
        self._hello = encode(
            Hello(
                {
                    "role": LINK_ROLE,
                    "name": config.shard,
                    "heartbeat_ms": LINK_HEARTBEAT_MS,
                    "liveness": LINK_LIVENESS,
                    # Without CURVE, what proves this link is the cluster's own.
                    **({"link_secret": config.link_secret} if config.link_secret else {}),
                }
            )
        )
        now = time.monotonic()
        for link in self._links.values():
            self._connect(link, now)

    @property
    def sockets(self) -> list[zmq.Socket]:
        self.sockets_changed = False
        return list(self._by_socket)

    def _connect(self, link: _Link, now: float) -> None:
        if link.socket is not None:
            del self._by_socket[link.socket]
            link.socket.close(linger=0)
        sock = self._context.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = self._config.send_hwm
        sock.setsockopt(zmq.MAXMSGSIZE, self._config.max_frame_bytes)
        if self._curve is not None:
            sock.curve_publickey = self._curve.public
            sock.curve_secretkey = self._curve.secret
            sock.curve_serverkey = self._curve.public
        sock.connect(link.targets[link.target])
        link.socket = sock
        link.answered = False
        link.last_heard = now
        link.backlog.clear()
        self._by_socket[sock] = link
        self.sockets_changed = True
        self._write(link, self._hello, now)

    # ------------------------------------------------------------------ sending

    def send(self, forwards: list[tuple[str, bytes]]) -> None:
        now = time.monotonic()
        for name, frame in forwards:
            link = self._links.get(name)
            if link is not None:
                self._write(link, frame, now)

    def _write(self, link: _Link, frame: bytes, now: float) -> None:
        sock = link.socket
        assert sock is not None
        if link.backlog:
            if len(link.backlog) >= MAX_LINK_BACKLOG:
                link.dropped += len(link.backlog) + 1
                self._lose(link, "its link does not take frames", now)
                return
            link.backlog.append(frame)
            return
        try:
            sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            link.backlog.append(frame)
            return
        link.last_sent = now

    def _flush(self, link: _Link, now: float) -> None:
        sock = link.socket
        assert sock is not None
        while link.backlog:
            try:
                sock.send(link.backlog[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            link.backlog.popleft()
            link.last_sent = now

    # ------------------------------------------------------------------ reading

    def receive(self, core: Core, limit: int, deadline: float) -> tuple[int, bool]:
        """Read up to `limit` frames from the links (the server's transports' signature)."""
        read = 0
        drained = True
        now = time.monotonic()
        for sock, link in list(self._by_socket.items()):
            while read < limit and link.socket is sock:  # a frame may replace the socket
                try:
                    frame = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                read += 1
                self._on_frame(link, frame, now)
            else:
                drained = False
            if time.perf_counter() >= deadline:
                return read, False
        return read, drained

    def has_input(self) -> bool:
        return any(sock.get(zmq.EVENTS) & zmq.POLLIN for sock in self._by_socket)

    def _on_frame(self, link: _Link, frame: bytes, now: float) -> None:
        link.last_heard = now
        messages, error = decode_frame(frame, self._config.max_content_bytes)
        forwarding = self._forwarding
        for message in messages:
            if type(message) is Forward:
                forwarding.on_link_message(message, link.shard.name)
            elif type(message) is Hello:
                self._on_answer(link, message, now)
            elif type(message) is Disconnect:
                # The shard does not know us (it restarted) or is leaving: HELLO again, on
                # the same socket, so that it keeps taking us for the same link.
                log.info("shard %s: %s", link.shard.name, message.reason)
                link.answered = False
                self._write(link, self._hello, now)
            elif type(message) not in (Heartbeat, Kbai):
                log.warning("shard %s sent %s on a link", link.shard.name, type(message).__name__)
        if error is not None:
            log.warning("undecodable frame from shard %s: %s", link.shard.name, error.reason)

    def _on_answer(self, link: _Link, answer: Hello, now: float) -> None:
        theirs = answer.options.get("cluster")
        if theirs is not None:
            try:
                theirs = msgspec.convert(theirs, ClusterMap)
            except (msgspec.ValidationError, ValueError):
                theirs = None
        if not _same_shards(theirs, self._map) or answer.options.get("shard") != link.shard.name:
            why = (
                f"shard at {link.targets[link.target]} answers as {answer.options.get('shard')!r}"
                f" with another cluster map (epoch {getattr(theirs, 'epoch', None)}, ours"
                f" {self._map.epoch}): the two disagree on the cluster; not linking"
            )
            if why != link.disagrees:
                log.error("%s", why)
            link.disagrees = why
            self._forwarding.link_down(link.shard.name, why)
            return
        link.disagrees = ""
        assert theirs is not None
        if theirs.epoch != self._map.epoch and theirs.epoch not in self._epochs_seen:
            self._epochs_seen.add(theirs.epoch)
            log.warning(
                "shard %s has the cluster map of epoch %d, this replica %d: the nodes read"
                " different cluster files (a membership change not yet taken everywhere?)",
                link.shard.name,
                theirs.epoch,
                self._map.epoch,
            )
        if "standby" in answer.options:
            self._follow(link, answer.options.get("leader"), now)
            return
        link.retry_at = 0.0
        link.answered = True
        was_lost, link.lost = link.lost, False
        self._forwarding.link_up(link.shard.name)
        if was_lost:
            log.info("shard %s answers again", link.shard.name)

    def _follow(self, link: _Link, leader: object, now: float) -> None:
        """A follower replica answered: go to the leader it names, or, if it knows none
        (an election), ask the next replica a moment later."""
        targets = link.targets
        if type(leader) is str and leader in targets and targets.index(leader) != link.target:
            link.target = targets.index(leader)
            self._connect(link, now)
            return
        self._forwarding.link_down(
            link.shard.name, f"no leader of shard {link.shard.name} is known yet"
        )
        link.retry_at = now + FOLLOWER_RETRY_S

    def set_map(self, cluster_map: ClusterMap) -> None:
        """A new map of the same shards (docs/cluster.md "Membership"): a link whose replica
        is gone from its shard goes to another."""
        self._map = cluster_map
        self._epochs_seen.clear()
        now = time.monotonic()
        for shard in cluster_map.shards:
            link = self._links.get(shard.name)
            if link is None:
                continue
            targets = _Link(shard, self._config.bind).targets
            current = link.targets[link.target] if link.targets else None
            link.shard, link.targets = shard, targets
            if current in targets:
                link.target = targets.index(current)
            elif targets:
                link.target = 0
                self._connect(link, now)

    def retire(self, name: str) -> None:
        """No more link to shard `name` (this replica leads it now)."""
        link = self._links.pop(name, None)
        if link is not None and link.socket is not None:
            del self._by_socket[link.socket]
            link.socket.close(linger=0)
            self.sockets_changed = True

    # ------------------------------------------------------------------ liveness

    def tick(self) -> None:
        """Heartbeats, loss of silent shards, backlogs: once per loop turn."""
        now = time.monotonic()
        for link in list(self._links.values()):
            if link.backlog:
                self._flush(link, now)
            silent = now - link.last_heard
            if link.retry_at and now >= link.retry_at:
                link.retry_at = 0.0
                link.target = (link.target + 1) % len(link.targets)
                self._connect(link, now)
            elif silent > self.interval * LINK_LIVENESS:
                self._lose(link, f"silent for {silent:.1f}s", now)
            elif link.answered and now - link.last_sent >= self.interval:
                self._write(link, encode(Heartbeat()), now)

    def _lose(self, link: _Link, why: str, now: float) -> None:
        if not link.lost:
            log.warning("shard %s lost: %s", link.shard.name, why)
        link.lost = True
        self._forwarding.link_down(link.shard.name, why)
        link.target = (link.target + 1) % len(link.targets)  # another replica, if any
        self._connect(link, now)

    def close(self) -> None:
        for link in self._links.values():
            if link.socket is not None:
                with contextlib.suppress(zmq.ZMQError):
                    link.socket.send(encode(Kbai()), zmq.NOBLOCK)
                link.socket.close(linger=100)
                link.socket = None
        self._by_socket.clear()

    def stats(self) -> dict[str, object]:
        return {
            name: {
                "address": link.targets[link.target],
                "state": "refused" if link.disagrees else "lost" if link.lost else "up",
                "backlog_frames": len(link.backlog),
                "frames_dropped": link.dropped,
            }
            for name, link in self._links.items()
        }


def _same_shards(theirs: ClusterMap | None, ours: ClusterMap) -> bool:
    """Whether two maps agree on the shards (so on every queue's owner). In a replicated
    cluster a change of membership moves replicas, never shards, and nodes take it one after
    the other (docs/cluster.md "Membership"); without replicas the maps must be equal."""
    if theirs is None:
        return False
    if not any(shard.replicas for shard in ours.shards):
        return theirs == ours
    return [shard.name for shard in theirs.shards] == [shard.name for shard in ours.shards]
