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

Each document gets its own broker (phpmq.testing.BrokerProcess), working directory and shell:
the `$ ` lines of its console blocks run one after the other as in one terminal (`export`
and `cd` stay; `command &` runs in the background until the document ends). While its
examples run, PHPMQ_BROKER names that broker, so `Client()` and the `phpmq` commands reach it,
and its address in an output reads as the documented default, tcp://127.0.0.1:5555. A
document in OWN_BROKER starts its broker itself, on the address PHPMQ_BIND gives it.

Outputs are compared loosely where runs differ: message IDs, clock times, durations and sizes
in KiB-TiB match any other, runs of spaces and table rules of any width match, and `…` in a
shown output matches anything.
"""

from __future__ import annotations

import contextlib
import functools
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
from phpmq.testing import BrokerProcess, free_port
from pipeline_harness import spark_missing, stop_spark, stop_worker_spark

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
#: Where a document's run is kept in its namespace, and what its last python block printed.
RUN = "_docs_run"
PRINTED = "_docs_printed"
#: What a python block is given besides what it imports itself.
HELPERS = ("start_workers",)
#: For skip directives: `<!-- skip: next if(spark_missing(), reason="...") -->`.
CONDITIONS = {"spark_missing": spark_missing}
ANY = "…"
COMMAND_PROMPT = "$ "
COMMAND_TIMEOUT_S = 60.0
#: Wide enough that the CLI's tables are neither wrapped nor cut.
TERMINAL_COLUMNS = "120"
BIND_VARIABLE = "PHPMQ_BIND"

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


#: Documents whose examples start their own broker (`phpmq broker ... &`): they get none, and
#: PHPMQ_BIND names the address PHPMQ_BROKER does.
OWN_BROKER = ("docs/security.md",)
#: Appended to each command: the shell's variables after it, for the next command.
_KEEP_SHELL_STATE = '\nstatus=$?; env -0 > "$DOCS_SHELL_STATE"; exit $status'
_NOT_KEPT = frozenset({"_", "SHLVL", "OLDPWD", "DOCS_SHELL_STATE"})


@dataclass
class DocumentRun:
    """One document's broker, working directory, shell variables and background processes."""

    address: str
    broker: BrokerProcess | None
    directory: Path
    saved_directory: str
    saved_environment: dict[str, str]
    shell: dict[str, str] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(cls, own_broker: bool) -> DocumentRun:
        """A new directory and, unless the document starts its own, a broker."""
        # A document's Spark starts in its directory (its examples' relative checkpoints are
        # there): a Spark the tests of this process share is stopped, not handed to it.
        stop_worker_spark()
        directory = Path(tempfile.mkdtemp(prefix="phpmq-docs-"))
        broker = None
        if not own_broker:
            broker = BrokerProcess("--grace-seconds", "0", log_path=directory / "broker.log")
        run = cls(
            address=broker.address if broker else f"tcp://127.0.0.1:{free_port()}",
            broker=broker,
            directory=directory,
            saved_directory=os.getcwd(),
            saved_environment=dict(os.environ),
        )
        for name in [name for name in os.environ if name.startswith("PHPMQ_")]:
            del os.environ[name]
        os.environ[BROKER_VARIABLE] = run.address
        if own_broker:
            os.environ[BIND_VARIABLE] = run.address
        os.chdir(directory)
        run.shell = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(TESTS),  # the handlers of start_workers
            "COLUMNS": TERMINAL_COLUMNS,
            "PWD": str(directory),
        }
        return run

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        """Run one command line as the next in the document's shell: variables it exports
        and the directory it changes to stay for the commands after it."""
        state = self.directory / ".shell-state"
        # In a session of its own: a command past its time is killed with what it started
        # (subprocess.run would kill bash alone, and leave a `phpmq consume` running).
        with subprocess.Popen(
            ["bash", "-c", command + _KEEP_SHELL_STATE],
            cwd=self.shell["PWD"],
            env={**self.shell, "DOCS_SHELL_STATE": str(state)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        ) as process:
            try:
                output, _ = process.communicate(timeout=COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                raise
        result = subprocess.CompletedProcess(process.args, process.returncode, output)
        variables = (item.partition("=") for item in state.read_text().split("\0") if item)
        self.shell = {name: value for name, _, value in variables if name not in _NOT_KEPT}
        return result

    def start_in_background(self, command: str) -> None:
        """`command &`: it runs (its output in the directory's background.log) until the
        document ends."""
        with open(self.directory / "background.log", "ab") as log:
            self.processes.append(
                subprocess.Popen(
                    ["bash", "-c", f"exec {command}"],
                    cwd=self.shell["PWD"],
                    env=self.shell,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def start_workers(self, handler: str, *queues: str, timeout: float = 20.0) -> None:
        """Run `phpmq workers HANDLER -q QUEUE...` until the document ends; return once each
        queue has a consumer."""
        flags = " ".join(f"-q {queue}" for queue in queues)
        self.start_in_background(f"phpmq workers {handler} -p 1 {flags}")
        deadline = time.monotonic() + timeout
        while not self._consumed(queues):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no worker of {handler} consumed {queues} in {timeout}s")
            time.sleep(0.1)

    def _consumed(self, queues: tuple[str, ...]) -> bool:
        assert self.broker is not None, "start_workers needs the document's own broker"
        known = self.broker.stats()["queues"]
        return all(known.get(queue, {}).get("consumers", 0) > 0 for queue in queues)

    def end(self) -> None:
        """Stop what the document started, give back the directory and the environment."""
        os.chdir(self.saved_directory)
        os.environ.clear()
        os.environ.update(self.saved_environment)
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        if "pyspark" in sys.modules:  # a document's Spark ends with it, JVM included
            from pyspark.sql import SparkSession

            session = SparkSession.getActiveSession()
            if session is not None:
                stop_spark(session)
        if self.broker is not None:
            self.broker.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_document(namespace: dict[str, Any], own_broker: bool = False) -> None:
    """Sybil's set-up of a document: its directory, its broker, PHPMQ_BROKER."""
    run = DocumentRun.start(own_broker)
    namespace.update(CONDITIONS, **{RUN: run, "start_workers": run.start_workers})


def end_document(namespace: dict[str, Any]) -> None:
    namespace[RUN].end()


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
    if command.endswith("&") and not command.endswith("&&"):
        run.start_in_background(command.removesuffix("&"))
        return None if not shown.strip() else f"$ {command}\nruns in the background: show no output"
    result = run.run(command)
    actual = result.stdout.replace(run.address, DEFAULT_ADDRESS)
    shows_failure = any(line.startswith("phpmq: ") for line in shown.splitlines())
    if output_matches(shown, actual) and (result.returncode != 0) == shows_failure:
        return None
    return (
        f"$ {command}\nexited {result.returncode} and printed:\n{actual}\n"
        f"the docs show{' a failure' if shows_failure else ''}:\n{shown}"
    )


PARSERS = [
    SkipParser(),
    CodeBlockParser("python", evaluate_python),
    CodeBlockParser("console", evaluate_console),
]
DOCUMENTS = Sybil(
    parsers=PARSERS,
    path=str(ROOT),
    patterns=["README.md", "docs/*.md"],
    excludes=OWN_BROKER,
    setup=start_document,
    teardown=end_document,
) + Sybil(
    parsers=PARSERS,
    path=str(ROOT),
    patterns=OWN_BROKER,
    setup=functools.partial(start_document, own_broker=True),
    teardown=end_document,
)
