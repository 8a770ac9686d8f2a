"""Put runs: the plain sends of one write to one queue kept as one row, their content never
written again (docs/durability.md, "Put runs").

A producer filling a queue (a Spark sink, a backlog) has every message written once and, for
a while, nothing else done to it. As a row each, a message costs SQLite's insert into the
table and its two indexes, about 3 µs of the broker's CPU, and the dispatch and ack that
follow cost an update and a delete of that row; as part of a run, the put costs about 0.4 µs
and the dispatch and ack each set a bit of the run (issue #31: the durable sink went at half
the in-memory one's rate).

Kept in a run: a PUT of the plain or keyed form (store_schema's PLAIN_PUT, KEYED_PUT: no
event, reply route or delay) that never expires, to a queue no DEAD, CLEAR or DELETE_QUEUE
of the same write names; a run's messages have consecutive positions. What happens to them
next is kept in `run_bits`, a bit a message:
- a dispatch (FLY) sets `flown` for the ready ones it covers (`fly`);
- a batch lease (LEASE_TAKEN) sets `leased` for the ready ones it covers, and `run_leases`
  says which lease took which (`lease_taken`); its commit (LEASE_DONE) makes them gone;
- an ack (DROP, which names the message's queue and position) sets `gone` (`drop`); the run
  goes, with its bits, once every message in it is gone.
A start reads a run's messages that are not gone, in flight or leased as their bits say,
and never hands out again a position a run spans (`run_span`): an ack's position is its
message's alone.

Anything rarer *stubs* the run first (`_stub`): each message not gone gets a row in
`messages` like any other, in flight or leased as its bits say, but without its content and
headers, which stay in the run (`in_run` says where: the run's rowid times 64 plus the
message's place in it). The usual statements then act on the stubs, and the run goes with
its last stub (the trigger in STUBS_SCHEMA). A stub costs about a tenth of a 1 KB message's
row, so even that needs little room on a full disk. What stubs:
- a return or delay (BACK, DELAY), which names the position its message had: the run
  holding that position (`stub_at`);
- a dead letter (DEAD: by ID alone): the run holding it, looked for among the queue's runs
  in flight or leased (`stub_holding`), then oldest first (`stub_first_holding`: a full
  queue burying its oldest); none for a message the turn log never wrote;
- a purge or delete of the queue (CLEAR, DELETE_QUEUE) removes its runs inside the positions
  it marks whole, those with messages in flight or leased excepted for a purge, which it
  stubs (`clear`).
A return, delay or an ack of the older form (by ID alone) that names a message no row holds
looks for it among the runs holding messages in flight or leased, where the core's are, and
failing that in every run (`stub_holding`).

store_schema.py calls these while it writes a turn; this module owns the tables of runs.
"""

from __future__ import annotations

import sqlite3
from bisect import bisect_right
from collections.abc import Iterable
from operator import add, itemgetter

import msgspec

SCHEMA = """
CREATE TABLE IF NOT EXISTS put_runs (
    queue TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    puts BLOB NOT NULL,
    stubbed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS put_runs_unstubbed ON put_runs (queue, first_seq)
    WHERE stubbed = 0;
CREATE TABLE IF NOT EXISTS run_bits (
    run INTEGER PRIMARY KEY,
    flown INTEGER NOT NULL DEFAULT 0,
    gone INTEGER NOT NULL DEFAULT 0,
    leased INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS run_leases (
    lease TEXT NOT NULL,
    run INTEGER NOT NULL,
    taken INTEGER NOT NULL,
    PRIMARY KEY (lease, run)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS run_leases_by_run ON run_leases (run);
"""

#: Messages a run holds at most: a bit each in a SQLite INTEGER (signed, 64 bits)...
RUN_MESSAGES = 63
#: ...and the content and headers after which a run takes no more (a message bigger than
#: this is a run alone: SQLite's blobs stop at 1 GB, and max_content_bytes at 16 MiB).
RUN_BYTES = 1 << 20
#: `in_run` is the run's rowid shifted by this, plus the message's place.
_PLACE_BITS = 6

#: Once `messages` has its `in_run` column (an old store gets it first): the stubs' index,
#: and the trigger that deletes a stubbed run with its last stub, whatever deleted that (an
#: ack, a lease's commit, a dead letter, a purge's slice, a queue's deletion).
STUBS_SCHEMA = f"""
CREATE INDEX IF NOT EXISTS messages_in_run ON messages (in_run) WHERE in_run IS NOT NULL;
CREATE TRIGGER IF NOT EXISTS put_run_released AFTER DELETE ON messages
WHEN old.in_run IS NOT NULL
BEGIN
    DELETE FROM put_runs WHERE rowid = old.in_run >> {_PLACE_BITS} AND stubbed = 1
        AND NOT EXISTS (SELECT 1 FROM messages WHERE in_run
            BETWEEN (old.in_run >> {_PLACE_BITS}) << {_PLACE_BITS}
            AND ((old.in_run >> {_PLACE_BITS}) << {_PLACE_BITS}) + {(1 << _PLACE_BITS) - 1});
END;
"""

#: Where a PUT's values hold its queue, position, content, headers and expiry.
QUEUE_AT, SEQ_AT, CONTENT_AT, HEADERS_AT, EXPIRES_AT = 1, 2, 3, 4, 5
#: The values of a plain PUT; a keyed one has its message key after them.
PLAIN_VALUES = 7

#: A stub: a run's message as a row, its content and headers left in the run.
STUB_PUT = (
    "INSERT OR REPLACE INTO messages (id, queue, seq, content, headers, expires_wall,"
    " deliveries, in_flight, message_key, in_run, lease)"
    " VALUES (?, ?, ?, x'', x'', ?, ?, ?, ?, ?, ?)"
)
#: In the messages' `in_flight`: in flight, and in a batch lease (store_schema.StoredMessage).
IN_FLIGHT, LEASED = 1, 3
#: A run's row (`keep`, `keep_consecutive`).
_INSERT_RUN = "INSERT INTO put_runs (queue, first_seq, last_seq, puts) VALUES (?, ?, ?, ?)"
_FLOWN = (
    "INSERT INTO run_bits (run, flown) VALUES (?1, ?2)"
    " ON CONFLICT (run) DO UPDATE SET flown = flown | (?2 & ~gone & ~leased)"
)
_GONE = (
    "INSERT INTO run_bits (run, gone) VALUES (?1, ?2) ON CONFLICT (run) DO UPDATE"
    " SET gone = gone | ?2, flown = flown & ~?2, leased = leased & ~?2"
)
_LEASED = (
    "INSERT INTO run_bits (run, leased) VALUES (?1, ?2)"
    " ON CONFLICT (run) DO UPDATE SET leased = leased | ?2"
)
_LEASE_TAKES = (
    "INSERT INTO run_leases VALUES (?, ?, ?)"
    " ON CONFLICT (lease, run) DO UPDATE SET taken = taken | excluded.taken"
)
#: A run whose every message is gone goes, with its bits.
_RELEASE_RUN = (
    "DELETE FROM put_runs WHERE rowid = (SELECT run FROM run_bits WHERE run = ? AND gone = ?)"
)
_RELEASE_BITS = "DELETE FROM run_bits WHERE run = ? AND gone = ?"
#: A run with its bits, for stubs.
_WITH_BITS = (
    "SELECT p.rowid, p.puts, coalesce(b.flown, 0), coalesce(b.gone, 0), coalesce(b.leased, 0)"
    " FROM put_runs p LEFT JOIN run_bits b ON b.run = p.rowid"
)
_OVERLAPPING = " WHERE p.queue = ? AND p.stubbed = 0 AND p.first_seq <= ? AND p.last_seq >= ?"

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[tuple]).decode
_CONTENT = itemgetter(CONTENT_AT)
_HEADERS = itemgetter(HEADERS_AT)

#: A run taken for stubs: rowid, PUTs' values, flown, gone and leased bits.
TakenRun = tuple[int, list[tuple], int, int, int]


def in_run(run: int, place: int) -> int:
    """The `in_run` value of the message at `place` in the run with rowid `run`."""
    return (run << _PLACE_BITS) | place


def run_and_place(in_run_value: int) -> tuple[int, int]:
    return in_run_value >> _PLACE_BITS, in_run_value & ((1 << _PLACE_BITS) - 1)


# ---------------------------------------------------------------------- the common paths


def keep(db: sqlite3.Connection, puts: list[tuple]) -> list[tuple]:
    """Keep the PUTs of `puts` (one statement's values, in order) that never expire in runs
    of up to RUN_MESSAGES consecutive positions of one queue; returns the others, for rows."""
    rest: list[tuple] = []
    by_queue: dict[str, list[tuple]] = {}
    for values in puts:
        if values[EXPIRES_AT]:
            rest.append(values)
            continue
        queue_puts = by_queue.get(values[QUEUE_AT])
        if queue_puts is None:
            queue_puts = by_queue[values[QUEUE_AT]] = []
        queue_puts.append(values)
    runs = [
        (queue, run[0][SEQ_AT], run[-1][SEQ_AT], _encode(run))
        for queue, queue_puts in by_queue.items()
        for run in _cut(queue_puts)
    ]
    if runs:
        db.executemany(_INSERT_RUN, runs)
    return rest


def keep_consecutive(db: sqlite3.Connection, queue: str, first_seq: int, puts: list[tuple]) -> bool:
    """`puts` (values of PUTs to `queue` that never expire, at positions `first_seq` on
    without a gap) kept in runs as `keep` keeps them, cut every RUN_MESSAGES without a look at
    each; False, nothing written, if a run's contents and headers would reach RUN_BYTES
    (`keep` cuts those by size)."""
    count = len(puts)
    sizes = list(map(add, map(len, map(_CONTENT, puts)), map(len, map(_HEADERS, puts))))
    starts = range(0, count, RUN_MESSAGES)
    if max(sum(sizes[start : start + RUN_MESSAGES]) for start in starts) >= RUN_BYTES:
        return False
    db.executemany(
        _INSERT_RUN,
        [
            (queue, first_seq + start, first_seq + min(start + RUN_MESSAGES, count) - 1,
             _encode(puts[start : start + RUN_MESSAGES]))
            for start in starts
        ],
    )  # fmt: skip
    return True


def _cut(puts: list[tuple]) -> list[list[tuple]]:
    """`puts` (in order) as runs of consecutive positions, RUN_MESSAGES and about RUN_BYTES
    at most each (a run is read whole to stub it)."""
    runs: list[list[tuple]] = []
    run: list[tuple] = []
    size = 0
    for values in puts:
        if run and (
            len(run) == RUN_MESSAGES or size >= RUN_BYTES or values[SEQ_AT] != run[-1][SEQ_AT] + 1
        ):
            runs.append(run)
            run = []
            size = 0
        run.append(values)
        size += len(values[CONTENT_AT]) + len(values[HEADERS_AT])
    if run:
        runs.append(run)
    return runs


def fly(db: sqlite3.Connection, queue: str, first_seq: int, last_seq: int) -> None:
    """A dispatch of the ready messages of `queue` placed in [first_seq, last_seq]: those of
    its runs are in flight now."""
    flown = [
        (run, _span(max(first_seq, first), min(last_seq, last), first))
        for first, last, run in _overlapping(db, queue, first_seq, last_seq)
    ]
    if flown:
        db.executemany(_FLOWN, flown)


def drop(db: sqlite3.Connection, rows: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """Acks (a DROP's values: ID, queue, position): those of messages in runs are gone from
    them, and a run whose every message is gone goes. Returns the IDs (as 1-tuples) of the
    others, which are rows or nothing; and the acks of the older form (ID alone), which a
    run may hold (store_schema._apply_by_id)."""
    by_queue: dict[str, list[tuple]] = {}
    older: list[tuple] = []
    for row in rows:
        if len(row) == 3:
            queue_drops = by_queue.get(row[1])
            if queue_drops is None:
                queue_drops = by_queue[row[1]] = []
            queue_drops.append(row)
        else:
            older.append(row)
    rest: list[tuple] = []
    gone: dict[int, int] = {}
    full: dict[int, int] = {}
    for queue, queue_drops in by_queue.items():
        for drops in _clusters(queue_drops):
            _gone_in_runs(db, queue, drops, gone, full, rest)
    if gone:
        db.executemany(_GONE, gone.items())
        _release(db, [(run, full[run]) for run in gone])
    return rest, older


def _clusters(drops: list[tuple]) -> list[list[tuple]]:
    """Acks of one queue by position, in groups a run's length apart at least: each group's
    runs are found by one query over its positions alone (an ack at the tail and one at the
    head of a backlog would span every run between)."""
    drops = sorted(drops, key=_seq_of)
    clusters = [[drops[0]]]
    for row in drops[1:]:
        if row[2] - clusters[-1][-1][2] > RUN_MESSAGES:
            clusters.append([])
        clusters[-1].append(row)
    return clusters


def _seq_of(row: tuple) -> int:
    return row[2]


def _gone_in_runs(
    db: sqlite3.Connection,
    queue: str,
    drops: list[tuple],
    gone: dict[int, int],
    full: dict[int, int],
    rest: list[tuple],
) -> None:
    """The acks `drops` (in position order) of messages in runs added to `gone` (run ->
    bits) and `full` (run -> every message's bit); the others' IDs to `rest`."""
    runs = _overlapping(db, queue, drops[0][2], drops[-1][2])
    if not runs:
        rest.extend(row[:1] for row in drops)
        return
    firsts = [run[0] for run in runs]
    for row in drops:
        seq = row[2]
        at = bisect_right(firsts, seq) - 1
        if at < 0 or seq > runs[at][1]:
            rest.append(row[:1])
            continue
        first, last, run = runs[at]
        gone[run] = gone.get(run, 0) | (1 << (seq - first))
        full[run] = (1 << (last - first + 1)) - 1


def _release(db: sqlite3.Connection, done: list[tuple[int, int]]) -> None:
    """Of the runs `done` (rowid, every message's bit), those whose every message is gone go,
    with their bits and leases."""
    db.executemany(_RELEASE_RUN, done)
    released = [(run,) for run, _ in done]
    db.executemany(_RELEASE_BITS, done)
    db.executemany(
        "DELETE FROM run_leases WHERE run = ? AND NOT EXISTS"
        " (SELECT 1 FROM put_runs WHERE rowid = run_leases.run)",
        released,
    )


def _overlapping(
    db: sqlite3.Connection, queue: str, first_seq: int, last_seq: int
) -> list[tuple[int, int, int]]:
    """(first position, last position, rowid) of the runs of `queue` not stubbed with a
    message placed in [first_seq, last_seq], in position order."""
    return db.execute(
        "SELECT first_seq, last_seq, rowid FROM put_runs WHERE queue = ? AND stubbed = 0"
        " AND first_seq BETWEEN ? AND ? AND last_seq >= ? ORDER BY first_seq",
        (queue, first_seq - (RUN_MESSAGES - 1), last_seq, first_seq),
    ).fetchall()


def _span(lo: int, hi: int, first: int) -> int:
    """The bits of the places of positions lo..hi in a run starting at `first`."""
    return ((1 << (hi - lo + 1)) - 1) << (lo - first)


def lease_taken(
    db: sqlite3.Connection, lease: str, queue: str, first_seq: int, last_seq: int
) -> None:
    """A batch lease of the ready messages of `queue` placed in [first_seq, last_seq]: those
    of its runs are in the lease now."""
    taken: list[tuple[int, int]] = []
    for first, last, run, busy in db.execute(
        "SELECT p.first_seq, p.last_seq, p.rowid, coalesce(b.flown | b.gone | b.leased, 0)"
        " FROM put_runs p LEFT JOIN run_bits b ON b.run = p.rowid"
        " WHERE p.queue = ? AND p.stubbed = 0 AND p.first_seq BETWEEN ? AND ?"
        " AND p.last_seq >= ?",
        (queue, first_seq - (RUN_MESSAGES - 1), last_seq, first_seq),
    ):
        bits = _span(max(first_seq, first), min(last_seq, last), first) & ~busy
        if bits:
            taken.append((run, bits))
    if taken:
        db.executemany(_LEASED, taken)
        db.executemany(_LEASE_TAKES, [(lease, run, bits) for run, bits in taken])


def lease_done(db: sqlite3.Connection, queue: str, lease: str) -> None:
    """A batch lease committed: the messages of runs in it are gone."""
    taken = db.execute(
        "SELECT l.run, l.taken, p.last_seq - p.first_seq + 1 FROM run_leases l"
        " JOIN put_runs p ON p.rowid = l.run WHERE l.lease = ? AND p.queue = ?",
        (lease, queue),
    ).fetchall()
    if not taken:
        return
    db.executemany(_GONE, [(run, bits) for run, bits, _ in taken])
    db.executemany(
        "DELETE FROM run_leases WHERE lease = ? AND run = ?", [(lease, t[0]) for t in taken]
    )
    _release(db, [(run, (1 << size) - 1) for run, _, size in taken])


# ---------------------------------------------------------------------- the rarer paths


def stub_overlapping(db: sqlite3.Connection, queue: str, first_seq: int, last_seq: int) -> None:
    """The runs of `queue` with a message placed in [first_seq, last_seq], stubbed."""
    _stub(db, _taken(db, _OVERLAPPING, (queue, last_seq, first_seq)))


def stub_holding(
    db: sqlite3.Connection, ids: Iterable[bytes], queue: str | None = None, anywhere: bool = False
) -> set[bytes]:
    """The runs holding a message of `ids` in flight or in a lease (a return, a delay, a dead
    letter names its message by ID alone; it is almost always one a dispatch or lease took),
    or with `anywhere` as it may be, of a `queue` if given, stubbed; which of `ids` they
    held."""
    wanted = set(ids)
    where = (
        " WHERE p.stubbed = 0"
        if anywhere
        else " WHERE p.stubbed = 0 AND (b.flown != 0 OR b.leased != 0)"
    )
    if queue is None:
        runs = _taken(db, where, ())
    else:
        runs = _taken(db, where + " AND p.queue = ?", (queue,))
    found: set[bytes] = set()
    holding = []
    for run in runs:
        held = run[2] | run[4] if not anywhere else -1
        here = {
            values[0]
            for place, values in enumerate(run[1])
            if values[0] in wanted and held >> place & 1
        }
        if here:
            found |= here
            holding.append(run)
    _stub(db, holding)
    return found


def has_unstubbed(db: sqlite3.Connection) -> bool:
    """Whether `db` holds a run not stubbed."""
    if not _has_table(db):
        return False
    return db.execute("SELECT 1 FROM put_runs WHERE stubbed = 0 LIMIT 1").fetchone() is not None


def stub_at(db: sqlite3.Connection, places: list[tuple[str, int]]) -> None:
    """The runs holding the positions `places` (queue, position), stubbed (a return or a
    delay names where its message was)."""
    by_queue: dict[str, list[tuple]] = {}
    for queue, seq in places:
        by_queue.setdefault(queue, []).append((None, queue, seq))
    wanted: dict[int, None] = {}
    for queue, rows in by_queue.items():
        for cluster in _clusters(rows):
            runs = _overlapping(db, queue, cluster[0][2], cluster[-1][2])
            firsts = [run[0] for run in runs]
            for _, _, seq in cluster:
                at = bisect_right(firsts, seq) - 1
                if at >= 0 and seq <= runs[at][1]:
                    wanted[runs[at][2]] = None
    for run in wanted:
        _stub(db, _taken(db, " WHERE p.rowid = ?", (run,)))


def stub_first_holding(db: sqlite3.Connection, message_id: bytes, queue: str) -> bool:
    """The run of `queue` holding `message_id`, looked for oldest first (a full queue buries
    its oldest), stubbed; whether there was one. Runs that do not hold it stay as they are."""
    after = None
    while True:  # a few runs at a time: the first is almost always the one
        runs = db.execute(
            "SELECT rowid, first_seq FROM put_runs WHERE queue = ? AND stubbed = 0"
            " AND first_seq > coalesce(?, -(1 << 62)) ORDER BY first_seq LIMIT 8",
            (queue, after),
        ).fetchall()
        if not runs:
            return False
        for run, first in runs:
            taken = _taken(db, " WHERE p.rowid = ?", (run,))
            if any(values[0] == message_id for values in taken[0][1]):
                _stub(db, taken)
                return True
            after = first


def stub_every_run(db: sqlite3.Connection) -> int:
    """Every run not stubbed yet, stubbed; how many there were."""
    if not has_put_runs(db):
        return 0
    runs = _taken(db, " WHERE p.stubbed = 0 ORDER BY p.rowid", ())
    _stub(db, runs)
    return len(runs)


def clear(db: sqlite3.Connection, queue: str, lo: int | None, hi: int | None, delete: bool) -> None:
    """A purge (`delete` False: the ready messages) or a deletion of `queue` over positions
    [lo, hi] (None: every position, the form written before purges were marked): its runs
    inside them go whole, but for a purge those with a message in flight or leased, which
    are stubbed (the purge then deletes the ready stubs where it marked); so is a run
    reaching out of them (none should)."""
    if lo is None or hi is None:
        lo, hi = -(1 << 62), 1 << 62
    inside = (
        "SELECT p.rowid FROM put_runs p LEFT JOIN run_bits b ON b.run = p.rowid WHERE"
        " p.queue = ? AND p.stubbed = 0 AND p.first_seq >= ? AND p.last_seq <= ?"
    )
    if not delete:
        inside += " AND coalesce(b.flown | b.leased, 0) = 0"
    whole = db.execute(inside, (queue, lo, hi)).fetchall()
    if whole:
        db.executemany("DELETE FROM put_runs WHERE rowid = ?", whole)
        db.executemany("DELETE FROM run_bits WHERE run = ?", whole)
        db.executemany("DELETE FROM run_leases WHERE run = ?", whole)
    stub_overlapping(db, queue, lo, hi)


def _taken(db: sqlite3.Connection, where: str, values: tuple) -> list[TakenRun]:
    return [
        (run, _decode(blob), flown, gone, leased)
        for run, blob, flown, gone, leased in db.execute(_WITH_BITS + where, values)
    ]


def _leases(db: sqlite3.Connection, runs: Iterable[int]) -> dict[int, list[tuple[str, int]]]:
    """The leases holding messages of `runs`: run -> [(lease, its bits)]."""
    found: dict[int, list[tuple[str, int]]] = {}
    for run in runs:
        for lease, taken in db.execute("SELECT lease, taken FROM run_leases WHERE run = ?", (run,)):
            found.setdefault(run, []).append((lease, taken))
    return found


def _state(
    place: int, flown: int, leased: int, leases: list[tuple[str, int]]
) -> tuple[int, str | None]:
    """A run's message as a row would say it: `in_flight` and `lease`."""
    if leased >> place & 1:
        for lease, taken in leases:
            if taken >> place & 1:
                return LEASED, lease
    return (IN_FLIGHT if flown >> place & 1 else 0), None


def _stub(db: sqlite3.Connection, runs: list[TakenRun]) -> None:
    """Each message of `runs` not gone as a stub, in flight or in its lease as its bits say;
    the runs marked stubbed (one with every message gone deleted), their bits and leases
    deleted."""
    if not runs:
        return
    leases = _leases(db, [run[0] for run in runs if run[4]])
    stubs: list[tuple] = []
    for run, puts, flown, gone, leased in runs:
        run_leases = leases.get(run, [])
        for place, values in enumerate(puts):
            if gone >> place & 1:
                continue
            in_flight, lease = _state(place, flown, leased, run_leases)
            key = values[PLAIN_VALUES] if len(values) > PLAIN_VALUES else b""
            stubs.append(
                (
                    *values[:CONTENT_AT],
                    *values[EXPIRES_AT:PLAIN_VALUES],
                    in_flight,
                    key,
                    in_run(run, place),
                    lease,
                )
            )
    if stubs:
        db.executemany(STUB_PUT, stubs)
    rowids = [(run[0],) for run in runs]
    db.executemany("UPDATE put_runs SET stubbed = 1 WHERE rowid = ?", rowids)
    db.executemany("DELETE FROM run_bits WHERE run = ?", rowids)
    db.executemany("DELETE FROM run_leases WHERE run = ?", rowids)
    emptied = [(run[0],) for run in runs if run[3] == (1 << len(run[1])) - 1]
    if emptied:
        db.executemany("DELETE FROM put_runs WHERE rowid = ?", emptied)


# ---------------------------------------------------------------------- reading


def read_unstubbed(db: sqlite3.Connection) -> list[tuple[tuple, int, str | None]]:
    """The PUTs of every message of the runs not stubbed that is not gone, each with its
    `in_flight` and `lease` as a row would say them (a start reads them)."""
    if not has_put_runs(db):
        return []
    runs = _taken(db, " WHERE p.stubbed = 0", ())
    leases = _leases(db, [run[0] for run in runs if run[4]])
    return [
        (values, *_state(place, flown, leased, leases.get(run, [])))
        for run, puts, flown, gone, leased in runs
        for place, values in enumerate(puts)
        if not gone >> place & 1
    ]


def read_stubbed(db: sqlite3.Connection) -> dict[int, list[tuple]]:
    """The PUTs of every stubbed run, by its rowid (their stubs' content and headers)."""
    if not has_put_runs(db):
        return {}
    return {
        run: _decode(blob)
        for run, blob in db.execute("SELECT rowid, puts FROM put_runs WHERE stubbed = 1")
    }


def run_span(db: sqlite3.Connection) -> tuple[int, int] | None:
    """The lowest and highest position a run holds, gone messages included (None: none)."""
    if not _has_table(db):
        return None
    lo, hi = db.execute("SELECT min(first_seq), max(last_seq) FROM put_runs").fetchone()
    return None if lo is None else (lo, hi)


def has_put_runs(db: sqlite3.Connection) -> bool:
    """Whether `db` holds runs, stubbed or not."""
    if not _has_table(db):
        return False
    return db.execute("SELECT 1 FROM put_runs LIMIT 1").fetchone() is not None


def _has_table(db: sqlite3.Connection) -> bool:
    """Whether `db` has the runs' tables (a store older than them, read as it is, has not)."""
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'put_runs'").fetchone() is not None
