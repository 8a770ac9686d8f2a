"""Idempotency keys in the durable store (broker/shell/store_schema.py): held keys one row per
writer batch and turn, let go a batch at a time; the others one row per turn's expiry, deleted
by the order they were written in."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

from phpmq.broker.journal import HELD_GONE, KEY, LET_GO, UNKEY
from phpmq.broker.shell.durable import DB_NAME, DurableStore


def key(name: str, expires_wall: float, kind: str = KEY) -> tuple:
    return (kind, "jobs", name, b"id-" + name.encode(), expires_wall)


def gone(writer_batch: str, queue: str = "jobs") -> tuple:
    """Every held key of `writer_batch` was let go (key_holds.held_batch)."""
    return (HELD_GONE, queue, writer_batch)


def stored(store: DurableStore) -> dict[str, float]:
    return {k.key: k.expires_wall for k in store.load_keys()}


def test_expired_keys_are_deleted_and_held_or_live_ones_kept(tmp_path: Path) -> None:
    store = DurableStore(tmp_path)
    store.commit([key("held", math.inf), key("a", 10.0), key("b", 10.0)])
    store.commit([key("c", 20.0)])
    store.commit([key("d", 30.0)])
    store.commit([(UNKEY, 20.0)])
    assert stored(store) == {"held": math.inf, "d": 30.0}
    assert [k.id for k in store.load_keys()] == [b"id-held", b"id-d"]
    store.commit([(UNKEY, math.inf)])
    assert stored(store) == {}
    store.close()


def test_a_turns_keys_are_one_row(tmp_path: Path) -> None:
    store = DurableStore(tmp_path)
    store.commit([key(f"k{n}", 10.0) for n in range(1000)])
    store.close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    assert db.execute("SELECT count(*) FROM key_batches").fetchone() == (1,)
    db.close()
    store = DurableStore(tmp_path)
    assert len(stored(store)) == 1000
    store.close()


def test_a_held_key_let_go_expires_by_its_window(tmp_path: Path) -> None:
    store = DurableStore(tmp_path)
    store.commit([key("held", math.inf), key("a", 10.0)])
    store.commit([key("held", 15.0, LET_GO), gone("held/")])  # the window from now
    assert stored(store) == {"held": 15.0, "a": 10.0}
    store.commit([(UNKEY, 12.0)])
    assert stored(store) == {"held": 15.0}
    store.commit([(UNKEY, 15.0)])
    assert stored(store) == {}
    store.close()


def test_a_key_written_with_an_earlier_expiry_than_the_one_before_goes_later(
    tmp_path: Path,
) -> None:
    """The wall clock stepped back between two turns: the second's keys stay until the
    first's go (restart reads keys by their expiry, so a late deletion is never a late
    answer)."""
    store = DurableStore(tmp_path)
    store.commit([key("a", 30.0)])
    store.commit([key("b", 10.0)])
    store.commit([(UNKEY, 20.0)])
    assert stored(store) == {"a": 30.0, "b": 10.0}
    store.commit([(UNKEY, 30.0)])
    assert stored(store) == {}
    store.close()


def older_store(tmp_path: Path, insert: str, rows: list[tuple], *schema: str) -> None:
    """A store as an older broker wrote it: a new one, with `schema` run and `rows` put in
    by `insert`."""
    DurableStore(tmp_path).close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    for statement in schema:
        db.execute(statement)
    db.executemany(insert, rows)
    db.commit()
    db.close()


def test_a_store_with_a_row_per_key_is_moved_into_batches_at_open(tmp_path: Path) -> None:
    older_store(
        tmp_path,
        "INSERT INTO keys VALUES (?, ?, ?, ?)",
        [("jobs", "held", "id-held", math.inf), ("jobs", "a", "id-a", 10.0)],
        "CREATE TABLE keys (queue TEXT NOT NULL, key TEXT NOT NULL, id TEXT NOT NULL,"
        " expires_wall REAL NOT NULL, PRIMARY KEY (queue, key))",
        "CREATE INDEX keys_by_expiry ON keys (expires_wall)",
    )
    store = DurableStore(tmp_path)
    assert stored(store) == {"held": math.inf, "a": 10.0}
    assert {k.id for k in store.load_keys()} == {b"id-held", b"id-a"}
    store.commit([(UNKEY, 10.0)])
    assert stored(store) == {"held": math.inf}
    store.close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master")]
    db.close()
    assert "keys" not in tables and "keys_by_expiry" not in tables


def rows(tmp_path: Path, table: str) -> int:
    db = sqlite3.connect(tmp_path / DB_NAME)
    try:
        return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        db.close()


def test_a_writer_batch_s_held_keys_are_a_row_a_turn_and_deleted_together(
    tmp_path: Path,
) -> None:
    """A writer batch's held keys are one row per turn (not a row and an index entry each),
    kept while its keys are let go over several turns (a crash then finds them held, and
    recovery gives them the window), and deleted by one statement once all are."""
    store = DurableStore(tmp_path)
    turn = [key(f"query/7/{n}", math.inf) for n in range(1000)]
    store.commit([*turn[:500], key("query/8/0", math.inf)])
    store.commit(turn[500:])
    assert rows(tmp_path, "held_key_batches") == 3
    let_go = [key(f"query/7/{n}", 50.0, LET_GO) for n in range(1000)]
    store.commit(let_go[:600])  # let go over two turns: held on disk until all of it is
    assert rows(tmp_path, "held_key_batches") == 3
    store.commit([*let_go[600:], gone("query/7")])
    assert rows(tmp_path, "held_key_batches") == 1
    expected = {f"query/7/{n}": 50.0 for n in range(1000)} | {"query/8/0": math.inf}
    assert stored(store) == expected
    store.close()
    store = DurableStore(tmp_path)
    assert stored(store) == expected
    store.close()


def test_keys_let_go_and_held_again_in_one_turn_stay_held(tmp_path: Path) -> None:
    """A hold released and made again in one turn (an operator's key-release, then the
    writer's next task): the keys held after the release are what a restart finds held."""
    store = DurableStore(tmp_path)
    store.commit([key("query/3/0", math.inf), key("query/3/1", math.inf)])
    store.commit(
        [key("query/3/0", 50.0, LET_GO), key("query/3/1", 50.0, LET_GO), gone("query/3"),
         key("query/3/2", math.inf), key("query/3/0", math.inf)]
    )  # fmt: skip
    store.close()
    store = DurableStore(tmp_path)
    held = {k.key for k in store.load_keys() if k.expires_wall == math.inf}
    assert held == {"query/3/2", "query/3/0"}
    store.close()


def test_a_store_with_a_row_per_held_key_is_moved_into_batches_at_open(tmp_path: Path) -> None:
    older_store(
        tmp_path,
        "INSERT INTO held_keys VALUES (?, ?, ?)",
        [("jobs", "query/1/0", b"id-0"), ("jobs", "query/1/1", b"id-1")],
        "CREATE TABLE held_keys (queue TEXT NOT NULL, key TEXT NOT NULL, id BLOB NOT NULL,"
        " PRIMARY KEY (queue, key)) WITHOUT ROWID",
    )
    store = DurableStore(tmp_path)
    assert stored(store) == {"query/1/0": math.inf, "query/1/1": math.inf}
    assert {k.id for k in store.load_keys()} == {b"id-0", b"id-1"}
    store.commit([key("query/1/0", 9.0, LET_GO), key("query/1/1", 9.0, LET_GO), gone("query/1")])
    assert stored(store) == {"query/1/0": 9.0, "query/1/1": 9.0}
    store.close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master")]
    db.close()
    assert "held_keys" not in tables


def test_a_let_go_deletes_only_its_own_writer_batch_at_its_own_target(tmp_path: Path) -> None:
    """Groups are (target, `<scope>/<batch>`): batch 5 is not batch 55, and the same batch at
    another queue is another group, however the keys come in a row."""
    store = DurableStore(tmp_path)
    other = (KEY, "other", "q/5/0/0", b"id-other", math.inf)
    store.commit([key("q/5/0/0", math.inf), key("q/55/0/0", math.inf), other, key("q/5", math.inf)])
    store.commit([key("q/5/0/0", 9.0, LET_GO), key("q/5", 9.0, LET_GO), gone("q/5")])
    held = {(k.queue, k.key) for k in store.load_keys() if k.expires_wall == math.inf}
    assert held == {("jobs", "q/55/0/0"), ("other", "q/5/0/0")}
    store.close()
