"""`phpmq queue list|peek|purge|delete`, run as subprocesses against real brokers, and the
purge and delete surviving a `kill -9` of a durable broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import BrokerProcess, phpmq
from phpmq.client import QueueDeleted


def stats_queues(address: str) -> dict:
    return json.loads(phpmq("stats", "--broker", address, "--json").stdout)["queues"]


def test_list_and_peek_show_messages_without_taking_them(broker: BrokerProcess) -> None:
    address = ["--broker", broker.address]
    with broker.client() as client:
        client.send_many("emails", [b"first", b"second", b"third"], confirm=True)
        client.send("other", b"x", ttl=60, confirm=True)
    listed = phpmq("queue", "list", *address)
    assert listed.returncode == 0, listed.stderr
    assert "emails" in listed.stdout and "other" in listed.stdout and "dead" in listed.stdout
    peek = phpmq("queue", "peek", *address, "emails", "-n", "2")
    assert peek.returncode == 0, peek.stderr
    rows = peek.stdout.splitlines()
    assert len(rows) == 2 and rows[0].endswith("first") and rows[1].endswith("second")
    assert "deliveries=0" in rows[0]
    assert peek.stderr == "2 of 3 ready in emails\n"
    assert stats_queues(broker.address)["emails"]["ready"] == 3
    with broker.client() as client:
        message = next(client.consume("emails", window=1, timeout=5))
        assert message.content == b"first"
        assert message.delivery_count == 1  # the peek counted no delivery


def test_purge_deletes_ready_messages_and_keeps_the_queue(broker: BrokerProcess) -> None:
    address = ["--broker", broker.address]
    with broker.client() as client:
        client.send_many("work", [b"a", b"b"], confirm=True)
    declined = phpmq("queue", "purge", *address, "work", stdin="n\n")
    assert (declined.returncode, declined.stderr) == (1, "phpmq: aborted\n")
    assert stats_queues(broker.address)["work"]["ready"] == 2
    purged = phpmq("queue", "purge", *address, "work", stdin="y\n")
    assert purged.returncode == 0, purged.stderr
    assert "purged 2 messages from work" in purged.stdout
    assert stats_queues(broker.address)["work"]["ready"] == 0
    unknown = phpmq("queue", "purge", *address, "nope", "--yes")
    assert unknown.returncode == 1 and unknown.stderr == "phpmq: no queue named 'nope'\n"


def test_delete_removes_a_queue_in_use_and_says_what_went_with_it(broker: BrokerProcess) -> None:
    address = ["--broker", broker.address]
    with broker.client() as consumer:
        consumer.send_many("busy", [b"held", b"ready"], confirm=True)
        consumer.bind("busy", "busy.#")
        assert next(consumer.consume("busy", window=1, timeout=5)).content == b"held"
        deleted = phpmq("queue", "delete", *address, "busy", "--yes")
        assert deleted.returncode == 0, deleted.stderr
        assert deleted.stdout == (
            "deleted queue busy: 1 ready messages, 1 in flight, 0 delayed, 0 dead letters,"
            " 1 bindings, 1 consumers told\n"
        )
        with pytest.raises(QueueDeleted):
            consumer.receive(5)
    assert "busy" not in stats_queues(broker.address)
    missing = phpmq("queue", "delete", *address, "busy", "--yes")
    assert missing.returncode == 1 and missing.stderr == "phpmq: no queue named 'busy'\n"


def test_purge_and_delete_survive_a_crash_of_a_durable_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with BrokerProcess(tmp_path / "first.log", data_dir=data) as first:
        address = ["--broker", first.address]
        with first.client() as client:
            client.send_many("purged", [b"1", b"2", b"3"], confirm=True)
            client.send_many("kept", [b"k"], confirm=True)
            client.send_many("deleted", [b"d1", b"d2"], confirm=True)
            next(client.consume("deleted", window=1, timeout=5)).dead_letter("bad")
            client.subscribe("deleted", 0)
        assert phpmq("queue", "purge", *address, "purged", "--yes").returncode == 0
        deleted = phpmq("queue", "delete", *address, "deleted", "--yes")
        assert deleted.stdout.startswith("deleted queue deleted: 1 ready messages")
        assert "1 dead letters" in deleted.stdout
        first.kill()
    with BrokerProcess(tmp_path / "second.log", data_dir=data) as second:
        queues = second.stats()["queues"]
    assert queues["kept"]["ready"] == 1
    assert queues.get("purged", {"ready": 0})["ready"] == 0
    assert "deleted" not in queues


def test_an_orphaned_lease_is_listed_and_released_by_command(broker: BrokerProcess) -> None:
    """A Spark query that died with a batch leased (docs/pipeline.md) leaves a lease: `queue
    list` counts it, `queue leases` names it, `queue release` puts its messages back now."""
    address = ["--broker", broker.address]
    with broker.client() as client:
        client.send_many("events", [b"a", b"b", b"c", b"d"], confirm=True)
        leased = client.admin(
            "lease", queue="events", lease="r1/1", max_messages=3, max_bytes=1 << 20
        )
        assert leased["messages"] == 3
    listed = phpmq("queue", "list", *address)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "events" in line)
    assert "3 (1 lease)" in row
    leases = phpmq("queue", "leases", *address, "events")
    assert leases.returncode == 0, leases.stderr
    row = next(line for line in leases.stdout.splitlines() if "r1/1" in line)
    assert row.split("│")[3].strip() == "3" and leases.stderr == "1 leases\n"
    assert "r1/1" in phpmq("queue", "leases", *address).stdout  # every queue's
    released = phpmq("queue", "release", *address, "events", "r1/1", "--yes")
    assert released.returncode == 0, released.stderr
    assert released.stdout == "released 3 messages of lease r1/1 back to events\n"
    queue = stats_queues(broker.address)["events"]
    assert (queue["ready"], queue["leased"], queue["leases"]) == (4, 0, 0)
    again = phpmq("queue", "release", *address, "events", "r1/1", "--yes")
    assert again.returncode == 1
    assert again.stderr == (
        "phpmq: no lease 'r1/1' on queue 'events' (committed, released or timed out)\n"
    )
