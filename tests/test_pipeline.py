"""The Spark pipeline (pipeline/): the `phpmq` source and sink in real Spark local mode against
a real broker process on loopback.

Streaming queries use trigger(availableNow=True) or processAllAvailable(), never sleeps. Some
tests call the reader's methods directly, as Spark's source runner would, to check offsets and
acks without the cost of a query. Spark is optional: without pyspark (or Java) these tests skip
locally and fail in CI (CI=true).
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness import BrokerProcess

IN_CI = os.environ.get("CI") == "true"
#: The modules `pip install .[spark]` brings (and their own dependencies).
SPARK_EXTRA = {"pyspark", "pyarrow", "pandas", "py4j", "numpy"}
try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from phpmq.pipeline.datasource import PhpmqDataSource
    from phpmq.pipeline.demo import run_demo
    from phpmq.pipeline.options import OptionError
    from phpmq.pipeline.rows import SOURCE_SCHEMA
    from phpmq.pipeline.session import SparkUnavailable, local_session
except ModuleNotFoundError as missing:
    if (missing.name or "").split(".")[0] not in SPARK_EXTRA:
        raise  # a bug in pipeline/, not a missing optional dependency
    if IN_CI:
        pytest.fail(f"the spark extra is required in CI: {missing}", pytrace=False)
    pytest.skip(f"{missing} (pip install '.[spark]')", allow_module_level=True)


#: Any one streaming query must finish within this many seconds.
QUERY_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """One Spark for this file; stopped after it, JVM included, so that it takes no CPU or
    memory from the test files that run later."""
    try:
        session = local_session("phpmq-tests")
    except SparkUnavailable as exc:
        if IN_CI:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()
    _stop_gateway()


def _stop_gateway() -> None:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        process = getattr(gateway, "proc", None)
        if process is not None:  # the JVM outlives the gateway unless told to go
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(15)
        SparkContext._gateway = None
        SparkContext._jvm = None


def source(spark: SparkSession, broker: BrokerProcess, queue: str, batch: int) -> DataFrame:
    reader = spark.readStream.format("phpmq").option("broker", broker.address)
    return reader.option("queue", queue).option("maxRecordsPerTrigger", batch).load()


def run_available_now(frame: DataFrame, checkpoint: Path, sink: Callable[[Any], Any]) -> Any:
    """Run a query to the end of what is available now; returns it (raises what it raised)."""
    writer = frame.writeStream.option("checkpointLocation", str(checkpoint))
    query = sink(writer.trigger(availableNow=True)).start()
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish in time"
    return query


def queue_stats(broker: BrokerProcess, queue: str) -> dict[str, int]:
    return broker.stats()["queues"][queue]


def drain(broker: BrokerProcess, queue: str) -> list[Any]:
    """Every message of `queue`, acked."""
    messages = []
    with broker.client() as client:
        for message in client.consume(queue, window=1_000, timeout=0.5):
            message.ack()
            messages.append(message)
    return messages


# --------------------------------------------------------------------------- options


def test_sink_checks_columns_and_mode_before_anything_runs() -> None:
    text_only = StructType([StructField("content", StringType())])
    sink = PhpmqDataSource({"queue": "out"})
    assert sink.writer(SOURCE_SCHEMA, overwrite=False) is not None
    with pytest.raises(OptionError, match="cannot be overwritten"):
        sink.writer(SOURCE_SCHEMA, overwrite=True)
    with pytest.raises(OptionError, match="needs a column `content`"):
        sink.streamWriter(StructType([StructField("body", StringType())]), overwrite=False)
    with pytest.raises(OptionError, match="option queue, or a column `queue`"):
        PhpmqDataSource({}).writer(text_only, overwrite=False)


def test_sink_takes_an_event_column_or_option_instead_of_a_queue() -> None:
    text_only = StructType([StructField("content", StringType())])
    content = StructField("content", StringType())
    with_event = StructType([content, StructField("event", StringType())])
    assert PhpmqDataSource({"event": "order.paid"}).writer(text_only, overwrite=False)
    assert PhpmqDataSource({}).writer(with_event, overwrite=False) is not None
    with pytest.raises(OptionError, match=r"option event: event name 'order\.\*'"):
        PhpmqDataSource({"event": "order.*"}).writer(text_only, overwrite=False)
    numbered = StructType([content, StructField("event", LongType())])
    with pytest.raises(OptionError, match="column `event` must be a string"):
        PhpmqDataSource({"queue": "q"}).writer(numbered, overwrite=False)


# --------------------------------------------------------------------------- Spark queries


def test_a_dataframe_of_ten_thousand_rows_lands_in_a_queue(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    frame = spark.range(10_000).select(F.format_string("row-%05d", "id").alias("content"))
    frame.write.format("phpmq").option("broker", broker.address).option("queue", "results").mode(
        "append"
    ).save()
    assert queue_stats(broker, "results")["ready"] == 10_000
    contents = sorted(message.content for message in drain(broker, "results"))
    assert contents == [b"row-%05d" % i for i in range(10_000)]


def test_writing_the_same_rows_again_with_one_key_scope_adds_nothing(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    """A retried foreachBatch publishes the same rows with the same keys: the broker confirms
    them with the first IDs instead of queueing them twice."""
    frame = spark.range(1_000).select(F.format_string("row-%04d", "id").alias("content"))

    def write(scope: str | None) -> None:
        writer = frame.write.format("phpmq").option("broker", broker.address)
        if scope is not None:
            writer = writer.option("keyScope", scope)
        writer.option("queue", "results").mode("append").save()

    write("batch-7")
    write("batch-7")  # the retry
    assert queue_stats(broker, "results")["ready"] == 1_000
    write(None)  # a random scope: new keys, queued again
    assert queue_stats(broker, "results")["ready"] == 2_000
    assert broker.stats()["counters"]["deduplicated"] == 1_000
    contents = Counter(message.content for message in drain(broker, "results"))
    assert set(contents.values()) == {2} and len(contents) == 1_000


def test_a_sink_task_fails_when_the_broker_refuses_its_messages(
    spark: SparkSession, tmp_path: Path
) -> None:
    small = BrokerProcess(tmp_path / "broker.log", "--max-queue-length", "5")
    try:
        frame = spark.range(8).select(F.col("id").cast("string").alias("content"))
        writer = frame.coalesce(1).write.format("phpmq").option("broker", small.address)
        with pytest.raises(Exception, match=r"the broker refused 3 message\(s\): 429"):
            writer.option("queue", "full").mode("append").save()
    finally:
        small.stop()


def test_rows_with_an_event_are_published_to_the_bound_queues(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    if "published" not in broker.stats()["counters"]:
        pytest.skip("this broker does not route events yet (docs/protocol.md §6.5)")
    with broker.client() as client:
        client.bind("paid", "order.paid")
        client.bind("all", "order.#")
    kind = F.when(F.col("id") % 2 == 0, "order.paid").otherwise(F.lit(None))
    content = F.col("id").cast("string").alias("content")
    frame = spark.range(10).select(content, kind.alias("event"), F.lit("plain").alias("queue"))
    frame.coalesce(1).write.format("phpmq").option("broker", broker.address).mode("append").save()
    paid, every, plain = drain(broker, "paid"), drain(broker, "all"), drain(broker, "plain")
    assert sorted(int(m.content) for m in paid) == [0, 2, 4, 6, 8]
    assert all(m.event == "order.paid" for m in paid) and len(every) == 5
    assert sorted(int(m.content) for m in plain) == [1, 3, 5, 7, 9]


def test_streaming_sink_routes_rows_by_their_queue_and_ttl_columns(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    with broker.client() as client:
        client.send_many("events", (b"%d" % i for i in range(100)))
    parity = F.when(F.col("content").cast("string").cast("int") % 2 == 0, "even").otherwise("odd")
    routed = source(spark, broker, "events", 40).select(
        "content", parity.alias("queue"), F.lit(3_600).alias("ttl")
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


def test_demo_pipeline_counts_events_per_key_and_minute(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    quiet = Console(quiet=True)
    result = run_demo(spark, broker.address, tmp_path, events=600, keys=3, console=quiet)
    assert (result.produced, result.ingested, result.unique_events) == (600, 600, 600)
    assert result.counts_in_queue == result.counts > 0
    counts = spark.read.parquet(str(tmp_path / "counts"))
    assert counts.agg(F.sum("events")).first()[0] == 600
    assert queue_stats(broker, "demo.events")["in_flight"] == 0


def test_cli_offers_the_demo_without_loading_spark() -> None:
    from click.testing import CliRunner

    from phpmq.cli.pipeline import pipeline

    result = CliRunner().invoke(pipeline, ["demo", "--help"])
    assert result.exit_code == 0 and "count them per key and minute" in result.output
