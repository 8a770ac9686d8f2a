"""Idempotency keys in the durable store (broker/shell/store_schema.py): expired keys are
deleted by the order they were written in, without an index on their expiry."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

from phpmq.broker.journal import KEY, UNKEY
from phpmq.broker.shell.durable import DB_NAME, DurableStore


def key(name: str, expires_wall: float) -> tuple:
    return (KEY, "jobs", name, b"id-" + name.encode(), expires_wall)


def stored(store: DurableStore) -> dict[str, float]:
    return {k.key: k.expires_wall for k in store.load_keys()}


def test_expired_keys_are_deleted_and_held_or_live_ones_kept(tmp_path: Path) -> None:
    store = DurableStore(tmp_path)
    store.commit([key("held", math.inf), key("a", 10.0), key("b", 20.0), key("c", 30.0)])
    store.commit([(UNKEY, 20.0)])
    assert stored(store) == {"held": math.inf, "c": 30.0}
    store.commit([(UNKEY, math.inf)])
    assert stored(store) == {}
    store.close()


def test_a_key_written_again_expires_by_its_new_window(tmp_path: Path) -> None:
    store = DurableStore(tmp_path)
    store.commit([key("held", math.inf), key("a", 10.0)])
    store.commit([key("held", 15.0)])  # its hold let it go: the window from now
    store.commit([(UNKEY, 12.0)])
    assert stored(store) == {"held": 15.0}
    store.commit([(UNKEY, 15.0)])
    assert stored(store) == {}
    store.close()


def test_a_key_written_with_an_earlier_expiry_than_the_one_before_goes_later(
    tmp_path: Path,
) -> None:
    """The wall clock stepped back between two keys: the second stays until the first goes
    (restart reads keys by their expiry, so a late deletion is never a late answer)."""
    store = DurableStore(tmp_path)
    store.commit([key("a", 30.0), key("b", 10.0)])
    store.commit([(UNKEY, 20.0)])
    assert stored(store) == {"a": 30.0, "b": 10.0}
    store.commit([(UNKEY, 30.0)])
    assert stored(store) == {}
    store.close()


def test_a_store_with_the_expiry_index_loses_it_at_open(tmp_path: Path) -> None:
    DurableStore(tmp_path).close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.execute("CREATE INDEX keys_by_expiry ON keys (expires_wall)")
    db.commit()
    db.close()
    store = DurableStore(tmp_path)
    store.commit([key("a", 10.0)])
    store.commit([(UNKEY, 10.0)])
    assert stored(store) == {}
    store.close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    indexes = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='index'")]
    db.close()
    assert "keys_by_expiry" not in indexes
