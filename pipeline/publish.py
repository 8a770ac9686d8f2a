"""How the sink hands messages to the broker, behind one seam for what the broker can promise.

The sink computes a key for every row from the batch and the row's position
(`<scope>/<partition>/<row>`) and asks `open_publisher` for a publisher:

* a broker that announces publisher confirms and idempotent keys in its HELLO answer
  (docs/protocol.md §6.3) gets a `ConfirmingPublisher`: each row is sent with its key and
  confirmed (on disk, for a durable broker), and a retried task or batch that publishes the
  same rows again within the broker's key window adds nothing;
* an older broker gets a `BarrierPublisher`, which ignores the keys and proves delivery to the
  broker with a round trip.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..client import BrokerRefused, Client, ClientError, Unconfirmed
from ..protocol import Error

#: Longest the end-of-task round trip to the broker may take, in seconds.
BARRIER_TIMEOUT_S = 30.0
#: Refusals quoted in a PublishError.
QUOTED_REFUSALS = 3


class PublishError(RuntimeError):
    """Raised when the broker refused messages (queue full, broker draining, bad queue name)."""


@dataclass(frozen=True)
class Receipt:
    """What a publisher can vouch for once `finish()` returns."""

    published: int
    #: Each message was confirmed stored by the broker (not only read by it).
    confirmed: bool
    #: Keys went with the messages, so publishing the same rows again adds nothing.
    deduplicated: bool


class Publisher(Protocol):
    def publish(self, queue: str, ttl: int, contents: Sequence[bytes], first_row: int) -> None:
        """Send `contents` to `queue`; row `first_row + i` of the task has key
        `<key_prefix>/<first_row + i>`."""

    def publish_event(
        self, event: str, ttl: int, contents: Sequence[bytes], first_row: int
    ) -> None:
        """Publish `contents` as `event` (docs/protocol.md §6.5), keyed as `publish`."""

    def finish(self) -> Receipt:
        """Return once the broker has everything published so far.

        Raises:
            PublishError: the broker refused some of it.
            ClientError: the broker did not answer.
        """

    def close(self) -> None: ...


class BarrierPublisher:
    """For today's broker. Messages are sent in packed frames; `finish()` makes a round trip
    (ADMIN stats): the broker handles a peer's frames in order and answers a refused 001 with
    an ERROR, so when the answer comes, every message was stored or its refusal came first.
    Keys are ignored: a retried batch publishes its rows again."""

    def __init__(self, client: Client, key_prefix: str) -> None:
        self._client = client
        self.key_prefix = key_prefix
        self._published = 0

    def publish(self, queue: str, ttl: int, contents: Sequence[bytes], first_row: int) -> None:
        self._published += self._client.send_many(queue, contents, ttl)

    def publish_event(
        self, event: str, ttl: int, contents: Sequence[bytes], first_row: int
    ) -> None:
        for content in contents:
            self._client.publish(event, content, ttl, confirm=False)
        self._published += len(contents)

    def finish(self) -> Receipt:
        self._client.admin("stats", timeout=BARRIER_TIMEOUT_S)
        if self._client.error_count:
            raise _refused(self._client.error_count, list(self._client.errors))
        return Receipt(self._published, confirmed=False, deduplicated=False)

    def close(self) -> None:
        self._client.close()


class ConfirmingPublisher:
    """Sends each row with its key and waits for the broker's confirms (pipelined)."""

    def __init__(self, client: Client, key_prefix: str, deduplicated: bool) -> None:
        self._client = client
        self.key_prefix = key_prefix
        self._deduplicated = deduplicated
        self._published = 0

    def publish(self, queue: str, ttl: int, contents: Sequence[bytes], first_row: int) -> None:
        keys = [f"{self.key_prefix}/{first_row + i}" for i in range(len(contents))]
        try:
            self._client.send_many(queue, contents, ttl, confirm=True, keys=keys)
        except Unconfirmed as exc:
            if exc.errors:
                raise _refused(len(exc.errors), list(exc.errors.values())) from None
            raise  # no answer: the task fails and its retry sends the same keys
        self._published += len(contents)

    def publish_event(
        self, event: str, ttl: int, contents: Sequence[bytes], first_row: int
    ) -> None:
        """One confirmed publish per row (a publish is not pipelined): slower than `publish`."""
        for offset, content in enumerate(contents):
            key = f"{self.key_prefix}/{first_row + offset}"
            try:
                self._client.publish(event, content, ttl, key=key)
            except BrokerRefused as exc:
                raise _refused(1, [exc.error]) from None
        self._published += len(contents)

    def finish(self) -> Receipt:
        return Receipt(self._published, confirmed=True, deduplicated=self._deduplicated)

    def close(self) -> None:
        self._client.close()


def _refused(count: int, errors: list[Error]) -> PublishError:
    quoted = "; ".join(
        f"{error.code} {error.reason} (queue {error.queue!r})" for error in errors[:QUOTED_REFUSALS]
    )
    return PublishError(f"the broker refused {count} message(s): {quoted}")


def open_publisher(address: str, name: str, key_prefix: str) -> Publisher:
    """A publisher that uses what the broker at `address` supports.

    Raises:
        ClientError: no answer from the broker.
    """
    client = Client(address, name=f"{name} pid {os.getpid()}", role="spark-sink")
    try:
        client.admin("stats", timeout=BARRIER_TIMEOUT_S)  # reads the HELLO answer
    except ClientError:
        client.close()
        raise
    window_ms = client.broker_info.get("dedup_window_ms")
    if type(window_ms) is int:  # a broker with confirms and keys (docs/protocol.md §6.3)
        return ConfirmingPublisher(client, key_prefix, deduplicated=window_ms > 0)
    return BarrierPublisher(client, key_prefix)
