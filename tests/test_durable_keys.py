"""Idempotency keys in the durable store (broker/shell/store_schema.py): held keys a row
each, the others one row per turn's expiry, deleted by the order they were written in."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

from phpmq.broker.journal import KEY, LET_GO, UNKEY
from phpmq.broker.shell.durable import DB_NAME, DurableStore


def key(name: str, expires_wall: float, kind: str = KEY) -> tuple:
    return (kind, "jobs", name, b"id-" + name.encode(), expires_wall)


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
    store.commit([key("held", 15.0, LET_GO)])  # its hold let it go: the window from now
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


def test_a_store_with_a_row_per_key_is_moved_into_batches_at_open(tmp_path: Path) -> None:
    DurableStore(tmp_path).close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.execute(
        "CREATE TABLE keys (queue TEXT NOT NULL, key TEXT NOT NULL, id TEXT NOT NULL,"
        " expires_wall REAL NOT NULL, PRIMARY KEY (queue, key))"
    )
    db.execute("CREATE INDEX keys_by_expiry ON keys (expires_wall)")
    db.executemany(
        "INSERT INTO keys VALUES (?, ?, ?, ?)",
        [("jobs", "held", "id-held", math.inf), ("jobs", "a", "id-a", 10.0)],
    )
    db.commit()
    db.close()
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
