"""The rows of the `phpmq` source and batch read, made from the broker's ENTRY objects.

`lease-read`, `queue-peek` and `dlq-list` all answer with entries `{"id", "content" (base64),
"ttl", "deliveries", "sent_at", "headers" (JSON text or ""), "key" (base64 or null)}`, dead
letters with `reason` and `dead_at` too. One page of entries becomes one Arrow record batch,
in the schema Spark derives from SOURCE_SCHEMA (Spark checks it is exactly that).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

#: The rows the streaming source and the batch read produce, in this order.
SOURCE_SCHEMA = StructType(
    [
        StructField("queue", StringType()),
        StructField("id", StringType()),
        StructField("key", BinaryType()),
        StructField("content", BinaryType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("ttl", IntegerType()),
        StructField("delivery_count", IntegerType()),
        StructField("sent_at", TimestampType()),
        StructField("received_at", TimestampType()),
    ]
)
#: A batch read of dead letters: the same, and why and when each died.
DEAD_LETTER_SCHEMA = StructType(
    [
        *SOURCE_SCHEMA.fields,
        StructField("reason", StringType()),
        StructField("dead_at", TimestampType()),
    ]
)
ARROW_SCHEMA = to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")
DEAD_LETTER_ARROW_SCHEMA = to_arrow_schema(DEAD_LETTER_SCHEMA, timezone="UTC")


def record_batch(
    queue: str, entries: Sequence[dict[str, Any]], dead: bool = False
) -> pa.RecordBatch:
    """One Arrow batch of rows for `entries` of `queue`, read now."""
    now_us = time.time_ns() // 1_000
    columns: list[list[Any]] = [
        [queue] * len(entries),
        [entry["id"] for entry in entries],
        [_bytes(entry.get("key")) for entry in entries],
        [base64.b64decode(entry["content"]) for entry in entries],
        [_headers(entry.get("headers")) for entry in entries],
        [int(entry.get("ttl") or 0) for entry in entries],
        [int(entry.get("deliveries") or 0) for entry in entries],
        [_micros(entry.get("sent_at")) for entry in entries],
        [now_us] * len(entries),
    ]
    schema = DEAD_LETTER_ARROW_SCHEMA if dead else ARROW_SCHEMA
    if dead:
        columns.append([entry.get("reason") for entry in entries])
        columns.append([_micros(entry.get("dead_at")) for entry in entries])
    arrays = [
        pa.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _headers(text: str | dict[str, Any] | None) -> list[tuple[str, str]]:
    """The producer's HEADERS JSON text as map entries (values that are not strings as JSON)."""
    if not text:
        return []
    headers: Any = text
    if isinstance(text, str):
        try:
            headers = json.loads(text)
        except (json.JSONDecodeError, RecursionError):  # (nested too deep to read)
            return [("", text)]  # not JSON: kept whole rather than lost
    if not isinstance(headers, dict):
        return [("", str(text))]
    return [
        (str(name), value if isinstance(value, str) else json.dumps(value))
        for name, value in headers.items()
    ]


def _micros(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1_000_000)
