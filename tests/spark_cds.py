"""A class-data-sharing archive of Spark's classes for the suite's JVMs (issue #29).

A Spark JVM spends most of its start parsing and linking some 10,000 classes from Spark's
jars: a local session that counts ten rows costs 7-9 s of CPU. The JDK's dynamic CDS archive
keeps those classes parsed on disk (`-XX:ArchiveClassesAtExit` writes one as a JVM exits,
`-XX:SharedArchiveFile` maps it); with it, the same session costs 4.4 s. The suite's Spark
tests start dozens of JVMs on a CPU-bound 2-core machine, so `make test` builds the archive
once per Java and pyspark (`python tests/spark_cds.py`, about 30 s, kept with the venv) and
tests/conftest.py hands it to every Spark JVM of the run through SPARK_SUBMIT_OPTS.

A JVM that cannot use the archive (another class path: a standalone cluster's daemons) runs
as it would without it; the CDS log is off, so it says nothing about it either.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The JVM options of every Spark JVM of the suite: the quick JIT only and a one-thread GC (a
#: test's JVM lives seconds, and the optimizing JIT and parallel GC cost it a third more CPU).
BASE_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Building the archive takes about 30 s; past this, the suite goes on without it.
BUILD_TIMEOUT_S = 300
#: A JVM that cannot map the archive warns on stdout; these keep it quiet.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: What the archive is built from: classes of batch, Parquet, streaming and Arrow Python work.
_WORKLOAD = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
out = sys.argv[1]
spark.range(100).selectExpr("id", "cast(id as string) as content").write.parquet(out + "/a")
frame = spark.read.parquet(out + "/a")
frame.mapInArrow(lambda batches: batches, frame.schema).groupBy("content").count().collect()
query = (
    spark.readStream.schema(frame.schema).parquet(out + "/a").writeStream.format("parquet")
    .option("checkpointLocation", out + "/c").trigger(availableNow=True).start(out + "/b")
)
query.awaitTermination()
gateway = spark.sparkContext._gateway
spark.stop()
gateway.proc.stdin.close()  # the JVM exits on its stdin's end, writing the archive
gateway.proc.wait(120)
"""


def archive_path() -> Path | None:
    """Where the archive for this Java and pyspark is kept (None: no Java or no pyspark)."""
    java = shutil.which("java")
    try:
        import pyspark
    except ImportError:
        return None
    if java is None:
        return None
    binary = Path(java).resolve()
    key = f"{binary}:{binary.stat().st_mtime_ns}:{pyspark.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(sys.prefix) / "spark-cds" / f"spark-{digest}.jsa"


def jvm_options() -> str:
    """The options for the suite's Spark JVMs: the archive's, once it is built."""
    archive = archive_path()
    if archive is None or not archive.exists():
        return BASE_OPTIONS
    return f"{BASE_OPTIONS} -XX:SharedArchiveFile={archive} {QUIET}"


def build() -> int:
    """Build the archive if this Java and pyspark have none yet; the exit status (0: there is
    one, or no Spark to build it for)."""
    archive = archive_path()
    if archive is None or archive.exists():
        return 0
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    options = f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={partial} {QUIET}"
    with tempfile.TemporaryDirectory() as scratch:
        try:
            run = subprocess.run(
                [sys.executable, "-c", _WORKLOAD, scratch],
                env={**os.environ, "SPARK_SUBMIT_OPTS": options, "PYSPARK_PYTHON": sys.executable},
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
            problem = None if run.returncode == 0 else f"status {run.returncode}: {run.stderr}"
        except subprocess.TimeoutExpired:
            problem = f"not done within {BUILD_TIMEOUT_S} s"
    if problem is not None or not partial.exists():
        # The suite runs without the archive, only slower: say so (with the end of what
        # the build said), and go on.
        partial.unlink(missing_ok=True)
        print(f"no Spark class archive ({(problem or 'none written')[-2000:]})")
        return 0
    os.replace(partial, archive)  # whole or not at all, for a JVM that maps it meanwhile
    print(f"Spark class archive: {archive}")
    return 0


if __name__ == "__main__":
    sys.exit(build())
