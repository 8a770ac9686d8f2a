"""`phpmq publish`, `bind`, `unbind`, `rebind`, `subscribe` and `workers --bind`, run as
subprocesses against a real broker (skipped while it does not route events), and their
mistakes: one line on stderr, exit 1, no traceback, before any broker is asked."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import REPO, BrokerProcess, free_port, phpmq


@pytest.fixture
def events_broker(broker: BrokerProcess) -> BrokerProcess:
    if "published" not in broker.stats()["counters"]:
        pytest.skip("this broker does not route events yet (docs/protocol.md §6.5)")
    return broker


@pytest.mark.parametrize(
    "command",
    [
        ("publish", "order.*", "x"),
        ("bind", "q", "a..b"),
        ("unbind", "q", "user*"),
        ("rebind", "q", "--add", "has space"),
        ("subscribe", "a.#.b.", "--count", "1"),
    ],
)
def test_a_bad_event_or_pattern_fails_with_one_line(command: tuple[str, ...]) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    result = phpmq(*command, "--broker", address, "--timeout", "0.5", timeout=10)
    assert result.returncode == 1, result
    assert result.stderr.startswith("phpmq: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_unbind_without_patterns_is_a_usage_error() -> None:
    result = phpmq("unbind", "q")
    assert result.returncode == 2 and "PATTERN or --remove-mask" in result.stderr


def test_bind_publish_and_change_bindings(events_broker: BrokerProcess) -> None:
    address = ["--broker", events_broker.address]
    bound = phpmq("bind", *address, "billing", "order.*", "audit.#")
    assert bound.returncode == 0, bound.stderr
    assert bound.stdout == "order.* audit.#\n" and bound.stderr == "billing: 2 bindings\n"
    published = phpmq("publish", *address, "order.paid", "17", "--ttl", "60", "--key", "o-17")
    assert published.returncode == 0, published.stderr
    assert published.stdout == "published order.paid to 1 queue\n"
    nothing = phpmq("publish", *address, "user.created", "-", stdin="ada")
    assert nothing.stdout == "published user.created to 0 queues\n"
    listed = phpmq("queue", "list", *address)
    assert "order.*" in listed.stdout and "audit.#" in listed.stdout, listed.stdout
    unbound = phpmq("unbind", *address, "billing", "audit.#")
    assert unbound.stdout == "order.*\n"
    masked = phpmq("unbind", *address, "billing", "--remove-mask", "order.*")
    assert masked.stdout == "(no bindings)\n" and masked.stderr == "billing: 0 bindings\n"
    rebound = phpmq("rebind", *address, "billing", "--add", "a.b", "--add", "c.*")
    assert rebound.stdout == "a.b c.*\n"
    replaced = phpmq("rebind", *address, "billing", "--no-bindings", "--add", "x.y")
    assert replaced.stdout == "x.y\n"
    missing = phpmq("unbind", *address, "nope", "a.b")
    assert missing.returncode == 1 and missing.stderr.startswith("phpmq: broker refused")
    assert "404" in missing.stderr


def test_subscribe_prints_the_live_feed_until_count(events_broker: BrokerProcess) -> None:
    args = ["subscribe", "--broker", events_broker.address, "metric.#", "--count", "2", "--json"]
    feed = subprocess.Popen(
        [sys.executable, "-m", "phpmq", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with events_broker.client() as client:
            deadline = time.monotonic() + 10
            while not client.publish("metric.cpu", b"0.5") and time.monotonic() < deadline:
                time.sleep(0.05)  # until the feed's queue is bound
            assert client.publish("metric.disk.free", b"12") == 1
        out, err = feed.communicate(timeout=15)
    finally:
        if feed.poll() is None:
            feed.kill()
            feed.wait(5)
    assert feed.returncode == 0, err
    lines = out.splitlines()
    assert '"event":"metric.cpu"' in lines[0] and '"content":"0.5"' in lines[0]
    assert '"event":"metric.disk.free"' in lines[1] and err.endswith("2 events\n")
    time.sleep(0.3)
    assert not [q for q in events_broker.stats()["queues"] if q.startswith("live.")]


def test_subscribe_for_a_time_prints_nothing_when_nothing_is_published(
    events_broker: BrokerProcess,
) -> None:
    result = phpmq("subscribe", "--broker", events_broker.address, "quiet.#", "--for", "0.3")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == "0 events\n"


HANDLER = """
import pathlib

def handle(message):
    # Written then renamed, so the test never reads a file that exists but is still empty.
    partial = pathlib.Path("handled.partial")
    partial.write_text(f"{message.event} {message.content.decode()}")
    partial.replace("handled.txt")
"""


def test_workers_bind_their_queue_to_the_patterns(
    tmp_path: Path, events_broker: BrokerProcess
) -> None:
    (tmp_path / "event_tasks.py").write_text(HANDLER)
    args = ["event_tasks:handle", "-q", "orders", "--bind", "order.*"]
    pool = subprocess.Popen(
        [sys.executable, "-m", "phpmq", "workers", *args, "--broker", events_broker.address],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    handled = tmp_path / "handled.txt"
    try:
        with events_broker.client() as client:
            deadline = time.monotonic() + 20
            while not client.publish("order.paid", b"17") and time.monotonic() < deadline:
                time.sleep(0.1)  # until a worker's consume bound the queue
        while not handled.exists() and pool.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert handled.exists(), f"no worker handled the event; pool status {pool.poll()}"
        assert handled.read_text() == "order.paid 17"
        # The queue deleted under the pool: its worker starts over and binds it again.
        handled.unlink()
        with events_broker.client() as client:
            assert client.delete_queue("orders")["bindings"] == 1
            deadline = time.monotonic() + 20
            while not client.publish("order.sent", b"18") and time.monotonic() < deadline:
                time.sleep(0.1)
        while not handled.exists() and pool.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert handled.exists() and handled.read_text() == "order.sent 18"
    finally:
        pool.terminate()
        try:
            pool.wait(15)
        except subprocess.TimeoutExpired:
            pool.kill()
            pool.wait(5)
