from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cpu_accounting
import pytest
import spark_cds
from driven import connect

import lan
import pipeline_harness
from harness import BrokerProcess, CoreHarness
from phpmq.testing import fork_brokers

__all__ = ["connect"]  # a fixture: either client (tests/driven.py)

#: The JVMs of the Spark tests (and of the drivers and commands they start, which inherit the
#: environment): the quick JIT, one GC thread, and Spark's classes from the archive `make test`
#: builds (tests/spark_cds.py).
os.environ.setdefault("SPARK_SUBMIT_OPTS", spark_cds.jvm_options())


#: Ctrl-C as a terminal's foreground job gets it: a shell without job control starts its
#: background jobs (`make test &`) with SIGINT ignored, which every command a test starts
#: would inherit, and Python then leaves it ignored (the Ctrl-C tests hung, depending on
#: whether an earlier test in their worker had set a handler of its own).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: The suite starts about a thousand brokers: each is forked from a process that imported the
#: broker once (phpmq.testing_forks) rather than started afresh (0.01 s of CPU, not 0.13 s).
fork_brokers()


#: Set on a worker whose pytest-xdist could not group the xdist_group tests.
UNGROUPED: list[str] = []
#: The xdist groups that take longest, longest first (docs/testing.md): their tests come first
#: in the collection, so that `make test` (`--no-loadscope-reorder`) starts them first and the
#: short tests fill the workers around them, instead of a long group starting late and
#: running alone at the end.
LONGEST_GROUPS = (
    "replication", "spark-b", "spark", "lan", "replication-b", "spark-cluster", "shards",
    "timing", "replication-cli", "docs-pipeline", "docs-cli",
)  # fmt: skip


def _group_of(item: pytest.Item | None) -> str | None:
    marker = None if item is None else item.get_closest_marker("xdist_group")
    return marker.args[0] if marker is not None and marker.args else None


def _group_rank(item: pytest.Item) -> int:
    group = _group_of(item)
    return LONGEST_GROUPS.index(group) if group in LONGEST_GROUPS else len(LONGEST_GROUPS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest groups first (a stable sort: the rest keeps its order). Under `--dist
    loadgroup` pytest-xdist appends each grouped test's xdist_group to its id, and schedules
    by that. On a pytest where it cannot (pytest-xdist#1386) the groups would be spread over
    the workers without a word: every grouped test then fails instead."""
    items.sort(key=_group_rank)
    if getattr(config.option, "loadgroup", False):
        marked = [item.nodeid for item in items if item.get_closest_marker("xdist_group")]
        UNGROUPED.extend(nodeid for nodeid in marked if "@" not in nodeid)


@pytest.fixture(autouse=True)
def _grouped_as_marked(request: pytest.FixtureRequest) -> None:
    if UNGROUPED and request.node.get_closest_marker("xdist_group"):
        pytest.fail(
            f"pytest-xdist did not group the {len(UNGROUPED)} tests marked xdist_group on"
            f" pytest {pytest.__version__} (pytest-xdist#1386): see pyproject.toml's test extra",
            pytrace=False,
        )


@pytest.fixture
def core() -> CoreHarness:
    return CoreHarness()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A real broker process on a free loopback port; its log is shown if the test fails."""
    process = BrokerProcess(tmp_path / "broker.log", "--grace-seconds", "2")
    try:
        yield process
    finally:
        process.stop()


#: Where each test's CPU is written (tests/cpu_accounting.py); unset: not measured.
CPU_LOG = os.environ.get("TEST_CPU_LOG")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if CPU_LOG is None:
        return (yield)
    start, before = time.monotonic(), cpu_accounting.cpu_now()
    try:
        return (yield)
    finally:
        cpu_accounting.record(CPU_LOG, item.nodeid, before, cpu_accounting.cpu_now(), start)


#: The xdist groups whose tests share the process's local Spark (the `spark` fixture).
SHARED_SPARK_GROUPS = ("spark", "spark-b")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test of a Spark group (the next one is in another group, or none), its
    Spark is stopped: the JVM takes no memory or CPU from the tests the worker runs next."""
    yield
    if _group_of(item) in SHARED_SPARK_GROUPS and _group_of(nextitem) not in SHARED_SPARK_GROUPS:
        pipeline_harness.stop_worker_spark()


@pytest.fixture(scope="session")
def _spark_of_the_process() -> Iterator[None]:
    """Stops the process's local Spark (if a test outside the Spark groups started one) when
    the process ends."""
    yield
    pipeline_harness.stop_worker_spark()


@pytest.fixture
def spark(_spark_of_the_process: None) -> Iterator[Any]:
    """The process's one local Spark (tests/pipeline_harness.py), shared by the test files of
    a worker; queries a test leaves running are stopped after it."""
    session = pipeline_harness.worker_spark()
    yield session
    pipeline_harness.stop_queries(session)


@pytest.fixture
def lan_capable() -> None:
    """Use before `lan.lan(...)`: skips with the reason where namespaces cannot be made, and
    fails instead in CI (`CI=true`), where the LAN tests must run."""
    reason = lan.missing_capability()
    if reason is None:
        return
    if lan.in_ci():
        pytest.fail(f"the LAN tests must run in CI: {reason}", pytrace=False)
    pytest.skip(reason)
