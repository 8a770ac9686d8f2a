"""The compiled hot path (setup.py, docs/performance.md): a compiled module built from another
source refuses to load, and `make test`'s compiled pass runs compiled modules indeed."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from phpmq.broker.build import compiled_modules, hot_path
from phpmq.protocol.compiled import (
    STAMP_NAME,
    StaleCompiledModule,
    check_compiled,
    compiled_in,
    source_hash,
)

#: What setup.py compiles; `make test` sets EXPECT_COMPILED_HOT_PATH=1 for its compiled pass.
COMPILED_COUNT = 13


def _package(tmp_path: Path, stamped: bool = True) -> Path:
    """A package folder with one 'compiled' module (an empty file of an extension's name)."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "fast.py").write_text("X = 1\n")
    (tmp_path / f"fast{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    (tmp_path / f"_compiled__mypyc{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    (tmp_path / "slow.py").write_text("Y = 1\n")
    if stamped:
        (tmp_path / STAMP_NAME).write_text(f"fast.py {source_hash(str(tmp_path / 'fast.py'))}\n")
    return tmp_path


def test_a_package_whose_sources_match_their_stamp_loads(tmp_path: Path) -> None:
    folder = _package(tmp_path)
    assert compiled_in(str(folder)) == ["fast"]  # not the group's shared library, nor slow
    check_compiled(str(folder), "pkg")


def test_a_source_changed_after_the_build_refuses_to_load(tmp_path: Path) -> None:
    folder = _package(tmp_path)
    (folder / "fast.py").write_text("X = 2\n")
    with pytest.raises(StaleCompiledModule, match=r"pkg\.fast is compiled from another version"):
        check_compiled(str(folder), "pkg")
    with pytest.raises(StaleCompiledModule, match="make pure"):
        check_compiled(str(_package(tmp_path / "unstamped", stamped=False)), "pkg")


def test_a_pure_package_needs_no_stamp(tmp_path: Path) -> None:
    (tmp_path / "fast.py").write_text("X = 1\n")
    assert compiled_in(str(tmp_path)) == []
    check_compiled(str(tmp_path), "pkg")


def test_the_compiled_pass_runs_compiled_modules() -> None:
    names = compiled_modules()
    if os.environ.get("EXPECT_COMPILED_HOT_PATH") == "1":
        assert len(names) == COMPILED_COUNT, names
        assert hot_path() == f"compiled ({COMPILED_COUNT} modules)"
        import phpmq.broker.core

        assert not phpmq.broker.core.__file__.endswith(".py")
    else:
        assert hot_path() == ("pure Python" if not names else f"compiled ({len(names)} modules)")


def test_an_edited_source_stops_the_broker_from_starting_with_its_old_build(
    tmp_path: Path,
) -> None:
    """The guard runs where every process imports the broker (phpmq.broker's __init__)."""
    folder = Path(__file__).resolve().parents[1] / "broker"
    if not compiled_in(str(folder)):
        pytest.skip("the broker is not compiled in this pass")
    stamp = folder / STAMP_NAME
    kept = stamp.read_text()
    try:
        stamp.write_text(kept.replace(kept.split()[1], "0" * 64, 1))
        result = subprocess.run(
            [sys.executable, "-c", "import phpmq.broker"], capture_output=True, text=True
        )
    finally:
        stamp.write_text(kept)
    assert result.returncode != 0
    assert "is compiled from another version of" in result.stderr


def test_bytes_like_content_is_sent_as_bytes() -> None:
    """The compiled writer takes bytes only: a bytearray or memoryview (which pure Python
    happened to take) is copied to bytes first, so both builds send the same frames."""
    from phpmq.client.batches import send_batches
    from phpmq.client.message import content_bytes
    from phpmq.protocol import queue_packet

    assert content_bytes(bytearray(b"ab")) == content_bytes(memoryview(b"ab")) == b"ab"
    assert content_bytes("é") == "é".encode()

    def frames(contents: list) -> list[bytes]:
        batches = send_batches("q", queue_packet("q"), contents, 0, None, None, 64, 1 << 20)
        return [frame for frame, _, _ in batches]

    assert frames([bytearray(b"x"), memoryview(b"y"), "z"]) == frames([b"x", b"y", b"z"])


def test_a_shell_that_keeps_the_build_variable_exported_gets_no_warning() -> None:
    from phpmq.cli.environment import unknown_variables

    assert unknown_variables({"PHPMQ_COMPILE": "1"}) == []
    assert unknown_variables({"PHPMQ_COMPILED": "1"}) == ["PHPMQ_COMPILED"]
