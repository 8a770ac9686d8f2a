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

import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 (the usual name for this module)
from rich.console import Console
from rich.table import Table

from ..client import Client, ClientError

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
            with _broker() as address:
                _source_to_parquet(spark, address, WARM_UP_MESSAGES, size, 1_000, work / "warm")
                results.append(
                    _source_to_parquet(spark, address, messages, size, DEFAULT_BROKER_BATCH, work)
                )
                results.append(_sink(spark, address, messages, size))
            with _broker("--max-window", str(2 * BIG_BATCH + 1)) as address:
                results.append(_source_to_parquet(spark, address, messages, size, BIG_BATCH, work))
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


@contextmanager
def _broker(*args: str) -> Iterator[str]:
    """A broker subprocess on a free loopback port, stopped on exit."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    command = [sys.executable, "-m", "phpmq", "broker", "--bind", address]
    process = subprocess.Popen([*command, "--log-level", "WARNING", *args])
    try:
        _wait_until_answering(address, process)
        yield address
    finally:
        process.terminate()
        process.wait(10)


def _wait_until_answering(address: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the broker exited during start-up")
        with Client(address, send_timeout=1, close_timeout=0.5) as client:
            try:
                client.admin("stats", timeout=0.5)
                return
            except ClientError:
                pass
    raise RuntimeError("the broker did not answer within 20 s")
