"""The phpmq source's options, offsets, plans and rows, without Spark sessions or brokers.

They import pyspark's types (the schema, Arrow) but start no JVM: milliseconds each.
"""

from __future__ import annotations

import base64
import json
import os

import pytest

IN_CI = os.environ.get("CI") == "true"
try:
    import pyarrow  # noqa: F401

    from phpmq.pipeline.browse import BrowseOptions
    from phpmq.pipeline.datasource import PhpmqDataSource
    from phpmq.pipeline.lease_offsets import (
        Budget,
        LeaseOffset,
        queue_order,
        reader_id_for,
        slices,
    )
    from phpmq.pipeline.options import (
        DEFAULT_BROKER_TIMEOUT_MS,
        DEFAULT_MAX_BYTES_PER_TRIGGER,
        OptionError,
        SourceOptions,
    )
    from phpmq.pipeline.rows import ARROW_SCHEMA, DEAD_LETTER_ARROW_SCHEMA, record_batch
except ModuleNotFoundError as missing:
    if (missing.name or "").split(".")[0] not in {"pyspark", "pyarrow", "pandas", "numpy"}:
        raise
    if IN_CI:
        pytest.fail(f"the spark extra is required in CI: {missing}", pytrace=False)
    pytest.skip(f"{missing} (pip install '.[spark]')", allow_module_level=True)


# --------------------------------------------------------------------------- options


def test_defaults_fit_a_default_driver() -> None:
    options = SourceOptions.parse({"queue": "q"})
    assert options.max_bytes_per_trigger == DEFAULT_MAX_BYTES_PER_TRIGGER == 64 << 20
    assert options.broker_timeout_ms == DEFAULT_BROKER_TIMEOUT_MS
    assert options.fail_on_data_loss and options.queue_pattern is None


def test_the_broker_option_defaults_to_phpmq_broker_as_the_clients_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PHPMQ_BROKER", "tcp://127.0.0.1:6001")
    assert SourceOptions.parse({"queue": "q"}).broker == "tcp://127.0.0.1:6001"
    assert SourceOptions.parse({"queue": "q", "broker": "tcp://b:1"}).broker == "tcp://b:1"
    monkeypatch.delenv("PHPMQ_BROKER")
    assert SourceOptions.parse({"queue": "q"}).broker == "tcp://127.0.0.1:5555"


@pytest.mark.parametrize(
    ("given", "expected"),
    [("30000", 30_000), ("30s", 30_000), ("5m", 300_000), ("1h", 3_600_000), ("250ms", 250)],
)
def test_broker_timeout_takes_milliseconds_or_a_duration(given: str, expected: int) -> None:
    assert SourceOptions.parse({"queue": "q", "brokerTimeout": given}).broker_timeout_ms == expected


def test_sizes_and_aliases() -> None:
    options = SourceOptions.parse(
        {"queue": "q", "maxBytesPerTrigger": "8m", "maxRecordsPerBatch": "7", "minPartitions": "3"}
    )
    assert (options.max_bytes_per_trigger, options.max_records_per_trigger) == (8 << 20, 7)
    assert options.num_partitions == 3
    assert (
        SourceOptions.parse({"queue": "q", "MAXRECORDSPERTRIGGER": "9"}).max_records_per_trigger
        == 9
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of the options queue"),
        ({"queue": "a", "queues": "b"}, "exactly one of the options queue"),
        ({"queue": "a", "queuePattern": "b*"}, "one of the options queue, queues or queuePattern"),
        ({"queue": "q8*"}, r"'q8\*' is a pattern, not a queue name: use .option\(\"queuePattern\""),
        ({"queues": "a,b?"}, "option queues: 'b\\?' is a pattern"),
        ({"queue": "has space"}, "whitespace"),
        ({"queues": "a,a"}, "names a queue twice"),
        ({"queue": "q", "maxRecordsPerTrigger": "ten"}, "must be an integer"),
        ({"queue": "q", "maxRecordsPerTrigger": "1", "maxRecordsPerBatch": "1"}, "not both"),
        ({"queue": "q", "maxBytesPerTrigger": "lots"}, "positive size in bytes"),
        ({"queue": "q", "brokerTimeout": "soon"}, "duration like 30s"),
        ({"queue": "q", "failOnDataLoss": "maybe"}, "true or false"),
        ({"queue": "q", "leaseTimeout": "10ms"}, "leaseTimeout must be at least 5 min: a shorter"),
        ({"queue": "q", "leaseTimeout": "5s"}, "run out while Spark schedules"),
        ({"queue": "q", "leaseTimeout": "299999"}, "at least 5 min"),
        ({"queue": "q", "leaseTimeout": "8d"}, "duration like 30s"),
        ({"queue": "q", "leaseTimeout": "200h"}, "at most 168 h"),
        ({"queue": "q", "broker": "localhost:5555"}, "ZeroMQ address"),
        ({"queue": "q", "maxRecordPerTrigger": "5"}, "unknown option maxrecordpertrigger; the"),
        ({"queue": "q", "subscribe": "x"}, "subscribe is not a phpmq option: use queue"),
        ({"queue": "q", "subscribePattern": "x.*"}, "use queuePattern"),
        ({"queue": "q", "startingOffsets": "earliest"}, "no offsets to start from"),
        ({"queue": "q", "kafka.bootstrap.servers": "h:9092"}, "use broker"),
        ({"queue": "q", "maxOffsetsPerTrigger": "5"}, "use maxRecordsPerTrigger"),
        ({"queue": "q", "window": "5"}, "not needed any more"),
        ({"queue": "q", "path": "/x"}, "unknown option path"),
    ],
)
def test_bad_source_options_are_refused_with_the_option_named(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        SourceOptions.parse(options)


def test_lease_timeout_floor_is_five_minutes() -> None:
    assert SourceOptions.parse({"queue": "q", "leaseTimeout": "5m"}).lease_timeout_ms == 300_000
    assert SourceOptions.parse({"queue": "q"}).lease_timeout_ms == 3_600_000


@pytest.mark.parametrize(
    "pattern", ["topic-.*", "^orders", "orders$", "orders-\\d+", "(eu|us)-orders", "a+", ".*x"]
)
def test_a_regex_as_queue_pattern_is_refused_with_a_glob_hint(pattern: str) -> None:
    with pytest.raises(OptionError) as refused:
        SourceOptions.parse({"queuePattern": pattern})
    assert str(refused.value) == (
        f"option queuePattern {pattern!r} looks like a regular expression, but it is a glob"
        " (fnmatch: * any characters, ? one, [...] one of): for example 'orders-*' or"
        " 'orders.*' (a dot, then anything)"
    )


@pytest.mark.parametrize("pattern", ["orders.*", "orders-*", "*.*", "q?", "a[(]b", "x_.*"])
def test_globs_are_not_taken_for_regexes(pattern: str) -> None:
    assert SourceOptions.parse({"queuePattern": pattern}).queue_pattern == pattern


def test_unknown_option_error_lists_the_known_ones() -> None:
    with pytest.raises(OptionError) as refused:
        SourceOptions.parse({"queue": "q", "typo": "1"})
    for name in ("broker", "queuePattern", "maxBytesPerTrigger", "brokerTimeout", "failOnDataLoss"):
        assert name in str(refused.value)


def test_several_queues_by_list_json_or_pattern() -> None:
    assert SourceOptions.parse({"queues": "a, b,c"}).queues == ("a", "b", "c")
    assert SourceOptions.parse({"QUEUES": '["x,1", "y"]'}).queues == ("x,1", "y")
    pattern = SourceOptions.parse({"queuePattern": "orders.*"})
    assert (pattern.queues, pattern.queue_pattern) == ((), "orders.*")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": "q", "maxOffsetsPerTrigger": "5"}, "use maxRecordsPerTrigger"),
        ({"queue": "q", "leaseTimeout": "5s"}, "at least 5 min"),
        ({"queuePattern": "topic-.*"}, "looks like a regular expression"),
        ({"queue": "q", "deadLetters": "true", "leaseTimeout": "1h"}, "option leasetimeout"),
        ({"queue": "q", "ttl": "-1"}, "option ttl must be at least 0"),
        ({"queue": "q", "queryName": "x", "maxRecordsPerTrigger": "5"}, "the phpmq sink knows"),
        ({"qeueu": "q"}, "option qeueu; the phpmq source or sink knows: broker, brokerTimeout,"),
        ({"queue": "q", "path": "x"}, "the phpmq source and sink take no path"),
    ],
)
def test_the_data_source_checks_its_options_when_spark_makes_it_in_load(
    options: dict[str, str], message: str
) -> None:
    """Spark makes the data source inside load() and a batch save(), not saying which."""
    with pytest.raises(OptionError, match=message):
        PhpmqDataSource(options)


@pytest.mark.parametrize(
    "options",
    [
        {"queue": "q", "leaseTimeout": "1h", "checkpointLocation": "ck"},
        {"queue": "q", "deadLetters": "true", "numPartitions": "3"},
        {"queue": "q", "queryName": "x", "checkpointLocation": "ck", "keyScope": "s"},
        {"queues": "a,b", "clientName": "c"},
    ],
)
def test_the_data_source_takes_good_options_of_every_use(options: dict[str, str]) -> None:
    assert PhpmqDataSource(options).schema() is not None


def test_browse_options() -> None:
    options = BrowseOptions.parse({"queue": "q", "deadLetters": "true"})
    assert options.dead_letters and options.queues == ("q",)
    with pytest.raises(OptionError, match="unknown option maxrecordspertrigger"):
        BrowseOptions.parse({"queue": "q", "maxRecordsPerTrigger": "5"})


# --------------------------------------------------------------------------- offsets and plans


def test_offsets_are_json_with_a_fixed_key_order_and_running_totals() -> None:
    start = LeaseOffset.initial("r1", "tcp://b:1")
    assert json.dumps(start.to_json()) == (
        '{"reader": "r1", "lease": 0, "broker": "tcp://b:1", "queues": {}}'
    )
    first = start.next({"b": (3, 30, 7), "a": (1, 10, 0)})
    second = first.next({"a": (2, 20, 5)})
    assert second.lease_name == "r1/2" and list(second.to_json()["queues"]) == ["a", "b"]
    assert second.to_json()["queues"]["a"] == {
        "messages": 2,
        "bytes": 20,
        "total_messages": 3,
        "total_bytes": 30,
        "ready": 5,
    }
    assert second.queues["b"].messages == 0 and second.queues["b"].total_messages == 3
    assert set(second.leased()) == {"a"}
    again = LeaseOffset.from_json(json.loads(json.dumps(second.to_json())))
    assert again == second and json.dumps(again.to_json()) == json.dumps(second.to_json())


def test_an_old_checkpoint_offset_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="older phpmq source; start the query with a new"):
        LeaseOffset.from_json({"seq": 4})


def test_queue_order_turns_each_batch() -> None:
    assert [queue_order(["a", "b", "c"], n) for n in (1, 2, 3)] == [
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert queue_order([], 5) == []


def test_budget_is_spent_by_rows_or_bytes() -> None:
    budget = Budget(10, 100)
    budget.spend(3, 99)
    assert not budget.spent
    budget.spend(1, 5)  # an oversized message goes through alone: the budget goes below 0
    assert budget.spent


def test_slices_split_leases_by_position_in_proportion() -> None:
    offset = LeaseOffset.initial("r", "tcp://b:1").next({"big": (10, 1, 0), "small": (1, 1, 0)})
    pieces = slices(offset, 4)
    assert [(p.queue, p.first, p.count) for p in pieces] == [
        ("big", 0, 3),
        ("big", 3, 3),
        ("big", 6, 3),
        ("big", 9, 1),
        ("small", 0, 1),
    ]
    assert {p.lease for p in pieces} == {"r/1"}
    assert slices(LeaseOffset.initial("r", "x"), 4) == []


# --------------------------------------------------------------------------- rows


def _entry(**fields: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "id": "0" * 32,
        "content": base64.b64encode(b"body").decode(),
        "ttl": 0,
        "deliveries": 1,
        "sent_at": 1_700_000_000.5,
        "headers": json.dumps({"h": "v", "n": 3}),
        "key": base64.b64encode(b"k1").decode(),
    }
    entry.update(fields)
    return entry


def test_entries_become_rows_in_spark_s_arrow_schema() -> None:
    batch = record_batch("q", [_entry(), _entry(key=None, headers="", sent_at=None)])
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    assert rows[0]["key"] == b"k1" and rows[0]["content"] == b"body"
    assert rows[0]["headers"] == [("h", "v"), ("n", "3")]
    assert rows[0]["sent_at"].timestamp() == 1_700_000_000.5
    assert rows[1]["key"] is None and rows[1]["headers"] == [] and rows[1]["sent_at"] is None


def test_headers_nested_too_deep_to_read_are_kept_whole() -> None:
    """Not a failed batch (json.loads raised RecursionError): kept as one entry, as headers
    that are no JSON are."""
    deep = '{"a":' + "[" * 5000 + "]" * 5000 + "}"
    [row] = record_batch("q", [_entry(headers=deep)]).to_pylist()
    assert row["headers"] == [("", deep)]


def test_dead_letters_carry_reason_and_dead_at() -> None:
    batch = record_batch("q", [_entry(reason="expired", dead_at=1_700_000_100.0)], dead=True)
    assert batch.schema.equals(DEAD_LETTER_ARROW_SCHEMA)
    assert batch.to_pylist()[0]["reason"] == "expired"


# --------------------------------------------------------------------------- the runner's plans


class ContractLeases:
    """The broker's lease commands as docs/protocol.md's contract words them, in memory: the
    runner's planning is checked here without a broker process (the Spark tests in
    tests/test_pipeline_source.py run it against a real one)."""

    def __init__(self, queues: dict[str, list[int]]) -> None:
        self.ready = {name: list(sizes) for name, sizes in queues.items()}
        self.leases: dict[tuple[str, str], list[int]] = {}
        self.acked = 0

    def call(self, command: str, **o: object) -> dict[str, object]:
        if command == "stats":
            return {
                "queues": {
                    q: {"ready": len(m), "leased": self._leased(q)} for q, m in self.ready.items()
                }
            }
        if command == "lease-commit":
            self.acked += len(self.leases.pop((o["queue"], o["lease"]), []))
            return {"acked": 0}
        assert command == "lease", command
        key = (str(o["queue"]), str(o["lease"]))
        held = self.leases.get(key)
        if held is None:
            held, ready, size = [], self.ready.get(key[0], []), 0
            while (
                ready
                and len(held) < o["max_messages"]
                and (not held or size + ready[0] <= o["max_bytes"])
            ):
                size += ready[0]
                held.append(ready.pop(0))
            if held:
                self.leases[key] = held
        return {"messages": len(held), "bytes": sum(held), "ready": len(self.ready.get(key[0], []))}

    def _leased(self, queue: str) -> int:
        return sum(len(m) for (q, _), m in self.leases.items() if q == queue)

    def client(self) -> object:
        return type("C", (), {"broker_info": {}})()

    def stats_everywhere(self) -> dict[str, dict[str, int]]:
        return self.call("stats")["queues"]  # type: ignore[return-value]


def _reader(fake: ContractLeases, **options: str) -> object:
    from phpmq.pipeline.source import PhpmqStreamReader

    reader = PhpmqStreamReader(SourceOptions.parse({"queues": ",".join(fake.ready), **options}))
    reader._link = reader._subscription._link = fake  # type: ignore[assignment]
    return reader


def test_batches_keep_to_the_row_and_byte_budgets_and_commit_when_spark_moves_on() -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    fake = ContractLeases({"a": [10] * 5, "b": [1_000] + [10] * 3})
    reader = _reader(fake, maxRecordsPerTrigger="4", maxBytesPerTrigger="100")
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(4))
    # lease 1 starts at queue b: its oversized head goes alone, and the budget is spent
    assert first["queues"]["b"]["messages"] == 1 and "a" not in first["queues"]
    assert reader.latestOffset(start, ReadMaxRows(4)) == first  # asked again: the same lease
    second = reader.latestOffset(first, ReadMaxRows(4))
    assert fake.acked == 1  # batch 1 committed when Spark planned batch 2
    assert second["queues"]["a"]["messages"] == 4 and second["queues"]["a"]["total_messages"] == 4
    parts = reader.partitions(first, second)
    assert sum(p.count for p in parts) == 4 and {p.lease for p in parts} == {f"{first['reader']}/2"}
    third = reader.latestOffset(second, ReadMaxRows(4))
    fourth = reader.latestOffset(third, ReadMaxRows(4))
    assert reader.latestOffset(fourth, ReadMaxRows(4)) == fourth  # nothing left: no batch
    assert fake.acked == 9 and not fake.leases
    assert reader.partitions(fourth, fourth) == []


def test_a_restarted_runner_asks_for_the_same_lease_names() -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    fake = ContractLeases({"a": [1] * 10})
    first_runner = _reader(fake, maxRecordsPerTrigger="3")
    start = first_runner.initialOffset()
    planned = first_runner.latestOffset(start, ReadMaxRows(3))  # then the runner dies
    second_runner = _reader(fake, maxRecordsPerTrigger="3")
    assert second_runner.latestOffset(start, ReadMaxRows(3)) == planned
    assert fake.call("stats")["queues"]["a"] == {"ready": 7, "leased": 3}


def test_a_new_checkpoint_s_first_batch_is_found_again_after_a_driver_death() -> None:
    """The driver died after leasing batch 1 but before Spark wrote offsets/0: the restarted
    query starts from initialOffset() again, and must ask for the same lease names."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    fake = ContractLeases({"a": [1] * 10})
    first_runner = _reader(fake, maxRecordsPerTrigger="3", checkpointLocation="ck/q1")
    planned = first_runner.latestOffset(first_runner.initialOffset(), ReadMaxRows(3))
    second_runner = _reader(fake, maxRecordsPerTrigger="3", checkpointLocation="ck/q1")
    assert second_runner.latestOffset(second_runner.initialOffset(), ReadMaxRows(3)) == planned
    assert fake.call("stats")["queues"]["a"] == {"ready": 7, "leased": 3}
    other_query = _reader(fake, maxRecordsPerTrigger="3", checkpointLocation="ck/q2")
    assert other_query.initialOffset()["reader"] != planned["reader"]


def test_reader_ids_follow_the_checkpoint_location_however_spelled() -> None:
    cwd = os.getcwd()
    spellings = ["ck/q1", "ck/q1/", f"{cwd}/ck/./q1", f"file:{cwd}/ck/q1", f"file://{cwd}/ck/q1"]
    ids = {reader_id_for(spelling, "a") for spelling in spellings}
    assert len(ids) == 1 and len(ids.pop()) == 32
    assert reader_id_for("ck/q1", "a") != reader_id_for("ck/q1", "b")  # two sources of a query
    assert reader_id_for("s3a://b/ck/", "a") == reader_id_for("s3a://b/ck", "a")
    without = SourceOptions.parse({"queue": "q"})
    assert without.first_reader_id() is None  # a UUID then, as before


def test_available_now_stops_at_what_was_there() -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    fake = ContractLeases({"a": [1] * 5})
    reader = _reader(fake, maxRecordsPerTrigger="2")
    reader.prepareForTriggerAvailableNow()
    offset = reader.initialOffset()
    offset = reader.latestOffset(offset, ReadMaxRows(2))  # counts what is there: 5
    sizes = [offset["queues"]["a"]["messages"]]
    fake.ready["a"] += [1] * 3  # sent during the run: left for the next one
    for _ in range(5):
        end = reader.latestOffset(offset, ReadMaxRows(2))
        if end == offset:
            break
        sizes.append(end["queues"]["a"]["messages"])
        offset = end
    assert sizes == [2, 2, 1] and len(fake.ready["a"]) == 3 and not fake.leases
