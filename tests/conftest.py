from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from driven import connect

import lan
import pipeline_harness
from harness import BrokerProcess, CoreHarness

__all__ = ["connect"]  # a fixture: either client (tests/driven.py)


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


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark for the test process (tests/pipeline_harness.py)."""
    yield from pipeline_harness.local_spark()


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
