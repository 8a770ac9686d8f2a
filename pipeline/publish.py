"""How the sink hands messages to the broker, behind one seam for what the broker can promise.

Two broker features would make the sink stronger; neither exists yet (docs/protocol.md §6.3):

* publisher confirms: the broker acknowledges each stored message;
* idempotent keys: the broker drops a message whose key it has already stored, so a retried
  batch does not duplicate.

The sink always computes a key for every row from the batch and the row's position
(`<scope>/<partition>/<row>`) and asks `open_publisher` for a publisher. Today that is a
`BarrierPublisher`, which ignores the keys and proves delivery to the broker with a round trip.
When the broker announces the features in its HELLO answer, a publisher that uses them goes
in `open_publisher`, and nothing else in the sink changes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from workers.client import Client, ClientError

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

    def finish(self) -> Receipt:
        self._client.admin("stats", timeout=BARRIER_TIMEOUT_S)
        if self._client.error_count:
            quoted = "; ".join(
                f"{error.code} {error.reason} (queue {error.queue!r})"
                for error in list(self._client.errors)[:QUOTED_REFUSALS]
            )
            count = self._client.error_count
            raise PublishError(f"the broker refused {count} message(s): {quoted}")
        return Receipt(self._published, confirmed=False, deduplicated=False)

    def close(self) -> None:
        self._client.close()


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
    # The broker's HELLO answer (client.broker_info) is where it will announce confirms and
    # idempotent keys; a publisher that uses them is chosen here then. None exists yet.
    return BarrierPublisher(client, key_prefix)
