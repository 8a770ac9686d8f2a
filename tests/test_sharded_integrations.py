"""The worker pool, a bridge and the Spark source and sink work unchanged against a sharded
broker (`phpmq broker --shards 2`), with queues owned by both shards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from test_bridges import Bridge, bound
from test_pool import FAST, PoolProcess

from harness import BrokerProcess, hello_answer, wait_for
from phpmq.broker.shell.shards import shard_address
from phpmq.client import Client
from phpmq.protocol.cluster import ClusterMap
from phpmq.testing import free_ports

try:  # Spark is an optional extra: without it only the Spark tests are skipped
    import test_pipeline  # noqa: F401  (skips, or fails in CI, without Spark)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F  # noqa: N812

    from pipeline_harness import run_available_now

    SPARK_MISSING = None
except pytest.skip.Exception as missing:
    SPARK_MISSING = str(missing)

SHARDS = 2

#: Each test runs a broker of two shards: one sharded broker at a time. (A test with several
#: xdist_group marks would get a group of their own: the Spark tests have only "spark-b".)
sharded_group = pytest.mark.xdist_group("shards")


def needs_spark(test: Callable[..., None]) -> Callable[..., None]:
    """A Spark test: skipped without Spark, and run in the Spark tests' worker."""
    skip = pytest.mark.skipif(SPARK_MISSING is not None, reason=str(SPARK_MISSING))
    return pytest.mark.xdist_group("spark-b")(skip(test))


@pytest.fixture
def sharded(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of two shards: shard i at the base address's port + i."""
    process = BrokerProcess(
        tmp_path / "broker.log",
        "--shards",
        str(SHARDS),
        "--grace-seconds",
        "1",
        address=free_ports(2),
    )
    try:
        yield process
    finally:
        process.stop()


def cluster_map(broker: BrokerProcess) -> ClusterMap:
    return msgspec.convert(hello_answer(broker.address)["cluster"], ClusterMap)


def owned_by(broker: BrokerProcess, index: int, prefix: str) -> str:
    """The first queue named `prefix`-N that shard `index` owns."""
    mapping = cluster_map(broker)
    for n in range(1000):
        name = f"{prefix}-{n}"
        if mapping.owner(name).name == f"local/{index}":
            return name
    raise AssertionError(f"no {prefix}-N queue is owned by local/{index}")


def owner_index(broker: BrokerProcess, queue: str) -> int:
    return int(cluster_map(broker).owner(queue).name.rsplit("/", 1)[1])


def shard_queues(broker: BrokerProcess, index: int) -> dict[str, dict[str, Any]]:
    with Client(shard_address(broker.address, index), close_timeout=1) as client:
        return client.admin("stats")["queues"]


def at_owner(broker: BrokerProcess, queue: str) -> dict[str, int]:
    """The queue's counts at its owning shard (zeros where it holds no such queue)."""
    empty = {"ready": 0, "in_flight": 0, "delayed": 0, "dead_letters": 0}
    return {**empty, **shard_queues(broker, owner_index(broker, queue)).get(queue, {})}


def empty_at_owner(broker: BrokerProcess, queue: str) -> bool:
    stats = at_owner(broker, queue)
    figures = ("ready", "in_flight", "delayed", "dead_letters", "leased")
    return all(stats.get(name, 0) == 0 for name in figures)



def drain_at_owner(broker: BrokerProcess, queue: str, count: int) -> list[bytes]:
    """Consume and ack exactly `count` messages of `queue` at its owning shard."""
    got: list[bytes] = []
    address = shard_address(broker.address, owner_index(broker, queue))
    with Client(address, close_timeout=1) as consumer:
        for message in consumer.consume(queue, window=500, timeout=5):
            got.append(message.content)
            message.ack()
            if len(got) == count:
                break
    assert len(got) == count, f"{len(got)} of {count} in {queue}"
    return got


@sharded_group
def test_queues_have_owners_on_both_shards(sharded: BrokerProcess) -> None:
    first, second = owned_by(sharded, 0, "x"), owned_by(sharded, 1, "x")
    assert {owner_index(sharded, first), owner_index(sharded, second)} == {0, 1}


# --------------------------------------------------------------------------- worker pool


@sharded_group
def test_a_worker_pool_does_the_jobs_of_queues_on_different_shards(
    tmp_path: Path, sharded: BrokerProcess
) -> None:
    a, b = owned_by(sharded, 0, "jobs-a"), owned_by(sharded, 1, "jobs-b")
    pool = PoolProcess(tmp_path, sharded, "record", "-q", a, "-q", b, "--processes", "2", *FAST)
    try:
        expected = {a: [f"{a}-{i}" for i in range(50)], b: [f"{b}-{i}" for i in range(50)]}
        with Client(sharded.address) as client:  # routes each queue to its owner
            for queue, contents in expected.items():
                client.send_many(queue, contents)
        total = sum(len(c) for c in expected.values())
        pool.wait_for(lambda: len(pool.records("handled")) >= total, 30, f"{total} jobs done")
        handled = pool.records("handled")
        for queue, contents in expected.items():
            done = sorted(r["content"] for r in handled if r["queue"] == queue)
            assert done == sorted(contents), pool.failure(f"jobs of {queue}")
        for queue in expected:
            wait_for(lambda q=queue: empty_at_owner(sharded, q), f"{queue} empty at its owner", 20)
    finally:
        pool.stop()


# --------------------------------------------------------------------------- bridge


@sharded_group
def test_pull_in_bridge_fills_a_queue_owned_by_the_other_shard(
    tmp_path: Path, sharded: BrokerProcess
) -> None:
    # The bridge connects to the base address, shard 0; the queue belongs to shard 1.
    queue = owned_by(sharded, 1, "bridged")
    context = zmq.Context()
    bridge = None
    try:
        push, address = bound(context, zmq.PUSH, sndtimeo=10_000)
        bridge = Bridge(
            tmp_path / "bridge.log", sharded, "pull-in", address, "--queue", queue, "--name", "pull"
        )
        contents = [b"job-%04d" % i for i in range(500)]
        for content in contents:
            push.send(content)
        try:
            wait_for(lambda: at_owner(sharded, queue)["ready"] == len(contents), "all queued", 20)
        except AssertionError as failure:
            raise AssertionError(f"{failure}\n--- bridge log ---\n{bridge.log()}") from None
        assert queue not in shard_queues(sharded, 0), "the non-owner shard holds the queue"
        assert drain_at_owner(sharded, queue, len(contents)) == contents
        wait_for(lambda: empty_at_owner(sharded, queue), "every message acked", 20)
    finally:
        status = bridge.stop() if bridge is not None else 0
        context.destroy(linger=0)
    assert status == 0, bridge.log() if bridge is not None else ""


# --------------------------------------------------------------------------- Spark


@needs_spark
def test_spark_sink_routes_rows_to_queues_on_both_shards(
    spark: SparkSession, sharded: BrokerProcess
) -> None:
    a, b = owned_by(sharded, 0, "sink-a"), owned_by(sharded, 1, "sink-b")
    frame = spark.range(1_000).select(
        F.format_string("row-%04d", "id").alias("content"),
        F.when(F.col("id") % 2 == 0, a).otherwise(b).alias("queue"),
    )
    frame.write.format("phpmq").option("broker", sharded.address).mode("append").save()
    assert at_owner(sharded, a)["ready"] == at_owner(sharded, b)["ready"] == 500
    assert a not in shard_queues(sharded, 1) and b not in shard_queues(sharded, 0)
    assert sorted(drain_at_owner(sharded, a, 500)) == [b"row-%04d" % i for i in range(0, 1_000, 2)]
    assert sorted(drain_at_owner(sharded, b, 500)) == [b"row-%04d" % i for i in range(1, 1_000, 2)]


@needs_spark
def test_spark_source_reads_queues_on_both_shards_to_parquet(
    spark: SparkSession, sharded: BrokerProcess, tmp_path: Path
) -> None:
    a, b = owned_by(sharded, 0, "source-a"), owned_by(sharded, 1, "source-b")
    expected = {a: [f"{a}-{i:04d}".encode() for i in range(600)]}
    expected[b] = [f"{b}-{i:04d}".encode() for i in range(400)]
    with Client(sharded.address) as client:  # routes each queue to its owner
        for queue, contents in expected.items():
            client.send_many(queue, contents)
    assert at_owner(sharded, a)["ready"] == 600 and at_owner(sharded, b)["ready"] == 400
    reader = spark.readStream.format("phpmq").option("broker", sharded.address)
    frame = reader.option("queues", f"{a},{b}").option("maxRecordsPerTrigger", 250).load()
    run_available_now(
        frame,
        tmp_path / "checkpoint",
        lambda w: w.format("parquet").option("path", str(tmp_path / "out")),
    )
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    counts = {q: sum(1 for r in rows if r.queue == q) for q in expected}
    left = {q: at_owner(sharded, q) for q in expected}
    assert counts == {a: 600, b: 400}, f"read {counts}; left at the owners {left}"
    for queue, contents in expected.items():
        assert sorted(bytes(r.content) for r in rows if r.queue == queue) == contents
    assert len(rows) == 1_000
    for queue in expected:
        wait_for(lambda q=queue: empty_at_owner(sharded, q), f"{queue} acked at its owner", 20)
