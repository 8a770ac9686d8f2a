"""The Spark sink's Kafka-shaped `headers` column (pipeline/sink_rows.py `_pairs_as_map`),
against a plain model, without Spark: for any rows of (key, value) pairs (null rows, null
headers, null keys, keys given twice, values that are not UTF-8 text), in any slice of a
batch, `check` refuses the first row the sink cannot send (422, naming it) and otherwise the
headers sent are each row's pairs as a dict's compact JSON (a key's first place, its last
value; none for a row without any)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_harness import skip_without_spark

try:
    import pyarrow as pa
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

    from phpmq.pipeline.options import SinkOptions
    from phpmq.pipeline.sink_rows import RowRefused, SinkColumns, SinkRows
except ModuleNotFoundError as missing:
    skip_without_spark(missing)

KAFKA_HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
SCHEMA = StructType([StructField("content", StringType()), StructField("headers", KAFKA_HEADERS)])
ARROW = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

_keys = st.none() | st.sampled_from(["a", "b", 'q"', "\u00e9", ""])
_values = st.none() | st.sampled_from([b"1", b"", b"\xc3\xa9", b"\xff", b'"x"', b"\\"])
_header = st.none() | st.fixed_dictionaries({"key": _keys, "value": _values})
_rows = st.lists(st.none() | st.lists(_header, max_size=4), max_size=8)
#: Rows Arrow turns alone (no null key or header, UTF-8 values; keys twice now and then).
_clean_header = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["a", "b", 'q"', "\u00e9", ""]),
        "value": st.none() | st.sampled_from([b"1", b"", b"\xc3\xa9", b'"x"', b"\\"]),
    }
)
_clean_rows = st.lists(st.none() | st.lists(_clean_header, max_size=3), max_size=8)


def expected(rows: list) -> tuple[int | None, list[bytes | None]]:
    """(the first row to refuse, or None; each row's headers JSON) as the model says."""
    sent: list[bytes | None] = []
    for index, row in enumerate(rows):
        headers: dict[str, str | None] = {}
        for header in row or []:
            if header is None:
                continue
            if header["key"] is None:
                return index, []
            value = header["value"]
            if value is not None:
                try:
                    value = value.decode()
                except UnicodeDecodeError:
                    return index, []
            headers[header["key"]] = value
        sent.append(msgspec.json.encode(headers) if headers else None)
    return None, sent


@settings(max_examples=400, deadline=None)
@given(_rows | _clean_rows, st.integers(0, 8), st.integers(0, 8))
def test_kafka_shaped_headers_are_sent_as_the_model_says(
    rows: list, first: int, length: int
) -> None:
    options = SinkOptions.parse({"queue": "q"})
    sink = SinkRows(SinkColumns.of(SCHEMA, options), options)
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["c"] * len(rows)), pa.array(rows, ARROW)], ["content", "headers"]
    )
    first = min(first, len(rows))
    part = batch.slice(first, length)
    refused_row, sent = expected(rows[first : first + length])
    if refused_row is not None:
        with pytest.raises(RowRefused) as refused:
            sink.check(part, 100, 1 << 20)
        assert (refused.value.code, refused.value.row) == (422, 100 + refused_row)
        return
    sink.check(part, 100, 1 << 20)
    got = [h for run in sink.runs(part, 100) for h in run.headers or []]
    assert got == sent
