"""Spark through a failover of a replicated cluster (docs/cluster.md "Replicated queues",
docs/pipeline.md): the source reads a queue into Parquet and the sink writes keyed rows to
one while the node leading that queue's shard is killed -9. Exactly once holds: the
source's leases and the sink's idempotency keys are replicated like the messages.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from harness import wait_for
from pipeline_harness import assert_exactly_once, skip_without_spark, to_parquet
from replicated_cluster import ReplicatedCluster, replicated_cluster, until_done

try:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F  # noqa: N812

    from phpmq import Client, NotTaken
except ModuleNotFoundError as missing:
    skip_without_spark(missing)

# One Spark (a JVM) at a time with the other Spark files of its group.
pytestmark = [pytest.mark.xdist_group("spark-b"), pytest.mark.timeout(300)]

#: What the shard's other nodes need to elect a leader and serve again, at most.
FAILOVER_S = 60


def entry_and_leader(cluster: ReplicatedCluster, shard: str) -> tuple[str, str]:
    """A node that does not lead `shard` (where Spark connects), and the one that does."""
    leader = cluster.wait_for_leaders()[shard].node
    return next(node for node in cluster.names if node != leader), leader


def test_the_source_reads_exactly_once_through_a_failover(
    spark: SparkSession, tmp_path: Path
) -> None:
    with replicated_cluster(tmp_path) as cluster:
        shard = "a/0"
        queue = cluster.queue_of(shard)
        entry, leader = entry_and_leader(cluster, shard)
        with Client(cluster.address(entry), confirm_timeout=10) as client:
            # Keyed and sent again until confirmed: a leader elected anew under load (its
            # followers starved past the election timeout) loses an unconfirmed send.
            sent = [
                until_done(
                    lambda i=i: client.send(queue, b"m-%05d" % i, confirm=True, key=f"m-{i}")
                )
                for i in range(600)
            ]
        reader = spark.readStream.format("phpmq").option("broker", cluster.address(entry))
        frame = reader.option("queue", queue).options(
            maxRecordsPerTrigger="100", brokerTimeout="60s"
        )
        out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
        query = to_parquet(frame.load(), out, checkpoint, processingTime="200 milliseconds")
        try:
            wait_for(
                lambda: any(p["numInputRows"] for p in query.recentProgress) or query.exception(),
                "the first batch",
                timeout=120,
            )
            cluster.kill_node(leader)  # mid-stream: a batch's lease is held on the leader
            killed_at = time.monotonic()
            query.processAllAvailable()
            assert query.isActive, query.exception()
            print(f"the stream took every message {time.monotonic() - killed_at:.1f} s after")
        finally:
            query.stop()
        assert_exactly_once(spark, out, sent)


def test_the_sink_writes_each_row_once_through_a_failover(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The write meets the kill and rides the failover through: its tasks send what was not
    confirmed again, with the same keys, once a new leader serves. Run again with the same
    key scope, as a retried job would, it adds nothing."""
    with replicated_cluster(tmp_path) as cluster:
        shard = "b/0"
        queue = cluster.queue_of(shard)
        entry, leader = entry_and_leader(cluster, shard)
        rows = spark.range(20_000).repartition(4)
        frame = rows.select(F.format_string("row-%05d", "id").alias("content"))

        def write() -> None:
            writer = frame.write.format("phpmq").option("broker", cluster.address(entry))
            writer.options(queue=queue, keyScope="job-1")
            writer.mode("append").save()

        leading = cluster.leader(shard)
        killed = threading.Event()

        def kill_when_rows_arrive() -> None:
            # (The write stays on the test's thread: Spark finds the phpmq format there.)
            wait_for(
                lambda: (cluster.replication(leading) or {}).get("operations", 0) >= 1_000,
                "the first rows to reach the shard's leader",
                timeout=120,
            )
            cluster.kill_node(leader)
            killed.set()

        killer = threading.Thread(target=kill_when_rows_arrive, daemon=True)
        killer.start()
        started = time.monotonic()
        try:
            write()
        except Exception as exc:
            pytest.fail(f"the write did not ride the failover through: {_last_line(exc)}")
        killer.join(120)
        assert killed.is_set(), "the write ended before the kill: a bigger write is needed"
        print(f"the write went through the kill: {time.monotonic() - started:.1f} s in all")
        write()  # the job again: its keys make the rows already queued count once
        ids_of: dict[bytes, set[str]] = defaultdict(set)
        deliveries = 0
        with Client(cluster.address(entry)) as client:
            # The shard's home replica may be the dead one: the client raises NotTaken after
            # a second there, and goes on to the next replica when asked again.
            wait_for(lambda: _subscribed(client, queue), "a live replica to subscribe at", 30)
            while (message := client.receive(timeout=5)) is not None:
                ids_of[message.content].add(message.id)
                deliveries += 1
                message.ack()
    # A row queued twice has two message IDs. One ID delivered twice is a redelivery (a
    # busy machine's consumer given up on, its acks lost): at least once, as documented.
    doubled = [content for content, ids in ids_of.items() if len(ids) > 1]
    assert not doubled, f"{len(doubled)} rows queued twice, e.g. {doubled[:3]}"
    assert set(ids_of) == {b"row-%05d" % i for i in range(20_000)}
    print(f"{deliveries - len(ids_of)} redeliveries")


def _last_line(failure: BaseException) -> str:
    """The Python worker's own error, out of the JVM's report around it."""
    lines = [line for line in str(failure).splitlines() if line.startswith(("phpmq", "pipeline"))]
    return lines[-1].strip() if lines else str(failure)[-600:]


def _subscribed(client: Client, queue: str) -> bool:
    try:
        client.subscribe(queue, 1_000)
    except NotTaken:
        return False
    return True
