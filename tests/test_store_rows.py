"""The store's rows (broker/shell/store_schema.py): a plain or keyed send's PUT binds only the
values that differ from the columns' defaults; the row it writes must be the one the whole
statement writes, column by column and type by type, in a store made now or converted from an
old one, whether written at once or kept in a put run first."""

from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from harness import FIRST_MESSAGES_TABLE
from phpmq.broker.journal import PUT
from phpmq.broker.shell.store_schema import (
    ADDED_COLUMNS,
    SCHEMA,
    SEND_PUT_MIDDLE,
    STATEMENTS,
    runs_as_rows,
    write,
)


def _store(converted: bool) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    if converted:
        db.execute(FIRST_MESSAGES_TABLE)
        for name, declaration in ADDED_COLUMNS:
            db.execute(f"ALTER TABLE messages ADD COLUMN {name} {declaration}")
    db.executescript(SCHEMA)
    return db


def _rows(db: sqlite3.Connection) -> list[tuple]:
    columns = [row[1] for row in db.execute("PRAGMA table_info(messages)")]
    typed = ", ".join(f"{c}, typeof({c})" for c in columns)
    return db.execute(f"SELECT {typed} FROM messages ORDER BY id").fetchall()


tails = st.tuples(
    st.just(SEND_PUT_MIDDLE)
    | st.tuples(
        st.sampled_from([b"", b"user.42"]),
        st.sampled_from([None, "", "replies"]),
        st.sampled_from([None, "7"]),
        st.sampled_from([0.0, 1.5e9]),
    ),
    st.sampled_from([b"", b"k"]),
).map(lambda parts: (*parts[0], parts[1]))
puts = st.lists(
    st.tuples(
        st.binary(min_size=1, max_size=8),
        st.sampled_from(["a", "b"]),
        st.integers(-5, 5),
        st.binary(max_size=12),
        st.sampled_from([b"", b'{"h":"1"}']),
        st.sampled_from([0.0, 1.7e9]),
        st.integers(0, 3),
        tails,
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(puts, st.booleans(), st.booleans())
def test_a_plain_or_keyed_put_writes_the_row_the_whole_statement_writes(
    values: list[tuple], converted: bool, runs: bool
) -> None:
    """Written at once, or kept in put runs and written as rows when read (put_runs.py: the
    core never puts an ID twice but after its dead letter, which writes the runs first)."""
    if runs:
        values = list({value[0]: value for value in values}.values())  # one PUT an ID
    operations = [(PUT, *head, *tail) for *head, tail in values]
    fast, whole = _store(converted), _store(converted)
    fast.execute("BEGIN")
    write(fast, operations, keep_runs=runs)
    runs_as_rows(fast)
    fast.execute("COMMIT")
    whole.execute("BEGIN")
    for operation in operations:  # one by one, in order: a repeated ID replaces its row
        whole.execute(STATEMENTS[PUT], operation[1:])
    whole.execute("COMMIT")
    assert _rows(fast) == _rows(whole)
