"""A purge or delete of a big queue answers in its own turn and leaves the rest to later turns
(broker/queues.py, broker/shell/store_purges.py; docs/durability.md "Purging a big queue"):
the records are retired and the store's rows deleted a slice at a time, and nothing purged
comes back, whatever is killed when."""

from __future__ import annotations

import base64
import sqlite3
import threading
import time
from pathlib import Path

import msgspec
import pytest
from test_core_liveness import hello

import phpmq.protocol as p
from harness import BrokerProcess, CoreHarness, StoredCore, abandon, dispatches
from phpmq.broker import queues
from phpmq.broker.config import BrokerConfig
from phpmq.broker.shell import keeper as keeper_module
from phpmq.broker.shell import store_purges
from phpmq.broker.shell.durable import DB_NAME, DurableStore, StorageError
from phpmq.broker.shell.store_schema import read_put_runs
from phpmq.protocol import admin_commands as cmd

PRODUCER, CONSUMER = b"producer", b"consumer"
#: Small slices, so that a few hundred messages take several turns.
PER_TURN, SLICE_ROWS = 100, 40


@pytest.fixture(autouse=True)
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queues, "PURGE_PER_TURN", PER_TURN)
    monkeypatch.setattr(store_purges, "SLICE_ROWS", SLICE_ROWS)


#: A TTL the tests never reach: a message with one is a row at once (put runs keep only
#: messages that never expire, put_runs.py), for the purges' slices to delete.
LONG_TTL = 3600


def fill(core: CoreHarness | StoredCore, count: int, queue: str = "q", ttl: int = LONG_TTL) -> None:
    for start in range(0, count, 100):
        core.send(
            PRODUCER,
            *[p.Send(queue, b"old-%d" % n, ttl) for n in range(start, min(count, start + 100))],
        )


def contents_on_disk(path: Path, queue: str = "q") -> list[bytes]:
    """The contents of the queue's rows, and of its messages in put runs."""
    with sqlite3.connect(path / DB_NAME) as db:
        rows = db.execute("SELECT content FROM messages WHERE queue = ?", (queue,))
        in_runs = [m.content for m in read_put_runs(db) if m.queue == queue]
        return [row[0] for row in rows] + in_runs


def test_a_big_purge_answers_at_once_and_retires_a_slice_a_turn() -> None:
    core = CoreHarness()
    empty = core.core.ctx.held_bytes
    fill(core, 3 * PER_TURN + 7)
    assert core.admin(cmd.QUEUE_PURGE, queue="q")["purged"] == 3 * PER_TURN + 7
    assert core.stats("q")["ready"] == 0
    assert core.core.ctx.held_bytes > empty  # set aside, retired over the next turns
    core.send(PRODUCER, p.Send("q", b"new"))
    turns = 0
    while core.core.ctx.held_bytes > empty + 1_000:  # (the new message: about 200 bytes)
        core.advance(0.001)
        core.turn()
        turns += 1
    assert turns == 4
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("q", 10)))
    assert dispatch.content == b"new"


def test_ttls_due_while_a_purge_retires_bury_only_what_was_not_purged() -> None:
    """A TTL that comes due while its record waits to be retired would bury a purged message
    as expired: such TTLs wait until the purge is done, and only a record still ready then
    (sent after the purge) expires."""
    core = CoreHarness()
    fill(core, 3 * PER_TURN, ttl=1)
    core.admin(cmd.QUEUE_PURGE, queue="q")
    core.send(PRODUCER, p.Send("q", b"new", 1))
    core.advance(2)
    for _ in range(5):
        core.turn()
        core.advance(0.001)
    dead = core.admin(cmd.DLQ_LIST, queue="q")["entries"]
    assert [base64.b64decode(entry["content"]) for entry in dead] == [b"new"]
    assert core.core.counters.expired == 1


def test_a_kill_before_the_store_deleted_the_purged_rows_brings_none_back(
    tmp_path: Path,
) -> None:
    """The purge marks a range; its rows go a slice per commit. Killed part-way, the store
    brings back exactly what was not purged: the messages in flight at the purge and those
    sent after it."""
    stored = StoredCore(tmp_path)
    fill(stored, 5 * PER_TURN)
    held = dispatches(stored.send(CONSUMER, p.Consume("q", 3)))
    assert stored.admin(cmd.QUEUE_PURGE, queue="q")["purged"] == 5 * PER_TURN - 3
    stored.send(PRODUCER, p.Send("q", b"after"))
    assert len(contents_on_disk(tmp_path)) > 100  # most still on disk, marked
    restarted = stored.reopened()
    got = dispatches(restarted.send(CONSUMER, p.Consume("q", 100)))
    assert sorted(d.content for d in got) == sorted([b"after", *(d.content for d in held)])


def test_a_dispatch_spanning_a_purged_range_marks_none_of_it_in_flight(tmp_path: Path) -> None:
    """A message handed back unstarted goes to the head, below the purged range; one sent
    after goes above it; one turn dispatches both, and the store's FLY over that range must
    not take the purged rows waiting there with it (they would come back after a restart as
    messages that were in flight)."""
    stored = StoredCore(tmp_path)
    fill(stored, 5 * PER_TURN)
    [first] = dispatches(stored.send(CONSUMER, p.Consume("q", 1)))
    stored.send(CONSUMER, p.Consume("q", 0))
    stored.admin(cmd.QUEUE_PURGE, queue="q")
    stored.send(PRODUCER, p.Send("q", b"after"))
    stored.send(CONSUMER, p.Requeue("q", first.message_id, 0, flags=p.REQUEUE_UNSTARTED))
    got = dispatches(stored.send(CONSUMER, p.Consume("q", 10)))
    assert [d.content for d in got] == [first.content, b"after"]
    restarted = stored.reopened()  # both were in flight: back, and nothing else
    again = dispatches(restarted.send(CONSUMER, p.Consume("q", 100)))
    assert sorted(d.content for d in again) == sorted([first.content, b"after"])


def test_the_store_deletes_the_purged_rows_a_slice_a_commit(tmp_path: Path) -> None:
    stored = StoredCore(tmp_path)
    fill(stored, 3 * PER_TURN)
    stored.admin(cmd.QUEUE_PURGE, queue="q")
    left = [len(contents_on_disk(tmp_path))]
    while left[-1]:
        stored.turn()
        left.append(len(contents_on_disk(tmp_path)))
    assert left == list(range(left[0], -1, -SLICE_ROWS)) + ([0] if left[0] % SLICE_ROWS else [])
    assert not stored.store.purging


def test_a_deleted_queue_s_rows_and_dead_letters_go_in_slices_and_its_new_namesake_stays(
    tmp_path: Path,
) -> None:
    stored = StoredCore(tmp_path)
    fill(stored, 3 * PER_TURN)
    held = dispatches(stored.send(CONSUMER, p.Consume("q", 5)))
    dead = [p.DeadLetter("q", dispatch.message_id, "bad") for dispatch in held]
    stored.send(CONSUMER, *dead, p.Consume("q", 0))
    answer = stored.admin(cmd.QUEUE_DELETE, queue="q")
    assert (answer["purged"], answer["dead_letters"]) == (3 * PER_TURN - 5, 5)
    stored.send(PRODUCER, p.Send("q", b"namesake"))  # a new queue of the same name
    restarted = stored.reopened()
    got = dispatches(restarted.send(CONSUMER, p.Consume("q", 100)))
    assert [d.content for d in got] == [b"namesake"]
    assert restarted.admin(cmd.DLQ_LIST, queue="q")["entries"] == []
    assert contents_on_disk(tmp_path) == [b"namesake"]  # the restart finished the rest


def test_positions_a_purge_covered_are_never_handed_out_again(tmp_path: Path) -> None:
    """A replica elected later may have finished its markers while another still has them
    waiting: a message it places must not fall in their range there."""
    stored = StoredCore(tmp_path)
    fill(stored, 3 * PER_TURN)
    stored.admin(cmd.QUEUE_PURGE, queue="q")
    while stored.store.purging:
        stored.turn()
    lo, hi = stored.store.load_purged_seqs() or (0, 0)
    stored.store.read_done()
    restarted = stored.reopened()
    restarted.send(PRODUCER, p.Send("q", b"later"))
    [record] = restarted.core.queues["q"].ready
    assert not lo <= record.seq <= hi  # type: ignore[attr-defined]


def held_behind_ready(stored: StoredCore) -> p.Dispatch:
    """A message in flight with more than a slice of ready ones before it in position (the
    others handed back to the head): a purge marker's slices reach its position only after
    some commits, so a BACK there in between is inside what they still delete."""
    fill(stored, 5 * PER_TURN)
    held = dispatches(stored.send(CONSUMER, p.Consume("q", 2 * SLICE_ROWS + 1)))
    handed_back = [
        p.Requeue("q", dispatch.message_id, 0, flags=p.REQUEUE_UNSTARTED) for dispatch in held[:-1]
    ]
    stored.send(CONSUMER, p.Consume("q", 0), *handed_back)
    return held[-1]


def test_a_replica_promoted_while_a_purge_marker_waits_keeps_what_was_in_flight(
    tmp_path: Path,
) -> None:
    stored = StoredCore(tmp_path)
    abandon(stored.store)
    stored.store = DurableStore(tmp_path, synchronous="OFF", fold_on_read=False)  # a replica
    held = held_behind_ready(stored)
    stored.admin(cmd.QUEUE_PURGE, queue="q")
    assert stored.store.purging  # the marker waits (leader dies now; this replica is elected)
    stored.recovered()  # a promotion: the same store, read and recovered by a new core
    assert stored.core.stats("q")["ready"] == 1  # in memory: back, as it should be
    while stored.store.purging:  # the replica's store works through the marker
        stored.turn()
    restarted = stored.reopened()  # the new leader restarts (or fails over again)
    got = dispatches(restarted.send(CONSUMER, p.Consume("q", 10)))
    assert [d.content for d in got] == [held.content]


def test_left_over_operations_with_a_purge_written_after_recovery_keep_what_was_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: the purge's turn could not be written and went to the left-over file at
    the stop; the restart cannot write it either (read_with), recovery journals BACK for the
    in-flight message at its stored seq, and once there is room the keeper writes the CLEAR
    (a marker) and then that BACK (ready, inside the marked range) in one go."""
    stored = StoredCore(tmp_path)
    held = held_behind_ready(stored)
    stored.core.admin(cmd.QUEUE_PURGE, queue="q")
    unwritten = stored.core.core.journal.take()  # the commit failed: a full disk
    (tmp_path / keeper_module.LEFT_OVER_NAME).write_bytes(msgspec.msgpack.encode(unwritten))
    abandon(stored.store)

    real_commit, failing = DurableStore.commit, [True]

    def commit(self, operations, copy_first=False):  # still full at the restart
        if failing[0]:
            raise StorageError("database or disk is full")
        return real_commit(self, operations, copy_first)

    monkeypatch.setattr(DurableStore, "commit", commit)
    keeper = keeper_module.StoreKeeper(BrokerConfig(data_dir=str(tmp_path), min_free_disk=0))
    store = keeper.store
    core = CoreHarness(durable=True, dedup_window_seconds=60)
    messages, dead = store.load()
    core.core.restore(messages, dead, store.load_purged_seqs())
    store.read_done()
    assert core.stats("q")["ready"] == 1  # only the message that was in flight
    failing[0] = False  # room again: left-over operations, then recovery's
    assert keeper.commit(core.core.journal.take())
    while store.purging:
        store.reclaim()
    keeper.close()
    stored.store = DurableStore(tmp_path)
    restarted = stored.reopened()
    got = dispatches(restarted.send(CONSUMER, p.Consume("q", 10)))
    assert [d.content for d in got] == [held.content]


def test_a_read_only_store_is_not_forever_reclaimable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read-only (a full disk), the store cannot work through markers: it must not ask for
    idle turns to do it (the server would poll and fail every few milliseconds)."""
    DurableStore(tmp_path).close()

    def full(self) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(DurableStore, "_open", full)
    store = DurableStore(tmp_path)
    assert store.read_only
    try:
        assert not store.reclaimable and not store.stats()["purges_waiting"]
    finally:
        store.close()


def test_a_purge_still_in_the_turn_log_is_finished_before_recovery_reads(
    tmp_path: Path,
) -> None:
    """A busy pipe switches the turn log on: the purge's CLEAR waits in the log, and the
    fold for recovery's read makes its marker. The read must finish it too, or the purged
    messages are read back as ready."""
    stored = StoredCore(tmp_path)
    stored.send(CONSUMER, hello(60_000), p.Consume("busy", 1_000))
    acks: list = []
    for _ in range(8):
        sends = [p.Send("busy", b"x", 60) for _ in range(100)]
        out = stored.core.turn((PRODUCER, sends), (CONSUMER, acks))
        stored.commit()
        acks = [p.Ack("busy", got.message_id) for got in dispatches(out.get(CONSUMER, []))]
    fill(stored, 50)
    stored.admin(cmd.QUEUE_PURGE, queue="q")
    assert stored.store.stats()["turn_log_on"] and not stored.store.purging
    recovered = stored.recovered()
    assert "q" not in recovered.core.queues or recovered.stats("q")["ready"] == 0


def test_a_slice_passes_the_rows_in_flight_once(tmp_path: Path) -> None:
    """Rows in flight at the front of a purged range stay; each slice starts after the last
    row deleted, not again at the front (150,000 in flight made every slice 19 ms)."""
    stored = StoredCore(tmp_path)
    fill(stored, 5 * PER_TURN)
    dispatches(stored.send(CONSUMER, p.Consume("q", 2 * PER_TURN)))
    stored.admin(cmd.QUEUE_PURGE, queue="q")
    lows = []
    while stored.store.purging:
        with sqlite3.connect(tmp_path / DB_NAME) as db:
            lows.extend(row[0] for row in db.execute("SELECT lo FROM purges"))
        stored.turn()
    assert lows == sorted(lows) and len(set(lows)) == len(lows) > 2
    assert len(contents_on_disk(tmp_path)) == 2 * PER_TURN  # those in flight


def test_a_durable_broker_killed_after_a_big_purge_keeps_only_what_came_after(
    tmp_path: Path,
) -> None:
    """For real: 50,000 messages, a purge, a confirmed send, kill -9 at once (the store's
    slices have barely begun), a restart: only the send after the purge is there. Meanwhile
    another client's confirmed sends never waited for the purge's work."""
    data = tmp_path / "data"
    first = BrokerProcess(tmp_path / "1.log", "--data-dir", str(data))
    worst = [0.0]
    stop = threading.Event()
    try:
        with first.client() as client:
            client.send_many("big", (b"x" * 100 for _ in range(50_000)), confirm=True)

            def ping() -> None:
                with first.client() as pinger:
                    while not stop.is_set():
                        started = time.perf_counter()
                        pinger.send("pings", b"p", confirm=True)
                        worst[0] = max(worst[0], time.perf_counter() - started)

            pinger = threading.Thread(target=ping)
            pinger.start()
            time.sleep(0.3)
            assert client.admin(cmd.QUEUE_PURGE, queue="big")["purged"] == 50_000
            time.sleep(0.05)
            stop.set()
            pinger.join()
            client.send("big", b"after", confirm=True)
        first.kill()
        marked_left = len(contents_on_disk(data, "big")) - 1
        second = BrokerProcess(tmp_path / "2.log", "--data-dir", str(data))
        try:
            with second.client() as client:
                got = [m.content for m in client.consume("big", window=100, timeout=1)]
        finally:
            second.stop()
    finally:
        stop.set()
        first.stop()
    assert got == [b"after"]
    print(
        f"longest confirmed send of another client: {worst[0] * 1000:.1f} ms;"
        f" purged rows still on disk at the kill: {marked_left}"
    )


def test_a_purge_takes_the_put_runs_whole_and_a_kill_brings_none_back(tmp_path: Path) -> None:
    """Messages that never expire wait in put runs (put_runs.py): a purge deletes the runs
    with nothing in flight whole, at once (no slices), stubs the one a dispatch reached, and
    a kill brings back exactly what was in flight, with its content, and what came after."""
    stored = StoredCore(tmp_path)
    fill(stored, 5 * PER_TURN, ttl=0)
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        assert db.execute("SELECT count(*) FROM put_runs").fetchone()[0] > 0
        assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    held = dispatches(stored.send(CONSUMER, p.Consume("q", 3)))
    assert stored.admin(cmd.QUEUE_PURGE, queue="q")["purged"] == 5 * PER_TURN - 3
    stored.send(PRODUCER, p.Send("q", b"after"))
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        runs = db.execute("SELECT stubbed FROM put_runs ORDER BY rowid").fetchall()
        rows = db.execute("SELECT count(*), max(length(content)) FROM messages").fetchone()
    assert runs == [(1,), (0,)]  # the one the dispatch reached (stubbed), the one after
    assert 3 <= rows[0] <= 64 and rows[1] == 0  # its stubs, the ready ones marked for slices
    restarted = stored.reopened()
    got = dispatches(restarted.send(CONSUMER, p.Consume("q", 100)))
    assert sorted(d.content for d in got) == sorted([b"after", *(d.content for d in held)])
