"""The sink: `df.writeStream.format("phpmq")` and `df.write.format("phpmq")`.

Each Spark task opens its own connection (inside `write()`, on the executor), checks its rows
against the broker's packet limit, publishes them and returns only once the broker has them
(pipeline.publish). The driver's commit has nothing left to do: a message the broker has cannot
be taken back; a batch that is run again publishes its rows with the same idempotency keys, so
the broker queues none of them twice (see docs/pipeline.md). Columns: pipeline.sink_rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from .options import SinkOptions
from .publish import Publisher, PublishError, open_publisher
from .sink_rows import RowRefused, SinkColumns, SinkRows

__all__ = ["PhpmqBatchWriter", "PhpmqStreamWriter", "Published", "SinkColumns"]

#: Task-local properties Spark sets for a streaming write (observed in 4.3, not a public API):
#: the query id survives restarts from the checkpoint, so with the batch id it names a batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: Rows a task reads and checks before it sends the first one, in Arrow bytes: a task smaller
#: than this sends nothing when one of its rows is too large for the broker.
CHECK_AHEAD_BYTES = 64 * 1024 * 1024


@dataclass
class Published(WriterCommitMessage):
    """What one task published."""

    partition: int
    count: int
    confirmed: bool
    deduplicated: bool


def checked_ahead(
    batches: Iterator[pa.RecordBatch], check: Callable[[pa.RecordBatch, int], None]
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """(batch, its first row in the task), each checked with `check(batch, first_row)` before
    it is given out, and none given out before CHECK_AHEAD_BYTES of them (or all) passed."""
    held: list[tuple[pa.RecordBatch, int]] = []
    held_bytes = row = 0
    for batch in batches:
        check(batch, row)
        held.append((batch, row))
        held_bytes += batch.nbytes
        row += batch.num_rows
        if held_bytes >= CHECK_AHEAD_BYTES:
            yield from held
            held, held_bytes = [], 0
    yield from held


def _publish(
    batches: Iterator[pa.RecordBatch], rows: SinkRows, options: SinkOptions, scope: str
) -> Published:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    batches = (batch for batch in batches if batch.num_rows)
    first = next(batches, None)
    if first is None:  # many partitions are empty: no connection for them
        return Published(partition, 0, confirmed=True, deduplicated=True)
    publisher = open_publisher(
        options.broker, options.client_name, f"{scope}/{partition}", options.curve
    )
    try:
        sent = 0
        limit = publisher.max_content_bytes
        try:
            for batch, first_row in checked_ahead(
                _chained(first, batches), lambda b, row: rows.check(b, row, limit)
            ):
                _send(publisher, rows, batch, first_row)
                sent = first_row + batch.num_rows
        except RowRefused as exc:
            raise _row_refused(exc, partition, scope, sent) from None
        receipt = publisher.finish()
    finally:
        publisher.close()
    return Published(partition, receipt.published, receipt.confirmed, receipt.deduplicated)


def _chained(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


def _send(publisher: Publisher, rows: SinkRows, batch: pa.RecordBatch, first_row: int) -> None:
    for run in rows.runs(batch, first_row):
        publisher.publish(run)


def _row_refused(exc: RowRefused, partition: int, scope: str, sent: int) -> PublishError:
    done = "nothing of this task was sent" if not sent else f"its rows 0-{sent - 1} were sent"
    return PublishError(
        f"{exc.code} row {exc.row} of task partition {partition} (key"
        f" {scope}/{partition}/{exc.row}) cannot be sent: {exc}; {done}"
    )


def _streaming_scope() -> str:
    context = TaskContext.get()
    if context is None:
        return "stream"
    query = context.getLocalProperty(QUERY_ID_PROPERTY) or "query"
    batch = context.getLocalProperty(BATCH_ID_PROPERTY) or "batch"
    return f"{query}/{batch}"


class PhpmqStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("phpmq")`: keys are `<query id>/<batch id>/<partition>/<row>`."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self._options = options
        self._rows = SinkRows(columns, options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return _publish(iterator, self._rows, self._options, _streaming_scope())

    def commit(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        pass  # every task's messages were with the broker before the task returned

    def abort(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        pass  # published messages cannot be recalled; the batch's retry sends the same keys


class PhpmqBatchWriter(DataSourceArrowWriter):
    """`df.write.format("phpmq")`: keys are `<keyScope>/<partition>/<row>`, or without that
    option `write-<uuid>/<partition>/<row>`; the uuid is drawn when Spark plans the write, so a
    retried task derives the same keys."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self._options = options
        self._rows = SinkRows(columns, options)
        self._scope = options.key_scope or f"write-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return _publish(iterator, self._rows, self._options, self._scope)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        pass
