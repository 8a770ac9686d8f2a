"""The `phpmq` format: one Python data source class for the streaming source and both sinks.

Register it in each SparkSession (`pipeline.register(spark)`); its module must be importable
by Spark's Python workers, which `pip install .[spark]` takes care of.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .options import OptionError, SinkOptions, SourceOptions
from .sink import PhpmqBatchWriter, PhpmqStreamWriter, SinkColumns
from .source import SOURCE_SCHEMA, PhpmqStreamReader

FORMAT = "phpmq"


class PhpmqDataSource(DataSource):
    """Queues of a phpmq-zmq broker as a Spark streaming source and sink."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> PhpmqStreamReader:  # noqa: N802
        if schema != SOURCE_SCHEMA:
            raise OptionError(
                f"the phpmq source has a fixed schema ({SOURCE_SCHEMA.simpleString()}); do not"
                " pass .schema(...) to readStream, select or cast columns afterwards"
            )
        return PhpmqStreamReader(SourceOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> PhpmqStreamWriter:  # noqa: N802
        options = SinkOptions.parse(self.options)
        return PhpmqStreamWriter(options, SinkColumns.of(schema, options))

    def writer(self, schema: StructType, overwrite: bool) -> PhpmqBatchWriter:
        if overwrite:
            raise OptionError("a queue cannot be overwritten: write with mode('append')")
        options = SinkOptions.parse(self.options)
        return PhpmqBatchWriter(options, SinkColumns.of(schema, options))


def register(spark: SparkSession) -> None:
    """Make `format("phpmq")` known to `spark` (needed once per session)."""
    spark.dataSource.register(PhpmqDataSource)
