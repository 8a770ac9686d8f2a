"""The `phpmq` format: one Python data source class for the source, the batch read and the sinks.

Register it in each SparkSession (`pipeline.register(spark)`); its module must be importable
by Spark's Python workers, which `pip install .[spark]` takes care of.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .browse import BrowseOptions, PhpmqBrowseReader
from .listener import LeaseCommitter
from .options import CurveFiles, OptionError, SinkOptions, SourceOptions
from .rows import DEAD_LETTER_SCHEMA, SOURCE_SCHEMA
from .sink import PhpmqBatchWriter, PhpmqStreamWriter, SinkColumns
from .source import PhpmqStreamReader

FORMAT = "phpmq"


class PhpmqDataSource(DataSource):
    """Queues of a phpmq-zmq broker as a Spark streaming source and sink."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

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
