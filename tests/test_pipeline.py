"""The Spark pipeline (pipeline/): the `phpmq` source and sink in real Spark local mode against
a real broker process on loopback.

Streaming queries use trigger(availableNow=True) or processAllAvailable(), never sleeps. Some
tests call the reader's methods directly, as Spark's source runner would, to check offsets and
acks without the cost of a query. Spark is optional: without pyspark (or Java) these tests skip
locally and fail in CI (CI=true).
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from harness import REPO, BrokerProcess
from pipeline_harness import (
    QUERY_TIMEOUT_S,
    drain,
    queue_stats,
    run_available_now,
    skip_without_spark,
)
from pipeline_harness import spark as spark  # a fixture: one Spark for this file

try:
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from phpmq.pipeline.demo import run_demo
    from phpmq.pipeline.options import OptionError, SourceOptions
    from phpmq.pipeline.source import PhpmqStreamReader
    from phpmq.pipeline.subscription import SourceError
except ModuleNotFoundError as missing:
    skip_without_spark(missing)

#: A source whose runner dies gives its messages back after heartbeat x liveness (0.6 s).
FAST_LIVENESS = {"heartbeatMs": "200", "liveness": "3"}
#: A Spark driver of its own (argv: broker, queue, output, checkpoint) that writes batches to
#: Parquet with foreachBatch, says when batch 1 is written, and then hangs in it until killed.
CRASHING_DRIVER = """
import sys, threading
from phpmq.pipeline.session import local_session
broker, queue, output, checkpoint = sys.argv[1:]
spark = local_session("crashing-driver")
def write(frame, batch_id):
    frame.select("content").write.mode("append").parquet(output)
    if batch_id == 1:
        print("batch 1 written", flush=True)
        threading.Event().wait()
events = (spark.readStream.format("phpmq").option("broker", broker).option("queue", queue)
          .option("maxRecordsPerBatch", 400).option("heartbeatMs", 200).load())
events.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint).start()
threading.Event().wait()
"""


def source(spark: SparkSession, broker: BrokerProcess, queue: str, batch: int) -> DataFrame:
    reader = spark.readStream.format("phpmq").option("broker", broker.address)
    reader = reader.option("queue", queue).option("maxRecordsPerBatch", batch)
    return reader.options(**FAST_LIVENESS).load()


def reader_for(broker: BrokerProcess, **options: str) -> PhpmqStreamReader:
    settings = {"broker": broker.address, **FAST_LIVENESS, **options}
    return PhpmqStreamReader(SourceOptions.parse(settings))


# --------------------------------------------------------------------------- options


def test_window_must_exceed_twice_the_batch() -> None:
    with pytest.raises(OptionError, match=r"window \(200\) must be more than 2 x"):
        SourceOptions.parse({"queue": "q", "maxRecordsPerBatch": "100", "window": "200"})
    options = SourceOptions.parse({"queue": "q", "maxRecordsPerBatch": "100"})
    assert options.window == 201


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of the options queue"),
        ({"queue": "a", "queues": "b"}, "exactly one of the options queue"),
        ({"queue": "has space"}, "whitespace"),
        ({"queues": "a,a"}, "names a queue twice"),
        ({"queue": "q", "maxRecordsPerBatch": "ten"}, "must be an integer"),
        ({"queue": "q", "heartbeatMs": "10"}, "between 50 and 60000"),
        ({"queue": "q", "broker": "localhost:5555"}, "ZeroMQ address"),
    ],
)
def test_bad_source_options_are_refused_with_the_option_named(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        SourceOptions.parse(options)


def test_several_queues_by_list_or_json() -> None:
    assert SourceOptions.parse({"queues": "a, b,c"}).queues == ("a", "b", "c")
    assert SourceOptions.parse({"QUEUES": '["x,1", "y"]'}).queues == ("x,1", "y")


# --------------------------------------------------------------------------- the runner's side


def test_reader_acks_a_batch_when_spark_asks_for_the_next(broker: BrokerProcess) -> None:
    with broker.client() as client:
        client.send_many("events", (b"m%d" % i for i in range(25)))
    reader = reader_for(broker, queue="events", maxRecordsPerBatch="10")
    limit = reader.getDefaultReadLimit()
    assert reader.initialOffset() == {"seq": 0}
    assert reader.latestOffset({"seq": 0}, limit) == {"seq": 10}
    first = reader.partitions({"seq": 0}, {"seq": 10})
    assert sum(len(part.id) for part in first) == 10
    # The window (21) holds batch 0 and the prefetch; nothing is acked before Spark moves on.
    assert queue_stats(broker, "events")["in_flight"] == 21
    assert reader.latestOffset({"seq": 10}, limit) == {"seq": 20}
    assert broker.stats()["counters"]["acked"] == 10
    assert reader.latestOffset({"seq": 20}, ReadAllAvailable()) == {"seq": 25}
    reader.commit({"seq": 20})  # one batch late: already settled, changes nothing
    assert broker.stats()["counters"]["acked"] == 20
    contents = [c for part in reader.partitions({"seq": 20}, {"seq": 25}) for c in part.content]
    assert contents == [b"m%d" % i for i in range(20, 25)]
    assert reader.latestOffset({"seq": 25}, limit) == {"seq": 25}
    stats = queue_stats(broker, "events")
    assert (stats["ready"], stats["in_flight"], stats["consumers"]) == (0, 0, 1)
    reader.stop()


def test_reader_copy_for_executors_carries_no_connection(broker: BrokerProcess) -> None:
    with broker.client() as client:
        client.send("events", b"x")
    reader = reader_for(broker, queue="events")
    assert reader.latestOffset({"seq": 0}, reader.getDefaultReadLimit()) == {"seq": 1}
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.partitions({"seq": 0}, {"seq": 1}) == []
    [rows] = reader.partitions({"seq": 0}, {"seq": 1})
    batch = next(copy.read(pickle.loads(pickle.dumps(rows))))
    assert batch.column("content").to_pylist() == [b"x"]
    reader.stop()


def test_a_restarted_reader_numbers_on_from_the_checkpoint(broker: BrokerProcess) -> None:
    with broker.client() as client:
        client.send_many("events", [b"a", b"b", b"c"])
    first = reader_for(broker, queue="events", maxRecordsPerBatch="2")
    assert first.latestOffset({"seq": 0}, first.getDefaultReadLimit()) == {"seq": 2}
    first.stop()  # the runner goes away before Spark finished batch [0, 2): nothing was acked
    second = reader_for(broker, queue="events", maxRecordsPerBatch="5")
    assert second.partitions({"seq": 0}, {"seq": 2}) == []  # the replay of a lost batch
    assert second.latestOffset({"seq": 2}, ReadMaxRows(5)) == {"seq": 5}
    rows = second.partitions({"seq": 2}, {"seq": 5})
    assert sorted(c for part in rows for c in part.content) == [b"a", b"b", b"c"]
    assert max(n for part in rows for n in part.delivery_count) == 2
    second.stop()


def test_one_source_reads_several_queues(broker: BrokerProcess) -> None:
    with broker.client() as client:
        client.send_many("clicks", [b"c1", b"c2"])
        client.send_many("views", [b"v1"])
    reader = reader_for(broker, queues="clicks,views")
    assert reader.latestOffset({"seq": 0}, ReadAllAvailable()) == {"seq": 3}
    parts = reader.partitions({"seq": 0}, {"seq": 3})
    assert sorted(pair for p in parts for pair in zip(p.queue, p.content, strict=True)) == [
        ("clicks", b"c1"),
        ("clicks", b"c2"),
        ("views", b"v1"),
    ]
    reader.stop()


def test_a_window_above_the_brokers_limit_is_refused_clearly(tmp_path: Path) -> None:
    small = BrokerProcess(tmp_path / "broker.log", "--max-window", "100")
    try:
        reader = reader_for(small, queue="events", maxRecordsPerBatch="60")
        with pytest.raises(SourceError, match=r"above the broker's max_window \(100\)"):
            reader.latestOffset({"seq": 0}, reader.getDefaultReadLimit())
    finally:
        small.stop()


# --------------------------------------------------------------------------- Spark queries


def test_ten_thousand_messages_reach_parquet_and_leave_the_queue(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    expected = [f"event-{i:05d}".encode() for i in range(10_000)]
    with broker.client() as client:
        client.send_many("events", expected)
    query = run_available_now(
        source(spark, broker, "events", 2_500),
        tmp_path / "checkpoint",
        lambda w: w.format("parquet").option("path", str(tmp_path / "out")),
    )
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [2_500] * 4
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(bytes(row.content) for row in rows) == expected
    assert {row.queue for row in rows} == {"events"} and {row.delivery_count for row in rows} == {1}
    stats = queue_stats(broker, "events")
    assert (stats["ready"], stats["in_flight"], stats["dead_letters"]) == (0, 0, 0)


def test_a_batch_that_fails_midway_is_delivered_again_after_restart(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with broker.client() as client:
        client.send_many("events", (f"event-{i:04d}".encode() for i in range(3_000)))
    checkpoint = tmp_path / "checkpoint"

    def publish(frame: DataFrame) -> None:
        writer = frame.select("content").write.format("phpmq").mode("append")
        writer.option("broker", broker.address).option("queue", "results").save()

    def fails_in_batch_2(frame: DataFrame, batch_id: int) -> None:
        if batch_id == 2:
            publish(frame.limit(250))  # half the batch is out when the sink raises
            raise RuntimeError("sink failure in the middle of batch 2")
        publish(frame)

    with pytest.raises(StreamingQueryException, match="sink failure in the middle of batch 2"):
        run_available_now(
            source(spark, broker, "events", 500),
            checkpoint,
            lambda w: w.foreachBatch(fails_in_batch_2),
        )
    run_available_now(
        source(spark, broker, "events", 500),
        checkpoint,
        lambda w: w.foreachBatch(lambda frame, _: publish(frame)),
    )
    arrived = Counter(message.content for message in drain(broker, "results"))
    duplicates = sum(arrived.values()) - len(arrived)
    with capsys.disabled():
        print(
            f"\n  failure test: 3000 messages, {len(arrived)} distinct arrived,"
            f" {duplicates} duplicates"
        )
    assert set(arrived) == {f"event-{i:04d}".encode() for i in range(3_000)}
    assert duplicates <= 500  # at most the failed batch
    stats = queue_stats(broker, "events")
    assert (stats["ready"], stats["in_flight"]) == (0, 0)


def test_a_killed_driver_loses_nothing(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    expected = {f"event-{i:04d}".encode() for i in range(2_000)}
    with broker.client() as client:
        client.send_many("events", sorted(expected))
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = [broker.address, "events", str(output), str(checkpoint)]
    driver = subprocess.Popen(
        [sys.executable, "-c", CRASHING_DRIVER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        start_new_session=True,  # its JVM and Python workers die with it
    )
    try:
        wait_for_line(driver, "batch 1 written", QUERY_TIMEOUT_S)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the whole Spark driver, mid-batch
        driver.wait(10)
    run_available_now(
        source(spark, broker, "events", 400),
        checkpoint,
        lambda w: w.foreachBatch(
            lambda frame, _: frame.select("content").write.mode("append").parquet(str(output))
        ),
    )
    arrived = Counter(bytes(row.content) for row in spark.read.parquet(str(output)).collect())
    duplicates = sum(arrived.values()) - len(arrived)
    with capsys.disabled():
        print(f"\n  killed driver: 2000 messages, {len(arrived)} distinct, {duplicates} duplicates")
    assert set(arrived) == expected
    assert duplicates <= 400  # the batch the driver died in
    stats = queue_stats(broker, "events")
    assert (stats["ready"], stats["in_flight"]) == (0, 0)


def wait_for_line(process: subprocess.Popen, line: str, timeout: float) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(deadline - time.monotonic()):
                break
            got = process.stdout.readline().decode()
            if not got:
                raise AssertionError(f"the driver exited ({process.wait()}) before: {line}")
            if got.strip() == line:
                return
    raise AssertionError(f"no {line!r} from the driver within {timeout}s")


@pytest.mark.timeout(QUERY_TIMEOUT_S)  # bounds processAllAvailable(), which takes no timeout
def test_a_running_query_acks_each_batch_without_waiting_for_the_next(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    with broker.client() as client:
        client.send_many("events", (b"%d" % i for i in range(1_200)))
    query = (
        source(spark, broker, "events", 500)
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        # processAllAvailable returns after a trigger found nothing new: that trigger's
        # latestOffset acked the last batch, although Spark never called commit() for it.
        stats = queue_stats(broker, "events")
        assert (stats["ready"], stats["in_flight"], stats["consumers"]) == (0, 0, 1)
    finally:
        query.stop()
    assert spark.read.parquet(str(tmp_path / "out")).count() == 1_200


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
