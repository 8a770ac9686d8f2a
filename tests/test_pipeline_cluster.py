"""The phpmq source and sink on a real Spark standalone cluster (tests/spark_cluster.py): a
master and two workers on loopback, one executor JVM each, the driver in this process.

Local mode runs the tasks inside the driver's JVM; here every task runs in an executor that
reaches the broker itself, and a worker killed with SIGKILL in the middle of a batch (its
Worker JVM and its executor JVM, as a machine that dies) costs the query nothing: Spark runs
the lost task again on the other worker, which reads the same lease, and the output holds
every message once.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import BrokerProcess, wait_for
from pipeline_harness import (
    QUERY_TIMEOUT_S,
    assert_each_once,
    assert_exactly_once,
    drain,
    send,
    skip_without_spark,
    spark_missing,
    stop_spark,
    stream,
    to_parquet,
    wait_drained,
)
from spark_cluster import SparkCluster, cluster_session, executor_count, spark_cluster

try:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812
except ModuleNotFoundError as missing:
    skip_without_spark(missing)

# A master, two workers, two executors and a driver: six JVMs, never beside another cluster.
# The timeout covers the module's first test, which starts the cluster (15 to 35 s here).
pytestmark = [pytest.mark.xdist_group("spark-cluster"), pytest.mark.timeout(240)]

WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    reason = spark_missing()  # None in CI: there a missing Java fails the test
    if reason is not None:
        pytest.skip(reason)
    with spark_cluster(tmp_path_factory.mktemp("spark-cluster"), WORKERS) as started:
        yield started


@pytest.fixture(scope="module")
def spark(cluster: SparkCluster) -> Iterator[SparkSession]:
    """A session whose tasks run on the cluster's executors (never in the driver)."""
    session = cluster_session(cluster, "phpmq-cluster-tests", executors=WORKERS)
    try:
        yield session
    finally:
        stop_spark(session)


def to_queue(frame: DataFrame, broker: BrokerProcess, queue: str, checkpoint: Path) -> Any:
    writer = frame.writeStream.format("phpmq").option("broker", broker.address)
    writer = writer.option("queue", queue).option("checkpointLocation", str(checkpoint))
    return writer.trigger(availableNow=True).start()


def contents(count: int) -> list[bytes]:
    """What `send(broker, queue, count)` sent."""
    return [b"m-%05d" % i for i in range(count)]


def finished(query: Any) -> list[int]:
    """Waits for an availableNow query; the rows of each of its batches."""
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish in time"
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_the_source_streams_into_parquet_on_the_cluster_exactly_once(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    assert spark.sparkContext.master.startswith("spark://")
    assert executor_count(spark) == WORKERS
    sent = send(broker, "events", 600)
    frame = stream(spark, broker, "events", maxRecordsPerTrigger=250)
    out = tmp_path / "out"
    query = to_parquet(frame, out, tmp_path / "checkpoint", availableNow=True)
    assert finished(query) == [250, 250, 100]
    assert_exactly_once(spark, out, sent)
    assert wait_drained(broker, "events")["leased"] == 0


def test_the_source_streams_into_the_sink_on_the_cluster_exactly_once(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    send(broker, "events", 600)
    frame = stream(spark, broker, "events", maxRecordsPerTrigger=250).select("content")
    assert finished(to_queue(frame, broker, "results", tmp_path / "checkpoint")) == [250, 250, 100]
    assert_each_once(Counter(m.content for m in drain(broker, "results")), contents(600))
    assert wait_drained(broker, "events")["leased"] == 0


def hang_once_at(hang: bytes, marker: Path) -> Callable[[Column], Column]:
    """A UDF that passes contents through as text, except that the first task to meet `hang`
    writes its process id to `marker` and sleeps for good; a task that meets it again (the
    lost task run again elsewhere) goes on."""

    def passes_or_hangs(content: bytes) -> str:
        if content == hang:
            try:
                with open(marker, "x") as first:
                    first.write(str(os.getpid()))
            except FileExistsError:
                pass
            else:
                time.sleep(3600)
        return content.decode()

    # a closure, so pickled by value (the executors cannot import this module)
    return F.udf(passes_or_hangs, "string", useArrow=False)


@pytest.mark.parametrize("into", ["parquet", "phpmq"])
def test_a_worker_killed_mid_batch_costs_nothing_and_commits_every_lease(
    cluster: SparkCluster,
    spark: SparkSession,
    broker: BrokerProcess,
    tmp_path: Path,
    into: str,
) -> None:
    """Batches of 300; the task that meets m-00580 (batch 1) hangs until its worker (Worker
    JVM and executor JVM) is killed with SIGKILL. A worker takes its place for the next
    test."""
    sent = send(broker, "events", 900)
    marker, out, checkpoint = tmp_path / "hung", tmp_path / "out", tmp_path / "checkpoint"
    as_text = hang_once_at(b"m-00580", marker)
    frame = stream(spark, broker, "events", maxRecordsPerTrigger=300)
    if into == "parquet":
        rows = frame.select("id", as_text("content").alias("text"))
        query = to_parquet(rows, out, checkpoint, availableNow=True)
    else:
        texts = frame.select(as_text("content").alias("content"))
        query = to_queue(texts, broker, "out", checkpoint)
    task = wait_for(lambda: marker.exists() and marker.read_text(), "a task met m-00580", 90, 0.1)
    cluster.kill_worker_of(int(task))
    cluster.start_workers(1)
    assert finished(query) == [300, 300, 300]  # the lost attempt's rows counted once
    if into == "parquet":
        assert_exactly_once(spark, out, sent)
    else:
        assert_each_once(Counter(m.content for m in drain(broker, "out")), contents(900))
    assert wait_drained(broker, "events")["leased"] == 0
    wait_for(lambda: executor_count(spark) == WORKERS, "the new worker's executor", 90, 0.2)
