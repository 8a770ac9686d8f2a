"""The documentation as tests: Sybil finds the examples in README.md and docs/*.md, and the
conftest.py at the root of the repository hands them to pytest (`pytest README.md docs`).

- A ```python block runs as written and on its own, as a reader would copy it: it imports what
  it uses. What it prints is kept for a ```console block right after it.
- A ```console block is a shell session: each `$ ` line runs in bash, and what it prints
  (stdout and stderr together) must be what the block shows under it. Lines before the first
  `$ ` are what the python block before it printed.
- `<!-- skip: next "why" -->` before a block says why it cannot run here (a foreground broker,
  systemd, several hosts); `<!-- invisible-code-block: python ... -->` is set-up a reader does
  not need, e.g. `start_workers("docs_tasks:answer", "resize")` for a document's requests.
- Other blocks (```sh, ```toml, ...) are not run.

Each document gets its own broker (phpmq.testing.BrokerProcess) and working directory. While
its examples run, PHPMQ_BROKER names that broker, so `Client()` and the `phpmq` commands reach
it, and its address in an output reads as the documented default, tcp://127.0.0.1:5555.

Outputs are compared loosely where runs differ: message IDs, clock times, durations and sizes
in KiB-TiB match any other, runs of spaces and table rules of any width match, and `…` in a
shown output matches anything.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sybil import Example, Sybil
from sybil.evaluators.python import pad
from sybil.parsers.markdown import CodeBlockParser, SkipParser

from phpmq.broker.config import endpoint_is_local
from phpmq.client import BROKER_VARIABLE, DEFAULT_ADDRESS
from phpmq.testing import BrokerProcess

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
#: Where a document's run is kept in its namespace, and what its last python block printed.
RUN = "_docs_run"
PRINTED = "_docs_printed"
#: What a python block is given besides what it imports itself.
HELPERS = ("start_workers",)
ANY = "…"
COMMAND_PROMPT = "$ "
COMMAND_TIMEOUT_S = 60.0
#: Wide enough that the CLI's tables are neither wrapped nor cut.
TERMINAL_COLUMNS = "120"

_VARYING = (
    (re.compile(r"\b[0-9a-f]{32}\b"), "<id>"),
    (re.compile(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d)?\b"), "<time>"),
    (re.compile(r"\b\d+(\.\d+)?m?s\b"), "<duration>"),
    (re.compile(r"\b\d+(\.\d+)? [KMGT]iB\b"), "<size>"),  # e.g. the machine's RAM
)
_ENDPOINT = re.compile(r"\btcp://[^\s'\"]+")
_TABLE_RULE = re.compile(r"([━─])\1+")
_SPACE = re.compile(r"\s+")


def normalized(text: str) -> str:
    """`text` with what differs between runs replaced, one space for any run of whitespace."""
    for pattern, token in _VARYING:
        text = pattern.sub(token, text)
    return _SPACE.sub(" ", _TABLE_RULE.sub(r"\1", text)).strip()


def output_matches(shown: str, actual: str) -> bool:
    """Whether `actual` is what the docs show, `…` standing for anything."""
    pattern = ".*".join(re.escape(piece) for piece in normalized(shown).split(ANY))
    return re.fullmatch(pattern, normalized(actual), re.DOTALL) is not None


@dataclass
class DocumentRun:
    """One document's broker, working directory, worker pools and saved environment."""

    broker: BrokerProcess
    directory: Path
    saved_directory: str
    saved_environment: dict[str, str]
    pools: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def environment(self) -> dict[str, str]:
        """What a command of the document runs with: the test's Python first on the PATH,
        PHPMQ_BROKER naming the document's broker, and no other PHPMQ_* variable."""
        return {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(TESTS),
            "COLUMNS": TERMINAL_COLUMNS,
        }

    def start_workers(self, handler: str, *queues: str, timeout: float = 20.0) -> None:
        """Run `phpmq workers HANDLER -q QUEUE...` until the document ends; return once each
        queue has a consumer."""
        flags = [flag for queue in queues for flag in ("-q", queue)]
        self.pools.append(
            subprocess.Popen(
                [sys.executable, "-m", "phpmq", "workers", handler, "-p", "1", *flags],
                cwd=self.directory,
                env=self.environment(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + timeout
        while not self._consumed(queues):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no worker of {handler} consumed {queues} in {timeout}s")
            time.sleep(0.1)

    def _consumed(self, queues: tuple[str, ...]) -> bool:
        known = self.broker.stats()["queues"]
        return all(known.get(queue, {}).get("consumers", 0) > 0 for queue in queues)

    def stop(self) -> None:
        for pool in self.pools:
            pool.send_signal(signal.SIGTERM)
        for pool in self.pools:
            try:
                pool.wait(10)
            except subprocess.TimeoutExpired:
                pool.kill()
                pool.wait(5)
        self.broker.stop()


def start_document(namespace: dict[str, Any]) -> None:
    """Sybil's set-up of a document: its broker, its directory, PHPMQ_BROKER."""
    directory = Path(tempfile.mkdtemp(prefix="phpmq-docs-"))
    run = DocumentRun(
        broker=BrokerProcess("--grace-seconds", "0", log_path=directory / "broker.log"),
        directory=directory,
        saved_directory=os.getcwd(),
        saved_environment=dict(os.environ),
    )
    for name in [name for name in os.environ if name.startswith("PHPMQ_")]:
        del os.environ[name]
    os.environ[BROKER_VARIABLE] = run.broker.address
    os.chdir(directory)
    namespace[RUN] = run
    namespace["start_workers"] = run.start_workers


def end_document(namespace: dict[str, Any]) -> None:
    run: DocumentRun = namespace[RUN]
    os.chdir(run.saved_directory)
    os.environ.clear()
    os.environ.update(run.saved_environment)
    run.stop()
    shutil.rmtree(run.directory, ignore_errors=True)


def refuse_remote_endpoints(source: str) -> None:
    """Examples run for real, so they may name loopback addresses only: a LAN address in a
    runnable example must be shown in a block that does not run.

    Raises:
        AssertionError: `source` names an address beyond this host.
    """
    remote = [found for found in _ENDPOINT.findall(source) if not endpoint_is_local(found)]
    assert not remote, f"a runnable example may not reach beyond this host: {remote}"


def evaluate_python(example: Example) -> None:
    """Run a python block on its own, as a reader would copy it (only the set-up helpers are
    given); keep what it printed for the console block after it."""
    refuse_remote_endpoints(str(example.parsed))
    names = {name: example.namespace[name] for name in HELPERS}
    source = pad(example.parsed, example.line + example.parsed.line_offset)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, example.path, "exec", dont_inherit=True), names)
    example.namespace[PRINTED] = printed.getvalue()


def console_session(block: str) -> tuple[str, list[tuple[str, str]]]:
    """(the output shown before the first command, [(command, the output shown under it)])."""
    lead: list[str] = []
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith(COMMAND_PROMPT):
            steps.append((line.removeprefix(COMMAND_PROMPT), []))
        else:
            (steps[-1][1] if steps else lead).append(line)
    return "\n".join(lead), [(command, "\n".join(shown)) for command, shown in steps]


def evaluate_console(example: Example) -> str | None:
    """Run a console block's commands; a description of the first mismatch, or None."""
    run: DocumentRun = example.namespace[RUN]
    refuse_remote_endpoints(str(example.parsed))
    lead, steps = console_session(str(example.parsed))
    if lead.strip():
        printed = example.namespace.pop(PRINTED, "")
        if not output_matches(lead, printed):
            return f"the python block before printed:\n{printed}\nthe docs show:\n{lead}"
    for command, shown in steps:
        problem = _run_command(run, command, shown)
        if problem:
            return problem
    return None


def _run_command(run: DocumentRun, command: str, shown: str) -> str | None:
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=run.directory,
        env=run.environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    actual = result.stdout.replace(run.broker.address, DEFAULT_ADDRESS)
    shows_failure = any(line.startswith("phpmq: ") for line in shown.splitlines())
    if output_matches(shown, actual) and (result.returncode != 0) == shows_failure:
        return None
    return (
        f"$ {command}\nexited {result.returncode} and printed:\n{actual}\n"
        f"the docs show{' a failure' if shows_failure else ''}:\n{shown}"
    )


DOCUMENTS = Sybil(
    parsers=[
        SkipParser(),
        CodeBlockParser("python", evaluate_python),
        CodeBlockParser("console", evaluate_console),
    ],
    path=str(ROOT),
    patterns=["README.md", "docs/*.md"],
    setup=start_document,
    teardown=end_document,
)
