from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from driven import connect

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
