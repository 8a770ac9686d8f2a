"""The turn log (broker/shell/turn_log.py): whatever it logs, folds or leaves out, and
wherever a crash cuts it, the tables end as writing every turn straight to them leaves them:
purges marked the way the core journals them now (a range, finished later) among them."""

from __future__ import annotations

import math
import os
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_disk_space import fill, small_volume

from harness import FIRST_MESSAGES_TABLE, BrokerProcess, read_folded
from phpmq.broker.journal import (
    BACK,
    CLEAR,
    DEAD,
    DELAY,
    DELETE_QUEUE,
    DROP,
    FLY,
    KEY,
    LEASE_DONE,
    LEASE_TAKEN,
    LET_GO,
    PUT,
    SETTLE,
    UNDEAD,
    UNKEY,
)
from phpmq.broker.shell import turn_log as turn_log_module
from phpmq.broker.shell.durable import DurableStore, StorageError
from phpmq.broker.shell.store_purges import finish_all
from phpmq.broker.shell.store_schema import SCHEMA, read_keys, runs_as_rows, write
from phpmq.broker.shell.turn_log import FOLD_AFTER_S, TurnLog, fold_stored

QUEUES = ("a", "b")
TABLES = {
    "messages": "SELECT * FROM messages ORDER BY id",
    "dead_letters": "SELECT * FROM dead_letters ORDER BY position",
    "key_batches": "SELECT * FROM key_batches ORDER BY rowid",
    "held_key_batches": "SELECT * FROM held_key_batches ORDER BY rowid",
    "turn_log": "SELECT * FROM turn_log",
    "purges": "SELECT * FROM purges",
    "purged_seqs": "SELECT * FROM purged_seqs",
    "put_runs": "SELECT * FROM put_runs",
    "run_bits": "SELECT * FROM run_bits",
    "run_leases": "SELECT * FROM run_leases",
}


class Model:
    """Which messages exist, where: enough to journal operations the core could."""

    def __init__(self) -> None:
        self.next_id = 0
        self.tail = dict.fromkeys(QUEUES, 0)
        self.head = dict.fromkeys(QUEUES, 0)
        #: id -> [queue, seq, in flight]
        self.live: dict[bytes, list] = {}
        self.dead: dict[bytes, str] = {}

    def operation(self, action: int, pick: int) -> list[tuple]:
        queue = QUEUES[pick % 2]
        live = sorted(self.live)
        chosen = live[pick % len(live)] if live else None
        if action <= 3 or chosen is None:  # the common case: a send
            self.next_id += 1
            message_id = b"%032d" % self.next_id
            seq = self.tail[queue]
            self.tail[queue] += 1
            self.live[message_id] = [queue, seq, False]
            return [
                (PUT, message_id, queue, seq, b"c%d" % seq, b"", 0.0, 0, b"", None, None, 0.0, b"")
            ]
        chosen_queue, seq, _ = self.live[chosen]
        if action == 4:
            first = self.head[chosen_queue]
            for state in self.live.values():
                if state[0] == chosen_queue and first <= state[1] <= seq:
                    state[2] = True
            return [(FLY, chosen_queue, first, seq)]
        if action in (5, 6):  # an ack: by ID and place, or by ID alone as written before
            del self.live[chosen]
            return [(DROP, chosen, chosen_queue, seq) if action == 5 else (DROP, chosen)]
        if action == 7:  # returned: with the place it had, or by ID alone as written before
            self.head[chosen_queue] -= 1
            self.live[chosen] = [chosen_queue, self.head[chosen_queue], False]
            where = (chosen_queue, seq) if pick % 3 else ()
            return [(BACK, chosen, self.head[chosen_queue], 0.0, 1, *where)]
        if action == 8:
            del self.live[chosen]
            self.dead[chosen] = chosen_queue
            return [(DEAD, chosen_queue, chosen, b"x", "bad", 1, 1.0, b"", b"")]
        if action == 9 and self.dead:
            # A replayed dead letter: the only PUT of an ID that was put before.
            message_id = sorted(self.dead)[pick % len(self.dead)]
            dead_queue = self.dead.pop(message_id)
            seq = self.tail[dead_queue]
            self.tail[dead_queue] += 1
            self.live[message_id] = [dead_queue, seq, False]
            return [
                (UNDEAD, dead_queue, message_id),
                (PUT, message_id, dead_queue, seq, b"r", b"", 0.0, 0, b"", None, None, 0.0, b""),
            ]
        if action == 10:
            for message_id, state in list(self.live.items()):
                if state[0] == queue and not state[2]:
                    del self.live[message_id]
            return [(CLEAR, queue)]
        if action == 11:
            for message_id, state in list(self.live.items()):
                if state[0] == queue:
                    del self.live[message_id]
            self.dead = {m: q for m, q in self.dead.items() if q != queue}
            return [(DELETE_QUEUE, queue)]
        if action == 12:
            return [(KEY, queue, f"k{pick % 7}", chosen, 100.0 + pick % 5)]
        if action == 13:  # requeued with a delay: at the tail on disk
            tail = self.tail[chosen_queue]
            self.tail[chosen_queue] += 1
            self.live[chosen] = [chosen_queue, tail, False]
            return [(DELAY, chosen, tail, 0.0, 2, chosen_queue, seq)]
        lease = f"lease-{pick % 3}"
        if action == 14:
            return [(LEASE_TAKEN, lease, chosen_queue, self.head[chosen_queue], seq)]
        if action == 15:  # what it deletes the model does not follow: those IDs are not reused
            return [(LEASE_DONE, chosen_queue, lease)]
        if action == 16:
            return [(KEY, queue, f"k{pick % 7}", chosen, math.inf)]  # held
        if action == 17:
            return [(LET_GO, queue, f"k{pick % 7}", chosen, 100.0 + pick % 5)]
        if action in (19, 20):  # a purge or delete as journaled now: marked, finished later
            purge = action == 19
            for message_id, state in list(self.live.items()):
                if state[0] == queue and not (purge and state[2]):
                    del self.live[message_id]
            if not purge:
                self.dead = {m: q for m, q in self.dead.items() if q != queue}
            kind = CLEAR if purge else DELETE_QUEUE
            return [(kind, queue, self.head[queue], self.tail[queue] - 1)]  # as handed out
        if action == 21:
            return [(SETTLE,)]
        if action == 22 and self.live[chosen][2]:
            # A restart: what was in flight is ready again at its own place, which a marker
            # still waiting would take; recovery journals SETTLE first (store_purges.py).
            self.live[chosen][2] = False
            return [(SETTLE,), (BACK, chosen, seq, 0.0, 2, chosen_queue, seq)]
        return [(UNKEY, math.inf if pick % 4 == 0 else 100.0 + pick % 5)]


def tables(db: sqlite3.Connection) -> dict[str, list]:
    """What the store holds, its keys as a start reads them too."""
    found = {name: db.execute(query).fetchall() for name, query in TABLES.items()}
    return {**found, "keys": read_keys(db)}


def finished(db: sqlite3.Connection) -> sqlite3.Connection:
    """`db` with every purge it marked finished (what a read does first)."""
    db.execute("BEGIN")
    finish_all(db)
    db.execute("COMMIT")
    return db


def new_db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(SCHEMA)
    return db


turn_strategy = st.lists(
    st.tuples(st.integers(0, 22), st.integers(0, 1000)), min_size=0, max_size=12
)
step_strategy = st.tuples(
    turn_strategy,
    st.sampled_from((0.0, 0.01, FOLD_AFTER_S)),  # time to the next turn
    st.integers(0, 9),  # 0: a crash after this turn
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step_strategy, max_size=40), st.booleans(), st.integers(0, 30))
def test_logged_turns_fold_into_the_tables_as_written_turns_would(
    steps: list, always_log: bool, cap: int
) -> None:
    model = Model()
    direct, logged = new_db(), new_db()
    log = TurnLog()
    now = 0.0
    turn_log_module.MAX_LOGGED_OPERATIONS, saved_cap = cap, turn_log_module.MAX_LOGGED_OPERATIONS
    try:
        for actions, wait, crash in steps:
            operations = [op for action, pick in actions for op in model.operation(action, pick)]
            for db in (direct, logged):
                db.execute("BEGIN")
            write(direct, operations, keep_runs=False)  # every message a row at once
            if always_log:
                log.logging = True
            log.write_turn(logged, operations, now)
            for db in (direct, logged):
                db.execute("COMMIT")
            now += wait
            if crash == 0:  # what the next start finds: the log's table, folded
                log = TurnLog()
                logged.execute("BEGIN")
                fold_stored(logged)
                runs_as_rows(logged)  # (a start reads them as they are: rows to compare)
                logged.execute("COMMIT")
                assert tables(logged) == tables(finished(direct))
        logged.execute("BEGIN")
        log.fold(logged, now, every=True)
        runs_as_rows(logged)
        finish_all(logged)
        logged.execute("COMMIT")
    finally:
        turn_log_module.MAX_LOGGED_OPERATIONS = saved_cap
    assert not log.pending
    assert tables(logged) == tables(finished(direct))


@settings(max_examples=200, deadline=None)
@given(st.lists(step_strategy, max_size=30), st.sets(st.integers(0, 29)), st.booleans())
def test_a_rolled_back_turn_leaves_the_log_as_its_table_says(
    steps: list, failing: set[int], always_log: bool
) -> None:
    """A transaction that fails after the log appended and folded (a full disk at COMMIT)
    rolls back: the log forgets what it did, and the turn written again (as StoreKeeper
    does) ends where writing it once would."""
    model = Model()
    direct, logged = new_db(), new_db()
    log = TurnLog()
    now = 0.0
    for number, (actions, wait, _) in enumerate(steps):
        operations = [op for action, pick in actions for op in model.operation(action, pick)]
        direct.execute("BEGIN")
        write(direct, operations, keep_runs=False)
        direct.execute("COMMIT")
        if number in failing:
            logged.execute("BEGIN")
            log.logging = log.logging or always_log
            log.write_turn(logged, operations, now)
            logged.execute("ROLLBACK")
            log.stale = True  # what DurableStore does on a rollback
        logged.execute("BEGIN")
        log.logging = log.logging or always_log
        log.write_turn(logged, operations, now)
        logged.execute("COMMIT")
        now += wait
    logged.execute("BEGIN")
    log.fold(logged, now, every=True)
    runs_as_rows(logged)
    finish_all(logged)
    logged.execute("COMMIT")
    assert tables(logged) == tables(finished(direct))


def test_a_store_whose_commit_fails_forgets_what_its_log_did_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turn_log_module, "MAX_LOGGED_OPERATIONS", 400)  # about 3 turns
    store = DurableStore(tmp_path)
    log = store._log
    turns = pipe_turns(12)
    for number, operations in enumerate(turns[:6]):
        # The first turns' messages are in the tables; the logged turns hold their acks.
        log.logging = number >= 3
        store.commit(operations)
    reclaim_slice = store._reclaim_slice

    def full(db: sqlite3.Connection) -> int:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "_reclaim_slice", full)
    with pytest.raises(StorageError):
        store.commit(turns[6])  # appended, and turns 3 and 4 folded, then rolled back
    monkeypatch.setattr(store, "_reclaim_slice", reclaim_slice)
    try:
        for operations in turns[6:]:
            store.commit(operations)
        messages, _ = store.load()
    finally:
        store.close()
    assert sorted(m.seq for m in messages) == list(range(10 * 50, 12 * 50))


def pipe_turns(turns: int, per_turn: int = 50) -> list[list[tuple]]:
    """A producer and a consumer keeping up: each turn puts a batch, dispatches the last
    one and acks the one before."""
    ids: list[list[bytes]] = []
    result = []
    for turn in range(turns):
        batch = [os.urandom(16) for _ in range(per_turn)]
        ids.append(batch)
        operations: list[tuple] = [
            (
                PUT,
                message_id,
                "q",
                turn * per_turn + i,
                b"x",
                b"",
                0.0,
                0,
                b"",
                None,
                None,
                0.0,
                b"",
            )
            for i, message_id in enumerate(batch)
        ]
        if turn >= 1:
            operations.append((FLY, "q", (turn - 1) * per_turn, turn * per_turn - 1))
        if turn >= 2:
            operations.extend((DROP, message_id) for message_id in ids[turn - 2])
        result.append(operations)
    return result


def crashed_with_turns_logged(directory: Path) -> None:
    """A store that logged ten pipe turns (the last two turns' messages unacked), left as
    kill -9 leaves it: every turn still in its log."""
    store = DurableStore(directory)
    store._log.logging = True
    for operations in pipe_turns(10):
        store.commit(operations)
    store._log = TurnLog()  # the close folds nothing
    store.close()


def test_a_pipe_is_logged_and_its_acked_messages_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turn_log_module, "MAX_LOGGED_OPERATIONS", 1000)  # ~6 turns
    store = DurableStore(tmp_path)
    try:
        for operations in pipe_turns(200):
            store.commit(operations)
        stats = store.stats()
        assert stats["turn_log_on"] is True
        with sqlite3.connect(store.path) as db:
            # The first three turns' messages were written, and deleted when acked; the
            # folded turns' were never written; the last turns' are still in the log.
            assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
            assert db.execute("SELECT count(*) FROM put_runs").fetchone()[0] == 0
            assert db.execute("SELECT count(*) FROM turn_log").fetchone()[0] >= 6
        messages, _ = store.load()  # folds what is left first
        assert sorted(m.seq for m in messages) == list(range(198 * 50, 200 * 50))
        stats = store.stats()
        assert stats["turn_log_operations"] == 0
        # Logging starts at the fourth turn: every message put from there on and acked two
        # turns later, within the log's six, was never written.
        assert stats["puts_never_written"] == (198 - 3) * 50
    finally:
        store.close()


def test_a_filling_queue_is_written_straight_to_the_store_in_put_runs(tmp_path: Path) -> None:
    """Not logged (nothing acks), and not a row a message either: put runs (put_runs.py),
    which a start reads as they are."""
    store = DurableStore(tmp_path)
    try:
        for operations in pipe_turns(100):
            store.commit([op for op in operations if op[0] == PUT])
        assert store.stats()["turns_logged"] == 0
        with sqlite3.connect(store.path) as db:
            assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
            assert db.execute("SELECT count(*) FROM put_runs").fetchone()[0] == 100
    finally:
        store.close()
    again = DurableStore(tmp_path)
    try:
        messages = again.load()[0]
        assert [m.seq for m in messages] == list(range(100 * 50))
        assert {m.in_flight for m in messages} == {0}
    finally:
        again.close()


def test_logging_stops_when_its_folds_leave_nothing_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turn_log_module, "FOLD_AFTER_S", 0.0)  # every turn folded at once
    store = DurableStore(tmp_path)
    log = store._log
    try:
        log.logging = True
        for operations in pipe_turns(20):
            store.commit([op for op in operations if op[0] == PUT])
        stats = store.stats()
        assert stats["turn_log_on"] is False
        assert stats["turn_log_switches"] == 1
        assert 256 / 50 <= stats["turns_logged"] < 20
        assert stats["puts_never_written"] == 0
        with sqlite3.connect(store.path) as db:
            assert db.execute("SELECT count(*) FROM turn_log").fetchone()[0] == 0
        assert len(store.load()[0]) == 20 * 50  # (the last turns' in put runs)
    finally:
        store.close()


def test_a_start_after_a_crash_folds_the_logged_turns(tmp_path: Path) -> None:
    store = DurableStore(tmp_path)
    turns = pipe_turns(40)
    for operations in turns:
        store.commit(operations)
    assert store.stats()["turn_log_operations"] > 0
    store._log = TurnLog()  # as kill -9 leaves the file: the close folds nothing
    store.close()
    with sqlite3.connect(tmp_path / "phpmq.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM turn_log").fetchone()[0] > 0
    again = DurableStore(tmp_path)
    try:
        messages, _ = again.load()
        assert sorted(m.seq for m in messages) == list(range(38 * 50, 40 * 50))
        with sqlite3.connect(tmp_path / "phpmq.sqlite3") as db:
            assert db.execute("SELECT count(*) FROM turn_log").fetchone()[0] == 0
    finally:
        again.close()


def test_a_broker_killed_while_its_turn_log_holds_turns_keeps_exactly_the_unacked(
    tmp_path: Path,
) -> None:
    """A real broker in a pipe, logging; killed with SIGKILL while the log holds turns not
    yet folded (sends, their acks, and sends not yet acked): the next start has every
    confirmed message whose ack it had committed gone, and every other one back."""
    data = tmp_path / "data"
    first = BrokerProcess(tmp_path / "1.log", data_dir=data)
    confirmed: list[bytes] = []
    acked: set[bytes] = set()
    try:
        with first.client() as producer, first.client() as consumer:
            stream = consumer.consume("pipe", window=100, timeout=5)
            deadline = time.monotonic() + 20
            storage: dict = {}
            while True:
                assert time.monotonic() < deadline, f"the turn log was never used: {storage}"
                batch = [b"%d-%d" % (len(confirmed), i) for i in range(100)]
                producer.send_many("pipe", batch, confirm=True)
                confirmed.extend(batch)
                for _ in range(90):  # the consumer stays a little behind
                    message = next(stream)
                    message.ack()
                    acked.add(message.content)
                consumer.flush()
                # Answered after the turn that took the acks above was committed.
                storage = consumer.admin("stats")["storage"]
                if (
                    storage["turn_log_on"]
                    and storage["puts_never_written"] > 0
                    and storage["turn_log_operations"] > 0
                ):
                    break
            first.kill()
    finally:
        first.stop()
    second = BrokerProcess(tmp_path / "2.log", data_dir=data)
    try:
        assert "folded" in second.log()
        with second.client() as client:
            recovered = []
            for message in client.consume("pipe", window=1000, timeout=1):
                recovered.append(message.content)
                message.ack()
    finally:
        second.stop()
    assert sorted(recovered) == sorted(set(confirmed) - acked)


def test_a_start_on_a_full_disk_reads_the_turns_a_crash_left_in_the_log(tmp_path: Path) -> None:
    """SQLite cannot open the store for writing, so the log cannot be folded into the file:
    the store reads a copy with it folded."""
    with small_volume(tmp_path / "volume") as volume:
        data = volume / "data"
        crashed_with_turns_logged(data)
        with sqlite3.connect(data / "phpmq.sqlite3") as db:
            assert db.execute("SELECT count(*) FROM turn_log").fetchone()[0] == 10
        fill(volume)  # no reserve: the store was not opened by a broker
        again = DurableStore(data)
        try:
            assert again.read_only
            messages, _ = again.load()
        finally:
            again.close()
    assert sorted(m.seq for m in messages) == list(range(8 * 50, 10 * 50))


def test_a_log_that_stopped_paying_drains_a_slice_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sends acked later than the log keeps its turns: nothing is left out, so logging
    stops; the turns it holds go to the tables a bounded slice per commit (never the whole
    log in one turn), and then turns go straight there."""
    monkeypatch.setattr(turn_log_module, "FOLD_AFTER_S", 3600.0)  # nothing comes of age
    store = DurableStore(tmp_path)
    log = store._log
    log.logging = True
    sends = [[op for op in operations if op[0] == PUT] for operations in pipe_turns(400)]
    for operations in sends[:60]:
        store.commit(operations)
    assert log.logging and log.logged_operations == 60 * 50
    monkeypatch.setattr(turn_log_module, "MAX_LOGGED_OPERATIONS", 2000)
    store.commit(sends[60])  # over the cap: folds down to it, and judges (nothing left out)
    assert log.logging
    before = log.logged_operations
    commits = 0
    while log.logged_operations:
        store.commit(sends[61 + commits])  # the first stops logging
        assert not log.logging
        commits += 1
        # Its own turn is logged behind the others; at most a drain slice (and the turn
        # that crosses it) goes to the tables.
        assert before - log.logged_operations <= turn_log_module.DRAIN_OPERATIONS + 50
        before = log.logged_operations
    assert commits >= 2
    logged = store.stats()["turns_logged"]
    store.commit(sends[300])
    assert store.stats()["turns_logged"] == logged  # straight to the tables now
    try:
        messages, _ = store.load()
    finally:
        store.close()
    assert len(messages) == (61 + commits + 1) * 50


def test_a_start_that_cannot_fold_the_log_yet_reads_a_folded_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store opens, but a fold cannot be written (a disk with no room to spare): the
    recovery reads a copy with the log folded; the log folds once writes succeed."""
    crashed_with_turns_logged(tmp_path)
    real_fold = TurnLog.fold

    def fold_fails_on_disk(self: TurnLog, db: sqlite3.Connection, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        if db.execute("PRAGMA database_list").fetchone()[2]:  # a file, not a copy in memory
            raise sqlite3.OperationalError("database or disk is full")
        real_fold(self, db, *args, **kwargs)

    monkeypatch.setattr(TurnLog, "fold", fold_fails_on_disk)
    again = DurableStore(tmp_path)
    try:
        messages, _ = again.load()
        assert sorted(m.seq for m in messages) == list(range(8 * 50, 10 * 50))
        again.read_done()
        monkeypatch.setattr(TurnLog, "fold", real_fold)
        again.commit([])  # the first write: the log reads its table and drains it
        with sqlite3.connect(tmp_path / "phpmq.sqlite3") as db:
            assert db.execute("SELECT count(*) FROM turn_log").fetchone()[0] == 0
        with read_folded(tmp_path / "phpmq.sqlite3") as db:  # (its put runs as rows)
            assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 100
    finally:
        again.close()


def test_acks_that_come_too_late_make_the_log_try_again_less_and_less_often() -> None:
    """Acks a second after their sends: nothing is ever left out. Logging keeps seeming
    worth a try (acks keep up with sends), so it is tried at 5, 10, 20, 40 and 80 s."""
    db = new_db()
    log = TurnLog()
    per_turn, lag_turns, step = 50, 20, 0.05  # 20 turns a second
    put: list[list[bytes]] = []
    for turn in range(int(160 / step)):
        batch = [os.urandom(16) for _ in range(per_turn)]
        put.append(batch)
        operations: list[tuple] = [
            (PUT, m, "q", turn * per_turn + i, b"x", b"", 0.0, 0, b"", None, None, 0.0, b"")
            for i, m in enumerate(batch)
        ]
        if turn >= lag_turns:
            operations.extend((DROP, m) for m in put[turn - lag_turns])
        db.execute("BEGIN")
        log.write_turn(db, operations, turn * step)
        db.execute("COMMIT")
    assert log.puts_never_written == 0
    starts = (log.switches + 1) // 2
    assert 4 <= starts <= 6, log.switches  # 0-5-15-35-75-155 s; every 5 s would be 30


def test_a_store_another_thread_writes_is_read_through_a_folded_copy(tmp_path: Path) -> None:
    """A replica's store (the Raft thread writes it): a promotion reads what it holds
    without writing to it, and `read_folded` shows the same from outside."""
    store = DurableStore(tmp_path, synchronous="OFF", fold_on_read=False)
    store._log.logging = True
    try:
        for operations in pipe_turns(10):
            store.commit(operations)
        messages, _ = store.load()
        store.read_done()
        assert sorted(m.seq for m in messages) == list(range(8 * 50, 10 * 50))
        assert store.stats()["turn_log_operations"] > 0  # nothing folded by the read
        outside = read_folded(store.path)
        try:
            assert outside.execute("SELECT count(*) FROM messages").fetchone()[0] == 100
        finally:
            outside.close()
    finally:
        store.close()


def test_a_snapshot_from_an_older_broker_is_brought_up_to_date(tmp_path: Path) -> None:
    """A replica takes in a snapshot its group wrote before the turn log (and before the
    newer columns): the store it becomes has them, and logs turns like any other."""
    old = sqlite3.connect(":memory:", isolation_level=None)
    old.execute(FIRST_MESSAGES_TABLE)
    old.execute("INSERT INTO messages VALUES (x'6f6c64', 'q', -1, x'6f6c64', x'', 0, 0, 0)")
    store = DurableStore(tmp_path, synchronous="OFF", fold_on_read=False)
    try:
        store.restore_from(old)
        store._log.logging = True
        for operations in pipe_turns(10):
            store.commit(operations)
        messages, _ = store.load()
        store.read_done()
    finally:
        store.close()
    assert sorted(m.seq for m in messages) == [-1, *range(8 * 50, 10 * 50)]


def test_a_quiet_store_folds_its_log_in_reclaim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a single broker's idle turns, and a replica's Raft ticks, call: the turns that
    came of age are folded, and the store stops asking for idle calls."""
    store = DurableStore(tmp_path)
    store._log.logging = True
    try:
        for operations in pipe_turns(10):
            store.commit(operations)
        assert store.reclaimable
        store.reclaim()  # nothing came of age yet
        assert store.stats()["turn_log_operations"] > 0
        monkeypatch.setattr(turn_log_module, "FOLD_AFTER_S", 0.0)
        store.reclaim()
        assert store.stats()["turn_log_operations"] == 0
        assert not store.reclaimable
        with read_folded(store.path) as db:  # (its put runs as rows)
            assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 100
    finally:
        store.close()
