"""Durability (--data-dir): a broker killed with SIGKILL comes back with what it held."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

import phpmq.protocol as p
from harness import FIRST_MESSAGES_TABLE, BrokerProcess, dispatches, free_port, phpmq, read_folded
from phpmq.broker.clock import FakeClock
from phpmq.broker.config import BrokerConfig
from phpmq.broker.core import Core
from phpmq.broker.journal import DROP, Journal
from phpmq.broker.shell.durable import DurableStore, StorageError


def test_a_killed_broker_recovers_order_ttl_delivery_counts_and_dead_letters(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    address = f"tcp://127.0.0.1:{free_port()}"
    first = BrokerProcess(tmp_path / "1.log", "--data-dir", str(data), address=address)
    try:
        with first.client() as client:
            client.send_many("jobs", [b"m%d" % i for i in range(100)])
            client.send("jobs", b"short-lived", ttl=1)
            client.send("jobs", b"long-lived", ttl=3600)
            stream = client.consume("jobs", window=2, timeout=5)
            held = [next(stream) for _ in range(2)]
            held[0].ack()  # acked: must not come back
            held[1].dead_letter("bad input")
            client.flush()
            time.sleep(0.3)  # settled; m2 and m3 went to this client's prefetch and return
            # unstarted when it closes (never handed out: not a delivery)
        consumer = first.client()
        assert next(consumer.consume("jobs", window=2, timeout=5)).content == b"m2"
        time.sleep(0.3)  # m2 and m3 are in flight (delivery 1) when the broker is killed
        first.kill()
        consumer.close()
        time.sleep(1.1)  # the short-lived message expires while the broker is down
        second = BrokerProcess(tmp_path / "2.log", "--data-dir", str(data), address=address)
        try:
            log = second.log()
            assert "recovered" in log and "were in flight" in log
            with second.client() as client:
                got = []
                for message in client.consume("jobs", window=200, timeout=1):
                    got.append(message)
                    message.ack()
                dead = client.admin("dlq-list", queue="jobs")
        finally:
            second.stop()
    finally:
        first.stop()
    contents = [m.content for m in got]
    # m0 acked; m1 dead-lettered; m2 and m3 were in flight at the kill: back, in their order,
    # with one more delivery.
    assert contents[:3] == [b"m2", b"m3", b"m4"]
    assert contents[-1] == b"long-lived" and b"short-lived" not in contents
    assert len(contents) == 99
    counts = {m.content: m.delivery_count for m in got}
    # The first client never handed m2 and m3 out (no delivery); the second held them at
    # the kill (one delivery, counted when the restart took them back).
    assert (counts[b"m2"], counts[b"m3"], counts[b"m4"]) == (2, 2, 1)
    long_lived = next(m for m in got if m.content == b"long-lived")
    assert 3590 <= long_lived.ttl < 3600
    reasons = {entry["reason"] for entry in dead["entries"]}
    assert reasons == {"bad input", "expired"}


def test_the_broker_states_its_mode_at_start(broker: BrokerProcess, tmp_path: Path) -> None:
    assert "in memory" in broker.log()
    assert broker.stats()["storage"] == {"mode": "memory"}
    durable = BrokerProcess(tmp_path / "d.log", "--data-dir", str(tmp_path / "d"))
    try:
        storage = durable.stats()["storage"]
        assert storage["data_dir"] == str(tmp_path / "d")
        assert storage["size_bytes"] > 0
        assert {"fsyncs_per_s", "last_commit_ms", "commits"} <= set(storage)
    finally:
        durable.stop()


class BrokenStore(DurableStore):
    """The store with a failure seam: commits fail while `full` is set (a full disk)."""

    full = False

    def commit(self, operations, copy_first=False):  # type: ignore[no-untyped-def]
        if self.full:
            raise StorageError("database or disk is full")
        super().commit(operations, copy_first)


def test_a_full_disk_refuses_sends_keeps_serving_and_recovers(tmp_path: Path) -> None:
    from phpmq.broker.shell.server import BrokerServer

    server = BrokerServer(BrokerConfig(bind="tcp://127.0.0.1:*", data_dir=str(tmp_path / "d")))
    try:
        server.keeper.store.close()  # the data directory's lock passes to the broken store
        store = BrokenStore(tmp_path / "d")
        server.store = server.keeper.store = store
        core = server.core
        core.admin.stats.add_section("storage", store.stats)
        hello = p.encode(p.Hello({}))
        core.begin_turn()
        core.handle_frame(b"c", hello + p.encode(p.Consume("q", 10)))
        core.handle_frame(b"p", hello + p.encode(p.Send("q", b"before", 0)))
        core.end_turn()
        server._commit()
        store.full = True
        core.begin_turn()
        core.handle_frame(b"p", p.encode(p.Send("q", b"while full 1", 0)))
        out = dict(core.end_turn().frames)
        server._commit()  # fails: sends are refused from now on
        core.begin_turn()
        core.handle_frame(b"p", p.encode(p.Send("q", b"while full 2", 0)))
        out = dict(core.end_turn().frames)
        [refusal] = p.decode_frame(out[b"p"])[0]
        assert refusal.code == p.ErrorCode.INSUFFICIENT_STORAGE and "full" in refusal.reason
        store.full = False
        server._commit()
        assert core.storage_problem is None
        with read_folded(store.path) as db:  # (its put runs as rows)
            stored = {row[0] for row in db.execute("SELECT content FROM messages")}
        assert stored == {b"before", b"while full 1"}
    finally:
        server.router.close(0)
        server._context.term()


def test_a_send_accepted_while_the_disk_fails_is_confirmed_only_once_written(
    tmp_path: Path,
) -> None:
    from phpmq.broker.shell.server import BrokerServer

    server = BrokerServer(BrokerConfig(bind="tcp://127.0.0.1:*", data_dir=str(tmp_path / "d")))
    sent: list[tuple[bytes, bytes]] = []
    server._send = sent.extend  # type: ignore[method-assign]
    try:
        server.keeper.store.close()  # the data directory's lock passes to the broken store
        store = BrokenStore(tmp_path / "d")
        server.store = server.keeper.store = store
        core = server.core

        def turn(*messages: p.Message) -> list[p.Message]:
            sent.clear()
            core.begin_turn()
            if messages:
                core.handle_frame(b"p", p.encode_all(list(messages)))
            server._commit_and_send(core.end_turn())
            return [m for _, frame in sent for m in p.decode_frame(frame)[0]]

        [confirm] = turn(p.Send("q", b"before", 0, tag=1))
        assert isinstance(confirm, p.Confirm) and confirm.tag == 1
        store.full = True
        assert turn(p.Send("q", b"taken as the disk fills", 0, tag=2)) == []  # not on disk
        [refusal] = turn(p.Send("q", b"refused", 0, tag=3))
        assert (refusal.code, refusal.tag) == (p.ErrorCode.INSUFFICIENT_STORAGE, 3)
        assert turn() == []  # still failing: still not confirmed
        store.full = False
        [late] = turn()  # the retried commit succeeds: now it is on disk, and confirmed
        assert isinstance(late, p.Confirm) and late.tag == 2
        with read_folded(store.path) as db:  # (its put runs as rows)
            stored = {row[0] for row in db.execute("SELECT content FROM messages")}
        assert stored == {b"before", b"taken as the disk fills"}
    finally:
        server.router.close(0)
        server._context.term()


def test_the_store_rebuilds_a_core_exactly(tmp_path: Path) -> None:
    """Journal -> SQLite -> a fresh core: same queues, order, counts, dead letters."""
    clock = FakeClock()
    core = Core(BrokerConfig(), clock, journal=Journal())
    store = DurableStore(tmp_path)
    core.begin_turn()
    core.handle_frame(b"p", p.encode_all([p.Send("a", b"%d" % i, 0) for i in range(5)]))
    core.handle_frame(b"c", p.encode_all([p.Hello({}), p.Consume("a", 2)]))
    out = dict(core.end_turn().frames)
    first, second = dispatches(p.decode_frame(out[b"c"])[0])
    core.begin_turn()
    settle = [p.Ack("a", first.message_id), p.Requeue("a", second.message_id, 0)]
    core.handle_frame(b"c", p.encode_all(settle))
    core.end_turn()
    store.commit(core.journal.take())
    messages, dead = store.load()
    fresh = Core(BrokerConfig(), FakeClock())
    fresh.restore(messages, dead)
    original = [(r.content, r.deliveries) for r in core.queues["a"].ready if r.state == 0]
    rebuilt = [(r.content, r.deliveries) for r in fresh.queues["a"].ready]
    held = [r for window in core.queues["a"].windows for r in window.held.values()]
    in_flight = [(r.content, r.deliveries + 1) for r in held]
    assert sorted(rebuilt) == sorted(original + in_flight)
    assert [c for c, _ in rebuilt][-1] == second.content  # requeued to the tail
    store.close()


def test_a_crash_counts_a_delivery_for_exactly_the_messages_in_flight(tmp_path: Path) -> None:
    """Dispatch is journaled as one seq range per queue and pass: the range must take the
    dispatched messages and nothing around them (ready ones after it, a delayed requeue,
    a message returned to the head and waiting again)."""
    core = Core(BrokerConfig(), FakeClock(), journal=Journal())
    store = DurableStore(tmp_path)

    def turn(*inputs: tuple[bytes, list[p.Message]]) -> dict[bytes, list[p.Message]]:
        core.begin_turn()
        for peer, messages in inputs:
            core.handle_frame(peer, p.encode_all(messages))
        out = {peer: p.decode_frame(frame)[0] for peer, frame in core.end_turn().frames}
        store.commit(core.journal.take())
        return out

    turn((b"p", [p.Send("q", c, 0) for c in (b"a", b"b", b"c", b"d", b"e", b"f")]))
    out = turn((b"c1", [p.Hello({}), p.Consume("q", 2)]))
    a, b = dispatches(out[b"c1"])
    out = turn((b"c1", [p.Requeue("q", b.message_id, 0, delay_ms=60_000)]))  # b delayed
    [c] = dispatches(out[b"c1"])
    out = turn((b"c2", [p.Hello({}), p.Consume("q", 1)]))
    [d] = dispatches(out[b"c2"])
    turn((b"c2", [p.Kbai()]))  # d back to the head; c1 is full, so it waits there
    assert [m.content for m in (a, b, c, d)] == [b"a", b"b", b"c", b"d"]

    def rebuilt() -> list[tuple[bytes, int]]:
        fresh = Core(BrokerConfig(), FakeClock())
        fresh.restore(*store.load())
        return [(r.content, r.deliveries) for r in fresh.queues["q"].ready]

    # a and c were in flight: one more delivery; b's delay counted its delivery already;
    # d came back to the head with its count; e and f were never dispatched.
    assert rebuilt() == [(b"d", 2), (b"a", 2), (b"c", 2), (b"e", 1), (b"f", 1), (b"b", 2)]
    # One pass now spans the delayed b (its seq lies between f's and g's): it stays delayed.
    turn((b"p", [p.Send("q", b"g", 0)]))
    out = turn((b"c1", [p.Ack("q", a.message_id), p.Ack("q", c.message_id), p.Consume("q", 4)]))
    assert [m.content for m in dispatches(out[b"c1"])] == [b"d", b"e", b"f", b"g"]
    assert rebuilt() == [(b"d", 3), (b"e", 2), (b"f", 2), (b"b", 2), (b"g", 2)]
    store.close()


def test_an_unusable_data_dir_stops_the_broker_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(RuntimeError, match="cannot open the data directory"):
        BrokerProcess(tmp_path / "b.log", "--data-dir", str(blocker / "sub")).stop()


def test_a_second_broker_on_a_data_dir_in_use_names_the_holder_and_exits(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = BrokerProcess(tmp_path / "1.log", "--data-dir", str(data))
    try:
        with first.client() as client:
            client.send_many("jobs", [b"m%d" % i for i in range(20)], confirm=True)
        bind = f"tcp://127.0.0.1:{free_port()}"
        second = phpmq("broker", "--bind", bind, "--data-dir", str(data), timeout=20)
        assert second.returncode == 1
        [line] = second.stderr.strip().splitlines()
        assert line.startswith("phpmq: the data directory") and "in use" in line
        assert f"(pid {first.process.pid})" in line
        with first.client() as client:  # the first is untouched and still alone on its store
            assert len(list(client.consume("jobs", window=50, timeout=0.5))) == 20
    finally:
        first.kill()  # the kernel releases a dead holder's lock: kill -9 leaves none behind
    again = BrokerProcess(tmp_path / "2.log", "--data-dir", str(data))
    try:
        assert again.stats()["queues"]["jobs"]["ready"] == 20
        assert (data / "phpmq.lock").read_text().strip() == str(again.process.pid)
    finally:
        again.stop()


def test_a_store_written_with_text_ids_is_read_back_with_byte_ids(tmp_path: Path) -> None:
    """Stores from before IDs were bytes hold them as TEXT, which never equals a BLOB: an ack
    of such a message would be refused after the upgrade unless the store converts them."""
    DurableStore(tmp_path).close()
    with sqlite3.connect(tmp_path / "phpmq.sqlite3") as db:
        db.execute(
            "INSERT INTO messages (id, queue, seq, content, headers, expires_wall, deliveries,"
            " in_flight) VALUES ('a1', 'q', 1, x'61', x'', 0, 1, 1)"
        )
        # Keys were a row each then (store_schema.keys_into_batches moves them at open).
        db.execute("CREATE TABLE keys (queue, key, id, expires_wall, PRIMARY KEY (queue, key))")
        db.execute("INSERT INTO keys VALUES ('q', 'k', 'a1', 9e99)")
    store = DurableStore(tmp_path)
    [message], _ = store.load()
    [key] = store.load_keys()
    assert (message.id, key.id) == (b"a1", b"a1")
    store.commit([(DROP, b"a1")])  # what an ack journals: it finds the converted row
    assert store.load() == ([], [])
    store.close()


def test_a_store_written_before_events_gets_an_event_column(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "phpmq.sqlite3") as db:
        db.execute(FIRST_MESSAGES_TABLE)
        db.execute("INSERT INTO messages VALUES (x'6131', 'q', 1, x'61', x'', 0, 1, 0)")
    store = DurableStore(tmp_path)
    [message], _ = store.load()
    assert (message.id, message.event) == (b"a1", b"")
    store.close()
