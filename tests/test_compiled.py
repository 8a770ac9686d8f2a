"""The compiled hot path (setup.py, docs/performance.md): a compiled module built from another
source refuses to load, and `make test`'s compiled pass runs compiled modules indeed."""

from __future__ import annotations

import os
import shutil
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

#: What setup.py compiles; `make test` sets EXPECT_COMPILED_HOT_PATH=1 (0) for its compiled
#: (pure) pass.
COMPILED_COUNT = 13


def _package(tmp_path: Path, stamped: bool = True) -> Path:
    """A package folder with one 'compiled' module (an empty file of an extension's name), its
    shared library, another interpreter's build and a pure module, stamped as a build does."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "fast.py").write_text("X = 1\n")
    (tmp_path / f"fast{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    (tmp_path / f"_compiled__mypyc{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    (tmp_path / "other.cpython-399-x86_64-linux-gnu.so").write_bytes(b"")
    (tmp_path / "slow.py").write_text("Y = 1\n")
    if stamped:
        (tmp_path / STAMP_NAME).write_text(
            "".join(f"{n} {source_hash(str(tmp_path / n))}\n" for n in ("fast.py", "slow.py"))
        )
    return tmp_path


def test_a_package_whose_sources_match_their_stamp_loads(tmp_path: Path) -> None:
    folder = _package(tmp_path)
    assert compiled_in(str(folder)) == ["fast"]  # not the shared library, nor other builds
    check_compiled(str(folder), "pkg")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("fast.py", "fast.py changed since the build"),
        ("slow.py", "slow.py changed since the build"),  # its types are compiled into fast
        ("unstamped", f"{STAMP_NAME} is missing or unreadable"),
        ("not in the stamp", "fast.py has no source it was built from"),
        ("source gone", "fast.py has no source it was built from"),
    ],
)
def test_a_package_built_from_other_sources_refuses_to_load(
    tmp_path: Path, change: str, says: str
) -> None:
    folder = _package(tmp_path, stamped=change != "unstamped")
    if change.endswith(".py"):
        (folder / change).write_text("Z = 2\n")
    elif change == "source gone":
        (folder / "fast.py").unlink()
    elif change == "not in the stamp":
        (folder / STAMP_NAME).write_text(f"slow.py {source_hash(str(folder / 'slow.py'))}\n")
    with pytest.raises(StaleCompiledModule, match=f"pkg is compiled, and .*{says}.*make pure"):
        check_compiled(str(folder), "pkg")


def test_a_pure_package_needs_no_stamp(tmp_path: Path) -> None:
    (tmp_path / "fast.py").write_text("X = 1\n")
    assert compiled_in(str(tmp_path)) == []
    check_compiled(str(tmp_path), "pkg")


def test_each_pass_runs_what_it_says() -> None:
    """`make test` says which pass this is: the compiled one must run compiled modules, the
    pure one none (else the tests that run in the pure pass only would run in neither)."""
    names = compiled_modules()
    expected = os.environ.get("EXPECT_COMPILED_HOT_PATH")
    if expected == "1":
        assert len(names) == COMPILED_COUNT, names
        assert hot_path() == f"compiled ({COMPILED_COUNT} modules)"
        import phpmq.broker.core

        assert not phpmq.broker.core.__file__.endswith(".py")
    elif expected == "0":
        assert names == [] and hot_path() == "pure Python"
    else:
        pytest.skip("not run by `make test`, which says which pass it is")


def test_an_edited_source_stops_every_process_from_importing_the_old_build(
    tmp_path: Path,
) -> None:
    """The check runs where every process imports the broker (phpmq.broker's __init__); on a
    copy of the package, so that the suite's other processes keep importing the real one."""
    root = Path(__file__).resolve().parents[1]
    if not compiled_in(str(root / "broker")):
        pytest.skip("the broker is not compiled in this pass")
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(root / "phpmq", tmp_path / "phpmq", ignore=ignore)
    for folder in ("broker", "protocol"):
        shutil.copytree(root / folder, tmp_path / "phpmq" / folder, ignore=ignore)
    command = [sys.executable, "-c", "import phpmq.broker.core as c; print(c.__file__)"]
    environment = {**os.environ, "PYTHONPATH": str(tmp_path)}
    first = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=environment)
    assert first.stdout.startswith(str(tmp_path / "phpmq" / "broker" / "core.")), first.stderr
    model = tmp_path / "phpmq" / "broker" / "model.py"  # not compiled; its types are
    model.write_text(model.read_text() + "\n")
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=environment)
    assert result.returncode != 0
    assert "model.py changed since the build" in result.stderr
    # The command says it in one line, even when its first import of the codec fails.
    messages = tmp_path / "phpmq" / "protocol" / "messages.py"
    messages.write_text(messages.read_text() + "\n")
    command = [sys.executable, "-m", "phpmq", "stats"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=environment)
    assert result.returncode == 1
    assert result.stderr.startswith("phpmq: phpmq.protocol is compiled, and ")
    assert "messages.py changed since the build" in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_bytes_like_content_is_sent_as_bytes() -> None:
    """The compiled writer takes bytes only: a bytearray or memoryview (which pure Python
    happened to take) is copied to bytes first, so both builds send the same frames."""
    from phpmq.client.batches import send_batches
    from phpmq.client.message import content_bytes
    from phpmq.protocol import queue_packet

    assert content_bytes(bytearray(b"ab")) == content_bytes(memoryview(b"ab")) == b"ab"
    assert content_bytes("é") == "é".encode()
    with pytest.raises(TypeError, match="content must be bytes or str, not int"):
        content_bytes(5)  # type: ignore[arg-type]  # (bytes(5) would be five NULs)

    def frames(contents: list) -> list[bytes]:
        batches = send_batches("q", queue_packet("q"), contents, 0, None, None, 64, 1 << 20)
        return [frame for frame, _, _ in batches]

    assert frames([bytearray(b"x"), memoryview(b"y"), "z"]) == frames([b"x", b"y", b"z"])

    def keyed(message_keys: list) -> list[bytes]:
        batches = send_batches(
            "q", queue_packet("q"), [b"c"] * 3, 0, None, None, 64, 1 << 20, None, message_keys
        )
        return [frame for frame, _, _ in batches]

    assert keyed([bytearray(b"k"), memoryview(b"k"), "k"]) == keyed([b"k"] * 3)
    with pytest.raises(TypeError, match="a message key must be bytes or str, not int"):
        keyed([5, b"k", b"k"])


def test_a_shell_that_keeps_the_build_variable_exported_gets_no_warning() -> None:
    from phpmq.cli.environment import unknown_variables

    assert unknown_variables({"PHPMQ_COMPILE": "1"}) == []
    assert unknown_variables({"PHPMQ_COMPILED": "1"}) == ["PHPMQ_COMPILED"]
