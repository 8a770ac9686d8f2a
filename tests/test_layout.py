"""The package layout as a rule: one import name, no cycles, no import that goes up.

This is the project's lint for imports (ruff resolves a relative import by the folder name, so
it cannot tell `broker/` installs as `phpmq.broker`). It reads the source with `ast`, follows
every import, also those inside functions and TYPE_CHECKING blocks, and checks:

- nothing imports the bare folder names (`import broker`): only `phpmq.*` or relative;
- `protocol/` imports nothing of the project;
- `broker/` imports nothing above it (client, CLI, workers, bridges, pipeline, bench);
- the broker's pure core (`phpmq.broker.*` outside `phpmq.broker.shell`) never imports its
  shell (sockets, files, signals, the clock);
- the module import graph has no cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Import name -> the folder it installs from (pyproject.toml [tool.setuptools.package-dir]).
FOLDERS = {
    "phpmq": "phpmq",
    "phpmq.broker": "broker",
    "phpmq.protocol": "protocol",
    "phpmq.workers": "workers",
    "phpmq.bridges": "bridges",
    "phpmq.pipeline": "pipeline",
    "phpmq.bench": "bench",
}
BARE_NAMES = {folder for name, folder in FOLDERS.items() if name != "phpmq"}
ABOVE_THE_BROKER = (
    "phpmq.cli",
    "phpmq.client",
    "phpmq.workers",
    "phpmq.bridges",
    "phpmq.pipeline",
    "phpmq.bench",
    "phpmq.web",
)


def _modules() -> dict[str, Path]:
    """Every installed module: dotted name -> file."""
    modules = {}
    for package, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            if package == "phpmq" and parts and f"phpmq.{parts[0]}" in FOLDERS:
                continue
            modules[".".join([package, *parts])] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, resolved to dotted names."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = [
                f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES
            ]
            # `from . import messages` loads that module (its package is loaded anyway).
            yield from ((module, node.lineno) for module in submodules)
            if len(submodules) < len(node.names):
                yield target, node.lineno


def _ours(target: str) -> str | None:
    """The module of ours an import loads (the longest known prefix), or None."""
    while target:
        if target in MODULES:
            return target
        target = target.rpartition(".")[0]
    return None


GRAPH = {
    name: {
        (ours, line)
        for target, line in _imports(name, path)
        if (ours := _ours(target)) is not None and ours != name
    }
    for name, path in MODULES.items()
}


def _tracked_python_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:  # not a checkout: every file under the root
        return sorted(p for p in ROOT.rglob("*.py") if ".venv" not in p.parts)
    return [ROOT / line for line in listed.stdout.split()]


def test_nothing_imports_the_bare_folder_names() -> None:
    offences = []
    for path in _tracked_python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            for imported in names:
                if imported.partition(".")[0] in BARE_NAMES:
                    offences.append(f"{path.relative_to(ROOT)}:{node.lineno}: {imported}")
    assert not offences, "use phpmq.* or a relative import:\n" + "\n".join(offences)


def test_protocol_imports_nothing_of_the_project() -> None:
    offences = [
        f"{name} imports {target} (line {line})"
        for name, edges in GRAPH.items()
        if name.startswith("phpmq.protocol")
        for target, line in edges
        if not target.startswith("phpmq.protocol")
    ]
    assert not offences, "\n".join(offences)


def test_the_broker_imports_nothing_above_it() -> None:
    offences = [
        f"{name} imports {target} (line {line})"
        for name, edges in GRAPH.items()
        if name.startswith("phpmq.broker")
        for target, line in edges
        if target.startswith(ABOVE_THE_BROKER) or target == "phpmq"
    ]
    assert not offences, "\n".join(offences)


def test_the_broker_core_never_imports_its_shell() -> None:
    offences = [
        f"{name} imports {target} (line {line})"
        for name, edges in GRAPH.items()
        if name.startswith("phpmq.broker") and not name.startswith("phpmq.broker.shell")
        for target, line in edges
        if target.startswith("phpmq.broker.shell")
    ]
    assert not offences, "\n".join(offences)
    assert any(name.startswith("phpmq.broker.shell.") for name in GRAPH), "no shell modules read"


def _cycle() -> list[str] | None:
    """One cycle of the import graph, if there is any (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in GRAPH:
        if start in state:
            continue
        path = [start]
        stack = [iter(sorted(t for t, _ in GRAPH[start]))]
        state[start] = 1
        while stack:
            target = next(stack[-1], None)
            if target is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(target) == 1:
                return [*path[path.index(target) :], target]
            elif target not in state:
                state[target] = 1
                path.append(target)
                stack.append(iter(sorted(t for t, _ in GRAPH[target])))
    return None


def test_the_import_graph_has_no_cycle() -> None:
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle or [])


def test_the_layout_check_sees_the_whole_package() -> None:
    # Guards the checks above against reading nothing (a renamed folder, a broken walk).
    assert {"phpmq.broker.core", "phpmq.protocol.reader", "phpmq.client", "phpmq.cli"} <= set(
        MODULES
    )
    assert any(target == "phpmq.protocol" for target, _ in GRAPH["phpmq.broker.core"])


@pytest.mark.parametrize("bare", sorted(BARE_NAMES))
def test_the_bare_names_are_not_installed(bare: str) -> None:
    # From a directory that is not the checkout, as a user's program runs.
    result = subprocess.run(
        [sys.executable, "-c", f"import {bare}"], cwd="/", capture_output=True, text=True
    )
    assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr


def test_every_public_name_of_phpmq_resolves() -> None:
    import phpmq

    missing = [name for name in phpmq.__all__ if getattr(phpmq, name, None) is None]
    assert not missing
    assert phpmq.Client.__module__.startswith("phpmq.client")
    assert issubclass(phpmq.InvalidArgument, phpmq.ClientError)


def test_every_package_folder_is_listed_for_wheels() -> None:
    """Editable installs find sub-packages through their folder, wheels only those listed in
    [tool.setuptools] packages: a folder left out works in every test and is missing from a
    `pip install .` (it happened to broker/transports/)."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for package, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            if package == "phpmq" and parts and f"phpmq.{parts[0]}" in FOLDERS:
                continue
            found.add(".".join([package, *parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages"
