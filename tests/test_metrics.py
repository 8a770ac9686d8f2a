"""`--metrics-bind` with real processes (docs/metrics.md): a known sequence of sends, acks,
requeues, expiries and refusals through the reference client, then `/metrics` scraped over
HTTP shows exactly those counts."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import REPO, BrokerProcess, read_until
from phpmq.client import BrokerRefused
from phpmq.testing import BrokerStartError, free_ports

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape_when_up(port: int, timeout: float = 10.0) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return scrape(port)
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def scrape_until(port: int, ready: Callable[[Samples], bool], timeout: float = 5.0) -> Samples:
    """The loop publishes a new snapshot at most once a second: scrape until it shows what
    was done, then return that scrape."""
    return read_until(lambda: scrape(port), ready, timeout, 0.2)


def queue_sample(samples: Samples, name: str, queue: str, **labels: str) -> float | None:
    return samples.get((name, frozenset({"queue": queue, **labels}.items())))


def test_metrics_show_exact_counts_after_a_known_sequence(tmp_path: Path) -> None:
    with BrokerProcess(
        tmp_path / "broker.log",
        "--metrics-bind",
        "127.0.0.1:0",
        "--max-queue-length",
        "5",
        data_dir=tmp_path / "d",
    ) as broker:
        assert broker.metrics_address is not None
        port = int(broker.metrics_address.rpartition(":")[2])
        with broker.client() as producer:
            for index in range(5):
                producer.send("orders", b"order %d" % index, confirm=True)
            producer.send("short", b"a", ttl=1, confirm=True)
            producer.send("short", b"b", ttl=1, confirm=True)
        with broker.client() as latecomer, pytest.raises(BrokerRefused) as refused:
            latecomer.send("orders", b"one too many", confirm=True)  # full: 429
        with broker.client() as consumer:
            taken = []
            for message in consumer.consume("orders", window=3, timeout=5):
                taken.append(message)
                if len(taken) == 3:
                    break
            consumer.subscribe("orders", 0)  # no more dispatches: the counts stay exact
            taken[0].ack()
            taken[1].ack()
            taken[2].requeue()
        time.sleep(1.2)  # the two "short" messages expire (TTL 1 s)
        with broker.client() as holder:
            held = next(iter(holder.consume("orders", window=1, timeout=5)))
            samples = scrape_until(
                port,
                lambda s: (
                    queue_sample(s, "phpmq_queue_consumers", "orders") == 1
                    and queue_sample(s, "phpmq_queue_messages_expired_total", "short") == 2
                ),
            )
            held.ack()

    orders = {
        "phpmq_queue_messages_ready": 2,
        "phpmq_queue_messages_in_flight": 1,
        "phpmq_queue_messages_delayed": 0,
        "phpmq_queue_dead_letters": 0,
        "phpmq_queue_consumers": 1,
        "phpmq_queue_messages_leased": 0,
        "phpmq_queue_messages_published_total": 5,
        "phpmq_queue_messages_delivered_total": 4,
        "phpmq_queue_messages_acked_total": 2,
        "phpmq_queue_messages_requeued_total": 1,
        "phpmq_queue_messages_expired_total": 0,
        "phpmq_queue_messages_dead_lettered_total": 0,
    }
    assert {name: queue_sample(samples, name, "orders") for name in orders} == orders
    short = {
        "phpmq_queue_messages_ready": 0,
        "phpmq_queue_dead_letters": 2,
        "phpmq_queue_consumers": 0,
        "phpmq_queue_messages_published_total": 2,
        "phpmq_queue_messages_delivered_total": 0,
        "phpmq_queue_messages_expired_total": 2,
        "phpmq_queue_messages_dead_lettered_total": 2,
    }
    assert {name: queue_sample(samples, name, "short") for name in short} == short
    assert samples[("phpmq_received_total", frozenset())] == 7
    assert samples[("phpmq_acked_total", frozenset())] == 2
    code = str(refused.value.error.code)
    assert code == "429"
    assert samples[("phpmq_refusals_total", frozenset({("code", code)}))] == 1
    assert samples[("phpmq_peers", frozenset())] >= 1  # the holder, and the test's own
    assert samples[("phpmq_memory_held_bytes", frozenset())] > 0
    assert samples[("phpmq_process_resident_memory_bytes", frozenset())] > 10_000_000
    turns = samples[("phpmq_loop_turn_duration_seconds_count", frozenset())]
    assert turns > 0
    assert samples[("phpmq_loop_turn_duration_seconds_bucket", frozenset({("le", "+Inf")}))] == (
        turns
    )
    commits = samples[("phpmq_journal_commit_duration_seconds_count", frozenset())]
    assert commits >= 7  # one commit at least per confirmed send
    assert samples[("phpmq_journal_commits_total", frozenset())] >= commits
    assert samples[("phpmq_storage_size_bytes", frozenset())] > 0
    assert samples[("phpmq_disk_free_bytes", frozenset())] > 0
    assert samples[("phpmq_disk_low", frozenset())] == 0
    assert samples[("phpmq_storage_write_errors_total", frozenset())] == 0
    assert ("phpmq_storage_checkpoints_total", frozenset()) in samples
    assert ("phpmq_storage_puts_never_written_total", frozenset()) in samples
    assert samples[("phpmq_storage_turn_log_on", frozenset())] in (0, 1)
    assert samples[("phpmq_storage_purges_waiting", frozenset())] == 0

    # The Grafana dashboard in deploy/ asks only for metrics the broker serves.
    dashboard = (REPO / "deploy" / "grafana-dashboard.json").read_text()
    exprs = [
        target["expr"]
        for panel in json.loads(dashboard)["panels"]
        for target in panel.get("targets", [])
    ]
    wanted = {name for expr in exprs for name in re.findall(r"phpmq_\w+", expr)}
    assert len(wanted) > 15
    assert wanted <= {name for name, _ in samples}, wanted - {name for name, _ in samples}


@pytest.mark.xdist_group("shards")  # a sharded broker: one at a time
def test_each_shard_serves_its_own_metrics_with_its_name(tmp_path: Path) -> None:
    address = free_ports(2)
    metrics_port = int(free_ports(2).rpartition(":")[2])
    with BrokerProcess(
        tmp_path / "broker.log",
        "--shards",
        "2",
        "--metrics-bind",
        f"127.0.0.1:{metrics_port}",
        address=address,
    ):
        for index in range(2):
            # Shard 1 may still be starting when shard 0 answers: wait for its endpoint.
            samples = scrape_when_up(metrics_port + index)
            assert samples[("phpmq_peers", frozenset({("shard", f"local/{index}")}))] >= 0
            # In memory: no journal, so no commit histogram.
            assert not any(name.startswith("phpmq_journal") for name, _ in samples)


def test_a_taken_metrics_port_stops_the_broker_with_one_line(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "first.log", "--metrics-bind", "127.0.0.1:0") as first:
        taken = first.metrics_address
        assert taken is not None
        with pytest.raises(BrokerStartError, match=f"cannot serve metrics on {taken}: "):
            # With the TCP endpoint and a store open too: all of it closes before the exit.
            BrokerProcess(
                tmp_path / "second.log", "--metrics-bind", taken, tcp=True, data_dir=tmp_path / "d"
            )
