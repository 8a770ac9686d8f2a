"""The Spark workload (`phpmq pipeline bench`): rows/s through the phpmq source and sink, with
the default settings beside tuned ones, keyed rows (a message key and headers on each) beside
plain ones, and a durable broker (`--data-dir`) beside one in memory, in one run, for one
message size, and the driver's peak memory. Ratios: tuned over default, keyed over plain,
durable over memory.

* source -> Parquet: N messages wait in a queue; an availableNow query reads them with the
  phpmq source and writes Parquet. Default: no option but the queue. Tuned: batches of up to
  TUNED_RECORDS rows or TUNED_BYTES bytes, in the option names the source knows
  (maxRecordsPerTrigger / maxBytesPerTrigger, or maxRecordsPerBatch before them).
* DataFrame -> sink: a cached DataFrame of N rows is written to a queue with
  `df.write.format("phpmq")`, and the count is checked in the broker's stats. Default: as
  Spark splits it (spark.default.parallelism tasks). Tuned: TUNED_SINK_TASKS tasks.
* DataFrame -> discard ("Spark alone"): the same DataFrame written to a Python data source
  that reads each Arrow batch Spark hands it and keeps nothing: what Spark itself spends on
  the rows before the sink's code runs, plain and keyed. A keyed row carries two more columns
  (a binary and a map) that Spark converts to Arrow and hands over however fast the sink is,
  so the sink's keyed/plain ratio is printed beside Spark's own and beside the ratio of what
  the sink adds to it (`_beyond_spark`).

Peak memory, sampled from /proc every 0.1 s while the path runs: "JVM RSS" is the resident
memory of the driver JVM; "all PSS" adds every process under it (Spark's Python workers, the
source runner, the per-batch planner processes: in local mode the executors are in the driver),
as proportional set sizes, since the Python workers are forked from one daemon and share
pages. The JVM keeps part of what earlier paths made its heap grow to, so a path's peak is
not its own alone. Wall time includes query planning; a warm-up query
runs first, so Python worker start-up is not counted.

Rounds: one run of a path varies by up to a fifth on a shared 2-core machine, more than the
ratios it is compared by, so every path runs once a round (DEFAULT_ROUNDS, `--rounds`), the
order reversed every other round, and a row gives the path's median round beside the slowest
and fastest; the ratios are of medians. Both brokers run throughout, so that a keyed path and
its plain one, or a durable path and its in-memory one, meet the same machine in each round.
Figures are printed, never asserted. Needs `pip install .[spark]`; starts its own brokers (one
in memory, one durable in a scratch directory) on free loopback ports.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (the usual name for this module)
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType
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
#: Rounds of every path: one run of a path varies by up to a fifth on a shared 2-core machine,
#: so each row is a path's median round.
DEFAULT_ROUNDS = 3
#: Writes of a Spark alone path a round, their median its figure: one is a tenth of a second
#: at 100 000 rows, and varies by half from one to the next.
DISCARD_WRITES = 5
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
    rounds: int = DEFAULT_ROUNDS,
) -> list[dict]:
    """Run the paths (PATHS, SPARK_ALONE_PATHS, DURABLE_PATHS) `rounds` times and print a
    table of each path's median, and the keyed sinks' ratios beyond Spark's share
    (`_beyond_spark`); returns the table's rows. Without `spark`, a local session is started
    for the run and stopped after it; without `warm_up`, the first path pays for Spark's
    Python workers starting."""
    from ..pipeline.session import local_session

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    messages = messages or default_messages(size)
    console = Console(width=max(Console().width, 215))
    tuned = tuned_source_options(TUNED_RECORDS, TUNED_BYTES, size)
    console.print(
        f"spark: {messages:,} messages of {size:,} bytes per path, local[2], loopback brokers"
        f" (in memory, and durable: --data-dir); tuned source: {_describe(tuned)}; tuned sink:"
        f" {TUNED_SINK_TASKS} tasks; keyed: every message with a message key and headers;"
        f" {_rounds_said(rounds)}"
    )
    own_session = spark is None
    spark = spark or local_session("phpmq-bench")
    try:
        with tempfile.TemporaryDirectory(prefix="phpmq-bench-") as scratch:
            runs = _run_rounds(spark, messages, size, Path(scratch), tuned, warm_up, rounds)
    finally:
        if own_session:
            spark.stop()
    results = [_median_of(path_runs) for path_runs in runs.values()]
    _add_ratios(results)
    console.print(_table(results, size, rounds))
    for line in _beyond_spark(results):
        console.print(line)
    return results


def _rounds_said(rounds: int) -> str:
    if rounds == 1:
        return "one round"
    return (
        f"{rounds} rounds, every path once a round, in turn against both brokers (the order"
        " reversed every other round): each row is the path's median round, `range` its"
        " slowest and fastest, the ratios of medians"
    )


def _run_rounds(
    spark: SparkSession,
    messages: int,
    size: int,
    work: Path,
    tuned: dict[str, str],
    warm_up: bool,
    rounds: int,
) -> dict[tuple[bool, BenchPath], list[dict]]:
    """Each path's results, one a round, in table order (the in-memory broker's paths, then
    the durable one's). Both brokers run throughout, so that a path and the one it is
    compared with (keyed and plain, durable and in memory) share each round's machine."""
    driver = DriverRss(_driver_pid(spark))
    order = [(False, path) for path in PATHS + SPARK_ALONE_PATHS]
    order += [(True, path) for path in DURABLE_PATHS]
    runs: dict[tuple[bool, BenchPath], list[dict]] = {key: [] for key in order}
    with (
        BrokerProcess("--log-level", "WARNING") as memory,
        BrokerProcess("--log-level", "WARNING", data_dir=work / "data") as durable,
    ):
        brokers = {
            False: _Paths(spark, memory.address, size, work, tuned),
            True: _Paths(spark, durable.address, size, work, tuned),
        }
        if warm_up:
            for paths in brokers.values():
                paths.warm_up()
        for round_number in range(rounds):
            for is_durable, path in order if round_number % 2 == 0 else order[::-1]:
                with driver.sampling():
                    result = brokers[is_durable].run(path, messages, round_number)
                runs[(is_durable, path)].append(
                    {**path.labels(is_durable), **result, **driver.peaks()}
                )
    return runs


def _median_of(path_runs: list[dict]) -> dict:
    """A path's median round (by rows/s; the lower middle one of an even count), with the
    slowest and fastest rates of its rounds and the highest memory peaks."""
    ranked = sorted(path_runs, key=lambda run: run["rows_per_s"])
    median = dict(ranked[(len(ranked) - 1) // 2])
    median["slowest"], median["fastest"] = ranked[0]["rows_per_s"], ranked[-1]["rows_per_s"]
    median["rounds"] = len(ranked)
    for peak in ("jvm_peak", "driver_peak"):
        peaks = [run[peak] for run in path_runs if run[peak] is not None]
        median[peak] = max(peaks) if peaks else None
    return median


@dataclass(frozen=True)
class BenchPath:
    """One path through the pipeline: which direction, tuned or not, keyed rows or plain."""

    direction: str  # "source", "sink" or "discard" (Spark alone)
    tuned: bool = False
    keyed: bool = False

    def labels(self, durable: bool) -> dict:
        alone = self.direction == "discard"
        name = " ".join(
            part
            for part in (
                "durable" if durable else "",
                "Spark alone" if alone else self.direction,
                "" if alone else "tuned" if self.tuned else "default",
                "keyed" if self.keyed else "",
            )
            if part
        )
        return {
            "path": name,
            "direction": self.direction,
            "durable": durable,
            "tuned": self.tuned,
            "keyed": self.keyed,
        }


#: The in-memory broker's paths; the durable broker runs the default ones, plain and keyed.
PATHS = (
    BenchPath("source"),
    BenchPath("source", tuned=True),
    BenchPath("source", keyed=True),
    BenchPath("sink"),
    BenchPath("sink", tuned=True),
    BenchPath("sink", keyed=True),
)
#: Spark alone, plain and keyed: run beside the in-memory broker's paths (no broker is used).
SPARK_ALONE_PATHS = (BenchPath("discard"), BenchPath("discard", keyed=True))
DURABLE_PATHS = tuple(path for path in PATHS if not path.tuned)


class _Paths:
    """The paths against one broker."""

    def __init__(
        self, spark: SparkSession, address: str, size: int, work: Path, tuned: dict[str, str]
    ) -> None:
        self._spark = spark
        self._address = address
        self._size = size
        self._tuned = tuned
        self._source = _SourcePath(spark, address, size, work)

    def warm_up(self) -> None:
        """The default source, and the sink and Spark alone, plain and keyed, once each and
        small: the JVM compiles a plan's code (a keyed row's map column too) on its first
        run, which made a keyed sink's first round a third slower."""
        self._source.run("warm-up", WARM_UP_MESSAGES, {}, keyed=False)
        for keyed in (False, True):
            _sink(self._spark, self._address, WARM_UP_MESSAGES, self._size, None, keyed, -1)
            _discard(self._spark, WARM_UP_MESSAGES, self._size, keyed=keyed)

    def run(self, path: BenchPath, messages: int, round_number: int) -> dict:
        """One run of `path`, to and from queues of this round only."""
        if path.direction == "source":
            name = f"{'tuned' if path.tuned else 'default'}-{path.keyed}-{round_number}"
            options = self._tuned if path.tuned else {}
            return self._source.run(name, messages, options, path.keyed)
        tasks = TUNED_SINK_TASKS if path.tuned else None
        if path.direction == "discard":
            return _discard(self._spark, messages, self._size, path.keyed)
        return _sink(
            self._spark, self._address, messages, self._size, tasks, path.keyed, round_number
        )


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

    def run(self, name: str, messages: int, options: dict[str, str], keyed: bool) -> dict:
        queue = f"bench-source-{name}"
        extras = _keyed_messages(messages) if keyed else {}
        with Client(self._address, name="bench-spark-producer", send_timeout=30) as client:
            client.send_many(queue, (self._pad for _ in range(messages)), **extras)
        target = self._work / f"parquet-{name}-{time.monotonic_ns()}"
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
        for written in (target, Path(f"{target}.checkpoint")):  # (rounds would pile them up)
            shutil.rmtree(written, ignore_errors=True)
        return _result(_describe(options, "\n"), rows, batches, wall, len(self._pad))


def _keyed_messages(messages: int) -> dict[str, list[Any]]:
    """send_many's per-message message keys and headers for the keyed source paths."""
    return {
        "message_keys": [b"key-%d" % (n % 1000) for n in range(messages)],
        "headers": [{"n": str(n)} for n in range(messages)],
    }


def _sink(
    spark: SparkSession,
    address: str,
    messages: int,
    size: int,
    tasks: int | None,
    keyed: bool,
    round_number: int,
) -> dict:
    queue = f"bench-sink-{tasks or 'default'}-{keyed}-{messages}-{round_number}"
    frame = _sink_rows(spark, messages, size, tasks, keyed)
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


def _sink_rows(
    spark: SparkSession, messages: int, size: int, tasks: int | None, keyed: bool
) -> DataFrame:
    """The sink's input, cached and materialised (the sink is measured, not the generation):
    `size`-byte contents, and keyed a message key and a one-entry headers map on each row."""
    columns = [F.lpad(F.col("id").cast("string"), size, "x").alias("content")]
    if keyed:
        columns.append(F.format_string("key-%d", F.col("id") % 1000).cast("binary").alias("key"))
        columns.append(F.create_map(F.lit("n"), F.col("id").cast("string")).alias("headers"))
    frame = spark.range(messages).select(*columns)
    if tasks is not None:
        frame = frame.repartition(tasks)
    frame = frame.cache()
    frame.count()
    return frame


def _discard(spark: SparkSession, messages: int, size: int, keyed: bool) -> dict:
    """The sink's default path with a writer that keeps nothing (`DiscardingSource`): Spark's
    own cost of handing the rows to a Python data source, the median of DISCARD_WRITES
    writes. A write fails unless its writers together read every row."""
    spark.dataSource.register(DiscardingSource)
    frame = _sink_rows(spark, messages, size, None, keyed)
    tasks_used = frame.rdd.getNumPartitions()
    writer = frame.write.format(DiscardingSource.name()).option("rows", str(messages))
    walls = []
    for _ in range(DISCARD_WRITES):
        started = time.monotonic()
        writer.mode("append").save()
        walls.append(time.monotonic() - started)
    frame.unpersist()
    wall = statistics.median(walls)
    return _result(
        f"{tasks_used} tasks, no broker, median of {DISCARD_WRITES}", messages, None, wall, size
    )


class DiscardingSource(DataSource):
    """A Python data source whose writers read every Arrow batch and keep nothing; the
    write's commit fails unless they read the option `rows` rows in all."""

    @classmethod
    def name(cls) -> str:
        return "phpmq-bench-discard"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return _DiscardingWriter(int(self.options["rows"]))


@dataclass
class _Read(WriterCommitMessage):
    rows: int


class _DiscardingWriter(DataSourceArrowWriter):
    def __init__(self, rows: int) -> None:
        self._rows = rows

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _Read(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        read = sum(message.rows for message in messages if isinstance(message, _Read))
        if read != self._rows:
            raise RuntimeError(f"the discarding writers read {read} rows of {self._rows}")


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
    """Each path's rate over those it is compared with: a tuned path's over the default one
    (`vs_default`), a keyed path's over the plain one (`vs_plain`), a durable path's over the
    same path in memory (`vs_memory`); None where there is no such comparison."""
    rates = {_identity(r): r["rows_per_s"] for r in results}

    def over(result: dict, applies: bool, **change: bool) -> float | None:
        direction, durable, tuned, keyed = _identity(result)
        fields = {"durable": durable, "tuned": tuned, "keyed": keyed, **change}
        baseline = rates.get((direction, fields["durable"], fields["tuned"], fields["keyed"]))
        return result["rows_per_s"] / baseline if applies and baseline else None

    for result in results:
        result["vs_default"] = over(result, result["tuned"], tuned=False)
        result["vs_plain"] = over(result, result["keyed"], keyed=False)
        result["vs_memory"] = over(result, result["durable"], durable=False)


def _beyond_spark(results: list[dict]) -> list[str]:
    """A line per sink (in memory, durable) on its keyed/plain ratio without Spark's share:
    the time a row takes through the sink less the time Spark alone takes to hand it over
    (the discard path), plain over keyed. Sets `vs_plain_beyond_spark` on the keyed sink's
    result. No line and no ratio where a rate is missing or zero, or where Spark alone is not
    the faster (its share would be all of the sink's time or more: noise)."""
    rates = {_identity(result): result["rows_per_s"] for result in results}
    spark_plain = rates.get(("discard", False, False, False))
    spark_keyed = rates.get(("discard", False, False, True))
    lines: list[str] = []
    for result in results:
        if result["direction"] != "sink" or result["tuned"] or not result["keyed"]:
            continue
        plain = rates.get(("sink", result["durable"], False, False))
        if not (plain and spark_plain and spark_keyed and result["rows_per_s"]):
            continue
        own_plain = 1 / plain - 1 / spark_plain
        own_keyed = 1 / result["rows_per_s"] - 1 / spark_keyed
        if own_plain <= 0 or own_keyed <= 0:
            continue
        ratio = result["vs_plain_beyond_spark"] = own_plain / own_keyed
        lines.append(
            f"{result['path']}: keyed/plain {result['vs_plain']:.2f}x; Spark alone"
            f" {spark_keyed / spark_plain:.2f}x ({1e6 / spark_plain:.2f} and"
            f" {1e6 / spark_keyed:.2f} us a row); beyond Spark's share {ratio:.2f}x"
            f" ({1e6 * own_plain:.2f} and {1e6 * own_keyed:.2f} us a row)"
        )
    return lines


def _identity(result: dict) -> tuple[str, bool, bool, bool]:
    return result["direction"], result["durable"], result["tuned"], result["keyed"]


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


def _table(results: list[dict], size: int, rounds: int) -> Table:
    table = Table(title=f"{size:,}-byte messages")
    spread = ("range",) if rounds > 1 else ()
    columns = ("path", "settings", "rows", "batches", "wall s", "rows/s", *spread, "MB/s")
    ratios = {"vs_default": "vs default", "vs_plain": "keyed/plain", "vs_memory": "durable/memory"}
    for column in (*columns, *ratios.values(), "JVM RSS", "all PSS"):
        justify = "left" if column in ("path", "settings") else "right"
        table.add_column(column, justify=justify, no_wrap=True)
    for result in results:
        table.add_row(
            result["path"],
            result["settings"],
            f"{result['rows']:,}",
            str(result["batches"] or "-"),
            f"{result['wall_s']:.1f}",
            f"{result['rows_per_s']:,.0f}",
            *(f"{result['slowest']:,.0f}-{result['fastest']:,.0f}",) * len(spread),
            f"{result['mb_per_s']:,.1f}",
            *(f"{result[key]:.2f}x" if result[key] else "-" for key in ratios),
            _mb(result["jvm_peak"]),
            _mb(result["driver_peak"]),
        )
    return table


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / MB:,.0f} MB"
