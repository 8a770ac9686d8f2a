"""Test helpers shared by the suite: a core driven by a fake clock, a real broker process
(phpmq.testing's), raw DEALER sockets.

Import them from test modules (`from harness import CoreHarness`); pytest puts tests/ on the
path.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import zmq

import phpmq.protocol as p
from phpmq import testing
from phpmq.broker.build import compiled_modules
from phpmq.broker.clock import FakeClock
from phpmq.broker.config import BrokerConfig
from phpmq.broker.core import Core
from phpmq.broker.journal import Journal
from phpmq.broker.shell.durable import DurableStore
from phpmq.broker.shell.store_schema import runs_as_rows
from phpmq.broker.shell.turn_log import fold_stored
from phpmq.testing import free_port as free_port

#: A compiled core (docs/performance.md) calls the compiled codec's functions directly, and its
#: methods cannot be replaced on an instance: a test that replaces either to watch the core
#: runs in the pure-Python pass of `make test` only.
replaces_core_calls = pytest.mark.skipif(
    "phpmq.broker.core" in compiled_modules(),
    reason="replaces what a compiled core calls directly; the pure-Python pass runs it",
)

REPO = Path(__file__).resolve().parent.parent
#: The peer CoreHarness.admin sends from.
OPS = b"ops"

Value = TypeVar("Value")


class CoreHarness:
    """A Core with a FakeClock; `frame()` runs one loop turn and returns what it sent,
    decoded, per peer."""

    def __init__(
        self,
        ttl_form_default: bool = True,
        durable: bool = False,
        clock: FakeClock | None = None,
        **config: object,
    ) -> None:
        self.clock = clock or FakeClock()
        config.setdefault("dialect", "ttl" if ttl_form_default else "pre-ttl")
        journal = Journal() if durable else None
        self.core = Core(BrokerConfig(**config), self.clock, journal=journal)

    def turn(self, *inputs: tuple[bytes, bytes | p.Message | list[p.Message]]) -> dict[bytes, list]:
        """Feed (peer, frame-or-messages) pairs in one turn; return decoded output per peer."""
        self.core.begin_turn()
        for peer, data in inputs:
            self.core.handle_frame(peer, _as_frame(data))
        out: dict[bytes, list] = {}
        for peer, frame in self.core.end_turn().frames:
            messages, error = p.decode_frame(frame)
            assert error is None, f"the core sent an undecodable frame: {error}"
            out.setdefault(peer, []).extend(messages)
        return out

    def send(self, peer: bytes, *messages: p.Message) -> list:
        """One turn with messages from one peer; what that peer received."""
        return self.turn((peer, list(messages))).get(peer, [])

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def admin(self, command: str, peer: bytes = OPS, **options: object) -> dict:
        """The answer to an admin command sent by `peer` in a turn of its own (durable: after
        the turn's commit, which the answer to a command that changed the store waits for)."""
        received = self.send(peer, p.Admin({"command": command, **options}))
        for to, frame in self.core.release_confirms():
            if to == peer:
                received.extend(p.decode_frame(frame)[0])
        [reply] = received
        assert isinstance(reply, p.AdminReply), reply
        return reply.options

    def stats(self, queue: str) -> dict:
        queue_record = self.core.queues[queue]
        return {
            "ready": queue_record.ready_count,
            "in_flight": queue_record.in_flight,
            "dead": len(queue_record.dead),
        }


class StoredCore:
    """A durable core whose every turn's journal goes into a real store, as the server's
    does: `reopened()` is the core a restart after a kill -9 would make of that store."""

    def __init__(self, path: Path, **config: object) -> None:
        self.path = path
        self.config = {"dedup_window_seconds": 60, **config}
        self.core = CoreHarness(durable=True, **self.config)
        self.store = DurableStore(path)
        self.operations: list[list[tuple]] = []

    def commit(self) -> list[tuple]:
        operations = self.core.core.journal.take()
        self.store.commit(operations)
        self.operations.append(operations)
        return operations

    def admin(self, command: str, **options: object) -> dict:
        answer = self.core.admin(command, **options)
        self.commit()
        return answer

    def send(self, peer: bytes, *messages: p.Message) -> list:
        got = self.core.send(peer, *messages)
        self.commit()
        return got

    def turn(self, seconds: float = 0.001) -> list[tuple]:
        self.core.advance(seconds)
        self.core.turn()
        return self.commit()

    def reopened(self) -> CoreHarness:
        """The store left as a kill -9 leaves it (nothing folded or finished at a close),
        opened again and recovered as the server does; the new core journals into it."""
        abandon(self.store)
        self.store = DurableStore(self.path)
        return self.recovered()

    def recovered(self) -> CoreHarness:
        """A new core recovered from the store as the server's recovery does (a start, or
        a replica's promotion: the same store), its recovery's operations committed."""
        store = self.store
        self.core = core = CoreHarness(durable=True, **self.config)
        messages, dead = store.load()
        core.core.restore(messages, dead, store.load_purged_seqs())
        core.core.restore_keys(store.load_keys(), store.load_holds())
        store.read_done()
        self.commit()
        return core


def abandon(store: DurableStore) -> None:
    """Let go of a store's files as a killed process would: no fold, no finish, no close's
    housekeeping (what was committed is on disk)."""
    store._checkpointer.stop()
    for db in (store._db, store._immutable, store._copy):
        if db is not None:
            db.close()
    if store._lock is not None:
        store._lock.release()


def _as_frame(data: bytes | p.Message | list[p.Message]) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, list):
        return p.encode_all(data)
    return p.encode(data)


def dispatches(messages: list) -> list[p.Dispatch]:
    return [m for m in messages if isinstance(m, p.Dispatch)]


def errors(messages: list) -> list[p.Error]:
    return [m for m in messages if isinstance(m, p.Error)]


# --------------------------------------------------------------------------- waiting
# A longer timeout only delays a failure; the interval is short because a wait's first look
# usually comes too early.


def wait_for(
    check: Callable[[], Value], what: str, timeout: float = 10.0, interval: float = 0.02
) -> Value:
    """Call `check` until it returns something true and return that; past `timeout` seconds
    the test fails, naming `what` it waited for."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(interval)


def wait_until(check: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Whether `check` came true within `timeout` seconds: for a test that asserts more
    than that, or that goes on either way."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def read_until(
    read: Callable[[], Value],
    done: Callable[[Value], bool],
    timeout: float = 10.0,
    interval: float = 0.02,
) -> Value:
    """Call `read` until `done` holds for what it returned; that value, or the last one read
    at the deadline (the test's own assertion on it then says what is wrong)."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(interval)


# --------------------------------------------------------------------------- real processes


class BrokerProcess(testing.BrokerProcess):
    """phpmq.testing's broker called the suite's way: the log file first, then the flags."""

    def __init__(self, log_path: Path, *flags: str, **options: Any) -> None:
        super().__init__(*flags, log_path=log_path, **options)


def configured_broker(folder: Path, toml: str) -> BrokerProcess:
    """A broker (not started yet) with the settings `toml`, its file and log in `folder`."""
    config = folder / "broker.toml"
    config.write_text(toml)
    return BrokerProcess(folder / "broker.log", "--config", str(config))


def generate_keys(folder: Path, names: Iterable[str], allowed: Iterable[str]) -> Path:
    """CURVE key pairs made by `phpmq keys generate` in `folder`, the `allowed` ones' public
    keys copied into `folder/clients` (what `--curve-clients` reads); returns `folder`."""
    clients = folder / "clients"
    clients.mkdir(parents=True, exist_ok=True)
    for name in names:
        result = phpmq("keys", "generate", name, "--dir", str(folder))
        assert result.returncode == 0, result.stderr
    for name in allowed:
        (clients / f"{name}.key").write_text((folder / f"{name}.key").read_text())
    return folder


def curve_broker(
    tmp_path: Path,
    keys: Path,
    *flags: str,
    as_key: str,
    clients: Path | None = None,
    address: str | None = None,
) -> BrokerProcess:
    """A broker with CURVE on: its key pair `keys/broker.key_secret`, the clients let in from
    `clients` (default `keys/clients`); its readiness check and `client()` use `as_key`."""
    from phpmq.client import curve_keys

    return BrokerProcess(
        tmp_path / "broker.log",
        "--curve-secret",
        str(keys / "broker.key_secret"),
        "--curve-clients",
        str(clients or keys / "clients"),
        *flags,
        address=address,
        curve=curve_keys(keys / f"{as_key}.key_secret", keys / "broker.key"),
    )


@contextmanager
def raw_dealer(address: str, identity: bytes | None = None) -> Iterator[zmq.Socket]:
    """A bare DEALER socket, as a client that speaks PHPMQ bytes by hand would use."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    if identity is not None:
        sock.identity = identity
    sock.connect(address)
    try:
        yield sock
    finally:
        sock.close(linger=0)


def raw_admin(sock: zmq.Socket, command: str, **options: object) -> dict:
    """The answer to an admin command sent on a raw DEALER (the next frame must be it)."""
    sock.send(p.encode(p.Admin({"command": command, **options})))
    [reply] = recv_messages(sock)
    assert isinstance(reply, p.AdminReply), reply
    return reply.options


def hello_answer(address: str) -> dict:
    """The options of the broker's answer to a bare HELLO."""
    with raw_dealer(address) as sock:
        sock.send(p.encode(p.Hello({})))
        [answer] = recv_messages(sock)
        assert isinstance(answer, p.Hello)
        return answer.options


def recv_messages(sock: zmq.Socket, timeout: float = 5.0) -> list:
    """Decode the next frame the socket receives; fail instead of hanging."""
    if not sock.poll(int(timeout * 1000)):
        raise AssertionError(f"nothing received within {timeout}s")
    messages, error = p.decode_frame(sock.recv())
    assert error is None, error
    return messages


def phpmq(
    *args: str, stdin: str | None = None, timeout: float = 30, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The `phpmq` command line, run to its end in the repository (with `env`, if given)."""
    return subprocess.run(
        [sys.executable, "-m", "phpmq", *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def nothing_received(sock: zmq.Socket, wait: float = 0.3) -> bool:
    return not sock.poll(int(wait * 1000))


#: The durable store's first `messages` table, before the columns added since
#: (store_schema.ADDED_COLUMNS): what an older broker's store or snapshot holds.
FIRST_MESSAGES_TABLE = (
    "CREATE TABLE messages (id TEXT PRIMARY KEY, queue TEXT NOT NULL, seq INTEGER NOT NULL,"
    " content BLOB NOT NULL, headers BLOB NOT NULL, expires_wall REAL NOT NULL,"
    " deliveries INTEGER NOT NULL, in_flight INTEGER NOT NULL)"
)


def read_folded(path: str | Path) -> sqlite3.Connection:
    """A copy in memory of the store at `path`, its log folded into its tables and its put
    runs written as rows: what it holds, read without writing to it (a store a broker is
    using)."""
    source = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    copy = sqlite3.connect(":memory:", isolation_level=None)
    try:
        source.backup(copy)
        copy.execute("BEGIN")
        fold_stored(copy)
        runs_as_rows(copy)  # (a start reads them where they are: rows, to read plainly)
        copy.execute("COMMIT")
    except sqlite3.Error:
        copy.close()
        raise
    finally:
        source.close()
    return copy
