"""A turn of plain sends alone (store_schema._wrote_as_sends): written with passes in C, it
must leave the tables exactly as the general path does, for every turn it takes and hand
every other turn to that path."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phpmq.broker.journal import DROP, FLY, HELD_GONE, KEY, PUT
from phpmq.broker.shell import put_runs, store_schema
from phpmq.broker.shell.put_runs import RUN_BYTES, RUN_MESSAGES
from phpmq.broker.shell.store_schema import SCHEMA, read_keys, read_put_runs, write

KEYS_AT = 1_900_000_000.0


def send(seq: int, key: bytes = b"", queue: str = "q", expires: float = 0.0) -> tuple:
    """A journal PUT of a plain send, as Journal.put writes it."""
    return (PUT, b"%016d" % seq, queue, seq, b"c%d" % seq, b"", expires, 0, b"", None, None,
            0.0, key)  # fmt: skip


def idempotency_key(seq: int, expires: float = KEYS_AT) -> tuple:
    return (KEY, "q", f"scope/0/{seq}", b"%016d" % seq, expires)


def sink_turn(count: int, keyed: bool) -> list[tuple]:
    """A Spark sink's turn: each send followed by its idempotency key."""
    turn: list[tuple] = []
    for seq in range(count):
        turn += [send(seq, b"k%d" % seq if keyed else b""), idempotency_key(seq)]
    return turn


def tables(db: sqlite3.Connection) -> dict[str, list[tuple]]:
    return {
        table: db.execute(f"SELECT rowid, * FROM {table} ORDER BY rowid").fetchall()
        for table in ("messages", "put_runs", "run_bits", "key_batches", "held_key_batches")
    }


def written(operations: list[tuple], general: bool) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(SCHEMA)
    saved = store_schema._SENDS_AT_LEAST
    store_schema._SENDS_AT_LEAST = math.inf if general else saved  # type: ignore[assignment]
    try:
        db.execute("BEGIN")
        write(db, operations)
        db.execute("COMMIT")
    finally:
        store_schema._SENDS_AT_LEAST = saved
    return db


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many messages each write of a turn of sends took past the general path."""
    counts: list[int] = []
    keep = put_runs.keep_consecutive

    def counted(db: sqlite3.Connection, queue: str, first_seq: int, puts: list[tuple]) -> bool:
        kept = keep(db, queue, first_seq, puts)
        if kept:
            counts.append(len(puts))
        return kept

    monkeypatch.setattr(put_runs, "keep_consecutive", counted)
    yield counts


@pytest.mark.parametrize("keyed", [False, True])
def test_a_sinks_turn_is_written_as_sends_and_as_the_general_path_writes_it(
    keyed: bool, taken: list[int]
) -> None:
    turn = sink_turn(300, keyed)
    fast = written(turn, general=False)
    assert taken == [300]
    general = written(turn, general=True)
    assert tables(fast) == tables(general)
    assert len(tables(fast)["put_runs"]) == -(-300 // RUN_MESSAGES)
    assert [m.seq for m in read_put_runs(fast)] == list(range(300))
    assert [m.message_key for m in read_put_runs(fast)][:2] == (
        [b"k0", b"k1"] if keyed else [b""] * 2
    )
    assert len(read_keys(fast)) == 300


def test_a_producers_turn_without_keys_is_written_as_sends(taken: list[int]) -> None:
    turn = [send(seq) for seq in range(100)]
    assert tables(written(turn, general=False)) == tables(written(turn, general=True))
    assert taken == [100]


def _changed(turn: list[tuple], at: int, change: str) -> list[tuple]:
    """`turn` (a sink's) with one of its sends or keys made what a turn of sends is not."""
    turn = list(turn)
    put_at = 2 * at
    operation = turn[put_at]
    if change == "second queue":
        turn[put_at] = send(operation[3], operation[12], queue="other")
    elif change == "expires":
        turn[put_at] = send(operation[3], operation[12], expires=KEYS_AT)
    elif change == "gap":
        turn[put_at:] = [(*op[:3], op[3] + 5, *op[4:]) if op[0] == PUT else op
                         for op in turn[put_at:]]  # fmt: skip
    elif change == "reply route":
        turn[put_at] = (*operation[:9], "replies", *operation[10:])
    elif change == "one message key":
        turn[put_at] = (*operation[:12], b"one")
    elif change == "held key":
        turn[put_at + 1] = idempotency_key(at, math.inf)
    elif change == "later key":
        turn[put_at + 1] = idempotency_key(at, KEYS_AT + 1)
    elif change == "no key":
        del turn[put_at + 1]
    elif change == "dispatch":
        turn.insert(put_at, (FLY, "q", 0, 3))
    elif change == "held batch gone":
        turn[put_at + 1] = (HELD_GONE, "q", "scope/0")
    elif change == "big":
        turn[put_at] = (*operation[:4], bytes(RUN_BYTES), *operation[5:])
    return turn


CHANGES = ("second queue", "expires", "gap", "reply route", "one message key", "held key",
           "later key", "no key", "dispatch", "held batch gone", "big")  # fmt: skip


@pytest.mark.parametrize("change", CHANGES)
def test_a_turn_that_is_not_only_sends_of_one_form_goes_the_general_way(
    change: str, taken: list[int]
) -> None:
    turn = _changed(sink_turn(40, keyed=False), 17, change)
    assert tables(written(turn, general=False)) == tables(written(turn, general=True))
    assert taken == []


def _every_key_held(turn: list[tuple]) -> list[tuple]:
    return [(*op[:4], math.inf) if op[0] == KEY else op for op in turn]


OTHER_TURNS = {
    # An ack in the same queue: the one operation not a send nor a key.
    "sends and an ack": [send(seq) for seq in range(40)] + [(DROP, b"%016d" % 3, "q", 3)],
    # Held keys go to held_key_batches, by writer batch.
    "every key held": _every_key_held(sink_turn(40, keyed=True)),
    # A replica's turn as decoded: lists, whose PUTs the general path writes as rows.
    "lists": [list(operation) for operation in sink_turn(40, keyed=True)],
}


@pytest.mark.parametrize("name", OTHER_TURNS)
def test_a_turn_with_more_than_sends_or_not_as_the_journal_writes_it_goes_the_general_way(
    name: str, taken: list[int]
) -> None:
    turn = OTHER_TURNS[name]
    assert tables(written(turn, general=False)) == tables(written(turn, general=True))
    assert taken == []


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 200),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 199), st.sampled_from(CHANGES)), max_size=2),
)
def test_every_turn_of_sends_leaves_the_tables_as_the_general_path(
    count: int, keyed: bool, changes: list[tuple[int, str]]
) -> None:
    turn = sink_turn(count, keyed)
    for at, change in changes:
        if at < count and 2 * at + 1 < len(turn) and turn[2 * at][0] == PUT:
            turn = _changed(turn, at, change)
    assert tables(written(turn, general=False)) == tables(written(turn, general=True))
