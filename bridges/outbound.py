"""Bridges out of the broker: a queue feeds existing ZeroMQ receivers.

push-out  consume a queue, PUSH each message to PULL workers; acked once ZeroMQ accepted the
          send. Past the bridge delivery is at most once: a worker that dies with messages in
          its socket buffer loses them (ZeroMQ has no acks).
pub-out   consume a queue, PUB each message as [topic, content], the topic being the queue
          name or --topic; acked once published (PUB drops for slow or absent subscribers:
          at most once past the bridge, as PUB/SUB always is). With --events it follows a
          live feed instead: a temporary queue bound to the patterns, gone when the bridge
          stops, each message published under its event name.
req-out   consume a queue, send each message to REP/ROUTER workers over REQ, lazy-pirate
          style: wait --timeout for the reply, retry on a fresh socket, ack on reply, requeue
          after the last retry. At least once to workers that only speak plain REQ/REP.
          Replies can go to a reply queue.

A stopped bridge acks nothing it did not deliver: what it holds goes back to the queue when
its client says goodbye.
"""

from __future__ import annotations

import logging

import zmq

from ..client import BrokerRefused, Paused, ReceivedMessage
from .base import POLL_MS, Bridge, open_socket

log = logging.getLogger("phpmq.bridge")


class Outbound(Bridge):
    def __init__(
        self,
        broker: str,
        queue: str,
        window: int,
        name: str,
        report_seconds: float,
        counter_names: tuple[str, ...],
        events: tuple[str, ...] = (),
    ) -> None:
        super().__init__(broker, name, report_seconds, ("received", "acked", *counter_names))
        if events:
            self.queue = self.client.subscribe_events(*events, window=window)
        else:
            self.queue = queue
            self.client.subscribe(queue, window)

    def step(self) -> None:
        message = self.client.receive(timeout=POLL_MS / 1000)
        if message is None:
            return
        self.counters["received"] += 1
        if self.deliver(message):
            message.ack()
            self.counters["acked"] += 1

    def deliver(self, message: ReceivedMessage) -> bool:
        """Hand the message to the tool; True once it is delivered as far as the bridge's
        guarantee goes (then it is acked), False to leave it unsettled."""
        raise NotImplementedError


class PushOut(Outbound):
    kind = "push-out"

    def __init__(
        self,
        broker: str,
        queue: str,
        address: str,
        bind: bool,
        window: int,
        name: str,
        report_seconds: float,
        hwm: int,
    ) -> None:
        super().__init__(broker, queue, window, name, report_seconds, ("pushed",))
        self.sock = open_socket(zmq.Context.instance(), zmq.PUSH, address, bind, hwm)

    def deliver(self, message: ReceivedMessage) -> bool:
        # Block (in slices, to notice a stop) while no PULL peer can take it: backpressure.
        while not self.stopping:
            if self.sock.poll(POLL_MS, zmq.POLLOUT):
                try:
                    self.sock.send(message.content, zmq.NOBLOCK)
                except zmq.Again:
                    continue
                self.counters["pushed"] += 1
                return True
        return False


class PubOut(Outbound):
    kind = "pub-out"

    def __init__(
        self,
        broker: str,
        queue: str,
        address: str,
        bind: bool,
        topic: str | None,
        window: int,
        name: str,
        report_seconds: float,
        hwm: int,
        events: tuple[str, ...] = (),
    ) -> None:
        super().__init__(broker, queue, window, name, report_seconds, ("published",), events)
        self.sock = open_socket(zmq.Context.instance(), zmq.PUB, address, bind, hwm)
        #: None: each message's event name (a live feed).
        self.topic = topic.encode() if topic is not None else None if events else queue.encode()

    def deliver(self, message: ReceivedMessage) -> bool:
        topic = self.topic
        if topic is None:
            topic = (message.event or "").encode()
        self.sock.send_multipart((topic, message.content))
        self.counters["published"] += 1
        return True


class ReqOut(Outbound):
    kind = "req-out"
    handed_over = "replies_queued"

    def __init__(
        self,
        broker: str,
        queue: str,
        address: str,
        timeout: float,
        retries: int,
        reply_queue: str | None,
        name: str,
        report_seconds: float,
    ) -> None:
        super().__init__(
            broker,
            queue,
            1,
            name,
            report_seconds,
            ("requests", "replies", "timeouts", "requeued", "replies_queued"),
        )
        self.address = address
        self.timeout_ms = max(1, int(timeout * 1000))
        self.retries = retries
        self.reply_queue = reply_queue
        self.sock = self._new_socket()

    def _new_socket(self) -> zmq.Socket:
        return open_socket(zmq.Context.instance(), zmq.REQ, self.address, bind=False)

    def _queue_reply(self, reply: bytes) -> None:
        while True:
            try:
                self.client.send(self.reply_queue, reply)  # type: ignore[arg-type]
            except Paused:
                # The reply queue stayed full for send_timeout: wait on, unless stopping.
                self.counters["reply_queue_paused"] += 1
                if self.stopping:
                    self.counters["replies_dropped"] += 1
                    log.warning("stopping with a reply the full reply queue did not take")
                    return
                continue
            except BrokerRefused as refused:  # earlier replies were refused: this one goes now
                self.refused_by_broker(refused)
                continue
            self.counters["replies_queued"] += 1
            return

    def deliver(self, message: ReceivedMessage) -> bool:
        for attempt in range(1 + self.retries):
            if self.stopping:
                return False
            self.counters["requests"] += 1
            self.sock.send(message.content)
            if self.sock.poll(self.timeout_ms):
                reply = self.sock.recv()
                self.counters["replies"] += 1
                if self.reply_queue is not None:
                    self._queue_reply(reply)
                return True
            # Lazy pirate: a REQ socket that got no reply is stuck; start over on a new one.
            self.counters["timeouts"] += 1
            log.warning(
                "no reply for %s within %d ms (attempt %d of %d)",
                message.id,
                self.timeout_ms,
                attempt + 1,
                1 + self.retries,
            )
            self.sock.close(linger=0)
            self.sock = self._new_socket()
        message.requeue(ttl=message.ttl)
        self.counters["requeued"] += 1
        return False
