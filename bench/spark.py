"""The Spark workload (`phpmq pipeline bench`): rows/s through the phpmq source and sink, with
the default settings beside tuned ones, for one message size, and the driver's peak memory.

* source -> Parquet: N messages wait in a queue; an availableNow query reads them with the
  phpmq source and writes Parquet. Default: no option but the queue. Tuned: batches of up to
  TUNED_RECORDS rows or TUNED_BYTES bytes, in the option names the source knows
  (maxRecordsPerTrigger / maxBytesPerTrigger, or maxRecordsPerBatch before them).
* DataFrame -> sink: a cached DataFrame of N rows is written to a queue with
  `df.write.format("phpmq")`, and the count is checked in the broker's stats. Default: as
  Spark splits it (spark.default.parallelism tasks). Tuned: TUNED_SINK_TASKS tasks.

Peak memory, sampled from /proc every 0.1 s while the path runs: "JVM RSS" is the resident
memory of the driver JVM; "all PSS" adds every process under it (Spark's Python workers, the
source runner, the per-batch planner processes: in local mode the executors are in the driver),
as proportional set sizes, since the Python workers are forked from one daemon and share
pages. The JVM keeps part of what earlier paths made its heap grow to, so a path's peak is
not its own alone. Wall time includes query planning; a warm-up query
runs first, so Python worker start-up is not counted. Figures are printed, never asserted.
Needs `pip install .[spark]`; starts its own broker on a free loopback port.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 (the usual name for this module)
from rich.console import Console
from rich.table import Table

from ..client import Client
from ..pipeline.options import OptionError, SourceOptions
from ..protocol import admin_commands as cmd
from ..testing import BrokerProcess
from .measure import MB, RssSampler, pss_bytes, rss_bytes

#: Tuned source batches: this many rows at most, and at most this many bytes of content.
TUNED_RECORDS = 100_000
TUNED_BYTES = 256 * MB
#: Tasks of the tuned sink write.
TUNED_SINK_TASKS = 4
#: Messages per path when not given: 100 000, or fewer so that they hold at most this much.
DEFAULT_MESSAGES = 100_000
DEFAULT_BYTES = 256 * MB
WARM_UP_MESSAGES = 2_000
#: Seconds a query may take before the benchmark gives up.
QUERY_TIMEOUT_S = 600


def default_messages(size: int) -> int:
    """How many messages of `size` bytes a run sends per path when not told."""
    return max(1, min(DEFAULT_MESSAGES, DEFAULT_BYTES // max(size, 1)))


def run_spark_benchmark(
    messages: int | None = None,
    size: int = 100,
    spark: SparkSession | None = None,
    warm_up: bool = True,
) -> list[dict]:
    """Run the source and sink paths, default and tuned, and print a table; returns its rows.
    Without `spark`, a local session is started for the run and stopped after it; without
    `warm_up`, the first path pays for Spark's Python workers starting."""
    from ..pipeline.session import local_session

    messages = messages or default_messages(size)
    console = Console(width=max(Console().width, 140))
    tuned = tuned_source_options(TUNED_RECORDS, TUNED_BYTES, size)
    console.print(
        f"spark: {messages:,} messages of {size:,} bytes per path, local[2], loopback broker;"
        f" tuned source: {_describe(tuned)}; tuned sink: {TUNED_SINK_TASKS} tasks"
    )
    own_session = spark is None
    spark = spark or local_session("phpmq-bench")
    results = []
    try:
        driver = DriverRss(_driver_pid(spark))
        with tempfile.TemporaryDirectory(prefix="phpmq-bench-") as scratch:
            work = Path(scratch)
            with BrokerProcess("--log-level", "WARNING") as broker:
                source = _SourcePath(spark, broker.address, size, work)
                if warm_up:
                    source.run("warm-up", WARM_UP_MESSAGES, {})
                    _sink(spark, broker.address, WARM_UP_MESSAGES, size, None)
                paths: list[tuple[str, Callable[[], dict]]] = [
                    ("source default", lambda: source.run("default", messages, {})),
                    ("source tuned", lambda: source.run("tuned", messages, tuned)),
                    ("sink default", lambda: _sink(spark, broker.address, messages, size, None)),
                    (
                        "sink tuned",
                        lambda: _sink(spark, broker.address, messages, size, TUNED_SINK_TASKS),
                    ),
                ]
                for name, path in paths:
                    with driver.sampling():
                        result = path()
                    results.append({"path": name, **result, **driver.peaks()})
    finally:
        if own_session:
            spark.stop()
    _add_ratios(results)
    console.print(_table(results, size))
    return results


def tuned_source_options(records: int, max_bytes: int, size: int) -> dict[str, str]:
    """Source options for batches of at most `records` rows and `max_bytes` bytes, in the
    names the source knows; without a byte limit the row limit is cut to fit `max_bytes`."""
    options: dict[str, str] = {}
    if _source_knows("maxBytesPerTrigger", "1048576", "2097152"):
        options["maxBytesPerTrigger"] = str(max_bytes)
    else:
        records = max(1, min(records, max_bytes // max(size, 1)))
    for name in ("maxRecordsPerTrigger", "maxRecordsPerBatch"):
        if _source_knows(name, "1000", "2000"):
            options[name] = str(records)
            break
    return options


def _source_knows(name: str, one: str, other: str) -> bool:
    """The source accepts option `name` and it changes what the source does (an option the
    source ignores parses to the same result for both values)."""
    try:
        first = SourceOptions.parse({"queue": "q", name: one})
        second = SourceOptions.parse({"queue": "q", name: other})
    except OptionError:
        return False
    return first != second


def _describe(options: dict[str, str], between: str = ", ") -> str:
    described = (f"{name} {_amount(name, value)}" for name, value in sorted(options.items()))
    return between.join(described) or "defaults"


def _amount(name: str, value: str) -> str:
    return f"{int(value) // MB:,} MB" if "bytes" in name.lower() else f"{int(value):,}"


class _SourcePath:
    """Queue -> phpmq source -> Parquet, availableNow."""

    def __init__(self, spark: SparkSession, address: str, size: int, work: Path) -> None:
        self._spark = spark
        self._address = address
        self._pad = b"x" * size
        self._work = work

    def run(self, name: str, messages: int, options: dict[str, str]) -> dict:
        queue = f"bench-source-{name}"
        with Client(self._address, name="bench-spark-producer", send_timeout=30) as client:
            client.send_many(queue, (self._pad for _ in range(messages)))
        target = self._work / f"parquet-{name}"
        reader = self._spark.readStream.format("phpmq").option("broker", self._address)
        started = time.monotonic()
        query = (
            reader.option("queue", queue)
            .options(**options)
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
        batches = sum(1 for p in query.recentProgress if p["numInputRows"] > 0)
        rows = self._spark.read.parquet(str(target)).count()
        return _result(_describe(options, "\n"), rows, batches, wall, len(self._pad))


def _sink(spark: SparkSession, address: str, messages: int, size: int, tasks: int | None) -> dict:
    queue = f"bench-sink-{tasks or 'default'}-{messages}"
    frame = spark.range(messages).select(F.lpad(F.col("id").cast("string"), size, "x"))
    frame = frame.toDF("content")
    if tasks is not None:
        frame = frame.repartition(tasks)
    frame = frame.cache()
    frame.count()  # materialise first: measure the sink, not the generation
    tasks_used = frame.rdd.getNumPartitions()
    started = time.monotonic()
    writer = frame.write.format("phpmq").option("broker", address).option("queue", queue)
    writer.mode("append").save()
    wall = time.monotonic() - started
    frame.unpersist()
    with Client(address, name="bench-spark-check") as client:
        landed = client.admin(cmd.STATS)["queues"][queue]["ready"]
        client.admin(cmd.QUEUE_PURGE, queue=queue)  # the broker need not hold them any more
    return _result(f"{tasks_used} tasks", landed, None, wall, size)


def _result(settings: str, rows: int, batches: int | None, wall: float, size: int) -> dict:
    return {
        "settings": settings,
        "rows": rows,
        "batches": batches,
        "wall_s": wall,
        "rows_per_s": rows / wall,
        "mb_per_s": rows * size / wall / MB,
    }


def _add_ratios(results: list[dict]) -> None:
    """Each tuned path gets its rate over the default one's of the same direction."""
    defaults = {r["path"].split()[0]: r["rows_per_s"] for r in results if "default" in r["path"]}
    for result in results:
        default = defaults.get(result["path"].split()[0])
        result["vs_default"] = result["rows_per_s"] / default if default else None


# --------------------------------------------------------------------------- driver memory


def _driver_pid(spark: SparkSession) -> int | None:
    """The pid of the driver JVM py4j started (None if unknown: no memory column then)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None) if gateway is not None else None
    return process.pid if process is not None else None


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def _tree(pid: int) -> Iterator[int]:
    """`pid` and its descendants."""
    children = _children()
    stack = [pid]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(children.get(current, ()))


class _TreeRssSampler(RssSampler):
    """Samples the memory of a process and all its descendants, summed as PSS (RSS where PSS
    cannot be read); also the peak RSS of the root alone."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(pid, interval)
        self.root_peak = 0

    def sample(self) -> int | None:
        total = 0
        for pid in _tree(self.pid):
            if pid == self.pid:
                self.root_peak = max(self.root_peak, rss_bytes(pid) or 0)
            total += pss_bytes(pid) or rss_bytes(pid) or 0
        if total:
            self.samples.append((time.monotonic() - self.started, total))
        return total or None


class DriverRss:
    """Peak RSS of the driver JVM (and of it with its Python processes) per sampled stretch."""

    def __init__(self, jvm_pid: int | None) -> None:
        self._pid = jvm_pid
        self._sampler: _TreeRssSampler | None = None

    def sampling(self) -> Any:
        self._sampler = _TreeRssSampler(self._pid) if self._pid is not None else None
        return self._sampler if self._sampler is not None else contextlib.nullcontext()

    def peaks(self) -> dict[str, int | None]:
        sampler = self._sampler
        if sampler is None or sampler.peak is None:
            return {"jvm_peak": None, "driver_peak": None}
        return {"jvm_peak": sampler.root_peak, "driver_peak": sampler.peak}


# --------------------------------------------------------------------------- the table


def _table(results: list[dict], size: int) -> Table:
    table = Table(title=f"{size:,}-byte messages")
    columns = ("path", "settings", "rows", "batches", "wall s", "rows/s", "MB/s", "vs default")
    for column in (*columns, "JVM RSS", "all PSS"):
        justify = "left" if column in ("path", "settings") else "right"
        table.add_column(column, justify=justify, no_wrap=True)
    for result in results:
        ratio = result["vs_default"]
        table.add_row(
            result["path"],
            result["settings"],
            f"{result['rows']:,}",
            str(result["batches"] or "-"),
            f"{result['wall_s']:.1f}",
            f"{result['rows_per_s']:,.0f}",
            f"{result['mb_per_s']:,.1f}",
            f"{ratio:.2f}x" if ratio and "default" not in result["path"] else "-",
            _mb(result["jvm_peak"]),
            _mb(result["driver_peak"]),
        )
    return table


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / MB:,.0f} MB"
