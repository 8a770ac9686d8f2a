"""The blocking client's generated modules are what tools/unasync.py writes from their
asyncio sources (docs/architecture.md, "The client")."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "unasync.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_module_is_what_its_source_gives() -> None:
    for path, text in _script().outputs().items():
        assert path.read_text() == text, f"{path.name} is stale: run tools/unasync.py"


def test_a_generated_module_says_so_in_its_first_line() -> None:
    for path in _script().outputs():
        assert path.read_text().startswith("# auto-generated from aio"), path.name


def test_lines_lose_async_and_await_and_take_the_blocking_names() -> None:
    line = _script().unasync_line
    assert line("    async def cancel(self) -> int:") == "    def cancel(self) -> int:"
    assert line("        async with self._lock:") == "        with self._lock:"
    assert line("        x = await self._link_for(q)") == "        x = self._link_for(q)"
    assert line("class AsyncTopics:  # AsyncClient") == "class SyncTopics:  # Client"
    assert line("from .shards import to_owner_async") == "from .shards import to_owner"
    assert line("from . import aio_admin, aio_topics") == "from . import sync_admin, sync_topics"
    assert line("self.awaited = asyncio_thing") == "self.awaited = asyncio_thing"


def test_check_mode_fails_on_a_stale_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--check` is what `make test` runs: it fails, and writes nothing, when one differs."""
    script = _script()
    stale = tmp_path / "sync_x.py"
    stale.write_text("# edited by hand\n")
    monkeypatch.setattr(script, "outputs", lambda: {stale: "# generated\n"})
    assert script.main(["--check"]) == 1
    assert "sync_x.py differs" in capsys.readouterr().out
    assert stale.read_text() == "# edited by hand\n"
    assert script.main([]) == 0
    assert script.main(["--check"]) == 0
    assert stale.read_text() == "# generated\n"
