"""`phpmq pipeline`: the Spark pipeline's commands (Spark loads only when one of them runs)."""

from __future__ import annotations

from pathlib import Path

import click

from .shared import broker_option, fail

SPARK_MISSING = "this needs Spark: pip install '.[spark]' (pyspark 4.3, and Java 17 or 21)"


@click.group()
def pipeline() -> None:
    """Spark pipelines on phpmq queues (the `phpmq` format: docs/pipeline.md)."""


@pipeline.command()
@broker_option
@click.option(
    "--events",
    type=click.IntRange(min=1),
    default=5_000,
    show_default=True,
    help="Events to produce.",
)
@click.option(
    "--keys",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Sensors the events come from (sensor-0 ...).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("phpmq-demo"),
    show_default=True,
    help="Parquet tables and the streaming checkpoint; a later run continues from it.",
)
def demo(address: str, events: int, keys: int, workdir: Path) -> None:
    """Produce events, count them per key and minute with Spark, publish and store the counts.

    Needs a running broker (`phpmq broker`). The events go to queue demo.events, a streaming
    query ingests them into WORKDIR/events, and a batch job writes the counts to WORKDIR/counts
    and to queue demo.counts.
    """
    from ..client import ClientError

    try:
        from rich.console import Console

        from ..pipeline.demo import run_demo
        from ..pipeline.session import SparkUnavailable, local_session
    except ImportError:
        fail(SPARK_MISSING)
    try:
        spark = local_session("phpmq-pipeline-demo")
    except SparkUnavailable as exc:
        fail(str(exc))
    try:
        run_demo(spark, address, workdir.resolve(), events, keys, Console())
    except ClientError as exc:
        fail(f"{exc} (start one with `phpmq broker`)")
    finally:
        spark.stop()


@pipeline.command()
@click.option(
    "--messages",
    type=click.IntRange(min=1),
    default=None,
    help="Messages through each path.  [default: 100,000, or 256 MB worth if fewer]",
)
@click.option(
    "--size",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="Content bytes per message (e.g. 100, or 102400 for 100 KB).",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Runs of every path; each row is the path's median, and the ratios are of medians"
    " (one run varies by up to a fifth on a busy machine).",
)
def bench(messages: int | None, size: int, rounds: int) -> None:
    """Rows/s through the phpmq source (queue -> Parquet) and sink (DataFrame -> queue):
    default settings beside tuned ones, keyed rows beside plain ones, a durable broker beside
    one in memory, and the driver's peak memory. "Spark alone" (the sink's rows handed
    to a writer that discards them) shows what Spark itself spends on a keyed row's two extra
    columns.

    Starts its own brokers (one in memory, one durable in a scratch directory) on free
    loopback ports.
    """
    try:
        from ..bench.spark import run_spark_benchmark
        from ..pipeline.session import SparkUnavailable
    except ImportError:
        fail(SPARK_MISSING)
    try:
        run_spark_benchmark(messages=messages, size=size, rounds=rounds)
    except SparkUnavailable as exc:
        fail(str(exc))
