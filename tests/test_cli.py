"""The `phpmq` command line, run as a subprocess against a real broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from harness import REPO, BrokerProcess, free_port, phpmq
from phpmq import __version__


def test_send_consume_and_stats(broker: BrokerProcess) -> None:
    address = ["--broker", broker.address]
    sent = phpmq("send", *address, "emails", "hello")
    assert sent.returncode == 0, sent.stderr
    assert "sent 1 message to emails" in sent.stderr
    lines = phpmq("send", *address, "emails", "--lines", "--ttl", "60", stdin="one\ntwo\n")
    assert "sent 2 messages" in lines.stderr
    stats = json.loads(phpmq("stats", *address, "--json").stdout)
    assert stats["queues"]["emails"]["ready"] == 3
    got = phpmq("consume", *address, "emails", "--count", "3", "--json")
    assert got.returncode == 0, got.stderr
    rows = [json.loads(line) for line in got.stdout.splitlines()]
    assert [r["content"] for r in rows] == ["hello", "one", "two"]
    # Counted down since the send: three CLI runs apart, seconds on a loaded machine.
    assert rows[0]["ttl"] == 0 and 40 <= rows[1]["ttl"] <= 60
    assert all(len(r["id"]) == 32 for r in rows)
    table = phpmq("stats", *address)
    assert "emails" in table.stdout and "dead letters" in table.stdout
    assert json.loads(phpmq("stats", *address, "--json").stdout)["queues"]["emails"] == {
        "ready": 0,
        "in_flight": 0,
        "delayed": 0,
        "consumers": 0,
        "dead_letters": 0,
        "leased": 0,
        "leases": 0,
        "oldest_sent_at": None,
        "refused": 0,
        "totals": {
            "published": 3,
            "delivered": 3,
            "acked": 3,
            "requeued": 0,
            "expired": 0,
            "dead_lettered": 0,
        },
        "paused_producers": 0,
        "bindings": [],
        "binding_count": 0,
        "delete_when_unused_ms": None,
        "settings": {"max_deliveries": 20, "max_length": 1_000_000, "overflow": "reject"},
    }


def test_send_with_confirm_prints_ids_and_a_key_queues_once(broker: BrokerProcess) -> None:
    address = ["--broker", broker.address]
    first = phpmq("send", *address, "orders", "o-17", "--confirm", "--key", "order-17")
    assert first.returncode == 0, first.stderr
    [message_id] = first.stdout.split()
    assert len(message_id) == 32 and "sent 1 message to orders, confirmed" in first.stderr
    again = phpmq("send", *address, "orders", "o-17", "--confirm", "--key", "order-17")
    assert again.stdout.split() == [message_id]
    lines = phpmq("send", *address, "orders", "--lines", "--confirm", stdin="a\nb\n")
    assert len(lines.stdout.split()) == 2
    refused = phpmq("send", *address, "bad name", "x", "--confirm")
    assert refused.returncode == 1
    assert refused.stderr == (
        "phpmq: refused before sending: 422 queue name contains whitespace or control"
        " characters: 'bad name'\n"
    )
    assert json.loads(phpmq("stats", *address, "--json").stdout)["queues"]["orders"]["ready"] == 3


def test_consume_no_ack_leaves_messages_for_the_next_consumer(broker: BrokerProcess) -> None:
    address = ["--broker", broker.address]
    phpmq("send", *address, "q", "-", stdin="from stdin")
    first = phpmq("consume", *address, "q", "--no-ack")
    assert first.stdout.strip() == "from stdin"
    again = phpmq("consume", *address, "q", "--json")
    assert json.loads(again.stdout)["delivery_count"] == 2


def test_consume_timeout_reports_how_many_arrived(broker: BrokerProcess) -> None:
    address = ["--broker", broker.address]
    result = phpmq("consume", *address, "empty", "-n", "2", "--idle-timeout", "0.3")
    assert result.returncode == 0
    assert "got 0 of 2 messages before the idle timeout" in result.stderr


def test_dlq_list_replay_and_purge(broker: BrokerProcess) -> None:
    address = ["--broker", broker.address]
    with broker.client() as client:
        client.send_many("work", [b"bad-1", b"bad-2"])
        stream = client.consume("work", window=2, timeout=5)
        for _ in range(2):
            next(stream).dead_letter("cannot parse")
    listed = phpmq("dlq", "list", *address, "work")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("cannot parse") == 2
    assert "bad-1" in listed.stdout
    assert "2 dead letters in work" in listed.stderr
    replay = phpmq("dlq", "replay", *address, "work")
    assert "replayed 2 dead letters into work" in replay.stdout
    assert json.loads(phpmq("stats", *address, "--json").stdout)["queues"]["work"]["ready"] == 2
    with broker.client() as client:
        next(client.consume("work", window=1, timeout=5)).dead_letter("again")
    purge = phpmq("dlq", "purge", *address, "work")
    assert "purged 1 dead letters from work" in purge.stdout


def test_dlq_of_an_unknown_queue_fails_with_one_line(broker: BrokerProcess) -> None:
    result = phpmq("dlq", "list", "--broker", broker.address, "nope")
    assert result.returncode == 1
    assert result.stderr.strip() == "phpmq: no queue named 'nope'"


def test_commands_without_a_broker_fail_with_one_line_within_the_timeout() -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    commands = [
        ["send", "q", "x"],
        ["send", "q", "x", "--no-confirm"],
        ["consume", "q"],
        ["consume", "q", "--follow"],
        ["stats"],
        ["stats", "--watch"],
        ["dlq", "list", "q"],
        ["queue", "list"],
        ["queue", "purge", "q", "--yes"],
    ]
    for command in commands:
        started = time.monotonic()
        result = phpmq(*command, "--broker", address, "--timeout", "0.5", timeout=10)
        took = time.monotonic() - started
        assert result.returncode == 1, command
        assert result.stderr == (
            f"phpmq: no broker answered at {address} within 0.5s: nothing accepts connections"
            " there: is the broker running, at this address?\n"
        ), command
        assert took < 4, (command, took)  # 0.5 s and a Python start-up


def test_a_malformed_broker_address_is_a_usage_error() -> None:
    commands = {"send": ["q", "x"], "stats": [], "queue list": [], "consume": ["q"]}
    for path, arguments in commands.items():
        result = phpmq(*path.split(), *arguments, "--broker", "localhost:5555")
        assert result.returncode == 2, path
        assert result.stderr == (
            "phpmq: invalid value for '--broker': not a ZeroMQ address: 'localhost:5555'"
            f" (see 'phpmq {path} --help')\n"
        )


def test_bad_configuration_is_refused_with_one_line(tmp_path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('bind = "tcp://127.0.0.1:1"\nno_such_setting = 1\n')
    result = phpmq("broker", "--config", str(config))
    assert result.returncode == 1
    assert "no_such_setting" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = phpmq("broker", "--max-window", "0", "--bind", "tcp://127.0.0.1:*")
    assert result.returncode == 1
    assert "max_window must be positive" in result.stderr


def test_a_bad_environment_variable_is_named_in_one_line() -> None:
    bind = "tcp://127.0.0.1:*"
    environ = {**os.environ, "PHPMQ_MAX_WINDOW": "lots"}
    result = phpmq("broker", "--bind", bind, env=environ)
    assert result.returncode == 1
    assert result.stderr == "phpmq: invalid PHPMQ_MAX_WINDOW='lots': Expected `int`, got `str`\n"
    environ["PHPMQ_MAX_WINDOW"] = "0"
    result = phpmq("broker", "--bind", bind, env=environ)
    assert result.returncode == 1
    assert result.stderr == (
        "phpmq: invalid configuration: max_window must be positive (from PHPMQ_MAX_WINDOW)\n"
    )


def imported_modules(importtime_log: str) -> set[str]:
    """The modules named in a `python -X importtime` log."""
    return {
        line.rpartition("|")[2].strip()
        for line in importtime_log.splitlines()
        if line.startswith("import time:")
    }


def test_send_loads_the_client_but_not_the_broker_sqlite_or_spark(broker: BrokerProcess) -> None:
    command = ["send", "--broker", broker.address, "q", "x"]
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "phpmq", *command],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        # A client's variable is known without reading the broker's settings.
        env={**os.environ, "PHPMQ_ADMIN_SECRET": "s"},
    )
    assert result.returncode == 0, result.stderr
    assert "sent 1 message to q" in result.stderr
    modules = imported_modules(result.stderr)
    assert {"phpmq.client", "phpmq.cli.messages"} <= modules  # the log is read right
    unwanted = ("phpmq.broker", "sqlite3", "pyspark")
    loaded = sorted(
        module
        for module in modules
        if any(module == name or module.startswith(f"{name}.") for name in unwanted)
    )
    assert not loaded, f"phpmq send imported {loaded}"


def test_pipeline_help_does_not_load_spark() -> None:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "phpmq", "pipeline", "demo", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert "count them per key and minute" in result.stdout
    modules = imported_modules(result.stderr)
    assert "phpmq.cli.pipeline" in modules
    assert not sorted(m for m in modules if m.partition(".")[0] == "pyspark")


def test_version_is_the_package_version() -> None:
    result = phpmq("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"phpmq {__version__}"


def test_python_dash_m_phpmq_runs_the_command_line_from_anywhere(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "phpmq", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: phpmq [OPTIONS] COMMAND")


def test_help_explains_every_command() -> None:
    top = phpmq("--help")
    for command in ("broker", "send", "consume", "stats", "dlq", "bench"):
        assert command in top.stdout
    broker_help = phpmq("broker", "--help").stdout
    assert "--config" in broker_help and "PHPMQ_" in broker_help and "--dialect" in broker_help


def test_every_benchmark_runs_to_its_figures() -> None:
    """A smoke run of each workload with few messages: the figures are not judged here (they
    live in `phpmq bench`), but a benchmark that cannot finish is a broken tool."""
    result = phpmq("bench", "--messages", "2000", "--codec", "--durable", "--pool", timeout=150)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output
    figures = (
        "broker/relay ratio (raw consumer on both)",
        "asyncio/sync client ratio",
        "durable + confirms",
        "of the bare relay's",
    )
    for figure in (*figures, "2,000 confirmed, 0 not", "pool"):
        assert figure in output, figure


def test_every_overload_benchmark_runs_to_its_figures() -> None:
    """The flood, memory and steady workloads at a tiny size (they skip the pipe run): each
    prints its figures beside its targets; none is judged here."""
    result = phpmq(
        "bench", "--flood", "--memory", "--steady",
        "--seconds", "1", "--flooders", "1", "--queue-limit", "10000",
        "--count", "20000", "--watch-seconds", "1", "--rate", "2000",
        timeout=100,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output
    assert "broker/relay ratio" not in output  # no --pipe: the pipe workload did not run
    figures = (
        "flood: figures against targets",
        "broker RSS peak",
        "calm p99",
        "slowest stats answer",
        "broker counters at the end",
        "memory: RSS for queued messages",
        "20,000 of 20,000 confirmed; drained 20,000",
        "after / peak",
        "steady: 2,000 msg/s",
        "p99.9 target",
        "steady, durable: every",
    )
    for figure in figures:
        assert figure in output, figure


def test_an_unknown_phpmq_variable_is_told_with_the_name_it_may_mean() -> None:
    environ = {**os.environ, "PHPMQ_BROKR": "tcp://127.0.0.1:1", "PHPMQ_MAX_WINDOW": "5"}
    address = f"tcp://127.0.0.1:{free_port()}"
    result = phpmq("stats", "--broker", address, "--timeout", "0.2", env=environ)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "phpmq: warning: PHPMQ_BROKR is not a phpmq variable: ignored; did you mean PHPMQ_BROKER?",
        f"phpmq: no broker answered at {address} within 0.2s: nothing accepts connections there:"
        " is the broker running, at this address?",
    ]


def test_a_shell_holding_a_clients_curve_keys_still_starts_a_plain_broker(tmp_path) -> None:
    """docs/security.md has clients export PHPMQ_CURVE_SECRET/_SERVER; a broker started in
    that shell is not the client: it starts, saying which variable would be its own."""
    environ = {
        **os.environ,
        "PHPMQ_CURVE_SECRET": str(tmp_path / "client.key_secret"),
        "PHPMQ_CURVE_SERVER": str(tmp_path / "broker.key"),
    }
    bind = f"tcp://127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "phpmq", "broker", "--bind", bind],
        env=environ,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        first = process.stderr.readline()  # type: ignore[union-attr]
        listening = process.stderr.readline()  # type: ignore[union-attr]
    finally:
        process.send_signal(signal.SIGTERM)
        status = process.wait(20)
    assert first == (
        "phpmq: warning: PHPMQ_CURVE_SECRET is a client's variable; this broker's curve_secret"
        " is --curve-secret or PHPMQ_BROKER_CURVE_SECRET, not set\n"
    )
    assert f"listening on {bind}" in listening
    assert status == 0
