"""The options of the `phpmq` Spark format, parsed and checked before anything connects.

Spark hands a data source its options as strings in a case-insensitive dict; these classes turn
them into typed, validated values, and every refusal names the option and says what to do.
Nothing here imports pyspark, so the checks run (and are tested) without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ..protocol import DEFAULT_ADDRESS, event_name_problem, queue_name_problem, rules

#: Rows per micro-batch when `maxRecordsPerBatch` is not given.
DEFAULT_MAX_RECORDS_PER_BATCH = 1_000
#: Spark tasks (InputPartitions) a micro-batch is split into when `numPartitions` is not given.
DEFAULT_NUM_PARTITIONS = 2
#: The source's heartbeat: a runner killed by Spark is declared dead, and its unacked messages
#: go back to their queues, after heartbeatMs x liveness (1.5 s by default).
DEFAULT_HEARTBEAT_MS = 500
#: Room left in a 255-byte idempotency key for `/<partition>/<row>`.
MAX_KEY_SCOPE_BYTES = 200
DEFAULT_LIVENESS = rules.DEFAULT_LIVENESS
#: The broker clamps heartbeats and liveness to these ranges (docs/protocol.md §6.2).
HEARTBEAT_RANGE_MS = (rules.MIN_HEARTBEAT_MS, rules.MAX_HEARTBEAT_MS)
LIVENESS_RANGE = (rules.MIN_LIVENESS, rules.MAX_LIVENESS)


class OptionError(ValueError):
    """Raised when an option of the `phpmq` format is missing or has a bad value."""


@dataclass(frozen=True)
class SourceOptions:
    """What `spark.readStream.format("phpmq")` was asked to do."""

    broker: str
    queues: tuple[str, ...]
    max_records_per_batch: int
    #: Unacked messages the broker may dispatch to the source per queue (the 002 count).
    window: int
    num_partitions: int
    heartbeat_ms: int
    liveness: int
    #: How long an availableNow run waits for messages it counted at the start (ready, or in
    #: flight with a consumer that may be dead) before it ends without them, in milliseconds.
    available_now_wait_ms: int
    client_name: str

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Read and check the source options.

        Raises:
            OptionError: an option is missing, malformed, or inconsistent with another.
        """
        options = _lower_keys(options)
        batch = _int(options, "maxRecordsPerBatch", DEFAULT_MAX_RECORDS_PER_BATCH)
        window = _int(options, "window", 2 * batch + 1)
        if window <= 2 * batch:
            raise OptionError(
                f"option window ({window}) must be more than 2 x maxRecordsPerBatch"
                f" ({2 * batch}): Spark settles a batch only when it builds the next one, so the"
                f" source may hold two batches at once; use window >= {2 * batch + 1} or a"
                " smaller maxRecordsPerBatch"
            )
        heartbeat_ms = _int(options, "heartbeatMs", DEFAULT_HEARTBEAT_MS, *HEARTBEAT_RANGE_MS)
        liveness = _int(options, "liveness", DEFAULT_LIVENESS, *LIVENESS_RANGE)
        wait_default = 2 * heartbeat_ms * liveness + 1_000
        return cls(
            broker=_broker(options),
            queues=_queues(options),
            max_records_per_batch=batch,
            window=window,
            num_partitions=_int(options, "numPartitions", DEFAULT_NUM_PARTITIONS),
            heartbeat_ms=heartbeat_ms,
            liveness=liveness,
            available_now_wait_ms=_int(options, "availableNowWaitMs", wait_default, low=0),
            client_name=options.get("clientname") or "spark-source",
        )


@dataclass(frozen=True)
class SinkOptions:
    """What `df.write(Stream).format("phpmq")` was asked to do."""

    broker: str
    #: Where rows without a `queue` column (or with a null one) go; None: the column is required.
    queue: str | None
    #: TTL in seconds for rows without a `ttl` column (or with a null one); 0 = never expires.
    ttl: int
    client_name: str
    #: Where rows are published (an event name, docs/protocol.md §6.5) when they have no
    #: `event` column (or a null one); it wins over `queue`. None: rows go to queues.
    event: str | None = None
    #: Batch writes: the first part of every row's idempotency key instead of a random one,
    #: so that writing the same rows again (a retried foreachBatch) adds nothing.
    key_scope: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Read and check the sink options.

        Raises:
            OptionError: an option is unknown or malformed.
        """
        options = _lower_keys(options)
        refuse_unknown_options(options, SINK_OPTION_NAMES, "sink", SINK_OPTION_HINTS)
        queue = options.get("queue") or None
        if queue is not None:
            _check_queue_name(queue, "queue")
        event = options.get("event") or None
        if event is not None:
            _check_event(event)
        return cls(
            broker=_broker(options),
            queue=queue,
            ttl=_int(options, "ttl", 0, low=0),
            client_name=options.get("clientname") or "spark-sink",
            key_scope=_key_scope(options),
            event=event,
        )


def _check_event(event: str) -> None:
    problem = event_name_problem(event)
    if problem is not None:
        raise OptionError(f"option event: {problem}")


def _key_scope(options: Mapping[str, str]) -> str | None:
    scope = options.get("keyscope") or None
    if scope is not None and len(scope.encode()) > MAX_KEY_SCOPE_BYTES:
        raise OptionError(f"option keyScope is longer than {MAX_KEY_SCOPE_BYTES} bytes")
    return scope


def _lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    # Spark's CaseInsensitiveDict already does this; plain dicts (tests, tools) may not.
    return {str(key).lower(): value for key, value in options.items()}


def _broker(options: Mapping[str, str]) -> str:
    address = options.get("broker") or DEFAULT_ADDRESS
    if "://" not in address:
        raise OptionError(
            f"option broker must be a ZeroMQ address like tcp://host:5555: {address!r}"
        )
    return address


def _queues(options: Mapping[str, str]) -> tuple[str, ...]:
    """`queue` names one queue; `queues` names several, comma-separated or as a JSON list (for
    names that contain commas)."""
    single, several = options.get("queue"), options.get("queues")
    if bool(single) == bool(several):
        raise OptionError("give exactly one of the options queue (one name) or queues (a list)")
    if single:
        names: list[str] = [single]
    elif several.lstrip().startswith("["):
        names = _json_names(several)
    else:
        names = [name.strip() for name in several.split(",") if name.strip()]
    if not names:
        raise OptionError("option queues names no queue")
    if len(set(names)) != len(names):
        raise OptionError(f"option queues names a queue twice: {names}")
    for name in names:
        _check_queue_name(name, "queue" if single else "queues")
    return tuple(names)


def _json_names(text: str) -> list[str]:
    try:
        names = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option queues is not a valid JSON list: {exc}") from None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise OptionError("option queues must be a JSON list of strings")
    return names


def _check_queue_name(name: str, option: str) -> None:
    problem = queue_name_problem(name)
    if problem is not None:
        raise OptionError(f"option {option}: {problem}: {name!r}")


def _int(
    options: Mapping[str, str], key: str, default: int, low: int = 1, high: int | None = None
) -> int:
    text = options.get(key.lower())
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {key} must be an integer: {text!r}") from None
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise OptionError(f"option {key} must be {bounds}: {value}")
    return value


# --------------------------------------------------------------------------- unknown options
# Shared by the source and the sink: each passes the names it knows.

#: The sink's options (Spark adds checkpointLocation to a streaming write's options).
SINK_OPTION_NAMES = (
    "broker",
    "queue",
    "event",
    "ttl",
    "clientName",
    "keyScope",
    "checkpointLocation",
)
#: Options of Spark's Kafka sink (lower-cased) -> what to use with the phpmq sink instead.
SINK_OPTION_HINTS = {
    "topic": "use queue (or a column `queue`, or event to publish)",
    "kafka.bootstrap.servers": "use broker (a ZeroMQ address such as tcp://127.0.0.1:5555)",
    "includeheaders": "not needed: a column `headers` (map<string,string>) is sent as headers",
}


def refuse_unknown_options(
    options: Mapping[str, str], known: tuple[str, ...], what: str, hints: Mapping[str, str]
) -> None:
    """Raise OptionError for the first option (in name order) that is not one of `known`
    (case-insensitive), naming the known ones, or with the hint `hints` has for it.

    Raises:
        OptionError: an option is unknown.
    """
    by_lower = {name.lower(): name for name in known}
    for name in sorted(options):
        lower = str(name).lower()
        if lower in by_lower:
            continue
        if lower in hints:
            raise OptionError(f"option {name} is not a phpmq {what} option: {hints[lower]}")
        names = ", ".join(sorted(known, key=str.lower))
        raise OptionError(f"unknown option {name}; the phpmq {what} knows: {names}")
