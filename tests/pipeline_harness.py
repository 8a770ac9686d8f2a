"""Helpers of the Spark pipeline tests (tests/test_pipeline*.py): one local Spark per
pytest process, shared by the test files; the broker-side checks the tests share.

The `spark` fixture (tests/conftest.py) is `worker_spark()`: the process's one local Spark,
started by the first test that needs it and stopped after the last test of its group (a JVM
costs 15 to 30 s to start, and its first query 10 more). The Spark tests run in two
pytest-xdist workers (`xdist_group("spark")` and `"spark-b"`, docs/testing.md), one after
another in each, so at most two of these JVMs run at a time (the standalone cluster of
tests/spark_cluster.py has a group of its own, `"spark-cluster"`). Whatever needs a Spark of
its own in this process (the cluster's session, a document's examples) calls
`stop_worker_spark()` first: pyspark's `getOrCreate()` would otherwise hand it the shared
one. Spark is optional: a test file calls `skip_without_spark(missing)` when its pyspark
imports fail, which skips it locally and fails it in CI (CI=true).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from harness import BrokerProcess, read_until

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

IN_CI = os.environ.get("CI") == "true"
#: The modules `pip install .[spark]` brings (and their own dependencies).
SPARK_EXTRA = {"pyspark", "pyarrow", "pandas", "py4j", "numpy"}
#: Any one streaming query must finish within this many seconds.
QUERY_TIMEOUT_S = 120
#: How long a session's stop may take before its JVM is killed.
STOP_TIMEOUT_S = 30


def skip_without_spark(missing: ModuleNotFoundError) -> NoReturn:
    """Skip the test file (fail it in CI) for a missing optional module; raise it again if it
    is not one of the spark extra's (a bug in pipeline/)."""
    if (missing.name or "").split(".")[0] not in SPARK_EXTRA:
        raise missing
    if IN_CI:
        pytest.fail(f"the spark extra is required in CI: {missing}", pytrace=False)
    pytest.skip(f"{missing} (pip install '.[spark]')", allow_module_level=True)


#: The process's one local Spark while it runs (worker_spark()).
_WORKER_SPARK: list[Any] = []


def worker_spark() -> Any:
    """This process's local Spark: the running one, or a new one (skipped, failed in CI,
    without Java)."""
    from phpmq.pipeline.session import SparkUnavailable, local_session

    if _WORKER_SPARK and _is_running(_WORKER_SPARK[0]):
        return _WORKER_SPARK[0]
    _WORKER_SPARK.clear()
    try:
        session = local_session("phpmq-tests")
    except SparkUnavailable as exc:
        if IN_CI:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    _WORKER_SPARK.append(session)
    return session


def is_worker_spark(session: Any) -> bool:
    return bool(_WORKER_SPARK) and session is _WORKER_SPARK[0]


def stop_worker_spark() -> None:
    """Stop the process's local Spark, JVM included, if one runs."""
    if _WORKER_SPARK:
        stop_spark(_WORKER_SPARK.pop())


def stop_queries(session: Any) -> None:
    """Stop the queries a test left running (one that failed before its own stop), so that
    the next test on the shared session starts clean."""
    for query in session.streams.active:
        query.stop()


def _is_running(session: Any) -> bool:
    """Whether the session's SparkContext is pyspark's current one and not stopped."""
    from pyspark import SparkContext

    context = session.sparkContext
    return SparkContext._active_spark_context is context and context._jsc is not None


def stop_spark(session: Any) -> None:
    """Stop the session's queries, the session and its JVM (so that it takes no CPU or memory
    from the tests that run later). A stop that hangs (SparkContext.stop() waiting on a
    Python worker or a query stuck on a broker that is gone) is given STOP_TIMEOUT_S, then the
    JVM is killed; either way pyspark forgets the session, so the next test file of this
    worker starts a new one instead of calling into a dead or half-stopped JVM."""
    stopper = threading.Thread(target=_stop_session, args=(session,), daemon=True)
    stopper.start()
    stopper.join(STOP_TIMEOUT_S)
    hung = stopper.is_alive()
    _stop_gateway(kill_first=hung)
    _forget_session()
    if hung:
        warnings.warn(f"Spark's stop hung for {STOP_TIMEOUT_S} s: its JVM was killed", stacklevel=2)


def _stop_session(session: Any) -> None:
    stop_queries(session)
    session.stop()


def _forget_session() -> None:
    """pyspark's memory of the session and its JVM, as a clean stop leaves it."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    SparkContext._active_spark_context = None
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None


def spark_missing() -> str | None:
    """Why Spark cannot run here (pyspark or Java missing), or None. None in CI, where the
    Spark tests must run (and fail if they cannot)."""
    if IN_CI:
        return None
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install '.[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Spark needs Java 17 or 21 on the PATH"
    return None


def _stop_gateway(kill_first: bool = False) -> None:
    """Shut the gateway down and end its JVM (`kill_first`: a JVM that hung is killed before
    the gateway is asked anything)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    if kill_first and process is not None:
        process.kill()
        process.wait(15)
    with contextlib.suppress(Exception):  # a killed JVM's gateway has nothing to shut down
        gateway.shutdown()
    if process is not None and process.poll() is None:  # the JVM outlives the gateway
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)


def run_available_now(frame: Any, checkpoint: Path, sink: Callable[[Any], Any]) -> Any:
    """Run a query to the end of what is available now; returns it (raises what it raised)."""
    writer = frame.writeStream.option("checkpointLocation", str(checkpoint))
    query = sink(writer.trigger(availableNow=True)).start()
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish in time"
    return query


def queue_stats(broker: BrokerProcess, queue: str) -> dict[str, int]:
    return broker.stats()["queues"][queue]


def drain(broker: BrokerProcess, queue: str) -> list[Any]:
    """Every message of `queue`, acked."""
    messages = []
    with broker.client() as client:
        for message in client.consume(queue, window=1_000, timeout=0.5):
            message.ack()
            messages.append(message)
    return messages


def send(broker: BrokerProcess, queue: str, count: int, size: int = 0, **extra: Any) -> list[str]:
    """Send `count` messages `m-00000`... (padded to `size` bytes); returns their IDs."""
    ids = []
    with broker.client() as client:
        for i in range(count):
            content = (b"m-%05d" % i).ljust(size, b".")
            ids.append(client.send(queue, content, confirm=True, **extra))
    return ids


def stream(spark: SparkSession, broker: BrokerProcess, queue: str, **options: Any) -> DataFrame:
    """A phpmq stream of `queue`. Its brokerTimeout is 20 s unless given: a source runner
    still waiting for a broker its test has stopped would otherwise hold Spark's stop for
    the default 5 minutes, past the test timeout."""
    options.setdefault("brokerTimeout", "20s")
    reader = spark.readStream.format("phpmq").option("broker", broker.address)
    return reader.option("queue", queue).options(**{k: str(v) for k, v in options.items()}).load()


def to_parquet(frame: DataFrame, out: Path, checkpoint: Path, **trigger: Any) -> Any:
    writer = frame.writeStream.format("parquet").option("path", str(out))
    return writer.option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()


def output_ids(spark: SparkSession, out: Path) -> Counter[str]:
    return Counter(row.id for row in spark.read.parquet(str(out)).select("id").collect())


def assert_exactly_once(spark: SparkSession, out: Path, sent: list[str]) -> None:
    """The Parquet table at `out` holds each of the `sent` message IDs once, and nothing else."""
    assert_each_once(output_ids(spark, out), sent)


def assert_each_once(arrived: Counter[Any], sent: Iterable[Hashable]) -> None:
    doubled = {i: n for i, n in arrived.items() if n > 1}
    assert not doubled, f"{len(doubled)} messages written twice"
    expected = set(sent)
    assert set(arrived) == expected, f"{len(expected - set(arrived))} messages missing"


def wait_drained(broker: BrokerProcess, queue: str, timeout: float = 15) -> dict[str, Any]:
    """The queue's stats once nothing is ready or leased (the listener acks asynchronously)."""
    return read_until(
        lambda: queue_stats(broker, queue),
        lambda stats: (stats["ready"], stats.get("leased", 0)) == (0, 0),
        timeout,
        0.1,
    )
