"""The `phpmq` sink (pipeline/sink.py, sink_rows.py, publish.py) in real Spark local mode
against real broker processes on loopback: columns and options, refusals, idempotency keys
across a replayed batch, headers and message keys.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import BrokerProcess
from pipeline_harness import drain, queue_stats, run_available_now, skip_without_spark

try:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    from phpmq.pipeline import publish, sink, sink_rows
    from phpmq.pipeline.datasource import PhpmqDataSource
    from phpmq.pipeline.options import SPARK_WRITER_OPTION_NAMES, OptionError, SinkOptions
    from phpmq.pipeline.sink_rows import RowRefused, SinkColumns, SinkRows
except ModuleNotFoundError as missing:
    skip_without_spark(missing)

CONTENT = StructField("content", StringType())


# One Spark (a JVM) at a time: the Spark files run one after another in one worker.
pytestmark = pytest.mark.xdist_group("spark-b")


def write_to(frame: DataFrame, broker: BrokerProcess, **options: str) -> None:
    writer = frame.write.format("phpmq").option("broker", broker.address)
    writer.options(**options).mode("append").save()


# --------------------------------------------------------------------------- without Spark


def test_sink_checks_columns_and_mode_before_anything_runs() -> None:
    text_only = StructType([CONTENT])
    source_like = StructType([StructField("content", BinaryType()), StructField("id", LongType())])
    sink_source = PhpmqDataSource({"queue": "out"})
    assert sink_source.writer(source_like, overwrite=False) is not None
    with pytest.raises(OptionError, match="cannot be overwritten"):
        sink_source.writer(source_like, overwrite=True)
    with pytest.raises(OptionError, match=r"needs a column `content`.*Kafka's `value`"):
        sink_source.streamWriter(StructType([StructField("value", StringType())]), False)
    with pytest.raises(OptionError, match="option queue, or a column `queue`"):
        PhpmqDataSource({}).writer(text_only, overwrite=False)
    numbered_headers = StructType(
        [CONTENT, StructField("headers", MapType(StringType(), LongType()))]
    )
    with pytest.raises(
        OptionError,
        match=r"`headers` must be a map<string,string> or Kafka's .*, not map<string,bigint>",
    ):
        sink_source.writer(numbered_headers, overwrite=False)
    with pytest.raises(OptionError, match="column `key` must be binary or a string, not bigint"):
        sink_source.writer(StructType([CONTENT, StructField("key", LongType())]), False)


def test_sink_takes_an_event_column_or_option_instead_of_a_queue() -> None:
    text_only = StructType([CONTENT])
    with_event = StructType([CONTENT, StructField("event", StringType())])
    assert PhpmqDataSource({"event": "order.paid"}).writer(text_only, overwrite=False)
    assert PhpmqDataSource({}).writer(with_event, overwrite=False) is not None
    with pytest.raises(OptionError, match=r"option event: event name 'order\.\*'"):
        PhpmqDataSource({"event": "order.*"}).writer(text_only, overwrite=False)
    numbered = StructType([CONTENT, StructField("event", LongType())])
    with pytest.raises(OptionError, match="column `event` must be a string"):
        PhpmqDataSource({"queue": "q"}).writer(numbered, overwrite=False)


def test_unknown_sink_options_are_refused_naming_the_known_ones() -> None:
    known = "broker, checkpointLocation, clientName, curveSecret, curveServer, event, keyScope,"
    known += " queryName, queue, ttl"
    with pytest.raises(OptionError, match=f"unknown option qeueu; the phpmq sink knows: {known}$"):
        SinkOptions.parse({"qeueu": "results"})
    with pytest.raises(OptionError, match="option topic is not a phpmq option: use queue"):
        SinkOptions.parse({"topic": "results"})
    spark_given = {"Queue": "results", "checkpointlocation": "checkpoints/x", "KEYSCOPE": "s"}
    assert SinkOptions.parse(spark_given).queue == "results"


def test_the_sink_takes_every_option_spark_puts_among_a_writer_s() -> None:
    """Spark's own: `.queryName(...)` and a streaming write's checkpointLocation (pyspark 4.3,
    classic DataStreamWriter / DataFrameWriter); start(path) / save(path) is refused."""
    assert SPARK_WRITER_OPTION_NAMES == ("checkpointLocation", "queryName")
    spark_given = {"queue": "results", "queryname": "to-results", "checkpointlocation": "ck"}
    assert SinkOptions.parse(spark_given).queue == "results"
    assert PhpmqDataSource(spark_given).schema() is not None  # checked as Spark makes it
    with pytest.raises(OptionError, match="the phpmq sink writes to queues: give option queue"):
        SinkOptions.parse({"queue": "results", "path": "out"})


def test_a_row_too_large_for_the_broker_is_named_before_anything_is_given_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    columns = SinkColumns.of(
        StructType([CONTENT, StructField("key", StringType())]), SinkOptions.parse({"queue": "q"})
    )
    rows = SinkRows(columns, SinkOptions.parse({"queue": "q"}))
    batches = [
        pa.RecordBatch.from_pydict({"content": ["a", "b"], "key": ["k", "k"]}),
        pa.RecordBatch.from_pydict({"content": ["c", "d"], "key": ["k", "kkkkkk"]}),
    ]
    given = []
    with pytest.raises(
        RowRefused, match="its key is 6 bytes, over the broker's max_content_bytes 5"
    ) as caught:
        for _, first_row in sink.checked_ahead(iter(batches), lambda b, r: rows.check(b, r, 5)):
            given.append(first_row)
    assert caught.value.row == 3 and given == []
    monkeypatch.setattr(sink, "CHECK_AHEAD_BYTES", 1)  # past this, checked batches go out
    with pytest.raises(RowRefused):
        for _, first_row in sink.checked_ahead(iter(batches), lambda b, r: rows.check(b, r, 5)):
            given.append(first_row)
    assert given == [0]


def test_headers_over_the_limit_are_found_by_their_json_size_in_a_sliced_batch() -> None:
    """The headers check bounds each row's JSON from Arrow's string lengths and encodes only
    rows the bound does not clear: a control character (6 bytes in JSON) counts as such, and
    a slice of a batch (Spark hands those) is measured by its own rows."""
    schema = StructType([CONTENT, StructField("headers", MapType(StringType(), StringType()))])
    options = SinkOptions.parse({"queue": "q"})
    rows = SinkRows(SinkColumns.of(schema, options), options)
    headers = pa.array(
        [[("big", "x" * 40)], None, [("ctl", "\x01" * 8)], [("a", "b")]],
        pa.map_(pa.string(), pa.string()),
    )
    batch = pa.RecordBatch.from_arrays([pa.array(["r0", "r1", "r2", "r3"]), headers],
                                       ["content", "headers"])  # fmt: skip
    # {"ctl":"\u0001…"}: 2 + 5 + 1 + 8 * 6 + 2 = 58 bytes, from 8 raw ones
    with pytest.raises(RowRefused, match="its headers \\(as JSON\\) is 58 bytes") as caught:
        rows.check(batch.slice(1), 10, 57)
    assert caught.value.row == 11  # the slice's second row, row 11 of the task
    rows.check(batch.slice(1), 10, 58)  # the same rows fit at their real size
    with pytest.raises(RowRefused) as caught:
        rows.check(batch, 0, 49)  # {"big":"xx…"}: 50 bytes
    assert caught.value.row == 0
    runs = list(rows.runs(batch, 0))
    assert runs[0].headers[3] == b'{"a":"b"}' and runs[0].headers[1] is None


#: Map entries of every kind the headers' JSON must write: quotes, backslashes, non-ASCII,
#: JSON's own punctuation, DEL, a null value and control characters (the row-by-row path).
_header_text = st.text(alphabet='ab"\\/\u00e9\U0001f600 {}:,\x7f\n\x01', max_size=5)
_header_maps = st.none() | st.dictionaries(_header_text, st.none() | _header_text, max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.lists(_header_maps, max_size=12), st.integers(0, 12), st.integers(0, 12))
def test_a_batch_s_headers_are_the_json_the_client_writes_of_each_row(
    maps: list[dict[str, str | None] | None], first: int, length: int
) -> None:
    """The sink builds each row's headers JSON in Arrow (control characters: row by row); it
    is byte for byte what the client's encoder writes of the row's dict, in a slice too (Spark
    hands those), and None for an empty or null map."""
    schema = StructType([CONTENT, StructField("headers", MapType(StringType(), StringType()))])
    options = SinkOptions.parse({"queue": "q"})
    rows = SinkRows(SinkColumns.of(schema, options), options)
    column = pa.array(
        [None if m is None else list(m.items()) for m in maps], pa.map_(pa.string(), pa.string())
    )
    batch = pa.RecordBatch.from_arrays([pa.array(["c"] * len(maps)), column],
                                       ["content", "headers"])  # fmt: skip
    first = min(first, len(maps))
    sliced = batch.slice(first, length)
    expected = [msgspec.json.encode(m) if m else None for m in maps[first : first + length]]
    got = [h for run in rows.runs(sliced, 0) for h in (run.headers or [])]
    assert got == expected
    texts = [t for m in maps[first : first + length] if m for pair in m.items() for t in pair]
    if not any(t and any(ord(c) < 0x20 for c in t) for t in texts):  # the Arrow path, then
        assert sink_rows._headers_json(sliced.column("headers")) == expected


@pytest.mark.parametrize(
    "pairs",
    [
        [("n", "1"), ("é", "\U0001f600 {}:,"), ("", "")],  # a header a row: one join
        [("n", 'a"b'), ("m", "c"), ("k", "d\\")],  # one to escape: the general path
    ],
)
def test_a_batch_with_one_header_a_row_is_written_as_the_client_writes_it(
    pairs: list[tuple[str, str]],
) -> None:
    column = pa.array([[pair] for pair in pairs], pa.map_(pa.string(), pa.string()))
    for sliced in (column, column.slice(1, 2)):
        expected = [msgspec.json.encode(dict(row)) for row in sliced.to_pylist()]
        assert sink_rows._headers_json(sliced) == expected


def test_a_batch_s_headers_take_the_arrow_path_for_large_strings_and_not_for_bad_text() -> None:
    large = pa.array([[("a", 'b"c\\')], None, []], pa.map_(pa.large_string(), pa.large_string()))
    assert sink_rows._headers_json(large) == [b'{"a":"b\\"c\\\\"}', None, None]
    offsets = pa.py_buffer(bytes([0, 0, 0, 0, 2, 0, 0, 0]))  # one string, bytes 0 to 2
    not_utf8 = pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(b"\xff\xfe")])
    column = pa.MapArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array(["k"]), not_utf8)
    assert sink_rows._headers_json(column) is None  # the row-by-row path refuses it


#: Kafka's headers column, as Spark's Kafka source gives it with includeHeaders.
KAFKA_HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
_KAFKA_ARROW = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def test_kafka_s_headers_go_out_as_the_same_json_as_a_map_s() -> None:
    """A Kafka source's `headers` (a list of key/binary-value structs) is written as the map
    of the same pairs would be, in a slice of a batch too, a null header left out; a value
    that is not UTF-8 text or a null key is refused (422) naming its row before anything is
    sent, and a Kafka-shaped column of another value type before anything runs."""
    schema = StructType([CONTENT, StructField("headers", KAFKA_HEADERS)])
    options = SinkOptions.parse({"queue": "q"})
    rows = SinkRows(SinkColumns.of(schema, options), options)
    pairs = [
        [{"key": "trace", "value": b"abc"}],
        None,
        [{"key": "span", "value": b"7"}],
        [{"key": "a", "value": b"1"}, {"key": "b", "value": None}, {"key": "a", "value": b"2"}],
        [{"key": 'q"', "value": "\u00e9".encode()}, None],
    ]
    batch = pa.RecordBatch.from_arrays(
        [pa.array([f"r{n}" for n in range(5)]), pa.array(pairs, _KAFKA_ARROW)],
        ["content", "headers"],
    )

    def sent(part: pa.RecordBatch) -> list[bytes | None]:
        return [h for run in rows.runs(part, 0) for h in run.headers or []]

    # Key `a` twice: its first place and its last value, as a dict of the pairs would have.
    assert sent(batch.slice(1)) == [
        None, b'{"span":"7"}', b'{"a":"2","b":null}', '{"q\\"":"\u00e9"}'.encode()
    ]  # fmt: skip
    # The Arrow path (no row gives a key twice, no null header), from a slice's offset too:
    assert sent(batch.slice(1, 2)) == [None, b'{"span":"7"}']
    rows.check(batch, 0, 18)
    with pytest.raises(RowRefused, match="headers") as caught:
        rows.check(batch, 0, 17)  # row 3's JSON is 18 bytes
    assert caught.value.row == 3
    assert sent(batch) == [b'{"trace":"abc"}', *sent(batch.slice(1))]  # (what check kept)
    for bad, reason in (({"key": "k", "value": b"\xff"}, "header 'k' has a value that is not"),
                        ({"key": None, "value": b"v"}, "key is null")):  # fmt: skip
        column = pa.array([[{"key": "ok", "value": b"1"}], None, [bad]], _KAFKA_ARROW)
        bad_batch = pa.RecordBatch.from_arrays([pa.array(["a", "b", "c"]), column],
                                               ["content", "headers"])  # fmt: skip
        with pytest.raises(RowRefused, match=reason) as caught:
            rows.check(bad_batch, 10, 1000)
        assert (caught.value.code, caught.value.row) == (422, 12)
        with pytest.raises(ValueError, match=reason):
            list(rows.runs(bad_batch, 10))
    wrong = ArrayType(
        StructType([StructField("key", StringType()), StructField("value", LongType())])
    )
    with pytest.raises(OptionError, match="array<struct<key:string,value:binary>>"):
        SinkColumns.of(StructType([CONTENT, StructField("headers", wrong)]), options)


def test_keyed_rows_go_out_in_one_run_and_packed_frames_not_a_send_each(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = StructType(
        [
            CONTENT,
            StructField("key", StringType()),
            StructField("headers", MapType(StringType(), StringType())),
        ]
    )
    options = SinkOptions.parse({"queue": "keyed"})
    rows = SinkRows(SinkColumns.of(schema, options), options)
    batch = pa.RecordBatch.from_pydict(
        {
            "content": [str(n) for n in range(300)],
            "key": [None if n % 3 == 0 else f"k-{n}" for n in range(300)],
            "headers": [[("n", str(n))] if n % 2 else None for n in range(300)],
        },
        schema=pa.schema(
            [
                ("content", pa.string()),
                ("key", pa.string()),
                ("headers", pa.map_(pa.string(), pa.string())),
            ]
        ),
    )
    [run] = list(rows.runs(batch, 100))
    assert run.first_row == 100 and len(run.contents) == 300
    assert run.message_keys is not None and run.message_keys[:2] == [None, b"k-1"]
    assert run.headers is not None and run.headers[:2] == [None, b'{"n":"1"}']  # JSON once
    publisher = publish.open_publisher(broker.address, "test", "scope/0")

    def one_by_one(*args: object, **kwargs: object) -> None:
        raise AssertionError("a keyed row went out as a send of its own")

    monkeypatch.setattr(publish.Client, "send", one_by_one)
    try:
        publisher.publish(run)
        assert publisher.finish().published == 300
    finally:
        publisher.close()
    received = sorted(drain(broker, "keyed"), key=lambda m: int(m.content))
    assert [m.message_key for m in received[:3]] == [None, b"k-1", b"k-2"]
    assert [m.headers for m in received[:2]] == [{}, {"n": "1"}]
    assert len(received) == 300


# --------------------------------------------------------------------------- with Spark


def test_a_dataframe_of_ten_thousand_rows_lands_in_a_queue(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    frame = spark.range(10_000).select(F.format_string("row-%05d", "id").alias("content"))
    write_to(frame, broker, queue="results")
    assert queue_stats(broker, "results")["ready"] == 10_000
    contents = sorted(message.content for message in drain(broker, "results"))
    assert contents == [b"row-%05d" % i for i in range(10_000)]


def test_writing_the_same_rows_again_with_one_key_scope_adds_nothing(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    """A retried foreachBatch publishes the same rows with the same keys: the broker confirms
    them with the first IDs instead of queueing them twice."""
    frame = spark.range(1_000).select(F.format_string("row-%04d", "id").alias("content"))
    write_to(frame, broker, queue="results", keyScope="batch-7")
    write_to(frame, broker, queue="results", keyScope="batch-7")  # the retry
    assert queue_stats(broker, "results")["ready"] == 1_000
    write_to(frame, broker, queue="results")  # a random scope: new keys, queued again
    assert queue_stats(broker, "results")["ready"] == 2_000
    assert broker.stats()["counters"]["deduplicated"] == 1_000
    contents = Counter(message.content for message in drain(broker, "results"))
    assert set(contents.values()) == {2} and len(contents) == 1_000


def test_a_streaming_batch_run_again_queues_no_row_twice(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    """Spark runs a batch again when its commit is missing from the checkpoint (a driver that
    died after the sink wrote it): same query id, batch id, partitions and rows, same keys."""
    inbox, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    spark.range(500).select(F.format_string("row-%03d", "id").alias("content")).write.parquet(
        str(inbox)
    )
    frame = spark.readStream.schema("content string").parquet(str(inbox))

    def to_queue(writer):
        return writer.format("phpmq").option("broker", broker.address).option("queue", "out")

    run_available_now(frame, checkpoint, to_queue)
    assert queue_stats(broker, "out")["ready"] == 500
    (checkpoint / "commits" / "0").unlink()  # as if the driver died before committing
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    query = run_available_now(frame, checkpoint, to_queue)
    assert [p["batchId"] for p in query.recentProgress if p["numInputRows"]] == [0]
    assert queue_stats(broker, "out")["ready"] == 500
    assert broker.stats()["counters"]["deduplicated"] == 500


def test_a_streaming_batch_replayed_after_the_dedup_window_queues_no_row_twice(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Finding 4 of issue 31: the keys of a batch Spark may still run again are held by the
    broker however long the restart takes (here past a 2 s window), and let go once the next
    batch is committed."""
    inbox, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    rows = spark.range(500).select(F.format_string("row-%03d", "id").alias("content"))
    rows.write.parquet(str(inbox))
    frame = spark.readStream.schema("content string").parquet(str(inbox))
    with BrokerProcess(tmp_path / "broker.log", "--dedup-window-seconds", "2") as broker:

        def to_queue(writer):
            return writer.format("phpmq").option("broker", broker.address).option("queue", "out")

        run_available_now(frame, checkpoint, to_queue)
        assert broker.stats()["key_holds"]["held_keys"] == 500
        (checkpoint / "commits" / "0").unlink()  # as if the driver died before committing
        (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
        time.sleep(3)  # the restart comes after the window
        query = run_available_now(frame, checkpoint, to_queue)
        assert [p["batchId"] for p in query.recentProgress if p["numInputRows"]] == [0]
        assert queue_stats(broker, "out")["ready"] == 500
        assert broker.stats()["counters"]["deduplicated"] == 500
        more = spark.range(500, 600).select(F.format_string("row-%03d", "id").alias("content"))
        more.write.mode("append").parquet(str(inbox))
        run_available_now(frame, checkpoint, to_queue)  # batch 1's commit lets batch 0's go
        assert queue_stats(broker, "out")["ready"] == 600
        with broker.client() as client:
            [hold] = client.admin("key-holds")["holds"]
        assert hold["committed"] == 1 and hold["held_keys"] == 100 and hold["batches"] == [1, 1]


def test_a_named_streaming_query_writes_to_the_sink(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    """`.queryName(...)` puts queryName among the writer's options (finding 1 of issue 31)."""
    inbox = tmp_path / "in"
    spark.range(20).select(F.format_string("row-%02d", "id").alias("content")).write.parquet(
        str(inbox)
    )
    frame = spark.readStream.schema("content string").parquet(str(inbox))

    def named(writer):
        writer = writer.format("phpmq").queryName("rows-to-named")
        return writer.option("broker", broker.address).option("queue", "named")

    query = run_available_now(frame, tmp_path / "checkpoint", named)
    assert query.name == "rows-to-named" and query.exception() is None
    assert queue_stats(broker, "named")["ready"] == 20


@pytest.mark.parametrize(
    ("bad", "code", "problem"),
    [
        ("content", 413, "its content is 2000 bytes, over the broker's max_content_bytes 1000"),
        ("headers", 413, "its headers (as JSON) is 2008 bytes"),
        ("queue", 422, "queue name contains whitespace or control characters: 'has space'"),
    ],
)
def test_a_row_the_broker_would_refuse_fails_its_task_at_once_and_nothing_is_queued(
    spark: SparkSession, tmp_path: Path, bad: str, code: int, problem: str
) -> None:
    small = BrokerProcess(tmp_path / "broker.log", "--max-content-bytes", "1000")
    try:
        row_57 = F.col("id") == 57
        content = F.when(row_57 & F.lit(bad == "content"), F.repeat(F.lit("x"), 2_000))
        headers = F.when(
            row_57 & F.lit(bad == "headers"), F.create_map(F.lit("h"), F.repeat(F.lit("y"), 2_000))
        )
        queue = F.when(row_57 & F.lit(bad == "queue"), F.lit("has space"))
        frame = spark.range(100).select(
            content.otherwise(F.col("id").cast("string")).alias("content"),
            headers.otherwise(F.create_map(F.lit("h"), F.lit("small"))).alias("headers"),
            queue.otherwise(F.lit("big")).alias("queue"),
        )
        started = time.monotonic()
        with pytest.raises(
            Exception, match=rf"{code} row 57 of task partition 0 .* cannot be sent"
        ) as caught:
            write_to(frame.coalesce(1), small, keyScope="refused")
        elapsed = time.monotonic() - started
        print(f"\n  {bad} refused: failed after {elapsed:.1f}s")
        assert problem in str(caught.value) and "nothing of this task was sent" in str(caught.value)
        assert "big" not in small.stats()["queues"]  # not one row of the task was sent
    finally:
        small.stop()


def test_a_sink_task_fails_at_once_when_the_broker_refuses_its_messages(
    spark: SparkSession, tmp_path: Path
) -> None:
    small = BrokerProcess(tmp_path / "broker.log", "--max-queue-length", "5")
    try:
        frame = spark.range(8).select(F.col("id").cast("string").alias("content"))
        started = time.monotonic()
        with pytest.raises(Exception, match=r"the broker refused 3 message\(s\): 429"):
            write_to(frame.coalesce(1), small, queue="full")
        print(f"\n  refused: failed after {time.monotonic() - started:.1f}s")
    finally:
        small.stop()


def test_rows_with_an_event_are_published_to_the_bound_queues(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    with broker.client() as client:
        client.bind("paid", "order.paid")
        client.bind("all", "order.#")
    kind = F.when(F.col("id") % 2 == 0, "order.paid").otherwise(F.lit(None))
    content = F.col("id").cast("string").alias("content")
    frame = spark.range(10).select(content, kind.alias("event"), F.lit("plain").alias("queue"))
    write_to(frame.coalesce(1), broker)
    paid, every, plain = drain(broker, "paid"), drain(broker, "all"), drain(broker, "plain")
    assert sorted(int(m.content) for m in paid) == [0, 2, 4, 6, 8]
    assert all(m.event == "order.paid" for m in paid) and len(every) == 5
    assert sorted(int(m.content) for m in plain) == [1, 3, 5, 7, 9]


def test_headers_and_key_columns_arrive_with_the_messages(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    with broker.client() as client:
        client.bind("keyed-events", "sensor.#")
    key = F.when(F.col("id") % 3 == 0, F.lit(None)).otherwise(
        F.format_string("sensor-%d", F.col("id") % 3)
    )
    headers = F.when(F.col("id") % 2 == 0, F.create_map(F.lit("parity"), F.lit("even")))
    frame = spark.range(20).select(
        F.col("id").cast("string").alias("content"),
        headers.alias("headers"),
        key.cast("binary").alias("key"),
        F.when(F.col("id") >= 10, F.lit("sensor.reading")).alias("event"),
        F.lit("elsewhere").alias("queue"),  # the option overrides it, as Kafka's topic does
    )
    write_to(frame, broker, queue="keyed")
    assert "elsewhere" not in broker.stats()["queues"]
    received = drain(broker, "keyed") + drain(broker, "keyed-events")
    assert sorted(int(m.content) for m in received) == list(range(20))
    for message in received:
        number = int(message.content)
        assert message.headers == ({"parity": "even"} if number % 2 == 0 else {})
        expected_key = None if number % 3 == 0 else b"sensor-%d" % (number % 3)
        assert message.message_key == expected_key


def test_a_kafka_source_s_headers_column_goes_through_the_sink(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    """Kafka's headers shape (includeHeaders), as Spark converts it: binary values as text,
    a key given twice once with its last value, a null header left out, a row without headers
    with none."""

    def header(key: str, value: Column) -> Column:
        return F.struct(F.lit(key).alias("key"), value.cast("binary").alias("value"))

    trace = header("trace", F.col("id").cast("string"))
    headers = F.when(F.col("id") == 0, F.lit(None)).otherwise(
        F.array(
            trace,
            header("hop", F.lit("1")),
            header("hop", F.lit("2")),
            F.when(F.col("id") == 2, header("extra", F.lit("x"))),  # else a null header
        )
    )
    frame = spark.range(3).select(
        F.col("id").cast("string").alias("content"), headers.alias("headers")
    )
    write_to(frame, broker, queue="from-kafka")
    received = {m.content: m.headers for m in drain(broker, "from-kafka")}
    assert received == {
        b"0": {},
        b"1": {"trace": "1", "hop": "2"},
        b"2": {"trace": "2", "hop": "2", "extra": "x"},
    }


def test_streaming_sink_routes_rows_by_their_queue_and_ttl_columns(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    inbox = tmp_path / "in"
    spark.range(100).select(F.col("id").cast("string").alias("content")).write.parquet(str(inbox))
    parity = F.when(F.col("content").cast("int") % 2 == 0, "even").otherwise("odd")
    routed = (
        spark.readStream.schema("content string")
        .parquet(str(inbox))
        .select("content", parity.alias("queue"), F.lit(3_600).alias("ttl"))
    )
    run_available_now(
        routed,
        tmp_path / "checkpoint",
        lambda w: w.format("phpmq").option("broker", broker.address),
    )
    even, odd = drain(broker, "even"), drain(broker, "odd")
    assert sorted(int(m.content) for m in even) == list(range(0, 100, 2))
    assert sorted(int(m.content) for m in odd) == list(range(1, 100, 2))
    assert all(3_590 <= m.ttl <= 3_600 for m in even + odd)


# --------------------------------------------------------------------------- the benchmark


def test_the_benchmark_runs_at_a_tiny_size(spark: SparkSession) -> None:
    from phpmq.bench.spark import run_spark_benchmark, tuned_source_options

    results = run_spark_benchmark(messages=40, size=10, spark=spark, warm_up=False, rounds=2)
    memory = ["default", "tuned", "default keyed"]
    durable = ["default", "default keyed"]
    paths = [f"{direction} {name}" for direction in ("source", "sink") for name in memory]
    paths += ["Spark alone", "Spark alone keyed"]  # the sink's rows discarded, no broker
    paths += [f"durable {direction} {name}" for direction in ("source", "sink") for name in durable]
    assert [result["path"] for result in results] == paths
    assert all(result["rows"] == 40 for result in results)
    # Two rounds: each row is the slower one (the lower middle), beside the faster.
    assert all(result["rounds"] == 2 for result in results)
    assert all(result["rows_per_s"] == result["slowest"] <= result["fastest"] for result in results)
    by_path = {result["path"]: result for result in results}
    assert by_path["sink tuned"]["vs_default"] > 0 and by_path["sink default"]["vs_default"] is None
    assert by_path["source default keyed"]["vs_plain"] > 0
    assert by_path["durable sink default keyed"]["vs_memory"] > 0
    assert by_path["durable sink default keyed"]["vs_plain"] > 0
    assert by_path["Spark alone keyed"]["vs_plain"] > 0
    options = tuned_source_options(25_000, 64 << 20, 100 << 10)  # 100 KB messages
    if "maxBytesPerTrigger" not in options:  # the row limit is cut to fit the bytes
        assert list(options.values()) == ["655"]


def test_the_benchmark_takes_spark_s_share_out_of_the_keyed_ratio() -> None:
    from phpmq.bench.spark import _beyond_spark

    def row(direction: str, rate: float, keyed: bool, durable: bool = False) -> dict:
        return {"direction": direction, "durable": durable, "tuned": False, "keyed": keyed,
                "rows_per_s": rate, "path": f"{direction} {keyed}", "vs_plain": 0.5}  # fmt: skip

    # Spark alone: 1 us a plain row, 2 a keyed one; the sink: 4 and 6 in memory, 4 and 5
    # durable, so it adds 3 us to a plain row and 4 (in memory) or 3 (durable) to a keyed one.
    results = [
        row("discard", 1e6, False), row("discard", 5e5, True),
        row("sink", 2.5e5, False), row("sink", 1e6 / 6, True),
        row("sink", 2.5e5, False, durable=True), row("sink", 2e5, True, durable=True),
    ]  # fmt: skip
    lines = _beyond_spark(results)
    assert results[3]["vs_plain_beyond_spark"] == pytest.approx(0.75)
    assert results[5]["vs_plain_beyond_spark"] == pytest.approx(1.0)
    assert len(lines) == 2 and "Spark alone 0.50x" in lines[0] and "share 0.75x" in lines[0]
    # Without Spark's paths, or with Spark alone slower than the sink (noise), no line and
    # no ratio.
    assert _beyond_spark(results[2:]) == []
    slow_spark = [row("discard", 2e5, False), row("discard", 1e5, True), *results[2:4]]
    slow_spark[3].pop("vs_plain_beyond_spark")
    assert _beyond_spark(slow_spark) == [] and "vs_plain_beyond_spark" not in slow_spark[3]


def test_spark_alone_fails_unless_its_writers_read_every_row(spark: SparkSession) -> None:
    from phpmq.bench.spark import DiscardingSource, _discard

    assert _discard(spark, 50, 10, keyed=True)["rows"] == 50
    frame = spark.range(50).select(F.col("id").cast("string").alias("content"))
    writer = frame.write.format(DiscardingSource.name()).option("rows", "51").mode("append")
    with pytest.raises(Exception, match="the discarding writers read 50 rows of 51"):
        writer.save()


def test_cli_offers_the_benchmark_with_a_message_size() -> None:
    from click.testing import CliRunner

    from phpmq.cli.pipeline import pipeline

    result = CliRunner().invoke(pipeline, ["bench", "--help"])
    assert result.exit_code == 0 and "--size" in result.output and "102400" in result.output
    from phpmq.bench.spark import DEFAULT_ROUNDS

    assert "--rounds" in result.output and "median" in result.output
    assert f"[default: {DEFAULT_ROUNDS};" in result.output  # the CLI cannot import it early
