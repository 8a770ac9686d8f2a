"""The source's one broker connection, owned by Spark's long-lived source runner on the driver.

It opens on first use (never while Spark builds or pickles the reader), consumes every queue
of the source with one window each, hands out deliveries, and acks them in bulk. Acks are
followed by a round trip to the broker, so when a settle returns the broker has read them:
Spark kills the runner without warning when a query ends, and acks still in a socket buffer
would be lost (their messages redelivered).

If the runner dies, its heartbeats stop, and the broker puts every message it still held back
at the head of its queue after heartbeat_ms x liveness (docs/protocol.md §12.4).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from ..client import Client
from .ledger import Delivery, Held
from .options import SourceOptions

#: How long taking more messages may poll the socket once the inbox runs dry, in seconds.
DRAIN_POLL_S = 0.002
#: How long the first take after subscribing waits for messages the broker said were ready.
FIRST_DISPATCH_WAIT_S = 2.0
#: Longest a round trip to the broker (stats, the settle barrier) may take, in seconds.
ROUND_TRIP_TIMEOUT_S = 10.0


class SourceError(RuntimeError):
    """Raised when the broker will not serve the source as configured."""


class Subscription:
    """Consumes the source's queues; connects lazily."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._client: Client | None = None
        self._subscribed = False
        self._window = options.window
        #: How long the next take may wait for its first message at least, in seconds.
        self._first_wait_s = 0.0

    def pending(self) -> int:
        """Messages of the source's queues that are ready or in flight with any consumer (one
        that died among them): what an availableNow run sets out to read. The window shrinks
        to that count, so the run does not prefetch what arrives later; each message
        prefetched and given back counts as a delivery."""
        queues = self._queue_figures()
        total = sum(
            queues[name]["ready"] + queues[name]["in_flight"]
            for name in self._options.queues
            if name in queues
        )
        self._window = max(1, min(self._window, total))
        return total

    def take(self, count: int, wait_s: float) -> list[Held]:
        """Up to `count` deliveries: waits up to `wait_s` for the first, then takes what has
        arrived without waiting further."""
        client = self._consuming()
        taken: list[Held] = []
        timeout = max(wait_s, self._first_wait_s)
        self._first_wait_s = 0.0
        while len(taken) < count:
            message = client.receive(timeout)
            if message is None:
                break
            taken.append(Held(message, time.time_ns() // 1_000))
            timeout = DRAIN_POLL_S
        return taken

    def settle(self, messages: Iterable[Delivery]) -> None:
        """Ack `messages`, and return once the broker has read the acks.

        Raises:
            ClientError: the broker did not answer within ROUND_TRIP_TIMEOUT_S.
        """
        for message in messages:
            message.ack()
        self._stats()

    def close(self) -> None:
        """Leave cleanly: the broker puts what this connection still holds (prefetched, not
        yet numbered) back at the head of its queue at once."""
        if self._client is not None:
            client, self._client, self._subscribed = self._client, None, False
            client.close()

    def _consuming(self) -> Client:
        client = self._connected()
        if not self._subscribed:
            for queue in self._options.queues:
                client.subscribe(queue, self._window)
            self._subscribed = True
            # The broker's refusal of a 002, if any, arrives before this answer.
            queues = self._stats()["queues"]
            self._raise_refusals(client)
            if any(queues.get(name, {}).get("ready") for name in self._options.queues):
                # Messages were waiting: the first take waits for their dispatch, so the first
                # trigger does not report an empty queue (processAllAvailable would stop there).
                self._first_wait_s = FIRST_DISPATCH_WAIT_S
        return client

    def _connected(self) -> Client:
        if self._client is None:
            options = self._options
            client = Client(
                options.broker,
                name=f"{options.client_name} pid {os.getpid()}",
                role="spark-source",
                heartbeat_ms=options.heartbeat_ms,
                liveness=options.liveness,
            )
            self._client = client
            self._stats()  # learns the broker's limits from its HELLO answer
            self._check_window(client.broker_info)
        return self._client

    def _queue_figures(self) -> dict[str, Any]:
        """Each queue's figures from its owner: a sharded broker's shard answers `stats` for
        its own queues only (docs/cluster.md)."""
        client = self._connected()
        queues = dict(self._stats()["queues"])
        mapping = client.cluster_map
        if mapping is None or len(mapping.shards) < 2:
            return queues
        home = client.broker_info.get("shard")
        owners = {mapping.owner(name) for name in self._options.queues}
        for shard in sorted(owners, key=lambda s: s.name):
            if shard.name != home:
                with Client(shard.address, name="phpmq-spark-stats") as other:
                    queues.update(other.admin("stats", timeout=ROUND_TRIP_TIMEOUT_S)["queues"])
        return queues

    def _stats(self) -> dict[str, Any]:
        client = self._connected()
        client.flush()
        return client.admin("stats", timeout=ROUND_TRIP_TIMEOUT_S)

    def _check_window(self, broker_info: dict[str, Any]) -> None:
        limit = broker_info.get("max_window")
        window = self._options.window
        if type(limit) is int and window > limit:
            self.close()
            raise SourceError(
                f"option window ({window}) is above the broker's max_window ({limit}): use"
                f" maxRecordsPerBatch <= {(limit - 1) // 2} (the window must exceed twice the"
                f" batch), or start the broker with --max-window {window}"
            )

    def _raise_refusals(self, client: Client) -> None:
        refusals = [error for error in client.errors if error.queue in self._options.queues]
        if refusals:
            first = refusals[0]
            self.close()
            raise SourceError(
                f"the broker refused to serve queue {first.queue!r}: {first.code} {first.reason}"
            )
