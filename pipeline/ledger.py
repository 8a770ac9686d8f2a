"""The source's bookkeeping: broker deliveries numbered with Spark offsets, held until settled.

Rule 1: a queue has no offsets of its own, so the source numbers deliveries itself, in the
order it takes them, with consecutive sequence numbers (seq). A Spark offset is `{"seq": n}`:
the batch `[start, end)` is the deliveries numbered start..end-1.

Rule 2: deliveries leave the ledger from the front only, and only once Spark has finished every
batch that contains them; then (and only then) they are acked. So the held seqs are always one
contiguous run `[base, next_seq)`.

Nothing here talks to the broker or imports pyspark.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Protocol


class Delivery(Protocol):
    """What the ledger needs of a received message (phpmq.client.ReceivedMessage)."""

    queue: str
    id: str
    content: bytes
    ttl: int
    delivery_count: int

    def ack(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Held:
    """One delivery and when the source took it, in microseconds since the epoch (UTC)."""

    message: Delivery
    received_at_us: int


class Ledger:
    """Deliveries numbered `[base, next_seq)`, in the order they were taken."""

    def __init__(self) -> None:
        self._held: deque[Held] = deque()
        self._base: int | None = None

    @property
    def started(self) -> bool:
        return self._base is not None

    @property
    def next_seq(self) -> int:
        if self._base is None:
            raise RuntimeError("the ledger has no numbering yet: call resume_at first")
        return self._base + len(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def resume_at(self, seq: int) -> None:
        """Continue the numbering at `seq` (the offset Spark checkpointed), unless it already
        runs past it. A fresh source process starts from Spark's offset, so the numbers of a
        restarted query carry on from where the checkpoint left off."""
        if self._base is None or (not self._held and seq > self._base):
            self._base = seq

    def add(self, held: Held) -> int:
        """Number one more delivery; returns its seq."""
        seq = self.next_seq
        self._held.append(held)
        return seq

    def between(self, start: int, end: int) -> list[Held]:
        """The deliveries numbered `[start, end)` that are still held: all of them in a running
        query, none when a restarted query replays a batch taken by a process that is gone (the
        broker redelivers those messages, and they get new numbers)."""
        if self._base is None:
            return []
        first = max(start, self._base) - self._base
        last = min(end, self.next_seq) - self._base
        if last <= first:
            return []
        return list(islice(self._held, first, last))

    def release_below(self, seq: int) -> list[Delivery]:
        """Take the deliveries numbered below `seq` out of the ledger, oldest first."""
        released: list[Delivery] = []
        if self._base is None:
            return released
        while self._held and self._base < seq:
            released.append(self._held.popleft().message)
            self._base += 1
        if not self._held and seq > self._base:
            self._base = seq
        return released
