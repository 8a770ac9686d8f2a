"""The sink: `df.writeStream.format("phpmq")` and `df.write.format("phpmq")`.

Each Spark task opens its own connection (inside `write()`, on the executor), checks its rows
against the broker's packet limit, publishes them and returns only once the broker has them
(pipeline.publish). A batch that is run again publishes its rows with the same idempotency
keys, so the broker queues none of them twice (see docs/pipeline.md). A streaming task has the
broker hold its query's keys (no expiry) where its rows go; the driver's commit of batch B lets
the keys of the batches before B go, the ones Spark can no longer run again.
Columns: pipeline.sink_rows.
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
from .publish import Publisher, PublishError, Target, commit_holds, open_publisher
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
    #: A streaming task's query id and where the broker holds its keys (is_event, target).
    hold_scope: str | None = None
    held_at: tuple[Target, ...] = ()


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
    batches: Iterator[pa.RecordBatch],
    rows: SinkRows,
    options: SinkOptions,
    scope: str,
    hold_scope: str | None = None,
) -> Published:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    batches = (batch for batch in batches if batch.num_rows)
    first = next(batches, None)
    if first is None:  # many partitions are empty: no connection for them
        return Published(partition, 0, confirmed=True, deduplicated=True)
    publisher = open_publisher(
        options.broker, options.client_name, f"{scope}/{partition}", options.curve, hold_scope
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
    held = receipt.held_at
    return Published(
        partition, receipt.published, receipt.confirmed, receipt.deduplicated,
        hold_scope if held else None, held,
    )  # fmt: skip


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


def _streaming_scope() -> tuple[str, str | None]:
    """The task's key scope `<query id>/<batch id>`, and the query id its keys are held by
    (None: Spark did not say which query and batch, and nothing is held)."""
    context = TaskContext.get()
    if context is None:
        return "stream", None
    query = context.getLocalProperty(QUERY_ID_PROPERTY)
    batch = context.getLocalProperty(BATCH_ID_PROPERTY)
    held = query if query and batch and batch.isdigit() else None
    return f"{query or 'query'}/{batch or 'batch'}", held


class PhpmqStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("phpmq")`: keys are `<query id>/<batch id>/<partition>/<row>`,
    held by the broker until the commit of the next batch."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self._options = options
        self._rows = SinkRows(columns, options)
        #: Where the last batch's keys are held: a shard this batch did not write to is told
        #: of the commit too, so that it lets them go.
        self._last_held_at: tuple[Target, ...] = ()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        scope, hold_scope = _streaming_scope()
        return _publish(iterator, self._rows, self._options, scope, hold_scope)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        """Every task's messages were with the broker before the task returned. Spark runs
        this batch again only until it writes commits/<batch_id>, after this returns: the
        keys of earlier batches can go (docs/pipeline.md, "Retries do not duplicate")."""
        published = [m for m in messages if isinstance(m, Published) and m.hold_scope]
        if not published:
            return
        held_at = tuple(dict.fromkeys(t for m in published for t in m.held_at))
        targets = tuple(dict.fromkeys((*held_at, *self._last_held_at)))
        options = self._options
        scope = published[0].hold_scope
        assert scope is not None
        commit_holds(options.broker, options.client_name, options.curve, scope, batch_id, targets)
        self._last_held_at = held_at

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
