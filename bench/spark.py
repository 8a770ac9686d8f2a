"""The Spark workload (`phpmq pipeline bench`): rows/s through the phpmq source and sink.

* source -> Parquet: N messages wait in a queue; an availableNow query reads them with the
  phpmq source and writes Parquet. Measured twice: with the largest batch a default broker
  allows (window 10 000, so 4 999 rows per batch) and with bigger batches on a broker started
  with a larger --max-window.
* DataFrame -> sink: a DataFrame of N rows is written to a queue with `df.write.format("phpmq")`,
  and the count is checked in the broker's stats.

Wall time includes query planning; "in batches" is the sum of the micro-batches' own durations
(Spark's progress reports). A warm-up query runs first, so Python worker start-up is not
counted. Needs `pip install .[spark]`; starts its own broker on a free loopback port.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 (the usual name for this module)
from rich.console import Console
from rich.table import Table

from ..client import Client
from ..testing import BrokerProcess

#: Rows per batch on a broker with the default max_window (the window must exceed 2 x batch).
DEFAULT_BROKER_BATCH = 4_999
BIG_BATCH = 25_000
WARM_UP_MESSAGES = 2_000
#: Seconds a query may take before the benchmark gives up.
QUERY_TIMEOUT_S = 600


def run_spark_benchmark(messages: int = 100_000, size: int = 100) -> list[dict]:
    """Run both workloads and print a table; returns its rows."""
    from ..pipeline.session import local_session

    console = Console(width=max(Console().width, 90))
    console.print(
        f"spark: {messages:,} messages of {size} bytes, local[2], loopback broker; availableNow"
    )
    spark = local_session("phpmq-bench")
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="phpmq-bench-") as scratch:
            work = Path(scratch)
            with BrokerProcess("--log-level", "WARNING") as broker:
                address = broker.address
                _source_to_parquet(spark, address, WARM_UP_MESSAGES, size, 1_000, work / "warm")
                results.append(
                    _source_to_parquet(spark, address, messages, size, DEFAULT_BROKER_BATCH, work)
                )
                results.append(_sink(spark, address, messages, size))
            big_window = str(2 * BIG_BATCH + 1)
            with BrokerProcess("--log-level", "WARNING", "--max-window", big_window) as broker:
                results.append(
                    _source_to_parquet(spark, broker.address, messages, size, BIG_BATCH, work)
                )
    finally:
        spark.stop()
    console.print(_table(results))
    return results


def _source_to_parquet(
    spark: SparkSession, address: str, messages: int, size: int, batch: int, work: Path
) -> dict:
    queue = f"bench-source-{batch}"
    pad = b"x" * size
    with Client(address, name="bench-spark-producer", send_timeout=30) as client:
        client.send_many(queue, (pad for _ in range(messages)))
    target = work / f"parquet-{batch}"
    started = time.monotonic()
    query = (
        spark.readStream.format("phpmq")
        .option("broker", address)
        .option("queue", queue)
        .option("maxRecordsPerBatch", batch)
        .load()
        .writeStream.format("parquet")
        .option("path", str(target))
        .option("checkpointLocation", str(target) + ".checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(QUERY_TIMEOUT_S):
        query.stop()
        raise RuntimeError(f"the source query did not finish within {QUERY_TIMEOUT_S}s")
    wall = time.monotonic() - started
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    in_batches = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    rows = spark.read.parquet(str(target)).count()
    return _result(f"source -> Parquet ({batch:,}/batch)", rows, wall, in_batches, progress)


def _sink(spark: SparkSession, address: str, messages: int, size: int) -> dict:
    queue = "bench-sink"
    frame = spark.range(messages).select(F.lpad(F.col("id").cast("string"), size, "x"))
    frame = frame.toDF("content").cache()
    frame.count()  # materialise first: measure the sink, not the generation
    started = time.monotonic()
    frame.write.format("phpmq").option("broker", address).option("queue", queue).mode(
        "append"
    ).save()
    wall = time.monotonic() - started
    frame.unpersist()
    with Client(address, name="bench-spark-check") as client:
        landed = client.admin("stats")["queues"][queue]["ready"]
    return _result("DataFrame -> sink", landed, wall, None, [])


def _result(path: str, rows: int, wall: float, in_batches: float | None, progress: list) -> dict:
    return {
        "path": path,
        "rows": rows,
        "batches": len(progress) or None,
        "wall_s": wall,
        "rows_per_s": rows / wall,
        "batch_rows_per_s": rows / in_batches if in_batches else None,
    }


def _table(results: list[dict]) -> Table:
    table = Table()
    for column in ("path", "rows", "batches", "wall s", "rows/s", "in batches"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for result in results:
        in_batches = result["batch_rows_per_s"]
        table.add_row(
            result["path"],
            f"{result['rows']:,}",
            str(result["batches"] or "-"),
            f"{result['wall_s']:.1f}",
            f"{result['rows_per_s']:,.0f}",
            f"{in_batches:,.0f}" if in_batches else "-",
        )
    return table
