"""The batch read: `spark.read.format("phpmq")` browses a queue without consuming it.

It pages through the ready messages with `queue-peek` (or the dead letters with `dlq-list`
when `deadLetters` is true), which change nothing at the broker: no delivery is counted and
nothing leaves the queue. The driver counts what is there and splits the positions into
`numPartitions` ranges; each task pages through its range with `offset` and `end`. It is a snapshot
taken while the tasks run: messages consumed or added meanwhile shift the positions, so a row
may be missed or read twice by neighbouring tasks of a busy queue.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..client import BrokerRefused
from .broker_link import BrokerLink
from .options import (
    CURVE_OPTION_NAMES,
    DEFAULT_NUM_PARTITIONS,
    CurveFiles,
    OptionError,
    _bool,
    _broker,
    _int,
    _lower_keys,
    _queues,
    _refuse_unknown,
    broker_timeout_ms,
    curve_files,
)
from .rows import record_batch

#: Every option of the batch read.
BROWSE_OPTION_NAMES = (
    "broker",
    "queue",
    "queues",
    "deadLetters",
    "numPartitions",
    "brokerTimeout",
    "clientName",
    *CURVE_OPTION_NAMES,
)
#: Entries one `queue-peek` / `dlq-list` asks for at most.
PAGE_ENTRIES = 1_000
#: Content bytes one page asks for at most (the broker always gives one entry).
PAGE_BYTES = 4 << 20


@dataclass(frozen=True)
class BrowseOptions:
    """What `spark.read.format("phpmq")` was asked to do."""

    broker: str
    queues: tuple[str, ...]
    dead_letters: bool
    num_partitions: int
    broker_timeout_ms: int
    client_name: str
    curve: CurveFiles | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> BrowseOptions:
        """Raises OptionError for an unknown, missing or malformed option."""
        options = _lower_keys(options)
        _refuse_unknown(options, BROWSE_OPTION_NAMES)
        if "queuepattern" in options:
            raise OptionError("the batch read takes queue or queues, not queuePattern")
        return cls(
            broker=_broker(options),
            queues=_queues(options),
            dead_letters=_bool(options, "deadLetters", False),
            num_partitions=_int(options, "numPartitions", DEFAULT_NUM_PARTITIONS),
            broker_timeout_ms=broker_timeout_ms(options),
            client_name=options.get("clientname") or "spark-browse",
            curve=curve_files(options),
        )


@dataclass(frozen=True)
class BrowsePart(InputPartition):
    """Positions `[first, first + count)` of a queue's ready messages or dead letters."""

    queue: str
    first: int
    count: int


class PhpmqBrowseReader(DataSourceReader):
    """Reads a snapshot of the ready messages (or dead letters) of the queues."""

    def __init__(self, options: BrowseOptions) -> None:
        self._options = options

    def partitions(self) -> list[BrowsePart]:
        options = self._options
        parts: list[BrowsePart] = []
        with self._link() as link:
            for queue in options.queues:
                total = self._count(link, queue)
                if total == 0:
                    continue
                size = math.ceil(total / min(options.num_partitions, total))
                parts += [
                    BrowsePart(queue, first, min(size, total - first))
                    for first in range(0, total, size)
                ]
        return parts or [BrowsePart(options.queues[0], 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, BrowsePart)
        command = "dlq-list" if self._options.dead_letters else "queue-peek"
        last = partition.first + partition.count
        with self._link() as link:
            position = partition.first
            while position < last:
                reply = link.call(
                    command,
                    queue=partition.queue,
                    offset=position,
                    end=last,
                    limit=PAGE_ENTRIES,
                    max_bytes=PAGE_BYTES,
                )
                entries = reply.get("entries") or []
                if entries:
                    yield record_batch(partition.queue, entries, dead=self._options.dead_letters)
                following = int(reply.get("next_offset", position + len(entries)))
                if following <= position:
                    return  # the queue shrank since the driver counted it
                position = following

    def _count(self, link: BrokerLink, queue: str) -> int:
        command = "dlq-list" if self._options.dead_letters else "queue-peek"
        try:
            reply = link.call(command, queue=queue, limit=0)
        except BrokerRefused as refusal:
            if refusal.error.code == 404:
                return 0  # no such queue (yet): nothing to browse
            raise
        # Positions, not messages: a queue's positions include removed messages not yet
        # compacted away (docs/protocol.md §9, "Pages").
        return int(reply.get("total" if self._options.dead_letters else "positions", 0))

    def _link(self) -> BrokerLink:
        options = self._options
        return BrokerLink(
            options.broker, options.client_name, options.broker_timeout_ms, options.curve
        )
