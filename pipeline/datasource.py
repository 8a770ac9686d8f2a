"""The `phpmq` format: one Python data source class for the source, the batch read and the sinks.

Register it in each SparkSession (`pipeline.register(spark)`); its module must be importable
by Spark's Python workers, which `pip install .[spark]` takes care of.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .browse import BrowseOptions, PhpmqBrowseReader
from .listener import LeaseCommitter
from .option_names import KAFKA_HINTS, unknown_option_problem
from .options import (
    SINK_OPTION_NAMES,
    SOURCE_OPTION_NAMES,
    CurveFiles,
    OptionError,
    SinkOptions,
    SourceOptions,
)
from .rows import DEAD_LETTER_SCHEMA, SOURCE_SCHEMA
from .sink import PhpmqBatchWriter, PhpmqStreamWriter, SinkColumns
from .source import PhpmqStreamReader

FORMAT = "phpmq"
#: Names only a write has (lower-cased): such options are checked as the sink's.
SINK_ONLY_NAMES = frozenset({"event", "ttl", "keyscope", "queryname", "topic"})
PATH_HINT = {
    "path": "the phpmq source and sink take no path: give option queue, and call load(),"
    " start() or save() without one"
}
#: Names only the streaming source has: such options are checked as the source's.
SOURCE_ONLY_NAMES = frozenset(
    {
        "queuepattern",
        "maxrecordspertrigger",
        "maxrecordsperbatch",
        "maxbytespertrigger",
        "minpartitions",
        "failondataloss",
        "leasetimeout",
        *KAFKA_HINTS,
    }
)


class PhpmqDataSource(DataSource):
    """Queues of a phpmq-zmq broker as a Spark streaming source and sink."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        """Spark makes the data source synchronously inside `load()` and a batch `save()`
        (pyspark.sql.worker.create_data_source), with the options of either: they are checked
        here, so that a bad one fails `load()` instead of the running query a moment later.
        (A streaming write's `start()` makes none: pyspark 4.3 makes the sink's when it plans
        the first batch.)"""
        super().__init__(options)
        check_options(options)

    def schema(self) -> StructType:
        dead = str(self.options.get("deadLetters", "")).strip().lower() == "true"
        return DEAD_LETTER_SCHEMA if dead else SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> PhpmqStreamReader:  # noqa: N802
        _check_schema(schema, SOURCE_SCHEMA, "readStream")
        return PhpmqStreamReader(SourceOptions.parse(self.options))

    def reader(self, schema: StructType) -> PhpmqBrowseReader:
        options = BrowseOptions.parse(self.options)
        _check_schema(schema, DEAD_LETTER_SCHEMA if options.dead_letters else SOURCE_SCHEMA, "read")
        return PhpmqBrowseReader(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PhpmqStreamWriter:  # noqa: N802
        options = SinkOptions.parse(self.options)
        return PhpmqStreamWriter(options, SinkColumns.of(schema, options))

    def writer(self, schema: StructType, overwrite: bool) -> PhpmqBatchWriter:
        if overwrite:
            raise OptionError("a queue cannot be overwritten: write with mode('append')")
        options = SinkOptions.parse(self.options)
        return PhpmqBatchWriter(options, SinkColumns.of(schema, options))


def check_options(options: Mapping[str, str]) -> None:
    """Check `options` as the source's, the batch read's or the sink's, whichever they are:
    the data source is not told whether it serves a read or a write.

    Raises:
        OptionError: the options are no valid set for any of them.
    """
    names = {str(name).lower() for name in options}
    if names & SINK_ONLY_NAMES:
        SinkOptions.parse(options)
    elif "deadletters" in names:
        BrowseOptions.parse(options)
    elif names & SOURCE_ONLY_NAMES:
        SourceOptions.parse(options)
    else:
        _check_source_or_sink(options)


def _check_source_or_sink(options: Mapping[str, str]) -> None:
    try:
        SourceOptions.parse(options)
    except OptionError as as_source:
        try:
            SinkOptions.parse(options)
        except OptionError:
            known = {*SOURCE_OPTION_NAMES, *SINK_OPTION_NAMES}
            unknown = unknown_option_problem(options, known, "source or sink", PATH_HINT)
            raise (OptionError(unknown) if unknown else as_source) from None


def _check_schema(schema: StructType, expected: StructType, how: str) -> None:
    if schema != expected:
        raise OptionError(
            f"the phpmq source has a fixed schema ({expected.simpleString()}); do not"
            f" pass .schema(...) to {how}, select or cast columns afterwards"
        )


def register(spark: SparkSession, curve: CurveFiles | None = None) -> None:
    """Make `format("phpmq")` known to `spark` (needed once per session), and add the listener
    that acks each finished batch's leases at once (pipeline.listener); against a CURVE broker
    it needs `curve` (the keys of the source's curveSecret/curveServer options), or the
    PHPMQ_CURVE_* variables in this process."""
    spark.dataSource.register(PhpmqDataSource)
    if not getattr(spark, "_phpmq_lease_committer", None):
        committer = LeaseCommitter(curve)
        spark.streams.addListener(committer)
        spark._phpmq_lease_committer = committer  # type: ignore[attr-defined]
