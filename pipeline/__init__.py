"""Spark pipelines on phpmq-zmq queues: the `phpmq` format (a streaming source and a sink).

    import phpmq.pipeline
    phpmq.pipeline.register(spark)
    events = (spark.readStream.format("phpmq").option("broker", "tcp://127.0.0.1:5555")
              .option("queue", "events").load())

Spark is optional (`pip install .[spark]`): this package imports pyspark only when one of
the names below is used, so `phpmq.cli` loads without it. Guide: docs/pipeline.md.
"""

from __future__ import annotations

from typing import Any

#: Public name -> the module that defines it (imported on first use).
_LAZY = {
    "FORMAT": ".datasource",
    "PhpmqDataSource": ".datasource",
    "register": ".datasource",
    "local_session": ".session",
    "OptionError": ".options",
    "CurveFiles": ".options",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'phpmq.pipeline' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
