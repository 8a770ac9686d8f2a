"""The streaming source: `spark.readStream.format("phpmq")`, one broker lease per batch and queue.

Where things run (pyspark 4.3; see docs/pipeline.md, "How it works"):

* Spark keeps one Python process per query on the driver, the source runner, and calls
  `initialOffset`, `latestOffset`, `partitions` and `commit` on one reader instance in it.
  `latestOffset` plans the next batch: it leases up to the trigger's row and byte budget from
  each subscribed queue (pipeline.subscription), all under the name `<reader>/<n>`, and
  returns an offset that describes those leases (pipeline.lease_offsets). It holds no
  message contents.
* `partitions(start, end)` splits `end`'s leases into position ranges; `read()` runs on the
  executors and pages through its range with `lease-read` (pipeline.lease_read).
* Spark calls `latestOffset(start)` only after every batch ending at or before `start` is
  committed by the sink, so the leases of `start` are committed (acked) there; `commit(end)`
  does the same one batch later, and the listener `pipeline.register(spark)` installs does it
  right after each batch (for `trigger(once=True)`, which plans no later batch).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from .broker_link import BrokerLink
from .lease_offsets import Budget, LeaseOffset, lease_name, queue_order, slices
from .lease_read import LeasePart, read_lease
from .options import SourceOptions
from .subscription import Subscription


class PhpmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads the source's queues exactly once into idempotent sinks; offsets are leases."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._link = BrokerLink(
            options.broker, options.client_name, options.broker_timeout_ms, options.curve
        )
        self._subscription = Subscription(options, self._link)
        self._reader: str | None = None
        #: The highest lease number this process committed (Spark only moves forward).
        self._committed_through = 0
        #: availableNow: messages each queue may still give this run (None: other triggers).
        self._left: dict[str, int] | None = None
        self._available_now = False
        self._last: LeaseOffset | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles a planner's copy of the reader to call read() on executors: options only.
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_options"])  # type: ignore[misc]

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        if self._reader is None:  # Spark asks twice on a fresh checkpoint: one id for both
            self._reader = self._options.first_reader_id() or uuid.uuid4().hex
        return LeaseOffset.initial(self._reader, self._options.broker).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self._options.max_records_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._available_now = True  # the target is counted at the first latestOffset

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        offset = LeaseOffset.from_json(start)
        self._commit(offset)
        queues = self._subscription.queues()
        if self._available_now and self._left is None:
            self._left = self._subscription.available_now_target(queues, offset)
        taken = self._lease_next(offset, queues, self._row_cap(limit))
        if not taken:
            return start  # the same JSON: Spark sees no new data
        self._last = offset.next(taken)
        self._subscription.forget_stats()
        return self._last.to_json()

    def _lease_next(
        self, offset: LeaseOffset, queues: list[str], rows: int
    ) -> dict[str, tuple[int, int, int]]:
        """Lease batch `offset.lease + 1` from `queues` within the trigger's budget; returns
        (messages, bytes, ready after) per queue that gave any."""
        number = offset.lease + 1
        name = lease_name(offset.reader, number)
        budget = Budget(rows, self._options.max_bytes_per_trigger)
        taken: dict[str, tuple[int, int, int]] = {}
        for queue in queue_order(queues, number):
            cap = (
                budget.messages
                if self._left is None
                else min(budget.messages, self._left.get(queue, 0))
            )
            if budget.spent or cap <= 0:
                continue
            reply = self._subscription.lease(queue, name, cap, budget.bytes)
            messages = reply["messages"]
            if messages:
                taken[queue] = (messages, reply["bytes"], reply.get("ready", 0))
                budget.spend(messages, reply["bytes"])
                if self._left is not None:
                    self._left[queue] = self._left.get(queue, 0) - messages
        return taken

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802
        """What Spark shows as the source's `latestOffset` in each progress report: the backlog
        (pyspark 4.3 gives Python sources no `metrics`; docs/pipeline.md, "Metrics")."""
        return self._subscription.backlog(self._last)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[LeasePart]:
        if start == end:
            return []
        offset = LeaseOffset.from_json(end)
        options = self._options
        return [
            LeasePart(
                broker=options.broker,
                queue=piece.queue,
                lease=piece.lease,
                first=piece.first,
                count=piece.count,
                broker_timeout_ms=options.broker_timeout_ms,
                fail_on_data_loss=options.fail_on_data_loss,
                client_name=options.client_name,
                curve=options.curve,
            )
            for piece in slices(offset, options.num_partitions)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LeasePart)
        yield from read_lease(partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._commit(LeaseOffset.from_json(end))

    def stop(self) -> None:
        # Spark 4.3 does not call this (it kills the runner); leases are not tied to it.
        self._link.close()

    def _row_cap(self, limit: ReadLimit) -> int:
        cap = self._options.max_records_per_trigger
        if isinstance(limit, ReadMaxRows):
            cap = min(cap, limit.max_rows)
        return cap

    def _commit(self, offset: LeaseOffset) -> None:
        """Ack the leases of batch `offset` (idempotent at the broker; once per process)."""
        self._reader = offset.reader
        if offset.lease <= self._committed_through:
            return
        for queue in offset.leased():
            self._link.call("lease-commit", queue=queue, lease=offset.lease_name)
        self._committed_through = offset.lease
