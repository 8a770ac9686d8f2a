"""Bridges into the broker: existing ZeroMQ senders become queue producers.

pull-in  PULL socket; each message -> a send to a queue. When the broker does not take a
         message, the bridge stops reading: the PULL socket fills to its high-water mark and
         the PUSH side blocks (ZeroMQ's own backpressure) instead of anything being dropped.
sub-in   SUB socket with topic filters; each message -> a send to the queue mapped from its
         topic. Turns a lossy PUB stream into a durable queue from the moment it is read.
"""

from __future__ import annotations

import logging
import time

import zmq

from ..client import BrokerRefused, PartialSend
from .base import POLL_MS, Bridge, open_socket

log = logging.getLogger("phpmq.bridge")

#: Messages read from the tool's socket per step; they go to the broker in one frame.
READ_BATCH = 256
#: Pause before retrying a send the broker did not take.
RETRY_PAUSE_S = 0.5


class Inbound(Bridge):
    """Reads messages from a tool socket and hands them to the broker's socket, never dropping
    one it read: a batch is retried until the socket took it (or the bridge is stopped, and
    says how many it could not hand over). Broker refusals are counted (docs/bridges.md)."""

    def __init__(self, broker: str, name: str, report_seconds: float, sock: zmq.Socket) -> None:
        counters = ("received", "sent", "send_retries", "refused")
        super().__init__(broker, name, report_seconds, counters)
        self.sock = sock

    def step(self) -> None:
        if not self.sock.poll(POLL_MS):
            return
        batch: list[tuple[str, bytes]] = []
        while len(batch) < READ_BATCH:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            routed = self.route(frames)
            if routed is not None:
                batch.append(routed)
        self.counters["received"] += len(batch)
        self._hand_over(batch)

    def route(self, frames: list[bytes]) -> tuple[str, bytes] | None:
        raise NotImplementedError

    def _hand_over(self, batch: list[tuple[str, bytes]]) -> None:
        by_queue: dict[str, list[bytes]] = {}
        for queue, content in batch:
            by_queue.setdefault(queue, []).append(content)
        for queue, contents in by_queue.items():
            while contents:
                try:
                    self.client.send_many(queue, contents)
                    self.counters["sent"] += len(contents)
                    break
                except ValueError as exc:  # a queue name no broker accepts: never sent
                    self.counters["refused"] += len(contents)
                    log.warning("dropping %d messages: %s", len(contents), exc)
                    break
                except PartialSend as exc:
                    # Also Paused (a BrokerRefused too): the broker paused the queue and did
                    # not resume it within send_timeout. Backpressure, not a refusal.
                    # Frames before the one refused went out: resend only the rest.
                    self.counters["sent"] += exc.sent
                    contents = contents[exc.sent :]
                    # Backpressure or no broker: keep the batch, read nothing more meanwhile.
                    if self.stopping:
                        log.error(
                            "stopping with %d messages not handed to the broker: %s",
                            len(contents),
                            exc,
                        )
                        return
                    self.counters["send_retries"] += 1
                    log.warning(
                        "broker did not take %d messages (%s); retrying", len(contents), exc
                    )
                    time.sleep(RETRY_PAUSE_S)
                except BrokerRefused as exc:  # earlier sends (a full queue): not these yet
                    self.refused_by_broker(exc)


class PullIn(Inbound):
    kind = "pull-in"

    def __init__(
        self,
        broker: str,
        address: str,
        bind: bool,
        queue: str | None,
        name: str,
        report_seconds: float,
        hwm: int,
    ) -> None:
        sock = open_socket(zmq.Context.instance(), zmq.PULL, address, bind, hwm)
        super().__init__(broker, name, report_seconds, sock)
        self.queue = queue

    def route(self, frames: list[bytes]) -> tuple[str, bytes] | None:
        """One frame: content for --queue. Two frames (no --queue): [queue, content]."""
        if self.queue is not None and len(frames) == 1:
            return self.queue, frames[0]
        if self.queue is None and len(frames) == 2:
            return frames[0].decode(errors="replace"), frames[1]
        self.counters["refused"] += 1
        log.warning(
            "dropping a %d-part message: expected %s",
            len(frames),
            "1 part (the content)" if self.queue else "2 parts (queue, content)",
        )
        return None


class SubIn(Inbound):
    kind = "sub-in"

    def __init__(
        self,
        broker: str,
        address: str,
        bind: bool,
        topics: dict[str, str],
        name: str,
        report_seconds: float,
        hwm: int,
    ) -> None:
        sock = open_socket(zmq.Context.instance(), zmq.SUB, address, bind, hwm)
        for topic in topics:
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        super().__init__(broker, name, report_seconds, sock)
        #: Longest topic first, so that the most specific mapping wins.
        self.topics = sorted(
            ((t.encode(), q) for t, q in topics.items()), key=lambda tq: -len(tq[0])
        )

    def route(self, frames: list[bytes]) -> tuple[str, bytes] | None:
        """[topic, content] (multipart), or one frame that starts with its topic."""
        first = frames[0]
        content = frames[-1] if len(frames) > 1 else first
        for topic, queue in self.topics:
            if first.startswith(topic):
                return queue, content
        return None
