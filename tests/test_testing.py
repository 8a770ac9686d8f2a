"""phpmq.testing: the public helper that runs a real broker for a test, used as users would."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from harness import wait_for
from phpmq import Client
from phpmq.testing import (
    ANY_PORT,
    BrokerProcess,
    BrokerStartError,
    LocalCluster,
    _stopped,
    fork_brokers,
    process_state,
)
from phpmq.testing_forks import ForkedProcess

#: Far below start_timeout: a broker that fails at start-up is reported, not waited for.
START_FAILURE_BOUND_S = 8.0


def test_a_broker_starts_answers_and_stops_gracefully(tmp_path: Path) -> None:
    log_path = tmp_path / "broker.log"
    with BrokerProcess("--grace-seconds", "0", log_path=log_path) as broker:
        assert broker.address.startswith("tcp://127.0.0.1:")
        assert broker.process.poll() is None
        with Client(broker.address) as client:
            client.send("orders", b"order 17")
        assert broker.stats()["queues"]["orders"]["ready"] == 1
    assert broker.process.returncode == 0  # SIGTERM: drained and exited by itself
    assert "in memory" in log_path.read_text()
    assert broker.log() == log_path.read_text()


def test_without_a_log_path_the_log_outlives_its_temporary_file() -> None:
    broker = BrokerProcess()
    try:
        assert broker.log_path.exists()
    finally:
        assert broker.stop() == 0
    assert not broker.log_path.exists()
    assert "in memory" in broker.log()


def test_flags_tcp_and_data_dir_reach_the_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with BrokerProcess("--max-deliveries", "3", tcp=True, data_dir=data) as broker:
        assert broker.tcp_port is not None
        assert broker.tcp_address == f"tcp://127.0.0.1:{broker.tcp_port}"
        with socket.create_connection(("127.0.0.1", broker.tcp_port), timeout=5):
            pass
        with Client(broker.address) as client:
            client.send("q", b"x")
        stats = broker.stats()
        assert stats["storage"]["data_dir"] == str(data)
        assert stats["queues"]["q"]["settings"]["max_deliveries"] == 3


def test_every_endpoint_is_a_port_the_broker_got_itself_and_reported(tmp_path: Path) -> None:
    with BrokerProcess("--metrics-bind", "127.0.0.1:0", tcp=True) as broker:
        endpoints = broker.endpoints
        assert endpoints["pid"] == broker.process.pid
        assert broker.address == endpoints["bind"] != ANY_PORT
        assert broker.address.startswith("tcp://127.0.0.1:")
        assert broker.tcp_address == endpoints["tcp_bind"] != ANY_PORT
        assert broker.metrics_address == endpoints["metrics_bind"] != "127.0.0.1:0"
        assert len({broker.address, broker.tcp_address, f"tcp://{broker.metrics_address}"}) == 3
        with Client(broker.address) as client:
            client.send("q", b"x")
        assert broker.stats()["queues"]["q"]["ready"] == 1
        assert broker.tcp_port is not None
        with socket.create_connection(("127.0.0.1", broker.tcp_port), timeout=5):
            pass
        url = f"http://{broker.metrics_address}/metrics"
        with urllib.request.urlopen(url, timeout=5) as scraped:
            assert b"phpmq_queue_messages_ready" in scraped.read()


def test_a_broker_answering_at_the_address_is_not_taken_for_the_one_started(
    tmp_path: Path,
) -> None:
    """The second broker cannot bind the first one's address and exits: its start fails,
    although a broker answers there."""
    with BrokerProcess("--grace-seconds", "0") as first:
        with pytest.raises(BrokerStartError, match="exited at start-up") as refused:
            BrokerProcess(address=first.address, log_path=tmp_path / "second.log")
        assert f"cannot bind {first.address}" in str(refused.value)


def test_a_bad_flag_reports_the_brokers_error_instead_of_hanging(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(BrokerStartError, match="max_window must be positive") as refused:
        BrokerProcess("--max-window", "0", log_path=tmp_path / "b.log", start_timeout=30)
    assert "exited at start-up (status 1)" in str(refused.value)
    with pytest.raises(BrokerStartError, match="no such option '--no-such-flag'"):
        BrokerProcess("--no-such-flag", start_timeout=30)
    assert time.monotonic() - started < START_FAILURE_BOUND_S


def test_stop_kills_a_broker_that_does_not_exit_in_time() -> None:
    broker = BrokerProcess(stop_timeout=0.5)
    broker.signal(signal.SIGSTOP)  # a stopped process cannot act on SIGTERM
    assert broker.stop() == -signal.SIGKILL


def test_kill_is_a_crash() -> None:
    broker = BrokerProcess()
    assert broker.kill() == -signal.SIGKILL
    assert broker.stop() == -signal.SIGKILL  # already gone: nothing more to do


def test_process_states_tell_a_stopped_process_and_a_zombie_from_a_running_one() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert process_state(child.pid) in "RS"
        child.send_signal(signal.SIGSTOP)
        assert _stopped(child.pid, time.monotonic() + 5)
        child.send_signal(signal.SIGKILL)
        wait_for(lambda: process_state(child.pid) == "Z", "the unreaped child to be a zombie")
        assert not _stopped(child.pid, time.monotonic() + 5)  # no signal reaches a zombie
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) == "X"


class _ReadyFile:
    """A node's ready file as its supervisor rewrites it: the replica's pid of each start."""

    def __init__(self, shard: str, pid: int) -> None:
        self.shard, self.pid = shard, pid

    def ready_endpoints(self) -> dict[str, Any]:
        return {"shards": [{"shard": self.shard, "pid": self.pid}]}


def test_a_replica_is_signalled_at_its_next_start_when_the_file_names_a_zombie(
    tmp_path: Path,
) -> None:
    """A replica that handed leadership on exits and is restarted: until its supervisor
    reaps it, the ready file names a zombie, which a SIGSTOP would not stop (the restarted
    replica would then serve, unpaused, a test that thinks it paused)."""
    cluster = LocalCluster(tmp_path)
    replica = cluster.replica_sets["a/0"][1]
    exited = subprocess.Popen(["true"])
    wait_for(lambda: process_state(exited.pid) == "Z", "the exited replica to be a zombie")
    restarted = subprocess.Popen(["sleep", "30"])
    ready = _ReadyFile(replica.shard, exited.pid)
    cluster.nodes[replica.node] = ready  # type: ignore[assignment]
    threading.Timer(0.3, lambda: setattr(ready, "pid", restarted.pid)).start()
    try:
        cluster.signal(replica, signal.SIGSTOP)
        assert process_state(restarted.pid) == "T"
    finally:
        for child in (exited, restarted):
            child.kill()
            child.wait()


def test_a_forked_broker_gets_its_environment_log_and_exit_status(tmp_path: Path) -> None:
    """The suite forks its brokers (tests/conftest.py): each still gets its own environment
    and log, and reports its exit status as a Popen would."""
    with pytest.raises(BrokerStartError, match="PHPMQ_MAX_WINDOW"):
        BrokerProcess(env={"PHPMQ_MAX_WINDOW": "many"}, log_path=tmp_path / "bad.log")
    assert "PHPMQ_MAX_WINDOW" in (tmp_path / "bad.log").read_text()
    broker = BrokerProcess("--grace-seconds", "0")
    assert isinstance(broker.process, ForkedProcess)  # the suite's brokers are forked
    assert broker.stop() == 0
    broker = BrokerProcess()
    assert broker.kill() == -signal.SIGKILL
    # What the interpreter reads as it starts, a fork cannot change: that one starts afresh.
    broker = BrokerProcess("--grace-seconds", "0", env={"PYTHONHASHSEED": "17"})
    assert isinstance(broker.process, subprocess.Popen)
    assert broker.stop() == 0


def test_without_forking_a_broker_is_a_process_of_its_own() -> None:
    fork_brokers(False)
    try:
        broker = BrokerProcess("--grace-seconds", "0")
    finally:
        fork_brokers(True)
    assert isinstance(broker.process, subprocess.Popen)
    assert broker.stop() == 0


def test_the_brokers_of_a_killed_test_process_are_killed_with_it(tmp_path: Path) -> None:
    """A test process killed (pytest -x stopping its workers) leaves no forked broker behind."""
    script = (
        "from phpmq.testing import BrokerProcess, fork_brokers\n"
        "fork_brokers()\n"
        "broker = BrokerProcess()\n"
        "print(broker.process.pid, flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    test_process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert test_process.stdout is not None
        broker_pid = int(test_process.stdout.readline())
        assert process_state(broker_pid) in "RS"
    finally:
        test_process.kill()
        test_process.wait()
    wait_for(lambda: process_state(broker_pid) in "XZ", "the broker to be killed with it")
