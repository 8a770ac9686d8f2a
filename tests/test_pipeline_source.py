"""The phpmq streaming source and batch read in real Spark (local[2]) against real brokers.

Every streaming test compares message IDs end to end: the Parquet output (Spark's file sink,
exactly once with an idempotent source) must hold each sent message exactly once, after a
driver killed with SIGKILL mid-batch, a graceful stop and restart, or a broker killed and
restarted on its data directory. Needs a broker with leases (docs/pipeline.md): without one
these tests skip locally and fail in CI (CI=true), as they do without pyspark or Java.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness import REPO, BrokerProcess, curve_broker, generate_keys
from phpmq.testing import free_port

IN_CI = os.environ.get("CI") == "true"
try:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQueryListener

    from phpmq.client import BrokerRefused
    from pipeline_harness import (
        QUERY_TIMEOUT_S,
        assert_exactly_once,
        output_ids,
        queue_stats,
        run_available_now,
        send,
        stream,
        to_parquet,
        wait_drained,
    )
except ModuleNotFoundError as missing:
    if (missing.name or "").split(".")[0] not in {"pyspark", "pyarrow", "pandas", "numpy"}:
        raise
    if IN_CI:
        pytest.fail(f"the spark extra is required in CI: {missing}", pytrace=False)
    pytest.skip(f"{missing} (pip install '.[spark]')", allow_module_level=True)

# One Spark (a JVM) at a time: the Spark files run one after another in one worker.
pytestmark = pytest.mark.xdist_group("spark")

#: A Spark driver of its own (argv: broker, queue, output, checkpoint, marker, hang, and
#: "tell" to give the source the checkpoint location too) streaming to Parquet in batches of
#: 300; a Python UDF hangs the task that meets message `hang` after writing a marker file, so
#: the test can kill the driver in the middle of that batch.
CRASHING_DRIVER = """
import sys, threading, time, os
from pyspark.sql import functions as F
from phpmq.pipeline.session import local_session
broker, queue, output, checkpoint, marker, hang, tell = sys.argv[1:]
spark = local_session("crashing-driver")
@F.udf("string")
def hang_at(content):
    if content == hang.encode():
        open(marker, "w").close()
        time.sleep(3600)
    return content.decode()
reader = (spark.readStream.format("phpmq").option("broker", broker).option("queue", queue)
          .option("maxRecordsPerTrigger", 300))
if tell:
    reader = reader.option("checkpointLocation", checkpoint)
(reader.load().select("id", hang_at("content").alias("text")).writeStream.format("parquet")
       .option("path", output).option("checkpointLocation", checkpoint).start())
threading.Event().wait()
"""


@pytest.fixture
def leasing(broker: BrokerProcess) -> BrokerProcess:
    """The suite's broker, if it has leases (the source needs them)."""
    require_leases(broker)
    return broker


def require_leases(broker: BrokerProcess) -> None:
    with broker.client() as client:
        try:
            client.admin("leases")
        except BrokerRefused as refused:
            if IN_CI:
                pytest.fail(f"the broker has no leases: {refused}", pytrace=False)
            pytest.skip(f"this broker has no leases yet: {refused}")


# --------------------------------------------------------------------------- plain runs


def test_available_now_drains_with_headers_keys_and_sent_at(
    spark: SparkSession, leasing: BrokerProcess, tmp_path: Path
) -> None:
    sent = send(leasing, "events", 500, headers={"origin": "test"}, message_key=b"k")
    query = run_available_now(
        stream(spark, leasing, "events", maxRecordsPerTrigger=200),
        tmp_path / "checkpoint",
        lambda w: w.format("parquet").option("path", str(tmp_path / "out")),
    )
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [200, 200, 100]
    assert_exactly_once(spark, tmp_path / "out", sent)
    row = spark.read.parquet(str(tmp_path / "out")).first()
    assert row.headers == {"origin": "test"} and bytes(row.key) == b"k"
    assert row.sent_at is not None and row.delivery_count == 1 and row.queue == "events"
    stats = wait_drained(leasing, "events")
    assert (stats["ready"], stats["leased"]) == (0, 0)


def test_megabyte_messages_go_in_byte_bounded_batches(
    spark: SparkSession, leasing: BrokerProcess, tmp_path: Path
) -> None:
    """80 messages of 1 MB with the default maxBytesPerTrigger (64 MiB): two batches, and a
    default driver holds no contents, so nothing runs out of memory."""
    sent = send(leasing, "big", 80, size=1_000_000)
    query = run_available_now(
        stream(spark, leasing, "big"),
        tmp_path / "checkpoint",
        lambda w: w.format("parquet").option("path", str(tmp_path / "out")),
    )
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) >= 2 and sum(batches) == 80
    assert_exactly_once(spark, tmp_path / "out", sent)
    assert wait_drained(leasing, "big")["leased"] == 0


class CommitLogWitness(StreamingQueryListener):
    """Records, at each progress event, whether Spark's commit log already had that batch."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self.seen: list[bool] = []

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        batch = event.progress.batchId
        self.seen.append((self.checkpoint / "commits" / str(batch)).exists())

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass


def test_trigger_once_acks_its_batch_in_the_same_run(
    spark: SparkSession, leasing: BrokerProcess, tmp_path: Path
) -> None:
    sent = send(leasing, "events", 300)
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    witness = CommitLogWitness(checkpoint)
    spark.streams.addListener(witness)
    try:
        for _ in range(2):
            query = to_parquet(
                stream(spark, leasing, "events", maxRecordsPerTrigger=200),
                out,
                checkpoint,
                once=True,
            )
            assert query.awaitTermination(QUERY_TIMEOUT_S)
        stats = wait_drained(leasing, "events")
    finally:
        spark.streams.removeListener(witness)
    assert (stats["ready"], stats["leased"]) == (0, 0)
    assert witness.seen and all(witness.seen)  # progress comes after the commit log
    assert_exactly_once(spark, out, sent)


@pytest.mark.timeout(QUERY_TIMEOUT_S)
def test_a_queue_pattern_picks_up_queues_created_while_the_query_runs(
    spark: SparkSession, leasing: BrokerProcess, tmp_path: Path
) -> None:
    sent = send(leasing, "orders.eu", 50) + send(leasing, "orders.us", 30)
    send(leasing, "returns.eu", 20)  # not matched
    out = tmp_path / "out"
    reader = spark.readStream.format("phpmq").option("broker", leasing.address)
    frame = reader.option("queuePattern", "orders.*").load()
    query = to_parquet(frame, out, tmp_path / "checkpoint", processingTime="100 milliseconds")
    try:
        query.processAllAvailable()
        assert sum(output_ids(spark, out).values()) == 80
        sent += send(leasing, "orders.asia", 10)  # a new queue
        deadline = time.monotonic() + 30
        while sum(output_ids(spark, out).values()) < 90 and time.monotonic() < deadline:
            query.processAllAvailable()  # the pattern is matched against stats <= 1 s old
    finally:
        query.stop()
    assert_exactly_once(spark, out, sent)
    assert queue_stats(leasing, "returns.eu")["ready"] == 20


def test_metrics_show_the_backlog_in_the_reported_latest_offset(
    spark: SparkSession, leasing: BrokerProcess, tmp_path: Path
) -> None:
    send(leasing, "events", 250)
    query = run_available_now(
        stream(spark, leasing, "events", maxRecordsPerTrigger=100),
        tmp_path / "checkpoint",
        lambda w: w.format("parquet").option("path", str(tmp_path / "out")),
    )
    first = next(p for p in query.recentProgress if p["numInputRows"])
    source = first["sources"][0]
    end = json.loads(source["endOffset"])
    assert end["lease"] == 1 and end["queues"]["events"]["messages"] == 100
    assert end["queues"]["events"]["ready"] == 150
    # pyspark 4.3 shows a Python source as its JVM class: no API lets it name its queues
    assert source["description"].startswith("org.apache.spark.sql.execution.datasources.v2")
    latest = json.loads(source["latestOffset"])
    assert {"ready", "leased", "oldest_ready_age_s"} <= set(latest["queues"]["events"])
    assert latest["ready"] <= 250 and latest["reader"] == end["reader"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"maxOffsetsPerTrigger": 5}, "use maxRecordsPerTrigger"),
        ({"leaseTimeout": "5s"}, "option leaseTimeout must be at least 5 min"),
    ],
)
def test_bad_options_fail_load_itself_with_a_hint(
    spark: SparkSession, broker: BrokerProcess, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        stream(spark, broker, "events", **options)  # load(), before any query starts
    reader = spark.readStream.format("phpmq").option("queuePattern", "events-.*")
    with pytest.raises(Exception, match="looks like a regular expression, but it is a glob"):
        reader.load()


# --------------------------------------------------------------------------- exactly once


def test_a_driver_killed_mid_batch_gives_exactly_once_after_restart(
    spark: SparkSession, leasing: BrokerProcess, tmp_path: Path
) -> None:
    sent = send(leasing, "events", 1_000)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    kill_driver_in_batch(leasing, out, checkpoint, "m-00450")  # batch 1
    assert queue_stats(leasing, "events")["leased"] > 0  # batch 1 waits in its lease
    frame = stream(spark, leasing, "events", maxRecordsPerTrigger=300)
    restarted = frame.selectExpr("id", "cast(content as string) as text")
    to_parquet(restarted, out, checkpoint, availableNow=True).awaitTermination(QUERY_TIMEOUT_S)
    assert_exactly_once(spark, out, sent)
    assert wait_drained(leasing, "events")["leased"] == 0


def test_a_driver_killed_before_the_first_offset_was_written_finds_its_lease_again(
    spark: SparkSession, leasing: BrokerProcess, tmp_path: Path
) -> None:
    """A new checkpoint: the driver leased batch 0 and died before Spark wrote offsets/0 (the
    test removes it after the kill, which is the same to the restart). With the checkpoint
    location given to the source, the restart derives the same reader id and lease names."""
    sent = send(leasing, "events", 500)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    kill_driver_in_batch(leasing, out, checkpoint, "m-00100", tell_source=True)  # batch 0
    for written in (checkpoint / "offsets").iterdir():
        written.unlink()
    assert queue_stats(leasing, "events")["leased"] == 300
    frame = stream(
        spark, leasing, "events", maxRecordsPerTrigger=300, checkpointLocation=str(checkpoint)
    )
    restarted = frame.selectExpr("id", "cast(content as string) as text")
    to_parquet(restarted, out, checkpoint, availableNow=True).awaitTermination(QUERY_TIMEOUT_S)
    assert_exactly_once(spark, out, sent)
    assert wait_drained(leasing, "events")["leased"] == 0


def kill_driver_in_batch(
    broker: BrokerProcess, out: Path, checkpoint: Path, hang: str, tell_source: bool = False
) -> None:
    """Run CRASHING_DRIVER on queue `events` until a task meets message `hang`, then kill its
    whole process group (JVM, runner, Python workers) with SIGKILL."""
    marker = checkpoint.parent / "hung"
    args = [broker.address, "events", str(out), str(checkpoint), str(marker), hang]
    args.append("tell" if tell_source else "")
    driver = subprocess.Popen(
        [sys.executable, "-c", CRASHING_DRIVER, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        start_new_session=True,  # its JVM and Python workers die with it
    )
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while not marker.exists():
            assert driver.poll() is None, f"the driver exited before a task met {hang}"
            assert time.monotonic() < deadline, f"no task met {hang}"
            time.sleep(0.2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the whole Spark driver, mid-batch
        driver.wait(10)


@pytest.mark.timeout(QUERY_TIMEOUT_S)  # bounds processAllAvailable(), which takes no timeout
def test_a_graceful_stop_and_restart_is_exactly_once(
    spark: SparkSession, leasing: BrokerProcess, tmp_path: Path
) -> None:
    sent = send(leasing, "events", 700)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    frame = stream(spark, leasing, "events", maxRecordsPerTrigger=300)
    query = to_parquet(frame, out, checkpoint, processingTime="100 milliseconds")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    sent += send(leasing, "events", 400)
    to_parquet(frame, out, checkpoint, availableNow=True).awaitTermination(QUERY_TIMEOUT_S)
    assert_exactly_once(spark, out, sent)
    assert wait_drained(leasing, "events")["leased"] == 0


@pytest.mark.timeout(QUERY_TIMEOUT_S)
def test_a_broker_killed_and_restarted_durable_is_ridden_through_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    data, log = tmp_path / "data", tmp_path / "broker.log"
    broker = BrokerProcess(log, data_dir=data)
    try:
        require_leases(broker)
        sent = send(broker, "events", 1_000)
        out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
        frame = stream(spark, broker, "events", maxRecordsPerTrigger=100, brokerTimeout="60s")
        query = to_parquet(frame, out, checkpoint, processingTime="200 milliseconds")
        try:
            deadline = time.monotonic() + QUERY_TIMEOUT_S
            while not any(p["numInputRows"] for p in query.recentProgress):
                assert time.monotonic() < deadline and query.isActive, query.exception()
                time.sleep(0.1)
            broker.kill()  # SIGKILL, in the middle of the stream
            time.sleep(3)  # an outage: the source and its tasks wait (brokerTimeout 60 s)
            broker = BrokerProcess(log, address=broker.address, data_dir=data)
            query.processAllAvailable()
            assert query.isActive
        finally:
            query.stop()
        assert_exactly_once(spark, out, sent)
        assert wait_drained(broker, "events")["leased"] == 0
    finally:
        broker.stop()


# --------------------------------------------------------------------------- batch read


def test_batch_read_browses_ready_messages_and_dead_letters_without_consuming(
    spark: SparkSession, leasing: BrokerProcess
) -> None:
    sent = send(leasing, "events", 120, headers={"n": "1"})
    reader = spark.read.format("phpmq").option("broker", leasing.address).option("queue", "events")
    rows = reader.option("numPartitions", 3).load().collect()
    assert sorted(row.id for row in rows) == sorted(sent)
    assert {row.headers["n"] for row in rows} == {"1"}
    assert queue_stats(leasing, "events")["ready"] == 120  # nothing consumed
    with leasing.client() as client:
        for message in client.consume("events", window=5, timeout=1):
            message.dead_letter("not wanted")
            if message.content == b"m-00004":
                break
    dead = reader.option("deadLetters", "true").load().collect()
    assert len(dead) == 5 and {row.reason for row in dead} == {"not wanted"}
    assert all(row.dead_at is not None for row in dead)
    assert queue_stats(leasing, "events")["dead_letters"] == 5


# --------------------------------------------------------------------------- failures


def test_a_broker_gone_longer_than_broker_timeout_fails_with_a_clear_error() -> None:
    from phpmq.pipeline.broker_link import SourceError
    from phpmq.pipeline.options import SourceOptions
    from phpmq.pipeline.source import PhpmqStreamReader
    from phpmq.testing import free_port

    address = f"tcp://127.0.0.1:{free_port()}"  # nobody there
    options = SourceOptions.parse({"broker": address, "queue": "q", "brokerTimeout": "1500ms"})
    reader = PhpmqStreamReader(options)
    began = time.monotonic()
    with pytest.raises(
        SourceError, match=r"did not answer 'lease' for \d s \(option brokerTimeout is 1.5 s\)"
    ):
        reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
    assert time.monotonic() - began < 5


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_lease_that_is_gone_fails_the_task_unless_told_to_skip(
    leasing: BrokerProcess, fail_on_data_loss: bool
) -> None:
    from phpmq.pipeline.broker_link import SourceError
    from phpmq.pipeline.lease_read import LeasePart, read_lease

    send(leasing, "events", 3)
    with leasing.client() as client:
        client.admin("lease", queue="events", lease="r/1", max_messages=3, max_bytes=1 << 20)
        part = LeasePart(leasing.address, "events", "r/1", 0, 3, 5_000, fail_on_data_loss, "t")
        assert sum(batch.num_rows for batch in read_lease(part)) == 3
        client.admin("lease-commit", queue="events", lease="r/1")
    if fail_on_data_loss:
        with pytest.raises(
            SourceError, match="lease r/1 of queue 'events' is gone from the broker"
        ):
            list(read_lease(part))
    else:
        assert list(read_lease(part)) == []


# --------------------------------------------------------------------------- security


def test_the_listener_leaves_a_broker_it_could_not_reach_alone_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark runs listeners one event at a time: a broker the listener cannot reach (gone, or
    CURVE without its keys) costs one wait, not one per batch of every query (which held back
    the session's stop past 30 s after the CURVE test)."""
    from phpmq.pipeline import listener
    from phpmq.pipeline.lease_offsets import LeaseOffset, QueueShare

    monkeypatch.setattr(listener, "LISTENER_TIMEOUT_MS", 300)
    monkeypatch.setattr(listener, "_unreachable", {})
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    offset = LeaseOffset("reader", 3, nowhere, {"in": QueueShare(messages=5)})
    end_offset = json.dumps(offset.to_json())
    started = time.monotonic()
    assert listener.commit_finished(end_offset) == 0
    first = time.monotonic() - started
    started = time.monotonic()
    assert listener.commit_finished(end_offset) == 0
    again = time.monotonic() - started
    assert first >= 0.3 and again < 0.05, (first, again)
    assert listener._unreachable[nowhere] > time.monotonic() + 50


def test_the_source_and_sink_use_their_curve_keys_and_get_exactly_their_rights(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A CURVE broker with rights: the source's key may consume `in`, the sink's may send to
    `out`; a source key without the consume right fails the query with the broker's 403."""
    names = ("broker", "reader", "writer", "nobody")
    keys = generate_keys(tmp_path / "keys", names, names)
    (keys / "rights.toml").write_text(
        '[keys.reader]\nconsume = ["in"]\n[keys.writer]\nsend = ["in", "out"]\n[keys.nobody]\n'
    )
    secure = curve_broker(
        tmp_path, keys, "--permissions", str(keys / "rights.toml"), as_key="writer"
    )
    try:
        sent = send(secure, "in", 50)

        def curve_of(name: str) -> dict[str, str]:
            secret, server = keys / f"{name}.key_secret", keys / "broker.key"
            return {"curveSecret": str(secret), "curveServer": str(server)}

        def to_out(writer: Any) -> Any:
            writer = writer.format("phpmq").option("broker", secure.address)
            return writer.option("queue", "out").options(**curve_of("writer"))

        frame = stream(spark, secure, "in", **curve_of("reader")).select("content")
        query = run_available_now(frame, tmp_path / "checkpoint", to_out)
        assert sum(p["numInputRows"] for p in query.recentProgress) == len(sent)
        assert queue_stats(secure, "out")["ready"] == len(sent)
        browse = spark.read.format("phpmq").option("broker", secure.address)
        browsed = browse.option("queue", "out").options(**curve_of("reader")).load()
        with pytest.raises(Exception, match="403"):  # reader may consume `in`, not `out`
            browsed.count()
        refused = stream(spark, secure, "out", **curve_of("nobody"))
        with pytest.raises(Exception, match="403"):
            run_available_now(refused, tmp_path / "checkpoint-2", lambda w: w.format("noop"))
    finally:
        secure.stop()
