"""Rights through the tools built on the client (docs/security.md): the worker pool and a
bridge run with their own CURVE keys from the environment, and get exactly the rights the
permissions file gives those keys."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from test_pool import PoolProcess

from harness import REPO, BrokerProcess, curve_broker, generate_keys, wait_for

PERMISSIONS = """
[keys.producer]
send = ["jobs"]
consume = ["bridged"]

[keys.worker]
consume = ["jobs"]

[keys.bridge]
send = ["bridged"]

[keys.outsider]
"""


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    clients = ("producer", "worker", "bridge", "outsider")
    folder = generate_keys(tmp_path_factory.mktemp("keys"), ("broker", *clients), clients)
    (folder / "permissions.toml").write_text(PERMISSIONS)
    return folder


@pytest.fixture
def broker(tmp_path: Path, keys: Path) -> Iterator[BrokerProcess]:
    permissions = str(keys / "permissions.toml")
    with curve_broker(tmp_path, keys, "--permissions", permissions, as_key="producer") as process:
        yield process


def environment(keys: Path, name: str) -> dict[str, str]:
    return {
        "PHPMQ_CURVE_SECRET": str(keys / f"{name}.key_secret"),
        "PHPMQ_CURVE_SERVER": str(keys / "broker.key"),
    }


def test_a_worker_pool_consumes_with_its_key_and_one_without_the_right_is_refused(
    tmp_path: Path, broker: BrokerProcess, keys: Path
) -> None:
    with broker.client() as producer:
        for i in range(20):
            producer.send("jobs", f"job-{i}", confirm=True)
    pool = PoolProcess(
        tmp_path, broker, "record", "-q", "jobs", "-p", "2", env=environment(keys, "worker")
    )
    try:
        pool.wait_for(lambda: len(pool.records()) >= 20, 30, "20 jobs handled")
    finally:
        pool.stop()
    assert sorted(r["content"] for r in pool.records()) == sorted(f"job-{i}" for i in range(20))
    outsider = PoolProcess(
        tmp_path,
        broker,
        "record",
        "-q",
        "jobs",
        "-p",
        "1",
        name="outsider",
        env=environment(keys, "outsider"),
    )
    try:
        outsider.wait_for(lambda: "403" in outsider.log(), 20, "the pool told of its 403")
    finally:
        outsider.stop()
    assert "no consume right on 'jobs'" in outsider.log()


def test_a_bridge_sends_with_its_key_only_where_its_rights_allow(
    tmp_path: Path, broker: BrokerProcess, keys: Path
) -> None:
    context = zmq.Context.instance()
    push = context.socket(zmq.PUSH)
    push.linger = 0
    port = push.bind_to_random_port("tcp://127.0.0.1")
    allowed = _bridge(tmp_path, broker, keys, port, "bridged", "ok")
    try:
        for i in range(10):
            push.send(b"b%d" % i)
        wait_for(lambda: _ready(broker, "bridged") == 10, "10 bridged messages queued")
    finally:
        allowed_log = _stop(allowed)
        push.close()
    push = context.socket(zmq.PUSH)
    push.linger = 0
    port = push.bind_to_random_port("tcp://127.0.0.1")
    refused = _bridge(tmp_path, broker, keys, port, "jobs", "no")
    try:
        push.send(b"not allowed")
        wait_for(lambda: "403" in refused[1].read_text(errors="replace"), "the bridge's 403")
    finally:
        refused_log = _stop(refused)
        push.close()
    assert "403" not in allowed_log
    assert "no send right on 'jobs'" in refused_log
    assert _ready(broker, "jobs") == 0


def _bridge(
    tmp_path: Path, broker: BrokerProcess, keys: Path, port: int, queue: str, name: str
) -> tuple[subprocess.Popen, Path]:
    """`phpmq bridge pull-in` from the PUSH socket at `port` into `queue`, with the bridge's
    key from the environment."""
    log_path = tmp_path / f"bridge-{name}.log"
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "phpmq",
                "bridge",
                "pull-in",
                f"tcp://127.0.0.1:{port}",
                "--queue",
                queue,
                "--name",
                name,
                "--broker",
                broker.address,
                "--report-seconds",
                "1",  # refusals are collected (and logged) at each report
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, **environment(keys, "bridge")},
        )
    return process, log_path


def _stop(bridge: tuple[subprocess.Popen, Path]) -> str:
    process, log_path = bridge
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return log_path.read_text(errors="replace")


def _ready(broker: BrokerProcess, queue: str) -> int:
    with broker.client() as client:
        return client.admin("stats")["queues"].get(queue, {}).get("ready", 0)

