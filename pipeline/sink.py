"""The sink: `df.writeStream.format("phpmq")` and `df.write.format("phpmq")`.

Each Spark task opens its own connection (inside `write()`, on the executor), publishes its
rows and returns only once the broker has them (pipeline.publish). The driver's commit has
nothing left to do: a message the broker has cannot be taken back, so a failed batch that is
run again publishes its rows again (at-least-once; see docs/pipeline.md).

Columns: `content` (binary or string) is required; `queue` (string), `event` (string) and `ttl`
(integer, seconds, 0 = never expires) are optional and fall back to the options of the same
name when absent or null. A row with an event is published as that event (docs/protocol.md
§6.5: one copy into every queue bound to a matching pattern) instead of sent to its queue; a
row with neither an event nor a queue fails the task. Other columns are ignored.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, IntegralType, StringType, StructType

from .options import OptionError, SinkOptions
from .publish import Publisher, open_publisher

#: Task-local properties Spark sets for a streaming write (observed in 4.3, not a public API):
#: the query id survives restarts from the checkpoint, so with the batch id it names a batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True)
class SinkColumns:
    """Which input columns the sink reads."""

    content_is_text: bool
    has_queue: bool
    has_ttl: bool
    has_event: bool = False

    @classmethod
    def of(cls, schema: StructType, options: SinkOptions) -> SinkColumns:
        """The columns of `schema` the sink reads.

        Raises:
            OptionError: no usable `content` column, a column of the wrong type, or no queue.
        """
        fields = {field.name: field.dataType for field in schema.fields}
        content = fields.get("content")
        if not isinstance(content, BinaryType | StringType):
            raise OptionError(
                "the phpmq sink needs a column `content` of type binary or string; got"
                f" {content.simpleString() if content else 'none'} (columns: {list(fields)})"
            )
        queue, ttl, event = fields.get("queue"), fields.get("ttl"), fields.get("event")
        for name, column in (("queue", queue), ("event", event)):
            if column is not None and not isinstance(column, StringType):
                raise OptionError(f"column `{name}` must be a string, not {column.simpleString()}")
        if ttl is not None and not isinstance(ttl, IntegralType):
            raise OptionError(f"column `ttl` must be an integer, not {ttl.simpleString()}")
        if queue is None and options.queue is None and event is None and options.event is None:
            raise OptionError(
                "give the option queue, or a column `queue`, to the phpmq sink (or the option"
                " event, or a column `event`, to publish rows as events)"
            )
        text = isinstance(content, StringType)
        return cls(text, queue is not None, ttl is not None, event is not None)


@dataclass
class Published(WriterCommitMessage):
    """What one task published."""

    partition: int
    count: int
    confirmed: bool
    deduplicated: bool


#: Where a row goes: (True, event name) or (False, queue name).
Target = tuple[bool, str]


class _Runs:
    """Turns record batches into runs of consecutive rows with one target (a queue or an
    event) and one TTL, so each run to a queue goes out as packed frames (Client.send_many)."""

    def __init__(self, columns: SinkColumns, options: SinkOptions) -> None:
        self._columns = columns
        self._options = options

    def of(self, batch: pa.RecordBatch) -> Iterator[tuple[Target, int, list[bytes]]]:
        rows = zip(self._targets(batch), self._ttls(batch), self._contents(batch), strict=True)
        for (target, ttl), run in itertools.groupby(rows, key=lambda row: (row[0], row[1])):
            yield target, ttl, [content for _, _, content in run]

    def _contents(self, batch: pa.RecordBatch) -> list[bytes]:
        values = batch.column("content").to_pylist()
        if None in values:
            raise ValueError("the phpmq sink cannot publish a row whose content is null")
        if self._columns.content_is_text:
            return [value.encode() for value in values]
        return values

    def _targets(self, batch: pa.RecordBatch) -> list[Target]:
        columns, options = self._columns, self._options
        events = _column_or(batch, "event", columns.has_event, options.event)
        queues = _column_or(batch, "queue", columns.has_queue, options.queue)
        targets: list[Target] = []
        for event, queue in zip(events, queues, strict=True):
            if event is not None:
                targets.append((True, event))
            elif queue is not None:
                targets.append((False, queue))
            else:
                raise ValueError(
                    "a row has a null `queue` and the option queue is not set (nor an event)"
                )
        return targets

    def _ttls(self, batch: pa.RecordBatch) -> list[int]:
        default = self._options.ttl
        if not self._columns.has_ttl:
            return [default] * batch.num_rows
        values = [default if value is None else value for value in batch.column("ttl").to_pylist()]
        if any(value < 0 for value in values):
            raise ValueError("column `ttl` holds a negative value (seconds; 0 = never expires)")
        return values


def _column_or(
    batch: pa.RecordBatch, name: str, present: bool, default: str | None
) -> list[str | None]:
    """Column `name`'s values, `default` where it is absent or null."""
    if not present:
        return [default] * batch.num_rows
    return [default if value is None else value for value in batch.column(name).to_pylist()]


def _publish(
    batches: Iterator[pa.RecordBatch], runs: _Runs, options: SinkOptions, scope: str
) -> Published:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    publisher: Publisher | None = None  # opened at the first row: many partitions are empty
    try:
        row = 0
        for batch in batches:
            for (is_event, target), ttl, contents in runs.of(batch):
                if publisher is None:
                    prefix = f"{scope}/{partition}"
                    publisher = open_publisher(options.broker, options.client_name, prefix)
                if is_event:
                    publisher.publish_event(target, ttl, contents, row)
                else:
                    publisher.publish(target, ttl, contents, row)
                row += len(contents)
        if publisher is None:
            return Published(partition, 0, confirmed=True, deduplicated=True)
        receipt = publisher.finish()
    finally:
        if publisher is not None:
            publisher.close()
    return Published(partition, receipt.published, receipt.confirmed, receipt.deduplicated)


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
        self._runs = _Runs(columns, options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return _publish(iterator, self._runs, self._options, _streaming_scope())

    def commit(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        pass  # every task's messages were with the broker before the task returned

    def abort(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        pass  # published messages cannot be recalled; the batch's retry publishes them again


class PhpmqBatchWriter(DataSourceArrowWriter):
    """`df.write.format("phpmq")`: keys are `<keyScope>/<partition>/<row>`, or without that
    option `write-<uuid>/<partition>/<row>`; the uuid is drawn when Spark plans the write, so a
    retried task derives the same keys."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self._options = options
        self._runs = _Runs(columns, options)
        self._scope = options.key_scope or f"write-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return _publish(iterator, self._runs, self._options, self._scope)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        pass
