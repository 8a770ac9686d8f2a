"""The sink's input: which columns it reads, and each Arrow batch of a task as runs of messages
(pipeline.publish.Run), checked against the broker's packet limit before any is sent.

Columns: `content` (binary or string) is required; `queue` (string) and `event` (string) are
used where the option of the same name is not given (an option overrides its column, as in
Kafka's sink); `ttl` (integer, seconds, 0 = never expires) falls back to the option where it is
absent or null; `headers` (map<string,string>, or Kafka's array of (key, value) structs with
values as UTF-8 bytes or text, as Spark's Kafka source gives them) becomes the message's
HEADERS JSON and `key` (binary or string) its message key. A row with an event is published
as that event (docs/protocol.md §6.5) instead of sent to its queue; a row with neither fails
the task. Other columns are ignored.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import numpy
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegralType,
    MapType,
    StringType,
    StructType,
)

from ..protocol import ErrorCode, event_name_problem, queue_name_problem
from .options import OptionError, SinkOptions
from .publish import Run

#: Headers are sent as the client sends them (compact JSON), so their size is measured so.
_HEADERS_JSON = msgspec.json.Encoder()


@dataclass(frozen=True)
class SinkColumns:
    """Which input columns the sink reads."""

    content_is_text: bool
    has_queue: bool
    has_ttl: bool
    has_event: bool = False
    has_headers: bool = False
    has_key: bool = False
    #: The headers column is Kafka's array of (key, value) structs, not a map.
    headers_are_pairs: bool = False

    @classmethod
    def of(cls, schema: StructType, options: SinkOptions) -> SinkColumns:
        """The columns of `schema` the sink reads.

        Raises:
            OptionError: no usable `content` column, a column of the wrong type, or no queue.
        """
        fields = {field.name: field.dataType for field in schema.fields}
        content = fields.get("content")
        if not isinstance(content, BinaryType | StringType):
            kafka = " (Kafka's `value`: rename it to content)" if "value" in fields else ""
            raise OptionError(
                "the phpmq sink needs a column `content` of type binary or string; got"
                f" {content.simpleString() if content else 'none'} (columns: {list(fields)}){kafka}"
            )
        queue, ttl, event = fields.get("queue"), fields.get("ttl"), fields.get("event")
        headers, key = fields.get("headers"), fields.get("key")
        for name, column in (("queue", queue), ("event", event)):
            if column is not None and not isinstance(column, StringType):
                raise OptionError(f"column `{name}` must be a string, not {column.simpleString()}")
        if ttl is not None and not isinstance(ttl, IntegralType):
            raise OptionError(f"column `ttl` must be an integer, not {ttl.simpleString()}")
        if key is not None and not isinstance(key, BinaryType | StringType):
            raise OptionError(f"column `key` must be binary or a string, not {key.simpleString()}")
        pairs = headers is not None and _is_kafka_headers(headers)
        if headers is not None and not pairs and not _is_string_map(headers):
            raise OptionError(
                "column `headers` must be a map<string,string> or Kafka's"
                f" array<struct<key:string,value:binary>>, not {headers.simpleString()}"
            )
        if queue is None and options.queue is None and event is None and options.event is None:
            raise OptionError(
                "give the option queue, or a column `queue`, to the phpmq sink (or the option"
                " event, or a column `event`, to publish rows as events)"
            )
        text = isinstance(content, StringType)
        return cls(
            text, queue is not None, ttl is not None, event is not None, headers is not None,
            key is not None, pairs,
        )  # fmt: skip


def _is_string_map(column: object) -> bool:
    return (
        isinstance(column, MapType)
        and isinstance(column.keyType, StringType)
        and isinstance(column.valueType, StringType)
    )


def _is_kafka_headers(column: object) -> bool:
    """Kafka's headers: array<struct<key:string,value:binary>> (or the value as a string)."""
    if not isinstance(column, ArrayType) or not isinstance(column.elementType, StructType):
        return False
    fields = {field.name: field.dataType for field in column.elementType.fields}
    return (
        len(fields) == 2
        and isinstance(fields.get("key"), StringType)
        and isinstance(fields.get("value"), BinaryType | StringType)
    )


#: Where a row goes: (True, event name) or (False, queue name).
Target = tuple[bool, str]


class RowRefused(ValueError):
    """A row the broker would refuse with `code`: a packet over its `max_content_bytes` (413;
    the broker would also drop the rest of the frame unanswered), a bad queue or event name
    (422). The message says why."""

    def __init__(self, code: int, row: int, problem: str) -> None:
        super().__init__(problem)
        self.code = code
        self.row = row


def _too_large(row: int, part: str, size: int, limit: int) -> RowRefused:
    problem = f"its {part} is {size} bytes, over the broker's max_content_bytes {limit}"
    return RowRefused(ErrorCode.TOO_LARGE, row, problem)


class SinkRows:
    """Turns record batches into runs of consecutive rows with one target (a queue or an event)
    and one TTL, so each run goes out as packed frames (Client.send_many, Client.publish_many),
    each row with its own headers and message key."""

    def __init__(self, columns: SinkColumns, options: SinkOptions) -> None:
        self._columns = columns
        self._options = options
        #: Kafka-shaped headers turned into maps by `check`, for `runs`: id(batch) ->
        #: (batch, map); at most the batches a task holds checked ahead (sink.checked_ahead).
        self._converted: dict[int, tuple[pa.RecordBatch, pa.MapArray]] = {}

    def check(self, batch: pa.RecordBatch, first_row: int, limit: int) -> None:
        """Raise RowRefused for the first row of `batch` (row `first_row` of the task) the
        broker would refuse: a content, headers or key longer than `limit` bytes, or a queue or
        event name it does not take."""
        for name in ("content", "key") if self._columns.has_key else ("content",):
            lengths = pc.binary_length(batch.column(name).cast(pa.binary()))
            if (pc.max(lengths).as_py() or 0) > limit:
                index = pc.index(pc.greater(lengths, limit), True).as_py()
                raise _too_large(first_row + index, name, lengths[index].as_py(), limit)
        if self._columns.has_headers:
            try:
                column = self._headers_map(batch)
            except BadHeader as exc:
                raise RowRefused(ErrorCode.INVALID_VALUE, first_row + exc.row, str(exc)) from None
            if self._columns.headers_are_pairs:
                self._converted[id(batch)] = (batch, column)
            for index in _headers_maybe_over(column, limit):
                pairs = column[index].as_py()
                size = len(_HEADERS_JSON.encode(dict(pairs))) if pairs else 0
                if size > limit:
                    raise _too_large(first_row + index, "headers (as JSON)", size, limit)
        single = self._single_target()
        targets = [(0, single)] if single is not None else _first_of_each(self._targets(batch))
        for index, (is_event, name) in targets:
            problem = event_name_problem(name) if is_event else queue_name_problem(name)
            if problem is not None:
                raise RowRefused(ErrorCode.INVALID_VALUE, first_row + index, f"{problem}: {name!r}")

    def runs(self, batch: pa.RecordBatch, first_row: int) -> Iterator[Run]:
        """The runs of `batch`, whose first row is row `first_row` of the task."""
        contents = self._contents(batch)
        headers, message_keys = self._headers(batch), self._message_keys(batch)
        # Either column gives the rows both (None where absent): rows of one form, which the
        # broker reads as a run (Client.send_many).
        if headers is None and message_keys is not None:
            headers = [None] * len(message_keys)
        elif message_keys is None and headers is not None:
            message_keys = [None] * len(headers)
        single = self._single_target()
        if single is not None and not self._columns.has_ttl:  # the batch is one run
            yield Run(*single, self._options.ttl, contents, first_row, headers, message_keys)
            return
        start = 0
        destinations = zip(self._targets(batch), self._ttls(batch), strict=True)
        for (target, ttl), rows in itertools.groupby(destinations):
            end = start + sum(1 for _ in rows)
            yield Run(
                target[0], target[1], ttl, contents[start:end], first_row + start,
                None if headers is None else headers[start:end],
                None if message_keys is None else message_keys[start:end],
            )  # fmt: skip
            start = end

    def _contents(self, batch: pa.RecordBatch) -> list[bytes]:
        values = batch.column("content").to_pylist()
        if None in values:
            raise ValueError("the phpmq sink cannot publish a row whose content is null")
        if self._columns.content_is_text:
            return [value.encode() for value in values]
        return values

    def _single_target(self) -> Target | None:
        """The target of every row when the options decide it (an option overrides its
        column, and `event` goes before `queue`); None when the rows' columns do."""
        options = self._options
        if options.event is not None:
            return (True, options.event)
        if options.queue is not None and not self._columns.has_event:
            return (False, options.queue)
        return None

    def _targets(self, batch: pa.RecordBatch) -> list[Target]:
        single = self._single_target()
        if single is not None:
            return [single] * batch.num_rows
        columns, options = self._columns, self._options
        events = _option_or_column(batch, "event", columns.has_event, options.event)
        queues = _option_or_column(batch, "queue", columns.has_queue, options.queue)
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

    def _headers(self, batch: pa.RecordBatch) -> list[bytes | None] | None:
        """Each row's headers as the JSON the client sends (None: no `headers` column); encoded
        here once, so the client sends the bytes as they are."""
        if not self._columns.has_headers:
            return None
        column = self._headers_map(batch)
        built = _headers_json(column)
        if built is not None:
            return built
        encode = _HEADERS_JSON.encode
        # A map arrives as a list of (key, value) pairs; an empty or null map sends no headers.
        return [encode(dict(pairs)) if pairs else None for pairs in column.to_pylist()]

    def _headers_map(self, batch: pa.RecordBatch) -> pa.MapArray:
        """The `headers` column as a map: Kafka's pairs turned into one (once: `check` keeps
        what it turned for `runs`).

        Raises:
            BadHeader: a row's Kafka-shaped headers cannot be sent.
        """
        column = batch.column("headers")
        if not self._columns.headers_are_pairs:
            return column
        converted = self._converted.pop(id(batch), None)
        if converted is not None and converted[0] is batch:
            return converted[1]
        return _pairs_as_map(column)

    def _message_keys(self, batch: pa.RecordBatch) -> list[bytes | None] | None:
        """Each row's message key (None: no `key` column); a string column is cast to bytes in
        Arrow, not row by row (0.15 -> 0.03 us a row)."""
        if not self._columns.has_key:
            return None
        return batch.column("key").cast(pa.binary()).to_pylist()


class BadHeader(ValueError):
    """Kafka-shaped headers the sink cannot send: row `row` of the batch, and why."""

    def __init__(self, row: int, problem: str) -> None:
        super().__init__(problem)
        self.row = row


def _pairs_as_map(column: pa.ListArray) -> pa.MapArray:
    """Kafka's headers (each row a list of (key, value) structs) as the map the sink reads:
    the pairs in their order, a null list a null map, a null header (a null struct in the
    list) none. A key a row gives twice (Kafka allows it) keeps its first place and its last
    value, as a dict of the pairs would: the headers' JSON has each key once.

    Raises:
        BadHeader: a row with a null key, or a value that is not UTF-8 text (headers travel
            as JSON).
    """
    offsets = column.offsets  # into the entries of every row, not only of this slice
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    entries = column.values.slice(start, end - start)
    parents = pc.list_parent_indices(column)
    keys, values = entries.field("key"), entries.field("value")
    if entries.null_count or keys.null_count:
        return _row_by_row(column, parents, entries)
    try:
        keys, values = keys.cast(pa.string()), values.cast(pa.string())
        values.validate(full=True)
    except (pa.ArrowInvalid, ValueError):
        return _row_by_row(column, parents, entries)  # which names the row
    pairs = pa.table({"row": parents, "key": keys})
    if pairs.group_by(["row", "key"]).aggregate([]).num_rows < len(keys):
        return _row_by_row(column, parents, entries)
    rebased = pc.subtract(offsets, start).cast(pa.int32())
    return pa.MapArray.from_arrays(rebased, keys, values, mask=column.is_null())


def _row_by_row(column: pa.ListArray, parents: pa.Array, entries: pa.StructArray) -> pa.MapArray:
    """`_pairs_as_map` in Python, for a batch Arrow alone cannot turn: a key given twice, a
    null header, or a row to refuse (BadHeader)."""
    rows: list[dict[str, str | None] | None] = [
        None if empty else {} for empty in column.is_null().to_pylist()
    ]
    pairs = zip(
        parents.to_pylist(),
        entries.is_valid().to_pylist(),
        entries.field("key").to_pylist(),
        entries.field("value").to_pylist(),
        strict=True,
    )
    for row, valid, key, value in pairs:
        headers = rows[row]
        if headers is None or not valid:
            continue  # a null header; or a null row's entries, if any, are not its own
        if key is None:
            raise BadHeader(row, "its `headers` hold a header whose key is null")
        if isinstance(value, bytes):
            try:
                value = value.decode()
            except UnicodeDecodeError:
                raise BadHeader(
                    row,
                    f"its header {key!r} has a value that is not UTF-8 text: the phpmq sink"
                    " sends headers as JSON text (decode binary values to strings first)",
                ) from None
        headers[key] = value
    maps = [None if headers is None else list(headers.items()) for headers in rows]
    return pa.array(maps, pa.map_(pa.string(), pa.string()))


def _headers_json(column: pa.MapArray) -> list[bytes | None] | None:
    """Each row's headers as the client's compact JSON (what `_HEADERS_JSON` writes of the
    row's dict), built in Arrow rather than row by row in Python (1.2 -> 0.15 us a row);
    None (a row without any) for an empty or null map. None for the whole batch when a key or
    value holds a control character, which only the row-by-row path escapes, or text that is
    not UTF-8, which it refuses. Spark's maps have no duplicate keys; a decoder would keep the
    last of any, as the dict would."""
    try:
        offsets = column.offsets  # into the entries of every row, not only of this slice
        start, end = offsets[0].as_py(), offsets[-1].as_py()
        entries = column.values.slice(start, end - start)
        # Large strings (spark.sql.execution.arrow.useLargeVarTypes) as strings; text that is
        # not UTF-8 raises here, and the row-by-row path then refuses it as it always did.
        keys, values = entries.field(0).cast(pa.string()), entries.field(1).cast(pa.string())
        escapes = False
        for strings in (keys, values):
            strings.validate(full=True)
            text = _text_bytes(strings)
            if (text < _SPACE).any():
                return None
            escapes = escapes or bool(((text == _QUOTE) | (text == _BACKSLASH)).any())
        counts = numpy.diff(offsets.to_numpy())
        if not (escapes or values.null_count or column.null_count) and (counts == 1).all():
            # A header a row, the usual keyed row: one join.
            objects = pc.binary_join_element_wise('{"', keys, '":"', values, '"}', "")
            return objects.cast(pa.binary()).to_pylist()
        quoted = _quoted if escapes else _quoted_plainly
        value_json = quoted(values)
        if values.null_count:
            value_json = pc.if_else(pc.is_valid(values), value_json, "null")
        pairs = pc.binary_join_element_wise(quoted(keys), value_json, ":")
        rows = pa.ListArray.from_arrays(pc.subtract(offsets, start), pairs)
        objects = pc.binary_join_element_wise("{", pc.binary_join(rows, ","), "}", "")
        has_headers = pc.and_(
            pc.greater(pc.subtract(offsets[1:], offsets[:-1]), 0), column.is_valid()
        )
    except (pa.ArrowException, ValueError):
        return None
    return pc.if_else(has_headers, objects, None).cast(pa.binary()).to_pylist()


#: The bytes that decide how JSON writes a text: below a space, JSON writes a \u escape (or
#: \n and the like), which Arrow cannot; a quote and a backslash are escaped with a backslash.
#: UTF-8 has them only as these single bytes, never inside another character's.
_SPACE, _QUOTE, _BACKSLASH = 0x20, ord('"'), ord("\\")


def _text_bytes(strings: pa.StringArray) -> numpy.ndarray:
    """The UTF-8 bytes of `strings`' values, as one array (no copy)."""
    offsets, data = strings.buffers()[1:3]
    if not len(strings) or offsets is None or data is None:
        return numpy.empty(0, numpy.uint8)
    bounds = numpy.frombuffer(offsets, numpy.int32)[strings.offset :][[0, len(strings)]]
    return numpy.frombuffer(data, numpy.uint8)[bounds[0] : bounds[1]]


def _quoted(strings: pa.Array) -> pa.Array:
    """Each string as a JSON string without control characters: quoted, `\\` and `"`
    escaped."""
    escaped = pc.replace_substring(pc.replace_substring(strings, "\\", "\\\\"), '"', '\\"')
    return _quoted_plainly(escaped)


def _quoted_plainly(strings: pa.Array) -> pa.Array:
    """Each string as a JSON string when none holds a control character, `\\` or `"`."""
    return pc.binary_join_element_wise('"', strings, '"', "")


def _first_of_each(targets: list[Target]) -> list[tuple[int, Target]]:
    """(index, target) of the first row of each distinct target."""
    first: dict[Target, int] = {}
    for index, target in enumerate(targets):
        first.setdefault(target, index)
    return [(index, target) for target, index in first.items()]


def _option_or_column(
    batch: pa.RecordBatch, name: str, present: bool, option: str | None
) -> list[str | None]:
    """The option's value for every row when it is given (as Kafka's `topic` option overrides
    the column: a phpmq source's `queue` column must not send rows back where they came from);
    else column `name`'s values (None where it is absent or null)."""
    if option is not None or not present:
        return [option] * batch.num_rows
    return batch.column(name).to_pylist()


#: JSON writes a string's byte as at most 6 (`\u00XX`), and each map entry adds at most 6
#: more (two pairs of quotes, a colon, a comma), the object 2: an upper bound of its size.
_JSON_BYTES_PER_BYTE = 6
_JSON_BYTES_PER_ENTRY = 6


def _headers_maybe_over(column: pa.MapArray, limit: int) -> list[int]:
    """The rows whose headers' JSON may be longer than `limit`, by a bound from the map's
    string lengths (no row is encoded for it): the few it names are then encoded to know."""
    offsets = column.offsets.to_numpy()
    values = column.values  # the entries of every row, not only of this slice: offsets index it
    lengths = pc.add(
        pc.binary_length(values.field(0)), pc.fill_null(pc.binary_length(values.field(1)), 0)
    ).to_numpy(zero_copy_only=False)
    totals = numpy.concatenate(([0], numpy.cumsum(lengths, dtype=numpy.int64)))
    entries = numpy.diff(offsets)
    bounds = (
        _JSON_BYTES_PER_BYTE * (totals[offsets[1:]] - totals[offsets[:-1]])
        + _JSON_BYTES_PER_ENTRY * entries
        + 2
    )
    return numpy.flatnonzero(bounds > limit).tolist()
