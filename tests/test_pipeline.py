"""The Spark pipeline (pipeline/): the demo in real Spark local mode against a real broker
process on loopback. The source's tests are in tests/test_pipeline_source*.py, the sink's in
tests/test_pipeline_sink.py; tests/pipeline_harness.py holds what they share. Spark is
optional: without pyspark (or Java) these tests skip locally and fail in CI (CI=true).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from harness import BrokerProcess
from pipeline_harness import queue_stats, skip_without_spark

try:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F  # noqa: N812

    from phpmq.pipeline.demo import run_demo
except ModuleNotFoundError as missing:
    skip_without_spark(missing)


# One Spark (a JVM) at a time: the Spark files run one after another in one worker.
pytestmark = pytest.mark.xdist_group("spark-b")


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
