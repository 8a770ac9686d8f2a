"""The durable store's tables, what each journal operation does to them, and the rows read
back at start (broker/durable.py opens and writes the store)."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable, Iterator, Sequence, Set
from operator import itemgetter

import msgspec

from ..journal import (
    BACK,
    BIND,
    CLEAR,
    DEAD,
    DELAY,
    DELETE_QUEUE,
    DROP,
    FLY,
    HELD_GONE,
    HOLD,
    KEY,
    LEASE_DONE,
    LEASE_TAKEN,
    LET_GO,
    PURGE,
    PUT,
    RAN,
    SCHEDULE,
    SETTLE,
    UNBIND,
    UNDEAD,
    UNHOLD,
    UNKEY,
    UNSCHEDULE,
    UNUSED,
)
from ..key_holds import WriterBatches
from . import put_runs
from .store_purges import SCHEMA as PURGES_SCHEMA
from .store_purges import finish_all, mark_cleared, mark_deleted, marked, outside_marked

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS messages (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    seq INTEGER NOT NULL,
    content BLOB NOT NULL,
    headers BLOB NOT NULL,
    expires_wall REAL NOT NULL,
    deliveries INTEGER NOT NULL,
    in_flight INTEGER NOT NULL,
    event BLOB NOT NULL DEFAULT x'',
    reply_to TEXT,
    correlation TEXT,
    visible_wall REAL NOT NULL DEFAULT 0,
    message_key BLOB NOT NULL DEFAULT x'',
    lease TEXT,
    in_run INTEGER
);
CREATE INDEX IF NOT EXISTS messages_by_position ON messages (queue, seq);
CREATE TABLE IF NOT EXISTS dead_letters (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    id TEXT NOT NULL,
    content BLOB NOT NULL,
    reason TEXT NOT NULL,
    deliveries INTEGER NOT NULL,
    dead_at REAL NOT NULL,
    headers BLOB NOT NULL,
    message_key BLOB NOT NULL DEFAULT x''
);
CREATE TABLE IF NOT EXISTS key_batches (
    expires_wall REAL NOT NULL,
    keys BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS held_key_batches (
    queue TEXT NOT NULL,
    batch TEXT NOT NULL,
    keys BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS held_key_batches_by_batch ON held_key_batches (queue, batch);
CREATE TABLE IF NOT EXISTS key_holds (
    scope TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    committed INTEGER NOT NULL,
    created_wall REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS bindings (
    queue TEXT NOT NULL,
    pattern TEXT NOT NULL,
    PRIMARY KEY (queue, pattern)
);
CREATE TABLE IF NOT EXISTS queue_settings (
    queue TEXT PRIMARY KEY,
    unused_ms INTEGER
);
CREATE TABLE IF NOT EXISTS turn_log (
    turn INTEGER PRIMARY KEY,
    operations BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS schedules (
    name TEXT PRIMARY KEY,
    spec BLOB NOT NULL,
    last_run REAL,
    runs INTEGER NOT NULL DEFAULT 0
);
"""
    + PURGES_SCHEMA
    + put_runs.SCHEMA
    + put_runs.STUBS_SCHEMA
)

STATEMENTS = {
    PUT: "INSERT OR REPLACE INTO messages (id, queue, seq, content, headers, expires_wall,"
    " deliveries, in_flight, event, reply_to, correlation, visible_wall, message_key)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?)",
    FLY: "UPDATE messages SET in_flight = 1"
    " WHERE queue = ? AND seq BETWEEN ? AND ? AND in_flight = 0",
    BACK: "UPDATE messages SET seq = ?2, expires_wall = ?3, deliveries = ?4, in_flight = 0,"
    " lease = NULL WHERE id = ?1",
    LEASE_TAKEN: "UPDATE messages SET in_flight = 3, lease = ?"
    " WHERE queue = ? AND seq BETWEEN ? AND ? AND in_flight = 0",
    LEASE_DONE: "DELETE FROM messages WHERE queue = ? AND lease = ?",
    DELAY: "UPDATE messages SET seq = ?2, expires_wall = ?3, deliveries = ?4, in_flight = 2"
    " WHERE id = ?1",
    DROP: "DELETE FROM messages WHERE id = ?",
    UNDEAD: "DELETE FROM dead_letters WHERE queue = ? AND id = ?",
    PURGE: "DELETE FROM dead_letters WHERE queue = ?",
    CLEAR: "DELETE FROM messages WHERE queue = ? AND in_flight = 0",  # (written before 2026-11)
    # Keys expire in the order they were written, which is rowid order: the expired batches
    # are the rows before the first one still in its window, found by reading from the first.
    UNKEY: "DELETE FROM key_batches WHERE expires_wall <= ?1 AND rowid < coalesce((SELECT"
    " rowid FROM key_batches WHERE expires_wall > ?1 ORDER BY rowid LIMIT 1), 1 << 62)",
    HOLD: "INSERT OR REPLACE INTO key_holds VALUES (?, ?, ?, ?)",
    UNHOLD: "DELETE FROM key_holds WHERE scope = ?",
    BIND: "INSERT OR IGNORE INTO bindings VALUES (?, ?)",
    UNBIND: "DELETE FROM bindings WHERE queue = ? AND pattern = ?",
    UNUSED: "INSERT OR REPLACE INTO queue_settings VALUES (?, ?)",
    SCHEDULE: "INSERT OR REPLACE INTO schedules (name, spec, last_run, runs)"
    " VALUES (?, ?, NULL, 0)",
    UNSCHEDULE: "DELETE FROM schedules WHERE name = ?",
    RAN: "UPDATE schedules SET last_run = ?2, runs = ?3 WHERE name = ?1",
}
#: PUT for a send with no event, reply route, correlation or delay (SEND_PUT_MIDDLE): its
#: first 7 values bound, and its message key if it has one; the other columns take their
#: defaults, which are those values (each bound parameter costs; a Spark sink's rows are
#: such).
PLAIN_PUT = (
    "INSERT OR REPLACE INTO messages (id, queue, seq, content, headers, expires_wall,"
    " deliveries, in_flight) VALUES (?, ?, ?, ?, ?, ?, ?, 0)"
)
KEYED_PUT = (
    "INSERT OR REPLACE INTO messages (id, queue, seq, content, headers, expires_wall,"
    " deliveries, in_flight, message_key) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)"
)
#: A PUT's event, reply route, correlation and visible time when it is a plain send.
SEND_PUT_MIDDLE = (b"", None, None, 0.0)
#: The values PLAIN_PUT binds; the message key is the last of a PUT's.
_FIRST_VALUES = 7
_MIDDLE_END = 11


#: Columns of `messages` added since the first stores were written, in table order.
ADDED_COLUMNS = (
    ("event", "BLOB NOT NULL DEFAULT x''"),
    ("reply_to", "TEXT"),
    ("correlation", "TEXT"),
    ("visible_wall", "REAL NOT NULL DEFAULT 0"),
    ("message_key", "BLOB NOT NULL DEFAULT x''"),
    ("lease", "TEXT"),
    ("in_run", "INTEGER"),
)
#: The same for `dead_letters`.
ADDED_DEAD_COLUMNS = (("message_key", "BLOB NOT NULL DEFAULT x''"),)


class StoredMessage(msgspec.Struct, frozen=True, array_like=True):
    id: bytes
    queue: str
    seq: int
    content: bytes
    headers: bytes
    expires_wall: float
    deliveries: int
    #: 0 ready, 1 in flight (comes back with one more delivery), 2 delayed (counted), 3 in
    #: the batch lease `lease`.
    in_flight: int
    #: The event of a published copy (b"": a send).
    event: bytes = b""
    #: A request's reply route and correlation id (None: not a request).
    reply_to: str | None = None
    correlation: str | None = None
    #: A delayed send: wall-clock time it becomes visible (0: at once).
    visible_wall: float = 0.0
    message_key: bytes = b""
    lease: str | None = None


class StoredDeadLetter(msgspec.Struct, frozen=True, array_like=True):
    queue: str
    id: bytes
    content: bytes
    reason: str
    deliveries: int
    dead_at: float
    headers: bytes
    message_key: bytes = b""


class StoredKey(msgspec.Struct, frozen=True, array_like=True):
    queue: str
    key: str
    id: bytes
    #: inf: held by a key hold (no expiry).
    expires_wall: float


class StoredHold(msgspec.Struct, frozen=True, array_like=True):
    scope: str
    owner: str
    committed: int
    created_wall: float


def _runs(operations: Iterable[tuple]) -> Iterator[tuple[str, list[tuple]]]:
    """Consecutive operations of one kind, as (kind, their arguments): one executemany each
    keeps the order that matters (an insert before its update) and the per-row cost low."""
    kind = None
    rows: list[tuple] = []
    for operation in operations:
        if operation[0] != kind:
            if rows:
                yield kind, rows  # type: ignore[misc]
            kind, rows = operation[0], []
        rows.append(operation[1:])
    if rows:
        yield kind, rows  # type: ignore[misc]


def write(
    db: sqlite3.Connection,
    operations: Sequence[tuple],
    keep_runs: bool = True,
    absent: Set[bytes] = frozenset(),
) -> None:
    """Apply the journal's operations inside the open transaction of `db`; plain sends that
    never expire to a queue nothing else of `operations` names as put runs (put_runs.py),
    unless `keep_runs` is False (every message a row at once). Runs already in `db` are
    stubbed, dropped or left as the operations need either way. `absent`: IDs of messages
    never written (the turn log left their PUT out), which no run need be searched for.

    A keyed send journals PUT, KEY, PUT, KEY, ...: runs of one, a statement each. The keys
    go last instead, in their own order: no other operation reads them, and UNKEY only
    deletes keys whose window ended, which a key written in the same transaction never has.
    A turn of sends alone (a producer's, a Spark sink's) is written without a look at each
    operation in Python (`_wrote_as_sends`), to the same tables."""
    if keep_runs and len(operations) >= _SENDS_AT_LEAST and _wrote_as_sends(db, operations):
        return
    keys = [operation for operation in operations if operation[0] in KEY_KINDS]
    others = (op for op in operations if op[0] not in KEY_KINDS) if keys else operations
    named = _named_queues(operations) if keep_runs else None
    for kind, rows in _runs(others):
        if kind == PUT:
            for statement, puts in _put_runs(rows):
                if named is not None and statement is not STATEMENTS[PUT]:
                    puts = _keep_in_runs(db, puts, named)
                if puts:
                    db.executemany(statement, puts)
        elif kind == SETTLE:
            finish_all(db)
        elif kind in (DEAD, DELETE_QUEUE, CLEAR, UNKEY):
            for row in rows:
                if kind != UNKEY:
                    _runs_before(db, kind, row, absent)
                _apply(db, (kind, *row))
        elif kind == FLY:
            for row in rows:
                put_runs.fly(db, *row)
            db.executemany(STATEMENTS[FLY], _outside_purges(db, FLY, rows))
        elif kind == LEASE_TAKEN:
            for row in rows:
                put_runs.lease_taken(db, *row)
            db.executemany(STATEMENTS[LEASE_TAKEN], _outside_purges(db, LEASE_TAKEN, rows))
        elif kind == LEASE_DONE:
            for row in rows:
                put_runs.lease_done(db, *row)
            db.executemany(STATEMENTS[LEASE_DONE], rows)
        elif kind == DROP:
            rows_or_none, older = put_runs.drop(db, rows)
            if rows_or_none:
                db.executemany(STATEMENTS[DROP], rows_or_none)
            if older:
                _apply_by_id(db, STATEMENTS[DROP], older)
        elif kind in (BACK, DELAY):
            placed = [row[:4] for row in rows if len(row) == 6]
            if placed:  # the queue and the position it had: its run, if any, stubbed
                put_runs.stub_at(db, [row[4:] for row in rows if len(row) == 6])
                db.executemany(STATEMENTS[kind], placed)
            older = [row for row in rows if len(row) == 4]
            if older:
                _apply_by_id(db, STATEMENTS[kind], older)
        else:
            db.executemany(STATEMENTS[kind], rows)
    if keys:
        _write_keys(db, keys)


#: A turn of sends (`_wrote_as_sends`) is looked for in a write of this many operations or
#: more (in fewer, the passes cost more than they save).
_SENDS_AT_LEAST = 32
_KIND = itemgetter(0)
_QUEUE = itemgetter(2)
_SEQ = itemgetter(3)
_EXPIRES = itemgetter(6)
_MIDDLE = itemgetter(8, 9, 10, 11)
_MESSAGE_KEY = itemgetter(12)
_PLAIN_VALUES = itemgetter(*range(1, _FIRST_VALUES + 1))
_KEYED_VALUES = itemgetter(*range(1, _FIRST_VALUES + 1), _MIDDLE_END + 1)
_KEY_VALUES = itemgetter(1, 2, 3)
_KEY_EXPIRES = itemgetter(4)


def _wrote_as_sends(db: sqlite3.Connection, operations: Sequence[tuple]) -> bool:
    """Writes `operations` and returns True if they are a turn of plain sends alone (a
    producer's, a Spark sink's): tuples (as the journal writes them; a replica's decoded
    lists take the general path, which writes their PUTs as rows), PUTs of one form
    (PLAIN_PUT or KEYED_PUT) to one queue at consecutive positions that never expire, in
    runs under put_runs.RUN_BYTES, each followed by a KEY or none by one, the keys of one
    expiry and not held. It writes what the general path would (put runs, a key batch) with
    passes in C instead of that path's Python a message (about 0.5 µs a message, issue #31);
    False, nothing written, for any other turn."""
    count = len(operations)
    if list(map(type, operations)).count(tuple) != count:
        return False
    kinds = list(map(_KIND, operations))
    keyed = kinds[1::2].count(KEY) == count // 2 and count % 2 == 0
    puts, put_kinds = (operations[0::2], kinds[0::2]) if keyed else (operations, kinds)
    if (
        put_kinds.count(PUT) != len(puts)
        or len(set(map(_QUEUE, puts))) != 1
        or any(map(_EXPIRES, puts))
        or list(map(_MIDDLE, puts)).count(SEND_PUT_MIDDLE) != len(puts)
    ):
        return False
    seqs = list(map(_SEQ, puts))
    first_seq = seqs[0]
    if seqs != list(range(first_seq, first_seq + len(puts))):
        return False
    keys_at = set(map(_KEY_EXPIRES, operations[1::2])) if keyed else set()
    if keyed and (len(keys_at) != 1 or math.inf in keys_at):
        return False
    message_keys = list(map(_MESSAGE_KEY, puts))
    if not any(message_keys):
        values = list(map(_PLAIN_VALUES, puts))
    elif all(message_keys):
        values = list(map(_KEYED_VALUES, puts))
    else:
        return False  # rows of both forms: runs of each (_put_runs)
    if not put_runs.keep_consecutive(db, puts[0][2], first_seq, values):
        return False
    if keyed:
        _insert_key_batches(db, {keys_at.pop(): list(map(_KEY_VALUES, operations[1::2]))})
    return True


#: Operations that stub the runs of the queue they name, and where its name is: a PUT to one
#: of these queues in the same write is written as a row (put_runs.py).
_NAMING = {DEAD: 1, CLEAR: 1, DELETE_QUEUE: 1}


def _keep_in_runs(db: sqlite3.Connection, puts: list[tuple], named: set[str]) -> list[tuple]:
    """The plain or keyed PUTs `put_runs.keep` keeps in runs, but those to `named` queues;
    returns the rest, for rows."""
    if not named:
        return put_runs.keep(db, puts)
    rows = [values for values in puts if values[put_runs.QUEUE_AT] in named]
    rows += put_runs.keep(db, [v for v in puts if v[put_runs.QUEUE_AT] not in named])
    return rows


def _named_queues(operations: Sequence[tuple]) -> set[str]:
    named: set[str] = set()
    for operation in operations:
        at = _NAMING.get(operation[0])
        if at is not None:
            named.add(operation[at])
    return named


def runs_as_rows(db: sqlite3.Connection) -> None:
    """Every put run written as the rows it stands for, its stubs given their content and
    headers, and the runs deleted: the tables as writing every message as a row would have
    left them (to compare, or read plainly; a broker never needs this)."""
    put_runs.stub_every_run(db)
    for run, run_puts in put_runs.read_stubbed(db).items():
        db.executemany(
            "UPDATE messages SET content = ?, headers = ?, in_run = NULL WHERE in_run = ?",
            [(p[3], p[4], put_runs.in_run(run, place)) for place, p in enumerate(run_puts)],
        )
    if put_runs.has_put_runs(db):
        db.execute("DELETE FROM put_runs")


def read_put_runs(db: sqlite3.Connection) -> list[StoredMessage]:
    """The messages of the put runs not stubbed, as the rows they stand for would read."""
    return [
        StoredMessage(
            *values[:_FIRST_VALUES],
            in_flight,
            message_key=values[_FIRST_VALUES] if len(values) > _FIRST_VALUES else b"",
            lease=lease,
        )
        for values, in_flight, lease in put_runs.read_unstubbed(db)
    ]


def with_run_content(
    db: sqlite3.Connection, stubs: list[tuple[StoredMessage, int]]
) -> list[StoredMessage]:
    """Stubs read from `messages` (a message and its `in_run`), with the content and headers
    their runs hold."""
    if not stubs:
        return []
    runs = put_runs.read_stubbed(db)
    whole = []
    for message, at in stubs:
        run, place = put_runs.run_and_place(at)
        values = runs[run][place]
        whole.append(msgspec.structs.replace(message, content=values[3], headers=values[4]))
    return whole


def _runs_before(db: sqlite3.Connection, kind: str, row: tuple, absent: Set[bytes]) -> None:
    """What a DEAD, CLEAR or DELETE_QUEUE needs of its queue's put runs first: a dead
    letter's stub written (a message a dispatch took, or a full queue burying its oldest);
    a purge's or delete's runs gone with the positions it marks (put_runs.clear)."""
    queue = row[0]
    if kind == DEAD:
        if row[1] in absent or _has_row(db, row[1]) or put_runs.stub_holding(db, row[1:2], queue):
            return
        put_runs.stub_first_holding(db, row[1], queue)
        return
    lo, hi = (row[1], row[2]) if len(row) == 3 else (None, None)
    put_runs.clear(db, queue, lo, hi, delete=kind == DELETE_QUEUE)


def _has_row(db: sqlite3.Connection, message_id: bytes) -> bool:
    return db.execute("SELECT 1 FROM messages WHERE id = ?", (message_id,)).fetchone() is not None


def _apply_by_id(db: sqlite3.Connection, statement: str, rows: list[tuple]) -> None:
    """BACK, DELAY or older DROP rows, which name a message by ID alone: those whose message
    is in a put run not stubbed stub it first, found among the runs holding messages in
    flight or leased (where the core's are), or failing that in any run."""
    if put_runs.has_unstubbed(db):
        missing = [row[0] for row in rows if not _has_row(db, row[0])]
        if missing:
            rest = set(missing) - put_runs.stub_holding(db, missing)
            if rest:
                put_runs.stub_holding(db, rest, anywhere=True)
    db.executemany(statement, rows)


#: Operations on a range of positions, and where their queue is: they skip purged ranges.
_RANGED = {FLY: 0, LEASE_TAKEN: 1}


def _outside_purges(db: sqlite3.Connection, kind: str, rows: list[tuple]) -> list[tuple]:
    """FLY or LEASE_TAKEN rows without the ranges a purge or delete marked and has not
    deleted yet (store_purges.py): a range dispatched may span one."""
    ranges = marked(db)
    if not ranges:
        return rows
    at = _RANGED[kind]
    pieces: list[tuple] = []
    for row in rows:
        queue_ranges = ranges.get(row[at])
        if queue_ranges is None:
            pieces.append(row)
            continue
        head = row[: at + 1]
        pieces.extend((*head, lo, hi) for lo, hi in outside_marked(queue_ranges, *row[at + 1 :]))
    return pieces


def _put_runs(rows: list[tuple]) -> Iterator[tuple[str, list[tuple]]]:
    """A run of PUTs as consecutive runs of one statement (PLAIN_PUT, KEYED_PUT or the
    whole one) and the values it binds, in their order."""
    statement = ""
    run: list[tuple] = []
    for row in rows:
        if row[_FIRST_VALUES:_MIDDLE_END] != SEND_PUT_MIDDLE:
            this, values = STATEMENTS[PUT], row
        elif row[_MIDDLE_END]:
            this, values = KEYED_PUT, (*row[:_FIRST_VALUES], row[_MIDDLE_END])
        else:
            this, values = PLAIN_PUT, row[:_FIRST_VALUES]
        if this is not statement:
            if run:
                yield statement, run
            statement, run = this, []
        run.append(values)
    if run:
        yield statement, run


#: The operations `_write_keys` writes.
KEY_KINDS = frozenset({KEY, LET_GO, HELD_GONE})
_KEYS_BLOB = msgspec.msgpack.Encoder()
_KEYS_FROM_BLOB = msgspec.msgpack.Decoder(list[tuple[str, str, bytes]])
_HELD_FROM_BLOB = msgspec.msgpack.Decoder(list[tuple[str, bytes]])


def _write_keys(db: sqlite3.Connection, operations: list[tuple]) -> None:
    """Held keys as one row per target, writer batch (key_holds.held_batch) and turn, a blob
    of (key, id), deleted by one statement per writer batch once the core has let every key
    of it go (HELD_GONE; until then a restart finds them held, and recovery gives the window
    to those of a batch committed or released). The other keys of the turn, let-go ones
    among them, as one row per expiry time (all of a turn's share one), a blob of (queue,
    key, id). A key costs its bytes in a blob, not a row and an index entry (issue #31). A key
    written again is in two batches: the later one is what a restart keeps (load_keys,
    restore_keys)."""
    held: dict[tuple[str, str], list[tuple[str, bytes]]] = {}
    gone: dict[tuple[str, str], None] = {}
    batches: dict[float, list[tuple[str, str, bytes]]] = {}
    writer_batch = WriterBatches().of
    for operation in operations:
        if operation[0] == HELD_GONE:
            gone_group = (operation[1], operation[2])
            gone[gone_group] = None
            held.pop(gone_group, None)  # held before in this turn: gone too
            continue
        _, queue, key, message_id, expires_wall = operation
        if expires_wall == math.inf:
            group = writer_batch(queue, key)
            keys = held.get(group)
            if keys is None:
                keys = held[group] = []
            keys.append((key, message_id))
            continue
        batch = batches.get(expires_wall)
        if batch is None:
            batch = batches[expires_wall] = []
        batch.append((queue, key, message_id))
    if gone:
        db.executemany("DELETE FROM held_key_batches WHERE queue = ? AND batch = ?", gone)
    if held:
        db.executemany(
            "INSERT INTO held_key_batches VALUES (?, ?, ?)",
            [(queue, group, _KEYS_BLOB.encode(keys)) for (queue, group), keys in held.items()],
        )
    if batches:
        _insert_key_batches(db, batches)


def _insert_key_batches(
    db: sqlite3.Connection, batches: dict[float, list[tuple[str, str, bytes]]]
) -> None:
    """A row of `key_batches` for each expiry: its keys' (queue, key, ID), encoded."""
    db.executemany(
        "INSERT INTO key_batches VALUES (?, ?)",
        [(wall, _KEYS_BLOB.encode(batch)) for wall, batch in batches.items()],
    )


def read_keys(db: sqlite3.Connection) -> list[StoredKey]:
    """Every key on disk, held ones (+inf) and those of every batch, oldest batch first."""
    keys = [
        StoredKey(queue, key, message_id, math.inf)
        for queue, blob in db.execute("SELECT queue, keys FROM held_key_batches ORDER BY rowid")
        for key, message_id in _HELD_FROM_BLOB.decode(blob)
    ]
    for expires_wall, blob in db.execute(
        "SELECT expires_wall, keys FROM key_batches ORDER BY rowid"
    ):
        keys.extend(
            StoredKey(queue, key, message_id, expires_wall)
            for queue, key, message_id in _KEYS_FROM_BLOB.decode(blob)
        )
    return keys


def keys_into_batches(db: sqlite3.Connection) -> None:
    """A store written before key batches has its keys in a table `keys`, a row each, and
    one written before held keys went in batches has those in a table `held_keys`, a row
    each: moved into `held_key_batches` and `key_batches` (in the open transaction)."""
    for table, select in (
        ("keys", "SELECT ?, queue, key, CAST(id AS BLOB), expires_wall FROM keys"
                 " ORDER BY expires_wall"),
        ("held_keys", "SELECT ?, queue, key, id, 'inf' FROM held_keys"),
    ):  # fmt: skip
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
            rows = db.execute(select, (KEY,)).fetchall()
            _write_keys(db, [(*row[:4], float(row[4])) for row in rows])
            db.execute(f"DROP TABLE {table}")


def _apply(db: sqlite3.Connection, operation: tuple) -> None:
    kind = operation[0]
    if kind == DEAD:
        db.execute("DELETE FROM messages WHERE id = ?", (operation[2],))
        db.execute(
            "INSERT INTO dead_letters (queue, id, content, reason, deliveries, dead_at,"
            " headers, message_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            operation[1:],
        )
    elif kind == DELETE_QUEUE:
        if len(operation) == 4:  # the queue and the positions it had handed out
            mark_deleted(db, *operation[1:])
            return
        for table in ("messages", "dead_letters", "bindings", "queue_settings"):
            db.execute(f"DELETE FROM {table} WHERE queue = ?", operation[1:])
    elif kind == CLEAR and len(operation) == 4:
        mark_cleared(db, *operation[1:])
    elif kind == UNKEY:
        db.execute(STATEMENTS[UNKEY], operation[1:])
        if operation[1] == math.inf:  # every key: the held ones too
            db.execute("DELETE FROM held_key_batches")
    else:
        db.execute(STATEMENTS[kind], operation[1:])
