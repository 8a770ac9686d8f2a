"""The durable store gives space back (docs/durability.md, "Space"): once a queue drains, the
data file (database and WAL) shrinks to a small part of its peak by itself, checkpoints run
off the loop, and a store written without incremental vacuum is converted at open."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from harness import BrokerProcess
from phpmq.broker.journal import DROP, PUT
from phpmq.broker.shell.durable import DB_NAME, DurableStore
from phpmq.broker.shell.store_schema import SCHEMA

MESSAGES = 50_000


#: A PUT's columns after the content: headers, TTL, deliveries, event, reply route...
REST = (b"", 0.0, 1, b"", None, None, 0.0, b"")


def data_size(directory: Path) -> int:
    return sum(
        (directory / f"{DB_NAME}{suffix}").stat().st_size
        for suffix in ("", "-wal")
        if (directory / f"{DB_NAME}{suffix}").exists()
    )


def test_the_data_file_shrinks_after_a_queue_drains(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(tmp_path / "broker.log", "--grace-seconds", "0", data_dir=data)
    with broker:
        with broker.client() as producer:
            producer.send_many("big", (b"%0100d" % i for i in range(MESSAGES)))
        assert broker.stats()["queues"]["big"]["ready"] == MESSAGES
        peak = data_size(data)
        got = 0
        with broker.client() as consumer:
            for message in consumer.consume("big", window=2000, timeout=10):
                message.ack()
                got += 1
                peak = max(peak, data_size(data)) if got % 5000 == 0 else peak
                if got == MESSAGES:
                    break
        assert got == MESSAGES
        assert broker.stats()["queues"]["big"]["ready"] == 0
        peak = max(peak, data_size(data))
        deadline = time.monotonic() + 15
        while data_size(data) > peak // 10:
            assert time.monotonic() < deadline, (
                f"still {data_size(data)} bytes of a peak of {peak}: {broker.stats()['storage']}"
            )
            time.sleep(0.2)
        storage = broker.stats()["storage"]
        print(f"peak {peak}, now {data_size(data)}", storage)
    assert storage["pages_reclaimed"] > 0
    assert storage["checkpoints"] > 0
    assert peak > 5_000_000  # the test measured something


def test_a_store_without_incremental_vacuum_is_converted_at_open(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    old = sqlite3.connect(path)
    old.execute("PRAGMA journal_mode=WAL")
    old.executescript(SCHEMA)  # as an older broker left it: auto_vacuum NONE
    assert old.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    old.close()
    store = DurableStore(tmp_path)
    try:
        assert store._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # INCREMENTAL
        ids = [b"%016d" % i for i in range(5000)]
        store.commit(
            [
                (PUT, i, "q", n, b"x" * 500, b"", 0.0, 1, b"", None, None, 0.0, b"")
                for n, i in enumerate(ids)
            ]
        )
        store.commit([(DROP, i) for i in ids])
        # The commit that freed the pages already gave some back, the rest go in idle slices.
        assert store.pages_reclaimed > 0
        while store.reclaimable:
            store.reclaim()
        assert store.free_pages <= 256
    finally:
        store.close()


def test_checkpoints_leave_the_loop_and_the_wal_stays_bounded(tmp_path: Path) -> None:
    store = DurableStore(tmp_path)
    try:
        assert store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        largest_wal = 0
        for batch in range(600):  # ~60 MB of rows through the WAL
            store.commit(
                [
                    (PUT, b"%08d%08d" % (batch, n), "q", batch * 100 + n, b"x" * 1000, *REST)
                    for n in range(100)
                ]
            )
            largest_wal = max(largest_wal, store.wal_bytes())
            time.sleep(0.002)  # the loop's turn between two commits
        # The thread copied it and handed the last frames to the loop: the WAL started over.
        assert store.hand_offs > 0
        assert largest_wal < 40 * 1024 * 1024, store.stats()
        deadline = time.monotonic() + 10
        # Idle: the WAL is copied and truncated (the file is empty a moment before the thread
        # counts the truncation, so wait for both).
        while store.wal_bytes() > 0 or store._checkpointer.truncations == 0:
            assert time.monotonic() < deadline, store.stats()
            time.sleep(0.05)
    finally:
        store.close()
    assert not store._checkpointer.is_alive()
