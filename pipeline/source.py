"""The streaming source: `spark.readStream.format("phpmq")`.

Where things run (pyspark 4.3; see docs/pipeline.md):

* Spark keeps one Python process per query on the driver, the source runner, and calls
  `initialOffset`, `latestOffset`, `partitions` and `commit` on one reader instance in it. Only
  that instance connects to the broker (pipeline.subscription), numbers deliveries
  (pipeline.ledger) and acks them.
* `partitions()` puts the rows of a batch inside the InputPartitions, and `read()` on the
  executors only turns them into Arrow: executors never talk to the broker, because a queue
  cannot be re-read by range.
* Spark calls `latestOffset(start)` only after every batch that ends at or before `start` has
  been written and committed by the sink, so that is where a batch's messages are acked.
  `commit(end)` says the same thing one batch later (and never for the last batch of an
  availableNow run), so it is only a backstop. Acking in `latestOffset` also means the source
  never holds more than one batch plus the window's prefetch: no deadlock with the window.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .ledger import Held, Ledger
from .options import SourceOptions
from .subscription import Subscription

#: The rows the source produces, in this order.
SOURCE_SCHEMA = StructType(
    [
        StructField("queue", StringType()),
        StructField("id", StringType()),
        StructField("content", BinaryType()),
        StructField("ttl", IntegerType()),
        StructField("delivery_count", IntegerType()),
        StructField("received_at", TimestampType()),
    ]
)
#: The same as Arrow, as Spark expects a Python source's record batches (timestamps in UTC).
ARROW_SCHEMA = pa.schema(
    [
        ("queue", pa.string()),
        ("id", pa.string()),
        ("content", pa.binary()),
        ("ttl", pa.int32()),
        ("delivery_count", pa.int32()),
        ("received_at", pa.timestamp("us", tz="UTC")),
    ]
)
#: How long a trigger (other than availableNow) may wait for a first message, in seconds. The
#: engine polls again at once when nothing came, so this only avoids a busy loop.
POLL_WAIT_S = 0.01


@dataclass
class Rows(InputPartition):
    """One task's share of a micro-batch, as columns."""

    queue: list[str]
    id: list[str]
    content: list[bytes]
    ttl: list[int]
    delivery_count: list[int]
    received_at: list[int]

    @classmethod
    def of(cls, held: list[Held]) -> Rows:
        messages = [entry.message for entry in held]
        return cls(
            queue=[message.queue for message in messages],
            id=[message.id for message in messages],
            content=[message.content for message in messages],
            ttl=[message.ttl for message in messages],
            delivery_count=[message.delivery_count for message in messages],
            received_at=[entry.received_at_us for entry in held],
        )

    def record_batch(self) -> pa.RecordBatch:
        columns = (
            self.queue,
            self.id,
            self.content,
            self.ttl,
            self.delivery_count,
            self.received_at,
        )
        arrays = [
            pa.array(column, type=field.type)
            for column, field in zip(columns, ARROW_SCHEMA, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


class PhpmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads the source's queues at least once; offsets are `{"seq": n}` (pipeline.ledger)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._ledger = Ledger()
        self._subscription = Subscription(options)
        #: Messages an availableNow run still expects; None for other triggers.
        self._budget: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles a planner's copy of the reader to call read() on executors: options only.
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_options"])  # type: ignore[misc]

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self._options.max_records_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._budget = self._subscription.pending()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        begin = start["seq"]
        self._ledger.resume_at(begin)
        self._settle_below(begin)
        wanted = self._wanted(limit) - (self._ledger.next_seq - begin)
        if wanted > 0:
            self._take(wanted)
        end = self._ledger.next_seq
        if end == begin and self._budget == 0:
            # The availableNow run ends here, and Spark will kill this process: give back the
            # prefetched messages now rather than after the broker's liveness timeout.
            self._subscription.close()
        return {"seq": end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Rows]:
        held = self._ledger.between(start["seq"], end["seq"])
        if not held:
            return []
        tasks = min(self._options.num_partitions, len(held))
        size = -(-len(held) // tasks)
        return [Rows.of(held[first : first + size]) for first in range(0, len(held), size)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Rows)
        yield partition.record_batch()

    def commit(self, end: dict[str, int]) -> None:
        self._settle_below(end["seq"])

    def stop(self) -> None:
        # Spark 4.3 does not call this (it kills the runner); the broker's liveness covers that.
        self._subscription.close()

    def _wanted(self, limit: ReadLimit) -> int:
        cap = self._options.max_records_per_batch
        if isinstance(limit, ReadMaxRows):
            cap = min(cap, limit.max_rows)
        if self._budget is not None:
            cap = min(cap, self._budget)
        return cap

    def _take(self, count: int) -> None:
        available_now = self._budget is not None
        wait_s = self._options.available_now_wait_ms / 1000 if available_now else POLL_WAIT_S
        taken = self._subscription.take(count, wait_s)
        for held in taken:
            self._ledger.add(held)
        if self._budget is not None:
            # Nothing came within the wait: what is still counted is held elsewhere (another
            # live consumer), so this run stops waiting for it.
            self._budget = self._budget - len(taken) if taken else 0

    def _settle_below(self, seq: int) -> None:
        done = self._ledger.release_below(seq)
        if done:
            self._subscription.settle(done)
