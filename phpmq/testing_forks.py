"""Brokers forked from a process that imported the broker once, for a suite that starts many
(phpmq.testing's BrokerProcess with `fork_brokers(True)`).

A `python -m phpmq broker` spends about 0.12 s of CPU importing and starting before it serves
and about 0.01 s once it has; a suite on a busy machine that starts a thousand brokers pays
for the imports in minutes. So one process per test process (the *forker*) imports the broker
and waits for requests on its stdin: each request is a command line, an environment, a working
directory and a log file, and the forker forks, the child runs the `phpmq` command line as
`python -m phpmq` would (its stdout and stderr into the log; exit handlers run; the exit status
of the command), and the forker answers with the child's pid. It reaps its children and reports
each one's exit status, so `ForkedProcess` offers what BrokerProcess uses of a Popen: `pid`,
`poll`, `wait`, `returncode`, `send_signal`, `terminate`, `kill`.

The forker never starts a thread or a ZeroMQ context (a fork would copy them half-made); its
children start fresh, as a new process would (`ps` shows them with the forker's command line).
When its test process is gone, even killed, the forker kills the brokers still running.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any, TextIO

#: How long a start waits for the forker's answer.
START_TIMEOUT_S = 30.0
#: Modules the forker imports once, so that its children need not.
PRELOADED = ("phpmq.cli", "phpmq.cli.broker", "phpmq.broker.shell.server")


def serve() -> None:
    """The forker's loop: requests on stdin, answers and exit statuses on stdout (one JSON
    object per line); it exits when its stdin ends."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    pending = b""
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([0, wake_read], [], [])
        if wake_read in readable:
            os.read(wake_read, 4096)
            children -= _report_exits()
        if 0 in readable:
            chunk = os.read(0, 65536)
            if not chunk:  # the test process is gone (even killed): so go its brokers
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    os.close(wake_read)
                    os.close(wake_write)
                    _run_in_child(request)
                children.add(pid)
                _answer({"id": request["id"], "pid": pid})


def _answer(message: dict[str, Any]) -> None:
    os.write(1, json.dumps(message).encode() + b"\n")


def _report_exits() -> set[int]:
    """Reap the children that exited and report each one's status; their pids."""
    exited: set[int] = set()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return exited
        if pid == 0:
            return exited
        exited.add(pid)
        _answer({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _run_in_child(request: dict[str, Any]) -> None:
    """Become the process `python -m phpmq ARGS` would be; never returns."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    code = 1
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
        sys.stdin = _text_stream(0, "r", unbuffered)
        sys.stdout = _text_stream(1, "w", unbuffered)
        sys.stderr = _text_stream(2, "w", True, errors="backslashreplace")
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["phpmq", *request["args"]]
        code = _exit_code_of_main()
    finally:
        os._exit(code)


def _text_stream(fd: int, mode: str, write_through: bool, errors: str = "strict") -> TextIO:
    """A new sys stream on `fd`, line-buffered (a new interpreter's stdout on a file would be
    block-buffered: the log is only more prompt)."""
    raw = io.FileIO(fd, mode, closefd=False)
    buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    return io.TextIOWrapper(
        buffered, errors=errors, line_buffering=True, write_through=write_through
    )


def _exit_code_of_main() -> int:
    """Run the command line as `python -m phpmq` does; the status Python would exit with."""
    import atexit
    import traceback

    from .cli import main

    try:
        main(prog_name="phpmq")
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # what an interpreter's exit runs: logging, multiprocessing
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code


class ForkedProcess:
    """A broker the forker started: the part of subprocess.Popen that BrokerProcess uses."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # exited: its report is on its way
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Forker:
    """This process's forker (started with its first broker), and the brokers it forked."""

    def __init__(self) -> None:
        #: The interpreter's own variables the forker started with: its children have them.
        self.interpreter_environment = _interpreter_variables(os.environ)
        command = f"from {__name__} import serve; serve()"
        self._process = subprocess.Popen(
            [sys.executable, "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._lock = threading.Lock()
        self._next_id = 0
        #: Requests not answered yet: (answered, the process once it is, the command line).
        self._started: dict[int, tuple[threading.Event, list[ForkedProcess], list[str]]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._reader = threading.Thread(target=self._read, name="phpmq-forker", daemon=True)
        self._reader.start()

    def start(self, args: list[str], env: dict[str, str], log: str) -> ForkedProcess:
        """Fork a `phpmq ARGS` with `env` and its stdout and stderr into `log`."""
        done: threading.Event = threading.Event()
        answer: list[ForkedProcess] = []
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
            self._started[request_id] = (done, answer, ["phpmq", *args])
            request = {"id": request_id, "args": args, "env": env, "cwd": os.getcwd(), "log": log}
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
        if not done.wait(START_TIMEOUT_S) or not answer:
            raise RuntimeError("the broker forker did not answer (it exited?)")
        return answer[0]  # kept from the answer: a broker that exited at once is reaped

    def alive(self) -> bool:
        return self._process.poll() is None and self._reader.is_alive()

    def _read(self) -> None:
        assert self._process.stdout is not None
        try:
            for line in self._process.stdout:
                self._take(json.loads(line))
        finally:
            with self._lock:  # the forker is gone, and no exit would be reported: kill them
                for child in self._children.values():
                    child.kill()
                    child._exit(-signal.SIGKILL)
                self._children.clear()
                for done, _answer, _args in self._started.values():
                    done.set()  # unanswered: start() raises at once
                self._started.clear()

    def _take(self, message: dict[str, Any]) -> None:
        """An answer to a request (the child's pid) or a child's exit status."""
        with self._lock:
            if "exit" in message:
                child = self._children.pop(message["exit"], None)
                if child is not None:
                    child._exit(message["code"])
                return
            done, answer, args = self._started.pop(message["id"])
            child = self._children[message["pid"]] = ForkedProcess(message["pid"], args)
            answer.append(child)
            done.set()


_forker: Forker | None = None
_forker_lock = threading.Lock()


def forked(
    args: list[str | os.PathLike[str]], env: dict[str, str], log: str
) -> ForkedProcess | None:
    """A `phpmq ARGS` forked from this process's forker (started on the first call); None if
    `env` sets the interpreter's own variables (PYTHONPATH, PYTHONHASHSEED, ...) otherwise
    than the forker had them, which a fork cannot change: start that one afresh."""
    global _forker
    with _forker_lock:
        if _forker is None or not _forker.alive():
            _forker = Forker()
        forker = _forker
    if _interpreter_variables(env) != forker.interpreter_environment:
        return None
    return forker.start([os.fspath(arg) for arg in args], env, os.path.abspath(log))


def _interpreter_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The variables the interpreter reads as it starts (a fork keeps the forker's)."""
    return {key: value for key, value in env.items() if key.startswith("PYTHON")}
