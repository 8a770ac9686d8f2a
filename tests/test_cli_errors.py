"""How `phpmq` fails and stops: the broker's refusals as one line with their code, Ctrl-C as
a quiet exit 130, live commands that run until interrupted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness import REPO, BrokerProcess, free_port, phpmq, wait_for, wait_until

INTERRUPTED = 130


def start_phpmq(*args: str) -> subprocess.Popen:
    # faulthandler: a command that does not stop is made to print where each thread is.
    return subprocess.Popen(
        [sys.executable, "-m", "phpmq", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )


def interrupt(process: subprocess.Popen) -> tuple[int, str, str]:
    """Ctrl-C, as a terminal sends it; the exit status and what the command printed."""
    ignoring = _ignoring_sigint(process.pid)
    assert not ignoring, f"the command ignores SIGINT, as what started the suite did: {ignoring}"
    process.send_signal(signal.SIGINT)
    try:
        stdout, stderr = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        masks = _signal_masks(process.pid)
        process.send_signal(signal.SIGCONT)  # in case something stopped it
        process.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        stdout, stderr = process.communicate(timeout=10)
        raise AssertionError(
            f"still running 10 s after Ctrl-C ({masks}); its stacks and output:\n{stderr}\n{stdout}"
        ) from None
    finally:
        process.kill()
    return process.returncode, stdout, stderr


def _signal_masks(pid: int) -> dict[str, str]:
    """A process's state, and the signals it has pending, blocked, ignored and caught (bit
    n - 1 for signal n), from /proc/PID/status."""
    wanted = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    with open(f"/proc/{pid}/status") as status:
        pairs = (line.split(":", 1) for line in status if line.startswith(wanted))
        return {name: value.strip() for name, value in pairs}


def _ignoring_sigint(pid: int) -> str:
    """The process's SigIgn mask if SIGINT is in it: inherited from whatever started the suite
    (tests/conftest.py lifts it), else ""."""
    ignored = _signal_masks(pid)["SigIgn"]
    return ignored if int(ignored, 16) & 1 << (signal.SIGINT - 1) else ""


def test_send_reports_a_full_queue_and_an_oversized_message(tmp_path: Path) -> None:
    flags = ("--max-queue-length", "1", "--max-content-bytes", "2000")
    with BrokerProcess(tmp_path / "broker.log", *flags) as broker:
        address = ["--broker", broker.address]
        assert phpmq("send", *address, "q", "first").returncode == 0
        full = phpmq("send", *address, "q", "second")
        assert full.returncode == 1
        assert full.stderr == (
            "phpmq: broker refused the message to q: 429 queue 'q' is full (1 ready messages)\n"
        )
        started = time.monotonic()
        big = phpmq("send", *address, "other", "x" * 2001)
        assert time.monotonic() - started < 5  # not a 10 s wait for a confirm that never comes
        assert big.returncode == 1
        assert big.stderr == (
            "phpmq: refused before sending: 413 content of 2001 bytes is over the broker's"
            " limit of 2000: 'other'\n"
        )
        lines = phpmq("send", *address, "pair", "--lines", stdin="a\nb\n")
        assert lines.returncode == 1
        assert "broker refused message 2 to pair: 429" in lines.stderr
        assert lines.stderr.endswith("(1 of 2 confirmed)\n")
        # Fire and forget: no answer is waited for, yet the goodbye proves the broker read
        # the send, and a refusal that came back by then is told.
        forgotten = phpmq("send", *address, "q", "third", "--no-confirm")
        assert forgotten.returncode == 1
        assert (
            forgotten.stderr
            == "phpmq: broker refused: 429 queue 'q' is full (1 ready messages) (q)\n"
        )
        taken = phpmq("send", *address, "roomy", "fourth", "--no-confirm")
        assert taken.returncode == 0
        assert "sent 1 message to roomy (not confirmed)" in taken.stderr


def test_send_while_the_broker_drains_is_refused_with_503(tmp_path: Path) -> None:
    with (
        BrokerProcess(tmp_path / "broker.log", "--grace-seconds", "20") as broker,
        broker.client() as consumer,
    ):
        consumer.send("held", b"keeps the drain waiting", confirm=True)
        held = next(consumer.consume("held", window=1, timeout=5))
        broker.signal(signal.SIGTERM)
        broker.wait_draining()
        refused = phpmq("send", "--broker", broker.address, "q", "late")
        held.ack()
    assert refused.returncode == 1
    assert refused.stderr.startswith("phpmq: broker refused the message to q: 503 ")
    assert len(refused.stderr.splitlines()) == 1


def test_ctrl_c_stops_consume_follow_quietly_with_130(broker: BrokerProcess) -> None:
    process = start_phpmq("consume", "--broker", broker.address, "jobs", "--follow")
    try:
        with broker.client() as client:
            client.send_many("jobs", [b"one", b"two"], confirm=True)
        assert process.stdout is not None
        assert process.stdout.readline() == "one\n"  # it is running and consuming
        assert process.stdout.readline() == "two\n"
        # A message is printed, then acked: wait for both acks, or the interrupt could fall
        # between the two (and "two" would rightly come back).
        wait_until(lambda: not broker.stats()["queues"]["jobs"]["in_flight"], 5)
    except BaseException:
        process.kill()
        raise
    status, _, stderr = interrupt(process)
    assert status == INTERRUPTED
    assert "Traceback" not in stderr and "Aborted" not in stderr
    jobs = broker.stats()["queues"]["jobs"]
    assert (jobs["ready"], jobs["in_flight"]) == (0, 0)  # both were acked


def test_stats_watch_redraws_until_ctrl_c(broker: BrokerProcess) -> None:
    process = start_phpmq("stats", "--broker", broker.address, "--watch", "--interval", "0.2")
    try:
        time.sleep(1.0)
        with broker.client() as client:
            client.send("arrived-later", b"x", confirm=True)
        time.sleep(1.0)
    except BaseException:
        process.kill()
        raise
    status, stdout, stderr = interrupt(process)
    assert status == INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert f"phpmq broker {broker.address}" in stdout
    assert "arrived-later" in stdout  # drawn after the watch started: it redraws


def test_ctrl_c_while_waiting_for_messages_exits_130(broker: BrokerProcess) -> None:
    process = start_phpmq("consume", "--broker", broker.address, "quiet", "-n", "5")
    # Waiting for messages, not still importing (a loaded machine takes seconds to start it).
    wait_for(
        lambda: broker.stats()["queues"].get("quiet", {}).get("consumers") == 1,
        "the consume command to subscribe",
        timeout=30,
    )
    status, stdout, stderr = interrupt(process)
    assert status == INTERRUPTED and stdout == ""
    assert "Traceback" not in stderr and "Aborted" not in stderr


def test_a_broker_or_bridge_on_an_address_in_use_exits_at_once_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        used = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        free = f"tcp://127.0.0.1:{free_port()}"
        router = phpmq("broker", "--bind", used, timeout=10)
        assert router.returncode == 1
        assert router.stderr.startswith(f"phpmq: cannot bind {used}: Address already in use")
        tcp = phpmq("broker", "--bind", free, "--tcp-bind", used, timeout=10)
        assert tcp.returncode == 1
        assert tcp.stderr.startswith(f"phpmq: cannot bind {used}: Address already in use")
        assert len(tcp.stderr.splitlines()) == 1
        with BrokerProcess(tmp_path / "broker.log") as broker:
            for kind, arguments in (("pull-in", [used, "--queue", "q"]), ("pub-out", ["q", used])):
                bridged = phpmq("bridge", kind, "--broker", broker.address, "--bind", *arguments)
                assert bridged.returncode == 1, (kind, bridged.stderr)
                assert bridged.stderr == f"phpmq: cannot bind {used}: Address already in use\n"


def test_consume_on_a_refused_subscription_prints_the_reason_and_exits_1(
    tmp_path: Path,
) -> None:
    with BrokerProcess(tmp_path / "broker.log", "--max-window", "10") as broker:
        started = time.monotonic()
        refused = phpmq("consume", "--broker", broker.address, "jobs", "--window", "11")
        assert time.monotonic() - started < 10  # not waiting forever
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert "422" in refused.stderr and "maximum window 10" in refused.stderr


def test_usage_errors_are_one_line_naming_where_to_look() -> None:
    """docs/cli.md: every failure is one line starting `phpmq: ` (issue 33, item 6): not
    click's three (Usage, Try, Error)."""
    cases = {
        ("send",): "phpmq: missing argument 'QUEUE' (see 'phpmq send --help')",
        ("send", "q", "x", "--ttl", "abc"): (
            "phpmq: invalid value for '--ttl': 'abc' is not a valid integer range"
            " (see 'phpmq send --help')"
        ),
        ("send", "q", "x", "--bogus"): "phpmq: no such option '--bogus' (see 'phpmq send --help')",
        ("sned", "q"): "phpmq: no such command 'sned'. Did you mean 'send'? (see 'phpmq --help')",
        ("schedule", "add", "s", "x", "--queue", "q"): (
            "phpmq: give --every or --cron (one of them) (see 'phpmq schedule add --help')"
        ),
    }
    for args, line in cases.items():
        result = phpmq(*args)
        assert (result.returncode, result.stderr) == (2, line + "\n"), args


def test_a_bad_broker_address_from_the_environment_names_the_variable() -> None:
    environ = {**os.environ, "PHPMQ_BROKER": "nonsense"}
    result = phpmq("send", "q", "x", env=environ)
    assert result.returncode == 2
    assert result.stderr == (
        "phpmq: invalid value for PHPMQ_BROKER: not a ZeroMQ address: 'nonsense'"
        " (see 'phpmq send --help')\n"
    )


def test_the_broker_exits_130_after_ctrl_c_and_0_after_sigterm(tmp_path: Path) -> None:
    for signum, status in ((signal.SIGINT, INTERRUPTED), (signal.SIGTERM, 0)):
        broker = BrokerProcess(tmp_path / f"broker-{signum}.log")
        try:
            broker.signal(signum)
            assert broker.wait(20) == status, broker.log()
        finally:
            broker.stop()
