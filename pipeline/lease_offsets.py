"""The source's offsets and plans: a micro-batch is one broker lease per queue, all named alike.

Rule 1: a reader gets its id once and carries it in every offset; batch n's leases are named
`<reader>/<n>` in every queue. A query restarted from its checkpoint gets its reader id back
from the offsets, so it asks for the same names, and the broker answers a lease that exists
with the same messages (docs/pipeline.md, "How it works"). Before Spark has written the first
offset, only the id's origin can bring it back: derived from the checkpoint location (the
source's `checkpointLocation` option) it is the same in every run; without it, a UUID.

Rule 2: an offset says what its batch is: the lease number and, per queue, the messages and
bytes of that lease and the running totals. `partitions(start, end)` needs `end` only.

Offsets are JSON dicts with a fixed key order: Spark compares them as JSON text.
Nothing here talks to the broker or imports pyspark.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class QueueShare:
    """One queue's part of an offset: its lease in this batch and the totals so far."""

    messages: int = 0
    bytes: int = 0
    total_messages: int = 0
    total_bytes: int = 0
    #: Ready messages left in the queue when the batch was planned (its backlog then).
    ready: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "messages": self.messages,
            "bytes": self.bytes,
            "total_messages": self.total_messages,
            "total_bytes": self.total_bytes,
            "ready": self.ready,
        }


@dataclass(frozen=True)
class LeaseOffset:
    """A Spark offset of the phpmq source: the end of batch `lease`."""

    reader: str
    lease: int
    #: The broker the leases live on (the listener in the driver commits there).
    broker: str
    queues: dict[str, QueueShare]

    @classmethod
    def initial(cls, reader: str, broker: str) -> LeaseOffset:
        return cls(reader=reader, lease=0, broker=broker, queues={})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LeaseOffset:
        """Raises ValueError for an offset this source did not write (an old checkpoint)."""
        if not isinstance(data, dict) or "reader" not in data or "lease" not in data:
            raise ValueError(
                f"this checkpoint's offset {data!r} is not a phpmq lease offset: it was written"
                " by an older phpmq source; start the query with a new checkpointLocation"
            )
        queues = {name: QueueShare(**share) for name, share in data.get("queues", {}).items()}
        return cls(str(data["reader"]), int(data["lease"]), str(data.get("broker", "")), queues)

    def to_json(self) -> dict[str, Any]:
        return {
            "reader": self.reader,
            "lease": self.lease,
            "broker": self.broker,
            "queues": {name: self.queues[name].to_json() for name in sorted(self.queues)},
        }

    @property
    def lease_name(self) -> str:
        return lease_name(self.reader, self.lease)

    def leased(self) -> dict[str, QueueShare]:
        """The queues that have a lease in this batch (none for the initial offset)."""
        if self.lease == 0:
            return {}
        return {name: share for name, share in self.queues.items() if share.messages}

    def next(self, taken: dict[str, tuple[int, int, int]]) -> LeaseOffset:
        """The offset after this one, given (messages, bytes, ready) leased per queue."""
        queues = {name: replace(share, messages=0, bytes=0) for name, share in self.queues.items()}
        for name, (messages, size, ready) in taken.items():
            before = queues.get(name, QueueShare())
            queues[name] = QueueShare(
                messages,
                size,
                before.total_messages + messages,
                before.total_bytes + size,
                ready,
            )
        return LeaseOffset(self.reader, self.lease + 1, self.broker, queues)


def lease_name(reader: str, lease: int) -> str:
    return f"{reader}/{lease}"


def reader_id_for(checkpoint: str, queues: str) -> str:
    """32 hex characters (like a UUID's) that name the reader of the query checkpointed at
    `checkpoint` reading `queues` (SourceOptions.describe()): the same for the same location
    however it is spelled (relative paths against the working directory, as Spark resolves
    them; `file:` URIs as paths), different for two sources of one query."""
    location = _checkpoint_location(checkpoint)
    return hashlib.sha256(f"{location}\0{queues}".encode()).hexdigest()[:32]


def _checkpoint_location(checkpoint: str) -> str:
    text = checkpoint.strip()
    if text.startswith("file:"):
        text = "/" + text[len("file:") :].lstrip("/")
    elif "://" in text:
        return text.rstrip("/")
    return os.path.normpath(os.path.abspath(text))


@dataclass
class Budget:
    """What is left of one trigger's row and byte limits."""

    messages: int
    bytes: int

    @property
    def spent(self) -> bool:
        return self.messages <= 0 or self.bytes <= 0

    def spend(self, messages: int, size: int) -> None:
        self.messages -= messages
        self.bytes -= size


def queue_order(queues: list[str], lease: int) -> list[str]:
    """The queues in the order batch `lease` leases them: turning by one each batch, so that a
    busy queue does not always take the budget before the others."""
    if not queues:
        return []
    turn = lease % len(queues)
    return queues[turn:] + queues[:turn]


@dataclass(frozen=True)
class LeaseSlice:
    """Positions `[first, first + count)` of one queue's lease: what one Spark task reads."""

    queue: str
    lease: str
    first: int
    count: int


def slices(offset: LeaseOffset, tasks: int) -> list[LeaseSlice]:
    """Split the batch that ends at `offset` into about `tasks` slices, each queue's share in
    proportion to its messages (at least one slice per leased queue)."""
    leased = offset.leased()
    total = sum(share.messages for share in leased.values())
    result: list[LeaseSlice] = []
    for name in sorted(leased):
        messages = leased[name].messages
        parts = min(messages, max(1, round(tasks * messages / total)))
        size = math.ceil(messages / parts)
        for first in range(0, messages, size):
            count = min(size, messages - first)
            result.append(LeaseSlice(name, offset.lease_name, first, count))
    return result
