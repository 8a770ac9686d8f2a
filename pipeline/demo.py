"""`phpmq pipeline demo`: events into a queue, Spark counts them per key and minute.

1. Produce: JSON events `{"key": "sensor-3", "at": "...", "value": 17}` are sent to
   `demo.events`, spread over the last five minutes.
2. Ingest (Structured Streaming, availableNow): the phpmq source reads the queue into a
   Parquet table of raw events, checkpointed, so a second run picks up where this one ended.
   Each message is acked only after its batch is in the table.
3. Count (a batch job): the raw table, without duplicate message IDs (the source is
   at-least-once, and a redelivered message keeps its ID), grouped per key and minute; the
   counts are written to Parquet and published to `demo.counts` with the phpmq sink.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (the usual name for this module)
from rich.console import Console
from rich.table import Table

from ..client import Client
from ..protocol import admin_commands as cmd

EVENTS_QUEUE = "demo.events"
COUNTS_QUEUE = "demo.counts"
EVENT_SCHEMA = "key string, at timestamp, value long"
#: The span of event times, ending now, in minutes.
SPAN_MINUTES = 5
#: Seconds the ingesting query may run before the demo gives up.
QUERY_TIMEOUT_S = 600
#: Rows per micro-batch while ingesting; the default broker window (10 000) allows up to 4 999.
BATCH_ROWS = 2_000


@dataclass(frozen=True)
class DemoResult:
    produced: int
    ingested: int
    batches: int
    unique_events: int
    counts: int
    counts_in_queue: int


def produce(address: str, events: int, keys: int, seed: int = 7) -> int:
    """Send `events` JSON events to EVENTS_QUEUE; returns how many were sent."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    span_s = SPAN_MINUTES * 60

    def event() -> bytes:
        at = now - timedelta(seconds=rng.uniform(0, span_s))
        key = f"sensor-{min(int(rng.expovariate(0.6)), keys - 1)}"
        body = {
            "key": key,
            "at": at.isoformat(timespec="milliseconds"),
            "value": rng.randint(0, 100),
        }
        return json.dumps(body).encode()

    with Client(address, name="pipeline-demo") as client:
        return client.send_many(EVENTS_QUEUE, (event() for _ in range(events)))


def ingest(spark: SparkSession, address: str, workdir: Path) -> tuple[int, int]:
    """Stream EVENTS_QUEUE into workdir/events until it is empty; returns (rows, batches)."""
    checkpoint = str(workdir / "checkpoints" / "events")
    events = (
        spark.readStream.format("phpmq")
        .option("broker", address)
        .option("queue", EVENTS_QUEUE)
        .option("maxRecordsPerBatch", BATCH_ROWS)
        .option("checkpointLocation", checkpoint)  # the reader id survives a first-batch crash
        .load()
        .select("id", F.from_json(F.col("content").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("id", "e.key", "e.at", "e.value")
    )
    query = (
        events.writeStream.format("parquet")
        .option("path", str(workdir / "events"))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(QUERY_TIMEOUT_S):
        query.stop()
        raise RuntimeError(f"ingesting did not finish within {QUERY_TIMEOUT_S}s")
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return sum(p["numInputRows"] for p in progress), len(progress)


def count(spark: SparkSession, address: str, workdir: Path) -> DataFrame:
    """Counts per key and minute of every event ingested so far, to Parquet and COUNTS_QUEUE."""
    raw = spark.read.parquet(str(workdir / "events")).dropDuplicates(["id"])
    counts = (
        raw.groupBy("key", F.window("at", "1 minute").start.alias("minute"))
        .agg(F.count("*").alias("events"), F.sum("value").alias("value_sum"))
        .orderBy("minute", "key")
        .cache()
    )
    counts.write.mode("overwrite").parquet(str(workdir / "counts"))
    message = F.to_json(F.struct(F.col("key"), F.col("minute"), F.col("events")))
    (
        counts.select(message.alias("content"))
        .write.format("phpmq")
        .option("broker", address)
        .option("queue", COUNTS_QUEUE)
        .mode("append")
        .save()
    )
    return counts


def run_demo(
    spark: SparkSession, address: str, workdir: Path, events: int, keys: int, console: Console
) -> DemoResult:
    started = time.monotonic()
    produced = produce(address, events, keys)
    console.print(f"produced {produced} events to {EVENTS_QUEUE}")
    before = _ready(address, COUNTS_QUEUE)
    ingested, batches = ingest(spark, address, workdir)
    console.print(
        f"ingested {ingested} events in {batches} micro-batches into {workdir / 'events'}"
    )
    counts = count(spark, address, workdir)
    rows = counts.collect()
    unique = sum(row["events"] for row in rows)
    console.print(_table(rows, unique))
    published = _ready(address, COUNTS_QUEUE) - before
    console.print(
        f"wrote {len(rows)} counts to {workdir / 'counts'} and published {published} to"
        f" {COUNTS_QUEUE}; {time.monotonic() - started:.1f}s"
    )
    counts.unpersist()
    return DemoResult(produced, ingested, batches, unique, len(rows), published)


def _table(rows: list, unique: int) -> Table:
    table = Table(title="events per key and minute", caption=f"{unique} unique events so far")
    for column in ("minute (UTC)", "key", "events", "value sum"):
        table.add_column(column, justify="right" if column != "key" else "left")
    for row in rows:
        minute = row["minute"].strftime("%Y-%m-%d %H:%M")
        table.add_row(minute, row["key"], str(row["events"]), str(row["value_sum"]))
    return table


def _ready(address: str, queue: str) -> int:
    with Client(address, name="pipeline-demo") as client:
        stats = client.admin(cmd.STATS)["queues"].get(queue)
    return stats["ready"] if stats else 0
