"""Put runs (broker/shell/put_runs.py): plain sends kept as one row a run, their dispatch and
ack as bits of it, anything rarer on stubs; what a start reads must be what rows would say.
(test_turn_log's model compares whole tables against a store of rows; these pin the paths
one by one.)"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from harness import BrokerProcess, read_folded
from phpmq.broker.journal import (
    BACK,
    CLEAR,
    DEAD,
    DELETE_QUEUE,
    DROP,
    FLY,
    LEASE_DONE,
    LEASE_TAKEN,
    PUT,
    SETTLE,
)
from phpmq.broker.shell.durable import DB_NAME, DurableStore
from phpmq.broker.shell.put_runs import RUN_MESSAGES


def put(seq: int, queue: str = "q", ttl_wall: float = 0.0) -> tuple:
    return (PUT, b"%032d" % seq, queue, seq, b"c%d" % seq, b'{"h":1}', ttl_wall, 0, b"", None,
            None, 0.0, b"")  # fmt: skip


def drop(seq: int, queue: str = "q") -> tuple:
    return (DROP, b"%032d" % seq, queue, seq)


def tables(path: Path) -> dict[str, int]:
    with sqlite3.connect(path / DB_NAME) as db:
        return {
            table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("messages", "put_runs", "run_bits")
        }


def loaded(store: DurableStore) -> dict[int, tuple[bytes, bytes, int]]:
    """seq -> (content, headers, in flight) as a start reads the store."""
    messages, _ = store.load()
    return {m.seq: (m.content, m.headers, m.in_flight) for m in messages}


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    opened = DurableStore(tmp_path)
    yield opened
    opened.close()


def test_a_filled_queue_is_runs_and_its_dispatch_and_acks_are_bits_without_a_row(
    store: DurableStore, tmp_path: Path
) -> None:
    store.commit([put(seq) for seq in range(200)])
    assert tables(tmp_path) == {"messages": 0, "put_runs": 4, "run_bits": 0}  # 63 a run
    store.commit([(FLY, "q", 0, 99)])
    store.commit([drop(seq) for seq in range(0, 90)])
    # The first run is gone whole; the second has its dispatch and acks as bits.
    assert tables(tmp_path) == {"messages": 0, "put_runs": 3, "run_bits": 1}
    found = loaded(store)
    assert sorted(found) == list(range(90, 200))
    assert found[95] == (b"c95", b'{"h":1}', 1)  # dispatched, not acked: in flight
    assert found[150] == (b"c150", b'{"h":1}', 0)
    with read_folded(tmp_path / DB_NAME) as db:  # the rows the same turns would have written
        rows = db.execute("SELECT seq, in_flight FROM messages ORDER BY seq").fetchall()
    assert rows == [(seq, int(seq < 100)) for seq in range(90, 200)]


def test_a_run_acked_in_any_order_goes_and_leaves_nothing(
    store: DurableStore, tmp_path: Path
) -> None:
    store.commit([put(seq) for seq in range(RUN_MESSAGES)])
    store.commit([(FLY, "q", 0, RUN_MESSAGES - 1)])
    for seq in reversed(range(RUN_MESSAGES)):
        store.commit([drop(seq)])
    assert tables(tmp_path) == {"messages": 0, "put_runs": 0, "run_bits": 0}


def test_a_return_stubs_the_run_without_its_content_and_the_run_goes_with_the_last_stub(
    store: DurableStore, tmp_path: Path
) -> None:
    store.commit([put(seq) for seq in range(10)])
    store.commit([(FLY, "q", 0, 9)])
    store.commit([drop(seq) for seq in range(3)])
    store.commit([(BACK, b"%032d" % 5, -1, 0.0, 1)])  # returned: ready again at the head
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        stubs = db.execute("SELECT seq, length(content), in_flight FROM messages ORDER BY seq")
        assert stubs.fetchall() == [(-1, 0, 0), *((seq, 0, 1) for seq in (3, 4, 6, 7, 8, 9))]
    assert tables(tmp_path)["run_bits"] == 0
    found = loaded(store)
    assert found[-1] == (b"c5", b'{"h":1}', 0) and found[4] == (b"c4", b'{"h":1}', 1)
    store.commit([(DROP, b"%032d" % 5, "q", -1)] + [drop(seq) for seq in (3, 4, 6, 7, 8, 9)])
    assert tables(tmp_path) == {"messages": 0, "put_runs": 0, "run_bits": 0}


def test_a_lease_is_bits_its_commit_takes_the_run_and_its_expiry_stubs_it(
    store: DurableStore, tmp_path: Path
) -> None:
    store.commit([put(seq) for seq in range(20)])
    store.commit([put(seq, "other") for seq in range(3)])  # a run no lease touches
    store.commit([(LEASE_TAKEN, "batch-1", "q", 0, 9), (LEASE_TAKEN, "batch-2", "q", 5, 14)])
    assert tables(tmp_path) == {"messages": 0, "put_runs": 2, "run_bits": 1}
    found = {m.seq: m.in_flight for m in store.load()[0] if m.queue == "q"}
    assert found == {seq: 3 if seq < 15 else 0 for seq in range(20)}
    leases = {m.seq: m.lease for m in store.load()[0] if m.queue == "q"}
    assert [leases[seq] for seq in (0, 9, 10, 14, 15)] == ["batch-1"] * 2 + ["batch-2"] * 2 + [None]
    store.commit([(LEASE_DONE, "q", "batch-1")])
    assert sorted(m.seq for m in store.load()[0] if m.queue == "q") == list(range(10, 20))
    # batch-2 expires: its messages come back at the head, one by one, by ID.
    store.commit([(BACK, b"%032d" % seq, -1 - seq, 0.0, 1) for seq in range(10, 15)])
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        stubs = db.execute("SELECT seq, in_flight, lease FROM messages ORDER BY seq").fetchall()
        stubbed = db.execute("SELECT queue, stubbed FROM put_runs ORDER BY queue").fetchall()
    assert stubs == [(-1 - seq, 0, None) for seq in reversed(range(10, 15))] + [
        (seq, 0, None) for seq in range(15, 20)
    ]
    assert stubbed == [("other", 0), ("q", 1)]  # only the run holding them
    assert loaded(store)[-11] == (b"c10", b'{"h":1}', 0)
    store.commit([(LEASE_TAKEN, "batch-3", "q", -15, 19), (LEASE_DONE, "q", "batch-3")])
    assert tables(tmp_path) == {"messages": 0, "put_runs": 1, "run_bits": 0}  # "other"


def test_a_full_queue_burying_its_oldest_finds_it_in_a_run(
    store: DurableStore, tmp_path: Path
) -> None:
    store.commit([put(seq) for seq in range(100)])
    store.commit(
        [(DEAD, "q", b"%032d" % 0, b"c0", "queue full", 0, 1.0, b'{"h":1}', b""), put(100)]
    )
    found = loaded(store)
    assert sorted(found) == list(range(1, 101))
    assert found[1] == (b"c1", b'{"h":1}', 0)


def test_a_purge_takes_ready_runs_whole_and_keeps_what_is_in_flight(
    store: DurableStore, tmp_path: Path
) -> None:
    store.commit([put(seq) for seq in range(150)])
    store.commit([(FLY, "q", 0, 2)])
    store.commit([(CLEAR, "q", 0, 149), (SETTLE,)])
    assert sorted(loaded(store)) == [0, 1, 2]  # the purge leaves what consumers hold
    store.commit([drop(seq) for seq in range(3)])
    assert tables(tmp_path) == {"messages": 0, "put_runs": 0, "run_bits": 0}
    store.commit([put(seq, "other") for seq in range(5)])
    store.commit([(FLY, "other", 0, 0), (DELETE_QUEUE, "other", 0, 4), (SETTLE,)])
    assert loaded(store) == {}


def test_an_expiring_send_or_a_gap_in_positions_is_not_in_a_run(
    store: DurableStore, tmp_path: Path
) -> None:
    store.commit([put(0), put(1, ttl_wall=4e9), put(2), put(3), put(5)])
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        assert db.execute("SELECT seq FROM messages").fetchall() == [(1,)]
        runs = db.execute("SELECT first_seq, last_seq FROM put_runs ORDER BY first_seq")
        assert runs.fetchall() == [(0, 0), (2, 3), (5, 5)]
    assert sorted(loaded(store)) == [0, 1, 2, 3, 5]


def test_an_ack_by_id_alone_as_written_before_still_finds_its_message(
    store: DurableStore, tmp_path: Path
) -> None:
    store.commit([put(seq) for seq in range(5)])
    store.commit([(FLY, "q", 0, 4), (DROP, b"%032d" % 2)])  # a left-over file's, say
    assert sorted(loaded(store)) == [0, 1, 3, 4]
    # In one turn, one in a run in flight and one in a run nothing touched: both found.
    store.commit([put(seq) for seq in (10, 11, 20)])
    store.commit([(FLY, "q", 10, 11)])
    store.commit([(DROP, b"%032d" % 10), (DROP, b"%032d" % 20)])
    assert sorted(loaded(store)) == [0, 1, 3, 4, 11]


def test_a_broker_drains_a_backlog_from_runs_writing_no_row_and_a_kill_loses_nothing(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with BrokerProcess(tmp_path / "1.log", data_dir=data) as broker, broker.client() as client:
        client.send_many("jobs", [b"m%d" % n for n in range(1000)], confirm=True)
        stream = client.consume("jobs", window=100, timeout=2)
        for taken in range(700):
            message = next(stream)
            if taken < 600:
                message.ack()
        client.stats()  # the acks are in
        counts = tables(data)
        broker.kill()  # kill -9, 100 in flight: nothing returned them
    assert counts["messages"] == 0 and counts["put_runs"] >= 7
    with BrokerProcess(tmp_path / "2.log", data_dir=data) as broker, broker.client() as client:
        left = []
        for message in client.consume("jobs", window=500, timeout=1):
            left.append((message.content, message.delivery_count))
            message.ack()
    assert sorted(content for content, _ in left) == sorted(b"m%d" % n for n in range(600, 1000))
    assert {deliveries for content, deliveries in left if content < b"m7"} == {2}  # in flight


def test_positions_a_run_spans_are_never_handed_out_again_after_a_restart(
    tmp_path: Path,
) -> None:
    """A run whose last messages are gone still spans their positions: a restart hands out
    new ones above it, or an ack of a new message would land on the old run (found by a
    review: the acked message came back at the next start). Leases keep the run as it is
    across the restart (no return stubs it)."""
    from harness import StoredCore, dispatches
    from phpmq import protocol as p
    from phpmq.protocol import admin_commands as cmd

    stored = StoredCore(tmp_path)
    stored.send(b"producer", *[p.Send("q", b"m%d" % n, 0) for n in range(10)])
    stored.admin(cmd.LEASE, queue="q", lease="spark/1", max_messages=3, max_bytes=10_000)
    stored.admin(cmd.LEASE, queue="q", lease="spark/2", max_messages=7, max_bytes=10_000)
    stored.admin(cmd.LEASE_COMMIT, queue="q", lease="spark/2")
    stored.reopened()  # spark/1 holds the first three again; the run still spans ten
    stored.send(b"producer", p.Send("q", b"new", 3600))  # a TTL: a row, not a run
    [new] = dispatches(stored.send(b"consumer", p.Consume("q", 10)))
    stored.send(b"consumer", p.Ack("q", new.message_id))
    again = stored.reopened()
    assert dispatches(again.send(b"consumer", p.Consume("q", 10))) == []
    assert again.admin(cmd.LEASE_COMMIT, queue="q", lease="spark/1")


def test_a_dead_letter_stubs_only_the_run_that_holds_it_and_none_for_a_message_never_written(
    store: DurableStore, tmp_path: Path
) -> None:
    from phpmq.broker.shell.store_schema import write

    store.commit([put(seq) for seq in range(10)])
    store.commit([put(seq) for seq in range(20, 30)])  # a gap: a second run
    store.commit([(DEAD, "q", b"%032d" % 25, b"c25", "rejected", 1, 1.0, b"", b"")])
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        runs = db.execute("SELECT first_seq, stubbed FROM put_runs ORDER BY first_seq")
        assert runs.fetchall() == [(0, 0), (20, 1)]
    assert 25 not in loaded(store) and len(loaded(store)) == 19
    # The turn log left this one's PUT out: no run is searched, none stubbed.
    db = sqlite3.connect(":memory:", isolation_level=None)
    store.backup_into(db)
    db.execute("BEGIN")
    never = b"%032d" % 99
    write(db, [(DEAD, "q", never, b"x", "rejected", 1, 1.0, b"", b"")], absent={never})
    db.execute("COMMIT")
    assert db.execute("SELECT count(*) FROM put_runs WHERE stubbed = 0").fetchone()[0] == 1


def test_a_run_takes_about_a_mebibyte_at_most(store: DurableStore, tmp_path: Path) -> None:
    big = 600 * 1024
    store.commit(
        [(*put(seq)[:4], bytes(big), *put(seq)[5:]) for seq in range(3)] + [put(3), put(4)]
    )
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        runs = db.execute("SELECT first_seq, last_seq FROM put_runs ORDER BY first_seq")
        assert runs.fetchall() == [(0, 1), (2, 4)]
    assert [len(loaded(store)[seq][0]) for seq in range(3)] == [big] * 3


def test_a_replicas_batch_as_the_raft_log_carries_it_is_written_as_rows(
    store: DurableStore, tmp_path: Path
) -> None:
    """A replica writes its sends a row each: runs would differ in shape between replicas
    (their turn logs leave out different PUTs), and a new leader avoids only the positions
    its own runs span (replication.py `_batch_decoder`)."""
    from phpmq.broker.shell.replication import _batch_decoder, _batch_encoder

    turn = [put(seq) for seq in range(100)] + [(FLY, "q", 0, 9)]
    store.commit(_batch_decoder.decode(_batch_encoder.encode(turn)))
    assert tables(tmp_path) == {"messages": 100, "put_runs": 0, "run_bits": 0}
    store.commit(_batch_decoder.decode(_batch_encoder.encode([drop(seq) for seq in range(5)])))
    assert sorted(loaded(store)) == list(range(5, 100))
