"""Disk space as a resource of a durable broker (docs/durability.md, "Disk space"), on a real
20 MiB tmpfs mounted for each test (root only; skipped elsewhere): the floor refuses sends
while consumers drain, the WAL keeps to its budget, acks taken on a full disk survive a stop,
a broker starts on a full disk, and what a stop could not write is written at the next
start."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import msgspec
import pytest

import phpmq.protocol as p
from harness import BrokerProcess, dispatches, free_port, phpmq, read_folded
from phpmq.broker.config import BrokerConfig
from phpmq.broker.shell.durable import DB_NAME, StorageError
from phpmq.broker.shell.keeper import LEFT_OVER_NAME
from phpmq.client import BrokerRefused, ClientError, Unconfirmed

MIB = 1024 * 1024
KB = b"x" * 1000


@contextmanager
def small_volume(where: Path, size_mib: int = 20) -> Iterator[Path]:
    """A tmpfs of `size_mib` MiB at `where`, unmounted at the end."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=False)


def fill(volume: Path) -> Path:
    """Another program takes every byte left on the volume."""
    filler = volume / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        with suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    assert os.statvfs(volume).f_bavail == 0
    return filler


def storage(broker: BrokerProcess) -> dict:
    return broker.stats()["storage"]


def wait_for(condition, what: str, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.1)


def test_sustained_load_on_a_small_volume_keeps_the_floor_and_the_wal_budget(
    tmp_path: Path,
) -> None:
    """A producer as fast as it can go and a consumer acking everything, on 20 MiB: sends are
    refused (507) before the volume is full, the WAL stays within its budget, no write fails,
    and once the consumer drained the queue sends are taken again by themselves."""
    volume = tmp_path / "volume"
    with small_volume(volume):
        data = volume / "data"
        broker = BrokerProcess(tmp_path / "broker.log", "--grace-seconds", "1", data_dir=data)
        stop = threading.Event()
        peak = {"wal": 0, "free": 1 << 62}
        counts = {"confirmed": 0, "refused": 0, "acked": 0}

        def watch() -> None:
            while not stop.is_set():
                peak["free"] = min(peak["free"], os.statvfs(volume).f_bavail * 4096)
                with suppress(OSError):
                    peak["wal"] = max(peak["wal"], (data / f"{DB_NAME}-wal").stat().st_size)
                time.sleep(0.01)

        def produce() -> None:
            with broker.client(confirm_timeout=5) as client:
                while not stop.is_set():
                    try:
                        client.send_many("load", [KB] * 100, confirm=True)
                        counts["confirmed"] += 100
                    except Unconfirmed as exc:
                        codes = {error.code for error in exc.errors.values()}
                        assert codes <= {p.ErrorCode.INSUFFICIENT_STORAGE}, exc
                        counts["confirmed"] += sum(i is not None for i in exc.ids)
                        counts["refused"] += 1
                        time.sleep(0.02)

        def consume() -> None:
            time.sleep(2)  # the volume fills first
            with broker.client() as client:
                for message in client.consume("load", window=500, timeout=3):
                    message.ack()
                    counts["acked"] += 1

        threads = [threading.Thread(target=t, daemon=True) for t in (watch, produce, consume)]
        try:
            for thread in threads:
                thread.start()
            time.sleep(8)
            stop.set()
            threads[1].join(10)
            threads[2].join(30)  # it stops 3 s after the queue is empty
            threads[0].join(1)
            figures = storage(broker)
            with broker.client() as client:  # the floor is behind us: sends are taken
                client.send("load", b"after", confirm=True)
        finally:
            stop.set()
            broker.stop()
    print(
        f"20 MiB volume: WAL peaked at {peak['wal']} bytes (budget {figures['wal_limit_bytes']}),"
        f" {peak['free']} bytes free at the least; {counts}"
    )
    assert counts["refused"] > 0, "the floor was never reached: the test measured nothing"
    assert counts["acked"] >= counts["confirmed"] > 10_000
    assert figures["write_errors"] == 0 and figures["checkpoint_errors"] == 0
    assert peak["free"] > 0
    # Its limit, and the commit the loop wrote before it started the WAL over (a turn of
    # 1 KB sends and acks at full speed: up to ~2 MB). Without a budget: the whole volume.
    assert peak["wal"] <= figures["wal_limit_bytes"] + 3 * MIB
    assert figures["min_free_disk_bytes"] == 4 * MIB and figures["disk_lows"] >= 1


def test_acks_taken_while_another_program_fills_the_disk_survive_a_stop(tmp_path: Path) -> None:
    with small_volume(tmp_path / "volume") as volume:
        data = volume / "data"
        with BrokerProcess(tmp_path / "1.log", data_dir=data) as broker:
            with broker.client() as client:
                client.send_many("jobs", [KB] * 500, confirm=True)
            # Idle, the WAL is emptied: the acks' commits need new room on the volume.
            wait_for(
                lambda: storage(broker)["reserve_bytes"] > 0 and storage(broker)["wal_bytes"] == 0,
                "the reserve held and the WAL emptied",
            )
            filler = fill(volume)
            with broker.client() as client:
                got = 0
                for message in client.consume("jobs", window=100, timeout=1):
                    message.ack()
                    got += 1
            assert got == 500
            wait_for(lambda: broker.stats()["queues"]["jobs"]["ready"] == 0, "all acked")
            figures = storage(broker)
            with broker.client() as client, pytest.raises(BrokerRefused) as refused:
                client.send("jobs", b"more", confirm=True)
            assert refused.value.error.code == p.ErrorCode.INSUFFICIENT_STORAGE
        log = broker.log()
        assert "could not write" not in log and "could keep" not in log, log
        assert figures["reserve_releases"] >= 1 and figures["unwritten_operations"] == 0
        filler.unlink()
        with BrokerProcess(tmp_path / "2.log", data_dir=data) as again:
            assert again.stats()["queues"].get("jobs", {"ready": 0})["ready"] == 0


def test_a_broker_starts_on_a_full_disk_and_takes_sends_once_space_returns(
    tmp_path: Path,
) -> None:
    """A clean stop, then the volume filled and no reserve left: SQLite cannot even create
    its WAL index. The broker reads the store as it is, serves it, refuses sends (507), and
    opens it for writing once space returns; the acks taken meanwhile are then written."""
    with small_volume(tmp_path / "volume") as volume:
        data = volume / "data"
        with BrokerProcess(tmp_path / "1.log", data_dir=data) as broker, broker.client() as client:
            client.send_many("jobs", [KB] * 300, confirm=True)
        (data / "phpmq.reserve").unlink()
        filler = fill(volume)
        with BrokerProcess(tmp_path / "2.log", data_dir=data) as broker:
            assert storage(broker)["read_only"] is True
            with broker.client() as client:
                with pytest.raises(BrokerRefused) as refused:
                    client.send("jobs", b"refused", confirm=True)
                assert refused.value.error.code == p.ErrorCode.INSUFFICIENT_STORAGE
                stream = client.consume("jobs", window=100, timeout=5)
                for _ in range(100):
                    next(stream).ack()
                client.subscribe("jobs", 0)
            filler.unlink()
            wait_for(lambda: not storage(broker)["read_only"], "open for writing")
            with broker.client() as client:
                client.send("jobs", b"taken", confirm=True)
            wait_for(lambda: storage(broker)["unwritten_operations"] == 0, "acks written")
        assert "cannot open the store for writing" in broker.log()
        with BrokerProcess(tmp_path / "3.log", data_dir=data) as again:
            assert again.stats()["queues"]["jobs"]["ready"] == 201


class FullStore:
    """A store whose commits fail, as on a disk with no room at all."""

    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self._store = store

    def commit(self, operations, copy_first=False) -> None:  # type: ignore[no-untyped-def]
        raise StorageError("database or disk is full")

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._store, name)


def test_what_a_stop_could_not_write_is_kept_and_written_at_the_next_start(
    tmp_path: Path,
) -> None:
    from phpmq.broker.shell.server import BrokerServer

    data = tmp_path / "data"
    server = BrokerServer(
        BrokerConfig(bind=f"tcp://127.0.0.1:{free_port()}", data_dir=str(data), grace_seconds=0)
    )
    keeper, core = server.keeper, server.core
    assert keeper is not None
    hello = p.encode(p.Hello({}))
    core.begin_turn()
    core.handle_frame(b"p", hello + p.encode_all([p.Send("q", b"m%d" % i, 0) for i in range(3)]))
    core.end_turn()
    assert server._commit()
    real = keeper.store
    keeper.store = FullStore(real)  # type: ignore[assignment]
    core.begin_turn()
    core.handle_frame(b"c", hello + p.encode(p.Consume("q", 1)))
    [first] = dispatches(p.decode_frame(dict(core.end_turn().frames)[b"c"])[0])
    assert not server._commit()
    core.begin_turn()
    core.handle_frame(b"c", p.encode(p.Ack("q", first.message_id)))
    core.end_turn()
    assert not server._commit()
    keeper.store = real
    real.commit = FullStore.commit.__get__(real)  # type: ignore[method-assign]
    server._report_losses()  # the stop: the store still fails, the operations go to a file
    server.router.close(0)
    server._context.term()
    left_over = data / LEFT_OVER_NAME
    kinds = [op[0] for op in msgspec.msgpack.decode(left_over.read_bytes())]
    assert "drop" in kinds
    with read_folded(data / DB_NAME) as db:  # (its put runs as rows)
        assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 3  # not written
    with BrokerProcess(tmp_path / "next.log", data_dir=data) as broker:
        assert broker.stats()["queues"]["q"]["ready"] == 2
        assert not left_over.exists()
        with broker.client() as client:
            left = [m.content for m in client.consume("q", window=10, timeout=1)]
    assert left == [b"m1", b"m2"]
    assert "operations the last stop could not write" in broker.log()


def test_a_start_on_a_full_disk_reads_the_store_with_what_the_last_stop_kept(
    tmp_path: Path,
) -> None:
    """The left-over operations cannot be written at this start either (a full disk): the
    broker serves the store as they say it is, and writes them once space returns."""
    with small_volume(tmp_path / "volume") as volume:
        data = volume / "data"
        with BrokerProcess(tmp_path / "1.log", data_dir=data) as broker, broker.client() as client:
            client.send_many("jobs", [KB] * 50, confirm=True)
        with read_folded(data / DB_NAME) as db:  # (its put runs as rows)
            ids = [row[0] for row in db.execute("SELECT id FROM messages ORDER BY seq LIMIT 10")]
        (data / LEFT_OVER_NAME).write_bytes(msgspec.msgpack.encode([("drop", i) for i in ids]))
        (data / "phpmq.reserve").unlink()
        filler = fill(volume)
        with BrokerProcess(tmp_path / "2.log", data_dir=data) as broker:
            assert broker.stats()["queues"]["jobs"]["ready"] == 40
            assert storage(broker)["unwritten_operations"] >= 10
            filler.unlink()
            wait_for(lambda: storage(broker)["unwritten_operations"] == 0, "written")
            assert not (data / LEFT_OVER_NAME).exists()
        with BrokerProcess(tmp_path / "3.log", data_dir=data) as again:
            assert again.stats()["queues"]["jobs"]["ready"] == 40


def test_min_free_disk_is_checked_and_shown(tmp_path: Path) -> None:
    with (
        small_volume(tmp_path / "volume") as volume,
        BrokerProcess(
            tmp_path / "b.log", "--min-free-disk", "50%", data_dir=volume / "data"
        ) as broker,
    ):
        figures = storage(broker)
        assert figures["min_free_disk_bytes"] == 10 * MIB
        assert figures["disk_total_bytes"] == 20 * MIB
        with broker.client() as client:
            client.send_many("q", [KB] * 1000, confirm=True)  # ~1 MB: still over the floor
            with pytest.raises((Unconfirmed, BrokerRefused, ClientError)):
                for _ in range(20):  # ~12 MB more: under it
                    client.send_many("q", [KB] * 600, confirm=True)
        assert storage(broker)["disk_low"] is True
        shown = phpmq("stats", "--broker", broker.address)
        assert shown.returncode == 0, shown.stderr
        assert "(floor 10.0 MiB) [disk low: sends refused]" in shown.stdout, shown.stdout


def test_the_budget_and_the_floor_follow_the_volume() -> None:
    from phpmq.broker.config import ConfigError, load_config
    from phpmq.broker.shell.disk import checkpoint_bytes, min_free_bytes

    gib = 1024 * MIB
    sizes = (20 * MIB, 256 * MIB, gib, 100 * gib)
    assert [checkpoint_bytes(size) for size in sizes] == [MIB, 8 * MIB, 16 * MIB, 16 * MIB]
    assert [min_free_bytes("auto", size) for size in sizes] == [4 * MIB, 32 * MIB, 64 * MIB, gib]
    assert min_free_bytes("5%", 100 * MIB) == 5 * MIB
    assert min_free_bytes("256MiB", gib) == 256 * MIB
    assert min_free_bytes(0, gib) == 0
    assert load_config(overrides={"min_free_disk": "10%"}).min_free_disk == "10%"
    with pytest.raises(ConfigError, match="min_free_disk '12x' is not a size"):
        load_config(overrides={"min_free_disk": "12x"})


def test_a_damaged_left_over_file_stops_the_start_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / LEFT_OVER_NAME).write_bytes(b"\xc1 not msgpack")
    result = phpmq("broker", "--bind", f"tcp://127.0.0.1:{free_port()}", "--data-dir", str(data))
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"phpmq: cannot read {data / LEFT_OVER_NAME}") and "move it away" in line
