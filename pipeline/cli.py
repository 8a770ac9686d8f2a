"""`phpmq pipeline`: the Spark pipeline's commands (Spark itself is loaded only when they run).

Wired into the `phpmq` group by broker/cli.py; runnable alone as `python -m pipeline.cli`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from ..client import DEFAULT_ADDRESS, ClientError

SPARK_MISSING = "this needs Spark: pip install '.[spark]' (pyspark 4.3, and Java 17 or 21)"


def _fail(message: str) -> NoReturn:
    click.echo(f"phpmq: {message}", err=True)
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def pipeline() -> None:
    """Spark pipelines on phpmq queues (the `phpmq` format: docs/pipeline.md)."""


@pipeline.command()
@click.option(
    "--broker",
    "address",
    envvar="PHPMQ_BROKER",
    default=DEFAULT_ADDRESS,
    show_default=True,
    help="Broker address (env PHPMQ_BROKER).",
)
@click.option("--events", type=click.IntRange(min=1), default=5_000, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=4, show_default=True)
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
    try:
        from rich.console import Console

        from .demo import run_demo
        from .session import SparkUnavailable, local_session
    except ImportError:
        _fail(SPARK_MISSING)
    try:
        spark = local_session("phpmq-pipeline-demo")
    except SparkUnavailable as exc:
        _fail(str(exc))
    try:
        run_demo(spark, address, workdir.resolve(), events, keys, Console())
    except ClientError as exc:
        _fail(f"{exc} (start one with `phpmq broker`)")
    finally:
        spark.stop()


@pipeline.command()
@click.option("--messages", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--size", type=click.IntRange(min=0), default=100, show_default=True)
def bench(messages: int, size: int) -> None:
    """Rows/s through the phpmq source (queue -> Parquet) and sink (DataFrame -> queue).

    Starts its own broker on a free loopback port.
    """
    try:
        from ..bench.spark import run_spark_benchmark
    except ImportError:
        _fail(SPARK_MISSING)
    run_spark_benchmark(messages=messages, size=size)


if __name__ == "__main__":
    pipeline()
