"""A local SparkSession set up for the phpmq format (the demo, the benchmark and the tests).

Two environment settings decide whether local mode works at all here: PYSPARK_PYTHON must be
this interpreter (otherwise Spark's Python workers run `python3` from PATH, which lacks
pyarrow and this package), and SPARK_LOCAL_IP keeps Spark on loopback instead of the first
network interface.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from .datasource import register

#: Settings that make a local session quick to start and quiet.
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
}


class SparkUnavailable(RuntimeError):
    """Raised when Spark cannot run here (no Java)."""


def local_session(
    app_name: str = "phpmq", cores: int = 2, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A `local[cores]` session with the phpmq format registered.

    Raises:
        SparkUnavailable: no `java` on PATH and no JAVA_HOME.
    """
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise SparkUnavailable("Spark needs Java 17 or 21: put `java` on PATH or set JAVA_HOME")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    settings = {**LOCAL_CONF, "spark.default.parallelism": str(cores), **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
