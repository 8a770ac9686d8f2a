"""Every `phpmq` command, fuzzed: for each leaf command (found by walking the click group, so a
new one is covered by itself), each option and argument given values of the wrong kind, a
required argument left out, an unknown option; the commands that talk to a broker pointed at a
real one and at an address where nothing listens. Whatever the input, the command returns, and
a failure is a non-zero exit with one line naming the problem, never a traceback.

Commands that run until stopped (a broker, workers, bridges, the web console, benchmarks,
`top`) are given only values click refuses before anything starts. PHPMQ_CLI_FUZZ_SOAK=N
widens the values (every value for every parameter) and adds N random combinations per
command.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from harness import REPO, BrokerProcess, free_port
from phpmq.cli import main

TRACEBACK = "Traceback (most recent call last)"
#: Longer than this for one invocation is reported (the broker answers in milliseconds).
SLOW_S = 3.0
SOAK = int(os.environ.get("PHPMQ_CLI_FUZZ_SOAK", "0") or 0)

#: Commands that serve or run until stopped: only their refusals before starting are fuzzed.
RUNS_UNTIL_STOPPED = ("broker", "workers", "web", "bridge", "bench", "pipeline", "top")

#: What each command needs to be valid and to return by itself (`{file}`: the cluster file,
#: `{dir}`: a scratch folder); a parameter fuzzed replaces its own part of this. The options
#: that bound a command's wait come first: a `--` fuzzed into an argument would make them
#: arguments too.
VALID: dict[str, list[str]] = {
    "send": ["q", "m"],
    "consume": ["--idle-timeout", "0.1", "q"],
    "request": ["--timeout", "0.1", "q", "m"],
    "publish": ["ev.x", "m"],
    "subscribe": ["--for", "0.1", "ev.*"],
    "bind": ["q", "ev.*"],
    "unbind": ["q", "ev.*"],
    "rebind": ["q", "--add", "ev.*"],
    "stats": [],
    "dlq list": ["q"],
    "dlq purge": ["q"],
    "dlq replay": ["q"],
    "queue delete": ["q", "--yes"],
    "queue leases": [],
    "queue list": [],
    "queue peek": ["q"],
    "queue purge": ["q", "--yes"],
    "queue release": ["q", "lease", "--yes"],
    "cluster join": ["--file", "{file}", "c", "--address", "tcp://127.0.0.1:7300"],
    "cluster leave": ["--file", "{file}", "b"],
    "cluster move": ["s", "--to", "a"],
    "cluster status": [],
    "schedule add": ["job", "m", "--every", "10s", "--queue", "q"],
    "schedule list": [],
    "schedule remove": ["job"],
    "keys generate": ["k", "--dir", "{dir}", "--force"],
    "keys holds": [],
    "keys release": ["scope", "--yes"],
}

#: Options whose accepted values could keep the command waiting: only refused values for them.
UNBOUNDED = {("consume", "--idle-timeout"), ("subscribe", "--for"), ("request", "--timeout")}

CLUSTER_FILE = """\
epoch = 1
replicas = 2
[[nodes]]
name = "a"
address = "tcp://127.0.0.1:7100"
[[nodes]]
name = "b"
address = "tcp://127.0.0.1:7200"
"""

#: Values of every kind, given to every option and argument.
GENERIC = [
    "abc",
    "-1",
    "0",
    str(10**30),
    "",
    "x" * 5000,
    "naïve-ü-漢字-🚀",
    "nan",
    "inf",
    "1e400",
    "-0.5",
    " ",
    "a b\tc\n",
    "--",
    "{not: json",
    "[[nodes]]\nname=",
]
#: More, in a soak.
#: (Two addresses ZeroMQ takes and never reaches: a command waits its --timeout for them.)
EXTRA = [
    "tcp://127.0.0.1:99999",
    "tcp://[::1",
    "-inf",
    "0x10",
    "1_000",
    "1e-400",
    "\x7f",
    "%s%n",
    "../../etc/passwd",
    "?" * 300,
]
DURATIONS = ["5x", "ms", "-5s", "1e400s", "nanms", "infh", "10", "0ms", "1e30h"]
CRONS = ["* * *", "61 * * * *", "*/0 * * * *", "a b c d e", "* * * * * * *", "0 0 31 2 *"]
ZONES = ["Mars/Olympus", "../../etc/passwd", "UTC\n", "Europe/", "/etc/localtime"]
ADDRESSES = ["localhost:5555", "tcp://", "ipc://"]


def leaf_commands() -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(main)

    def walk(group: click.Group, path: tuple[str, ...]) -> Iterator[tuple[str, click.Command]]:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None, name
            if isinstance(command, click.Group):
                yield from walk(command, (*path, name))
            else:
                yield " ".join((*path, name)), command

    return walk(main, ())


LEAVES = dict(leaf_commands())


def runs_until_stopped(name: str) -> bool:
    return name.split()[0] in RUNS_UNTIL_STOPPED


def test_every_command_is_classified() -> None:
    """A new command needs valid arguments here, or to be one that runs until stopped."""
    unknown = [name for name in LEAVES if name not in VALID and not runs_until_stopped(name)]
    assert not unknown, f"add these to VALID or RUNS_UNTIL_STOPPED: {unknown}"


# -- the assertion every invocation gets -------------------------------------------------------


def problem(result: Result | subprocess.CompletedProcess, args: list[str]) -> str | None:
    """What is wrong with how the command ended (None: nothing)."""
    if isinstance(result, Result):
        code, output = result.exit_code, result.output
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            trace = "".join(traceback.format_exception(result.exception))
            return f"phpmq {args!r} raised:\n{trace}\n{output[-1000:]}"
    else:
        code, output = result.returncode, result.stdout + result.stderr
    shown = f"phpmq {args!r} exited {code}:\n{output[-3000:]}"
    if TRACEBACK in output:
        return f"a traceback: {shown}"
    if code < 0:
        return f"killed by a signal: {shown}"
    if code > 0 and not any(line.startswith("phpmq: ") for line in output.splitlines()):
        return f"no line naming the problem: {shown}"
    return None


def check(result: Result | subprocess.CompletedProcess, args: list[str]) -> None:
    found = problem(result, args)
    assert found is None, found


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    # In a folder of its own: `keys generate --dir VALUE` makes VALUE where it runs.
    monkeypatch.chdir(tmp_path)
    # A command that found no broker turns the client's log off for the rest of its process.
    log = logging.getLogger("phpmq.client")
    disabled = log.disabled
    yield CliRunner()
    log.disabled = disabled


def invoke(runner: CliRunner, args: list[str], env: dict[str, str] | None = None) -> Result:
    result = runner.invoke(main, args, input="", env=env, catch_exceptions=True)
    check(result, args)
    return result


# -- the values for one parameter ------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Paths of every kind: missing, a folder, garbage, bad TOML, bad UTF-8, empty, bad keys."""
    folder = tmp_path_factory.mktemp("fuzz-files")
    made = {
        "garbage": b"\x00\xff\xfe garbage \x80",
        "bad.toml": b"[[nodes]\nname = \n",
        "wrong.toml": b"epoch = 'x'\nnodes = 3\n",
        "empty": b"",
        "bad.key_secret": b'metadata\ncurve\n    public-key = "short"\n    secret-key = ""\n',
        "latin1.toml": "name = 'caf\xe9'".encode("latin-1"),
        "cluster.toml": CLUSTER_FILE.encode(),
    }
    paths = {}
    for name, content in made.items():
        (folder / name).write_bytes(content)
        paths[name] = str(folder / name)
    paths["missing"] = str(folder / "no" / "such" / "file")
    paths["dir"] = str(folder)
    paths["scratch"] = str(tmp_path_factory.mktemp("fuzz-scratch"))
    return paths


def values_for(command: str, param: click.Parameter, files: dict[str, str]) -> list[str]:
    paths = [v for k, v in files.items() if k not in ("cluster.toml", "scratch")]
    values = GENERIC + paths + (EXTRA if SOAK else [])
    opts = getattr(param, "opts", [])
    type_name = param.type.name
    if type_name == "duration" or "--delay" in opts or "--every" in opts:
        values += DURATIONS
    if "--cron" in opts:
        values += CRONS
    if "--tz" in opts:
        values += ZONES
    if "--broker" in opts or "--address" in opts or param.name == "address":
        values += ADDRESSES
    if "--bind" in opts and command == "web":
        values += ["host", ":", "1.2.3.4:99999", "[::1]:x", "-1:-1"]
    return values


def refused_by_click(command: click.Command, param: click.Parameter, value: str) -> bool:
    """Whether click refuses `value` for `param` before the command's code runs."""
    ctx = click.Context(command)
    given: Any = (value,) if getattr(param, "multiple", False) or param.nargs == -1 else value
    try:
        converted = param.type_cast_value(ctx, given)
        if param.callback is not None:
            param.callback(ctx, param, converted)
    except Exception:  # a crash here is a crash of the command too: it is checked
        return True
    return False


# -- the invocations -----------------------------------------------------------------------------


def valid_args(name: str, files: dict[str, str]) -> list[str]:
    fill = {"{file}": files["cluster.toml"], "{dir}": files["scratch"]}
    return [fill.get(arg, arg) for arg in VALID[name]]


def replaced(
    name: str, command: click.Command, param: click.Parameter, value: str, base: list[str]
) -> list[str]:
    """`base` with `param` given `value` instead of what it had."""
    args = list(base)
    if isinstance(param, click.Option):
        flag = param.opts[0]
        for i, arg in enumerate(args):
            if arg in param.opts and i + 1 < len(args):
                return [*args[:i], flag, value, *args[i + 2 :]]
        return [*args, flag, value]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    position = arguments.index(param)
    positional = [i for i, arg in enumerate(args) if _is_positional(command, args, i)]
    if position < len(positional):
        args[positional[position]] = value
        return args
    return [*args, value]


def _is_positional(command: click.Command, args: list[str], i: int) -> bool:
    if args[i].startswith("-"):
        return False
    previous = args[i - 1] if i else ""
    takes_value = {
        opt
        for p in command.params
        if isinstance(p, click.Option) and not p.is_flag
        for opt in p.opts
    }
    return previous not in takes_value


def fuzz_cases(
    name: str, command: click.Command, files: dict[str, str]
) -> Iterator[tuple[list[str], bool]]:
    """(arguments, whether the command may run to its end with them) for one command."""
    path = name.split()
    only_refused = runs_until_stopped(name)
    base = [] if only_refused else valid_args(name, files)
    yield [*path, "--no-such-option", *base], False
    if any(p.required for p in command.params):
        yield path, False  # every required argument left out
    if not only_refused:
        yield [*path, *base], True
        yield [*path, *base, "extra", "arguments"], True
    for param in command.params:
        if isinstance(param, click.Option) and (param.is_flag or param.count):
            continue
        if param.name == "help":
            continue
        values = values_for(name, param, files)
        if not SOAK:
            values = values[:: 2 if only_refused else 1]
        for value in values:
            opts = getattr(param, "opts", [])
            bounded = not (only_refused or any((name, opt) in UNBOUNDED for opt in opts))
            if not bounded and not refused_by_click(command, param, value):
                continue
            yield [*path, *replaced(name, command, param, value, base)], bounded


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path_factory.mktemp("fuzz-broker") / "broker.log") as process:
        yield process


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(LEAVES))
def test_fuzzed_arguments_fail_in_one_line(
    name: str, runner: CliRunner, broker: BrokerProcess, files: dict[str, str]
) -> None:
    command = LEAVES[name]
    env = {"PHPMQ_BROKER": broker.address}
    cases = list(fuzz_cases(name, command, files))
    assert cases
    found: dict[str, str] = {}  # one example per kind of failure
    for args, _ in cases:
        started = time.monotonic()
        result = runner.invoke(main, args, input="", env=env, catch_exceptions=True)
        took = time.monotonic() - started
        if (report := problem(result, args)) is not None:
            found.setdefault(signature(result, report), report)
        elif took > SLOW_S:
            found.setdefault(f"slow {args[len(name.split())]}", f"took {took:.1f}s: {args!r}")
    if SOAK and not runs_until_stopped(name):
        rng = random.Random(name)
        params = [p for p in command.params if not getattr(p, "is_flag", False)]
        for _ in range(SOAK):
            args = valid_args(name, files)
            for param in rng.sample(params, k=min(len(params), 3)):
                opts = getattr(param, "opts", [])
                if any((name, opt) in UNBOUNDED for opt in opts):
                    continue
                value = rng.choice(values_for(name, param, files))
                args = replaced(name, command, param, value, args)
            args = [*name.split(), *args]
            result = runner.invoke(main, args, input="", env=env, catch_exceptions=True)
            if (report := problem(result, args)) is not None:
                found.setdefault(signature(result, report), report)
    assert not found, "\n\n".join(found.values())


def signature(result: Result, report: str) -> str:
    """A failure's kind: the exception and where it was raised, or the report's first line."""
    exception = result.exception
    if exception is None or isinstance(exception, SystemExit):
        return report.splitlines()[0][:40]
    frame = traceback.extract_tb(exception.__traceback__)[-1]
    return f"{type(exception).__name__} at {frame.filename}:{frame.lineno}"


def talks_to_a_broker(command: click.Command) -> bool:
    return any("--broker" in getattr(p, "opts", []) for p in command.params)


@pytest.mark.timeout(120)
def test_no_broker_listening_is_one_line(runner: CliRunner, files: dict[str, str]) -> None:
    nobody = f"tcp://127.0.0.1:{free_port()}"
    for name, command in sorted(LEAVES.items()):
        if runs_until_stopped(name) or not talks_to_a_broker(command):
            continue
        args = [*name.split(), *valid_args(name, files), "--broker", nobody]
        if "--timeout" not in args:
            args += ["--timeout", "0.1"]
        else:
            args[args.index("--timeout") + 1] = "0.1"
        result = invoke(runner, args)
        assert result.exit_code == 1, (args, result.output)
        assert nobody in result.output, (args, result.output)


@pytest.mark.parametrize(
    "variable, value",
    [
        ("PHPMQ_CURVE_SECRET", "missing"),
        ("PHPMQ_CURVE_SECRET", "dir"),
        ("PHPMQ_CURVE_SECRET", "garbage"),
        ("PHPMQ_CURVE_SECRET", "bad.key_secret"),
        ("PHPMQ_CURVE_SECRET", "empty"),
        ("PHPMQ_CURVE_SERVER", "not-a-key"),
        ("PHPMQ_CURVE_SERVER", "x" * 40),
        ("PHPMQ_CURVE_SERVER", "garbage"),
        ("PHPMQ_CURVE_SERVER", "dir"),
        ("PHPMQ_ADMIN_SECRET", "naïve-🚀"),
        ("PHPMQ_BROKER", "localhost:5555"),
        ("PHPMQ_BROKER", ""),
        ("PHPMQ_BROKR", "typo"),
    ],
)
def test_bad_key_material_and_variables_are_one_line(
    variable: str,
    value: str,
    runner: CliRunner,
    broker: BrokerProcess,
    files: dict[str, str],
) -> None:
    env = {"PHPMQ_BROKER": broker.address, variable: files.get(value, value)}
    if variable == "PHPMQ_CURVE_SERVER":  # needs a secret of the client's own to matter
        secret = Path(files["scratch"]) / "k.key_secret"
        if not secret.exists():
            invoke(runner, ["keys", "generate", "k", "--dir", files["scratch"]])
        env["PHPMQ_CURVE_SECRET"] = str(secret)
    for args in (["stats", "--timeout", "0.3"], ["send", "q", "m", "--timeout", "0.3"]):
        invoke(runner, args, env=env)


# -- what the fuzzing found ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, said",
    [
        # nan and inf passed click's FloatRange, and crashed setting the ZeroMQ socket's
        # timeout (ValueError, OverflowError); so did 1e30, over a C int of milliseconds.
        (["send", "q", "m", "--timeout", "nan"], "'nan' is not a finite number"),
        (["stats", "--timeout", "inf"], "inf is not in the range"),
        (["queue", "list", "--timeout", str(10**30)], "--timeout"),
        (["request", "q", "m", "--timeout", "nan"], "'nan' is not a finite number"),
        # A delay of nan or inf crashed converting it to milliseconds.
        (["send", "q", "m", "--delay", "nan"], "'nan' is not a finite duration"),
        (["send", "q", "m", "--delay", "inf"], "'inf' is not a finite duration"),
        # Over 18 digits: the broker answered 400 (logged), and the command waited its
        # --timeout for a confirm and said only that none came.
        (["send", "q", "m", "--delay", "1e30h"], "'1e30h' is longer than"),
        (["send", "q", "m", "--ttl", str(10**18)], "--ttl"),
        (["publish", "e.x", "m", "--ttl", str(10**30)], "--ttl"),
        (["schedule", "add", "j", "m", "--every", "1e30h", "--queue", "q"], "--every"),
    ],
)
def test_out_of_range_numbers_are_usage_errors(
    args: list[str], said: str, runner: CliRunner, broker: BrokerProcess
) -> None:
    started = time.monotonic()
    result = invoke(runner, args, env={"PHPMQ_BROKER": broker.address})
    assert result.exit_code == 2, result.output
    assert said in result.output and result.output.count("\n") == 1, result.output
    assert time.monotonic() - started < 2


def test_a_config_file_that_is_not_utf8_is_one_line(files: dict[str, str]) -> None:
    """load_config (broker/config.py) let the UnicodeDecodeError of read_text() through."""
    args = ["broker", "--bind", f"tcp://127.0.0.1:{free_port()}", "--config", files["garbage"]]
    result = run_phpmq(*args, timeout=15)
    check(result, args)
    assert result.returncode == 1
    assert result.stderr.startswith(f"phpmq: cannot read config file {files['garbage']}: ")
    assert "can't decode" in result.stderr and len(result.stderr.splitlines()) == 1


# -- a few through a real process -------------------------------------------------------------


def run_phpmq(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """`phpmq ARGS` in a process group of its own, killed whole if it does not return."""
    process = subprocess.Popen(
        [sys.executable, "-m", "phpmq", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"phpmq {args} did not return:\n{stderr}\n{stdout}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.timeout(120)
def test_through_a_process(broker: BrokerProcess, files: dict[str, str]) -> None:
    nobody = f"tcp://127.0.0.1:{free_port()}"
    refused = [
        ["send", "q", "m", "--broker", nobody, "--timeout", "0.2"],
        ["schedule", "add", "j", "m", "--cron", "61 * * * *", "--queue", "q"],
        [
            "schedule",
            "add",
            "j",
            "m",
            "--cron",
            "* * * * *",
            "--tz",
            "Mars/Olympus",
            "--queue",
            "q",
        ],
        ["cluster", "join", "--file", files["garbage"], "c", "--address", "tcp://h:1"],
        ["cluster", "leave", "--file", files["bad.toml"], "a"],
        ["keys", "generate", "k", "--dir", files["garbage"]],
        ["workers", "mod:fn", "-q", "q", "--processes", "many"],
        ["bench", "--messages", "-5"],
        ["web", "--bind", "nowhere"],
    ]
    found = []
    for args in refused:
        if args[0] not in ("cluster", "keys", "workers", "bench", "web"):
            args = [*args, "--broker", broker.address] if "--broker" not in args else args
        result = run_phpmq(*args)
        if result.returncode == 0:
            found.append(f"phpmq {args!r} exited 0:\n{result.stdout}")
        elif (report := problem(result, args)) is not None:
            found.append(report)
    assert not found, "\n\n".join(found)


@pytest.mark.timeout(120)
def test_the_broker_refuses_bad_settings_before_it_starts(files: dict[str, str]) -> None:
    """`phpmq broker` with a setting it cannot use exits at once (killed if it serves)."""
    bind = ["--bind", f"tcp://127.0.0.1:{free_port()}"]
    cases = [
        ["--config", files["bad.toml"]],
        ["--config", files["garbage"]],
        ["--config", files["wrong.toml"]],
        ["--config", files["missing"]],
        ["--config", files["dir"]],
        ["--max-memory", "lots"],
        ["--min-free-disk", "-5GB"],
        ["--shards", "many"],
        ["--tcp-allow", "10.0.0.0/99"],
        ["--curve-secret", files["bad.key_secret"], "--curve-clients", files["dir"]],
        ["--permissions", files["bad.toml"]],
        ["--cluster-file", files["garbage"], "--node", "a"],
        ["--bind", "nonsense"],
    ]
    found = []
    for flags in cases:
        args = ["broker", *bind, *flags]
        result = run_phpmq(*args, timeout=15)
        if result.returncode == 0:
            found.append(f"phpmq {args!r} exited 0")
        elif (report := problem(result, args)) is not None:
            found.append(report)
    assert not found, "\n\n".join(found)
