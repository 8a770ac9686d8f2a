"""The options of the `phpmq` Spark format, parsed and checked before anything connects.

Spark hands a data source its options as strings in a case-insensitive dict; these classes turn
them into typed, validated values, and every refusal names the option and says what to do.
Nothing here imports pyspark, so the checks run (and are tested) without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ..client.curve import Curve, curve_keys
from ..client.driver import broker_address
from ..client.errors import CurveKeyError
from ..protocol import event_name_problem, queue_name_problem
from .lease_offsets import reader_id_for
from .option_names import (
    SINK_HINTS,
    duration_ms,
    regex_pattern_problem,
    size_bytes,
    unknown_option_problem,
)

#: Rows per micro-batch when `maxRecordsPerTrigger` is not given.
DEFAULT_MAX_RECORDS_PER_TRIGGER = 50_000
#: Bytes (contents and headers) per micro-batch when `maxBytesPerTrigger` is not given: a
#: default driver (1 GiB) and executor handle it with room to spare, since the driver holds no
#: contents and a task reads its share page by page.
DEFAULT_MAX_BYTES_PER_TRIGGER = 64 << 20
#: Spark tasks (InputPartitions) a micro-batch is split into when `numPartitions` is not given.
DEFAULT_NUM_PARTITIONS = 2
#: How long the source waits for a broker that does not answer before the query fails.
DEFAULT_BROKER_TIMEOUT_MS = 300_000
#: How long the broker keeps an untouched lease before its messages go back to the queue: a
#: batch Spark has not finished within this is read again by someone else.
DEFAULT_LEASE_TIMEOUT_MS = 3_600_000
#: The shortest leaseTimeout a healthy query survives, with room to spare. A lease is touched
#: when it is made (latestOffset), at every page a task reads, and committed one batch later;
#: between those Spark writes its offset log, schedules the tasks (8 s for a session's first
#: job, which starts the Python workers: 5 s failed it), waits for free cores when other jobs
#: hold them, and after the last page writes the rest of the batch and its commit log.
MIN_LEASE_TIMEOUT_MS = 300_000
LEASE_TIMEOUT_RANGE_MS = (MIN_LEASE_TIMEOUT_MS, 604_800_000)
#: Room left in a 255-byte idempotency key for `/<partition>/<row>`.
MAX_KEY_SCOPE_BYTES = 200
#: What a queue name may not contain for it to be a name and not a pattern.
GLOB_CHARACTERS = frozenset("*?[")

#: Every option of the streaming source (the names users write).
#: CURVE keys (docs/security.md): the client's .key_secret file and the broker's public key
#: (its .key file or 40 Z85 characters). Without them, PHPMQ_CURVE_SECRET/_SERVER apply.
CURVE_OPTION_NAMES = ("curveSecret", "curveServer")


@dataclass(frozen=True)
class CurveFiles:
    """Where the CURVE keys are: plain paths, so they travel to executors as they are."""

    secret: str
    server: str

    def keys(self) -> Curve:
        return curve_keys(self.secret, self.server)


SOURCE_OPTION_NAMES = (
    "broker",
    "queue",
    "queues",
    "queuePattern",
    "maxRecordsPerTrigger",
    "maxRecordsPerBatch",
    "maxBytesPerTrigger",
    "numPartitions",
    "minPartitions",
    "brokerTimeout",
    "failOnDataLoss",
    "leaseTimeout",
    "clientName",
    "checkpointLocation",
    *CURVE_OPTION_NAMES,
)


class OptionError(ValueError):
    """Raised when an option of the `phpmq` format is missing or has a bad value."""


@dataclass(frozen=True)
class SourceOptions:
    """What `spark.readStream.format("phpmq")` was asked to do."""

    broker: str
    #: The queues named by `queue` / `queues`; empty when `queue_pattern` chooses them.
    queues: tuple[str, ...]
    #: A glob over queue names (fnmatch: `*`, `?`, `[...]`), resolved at every trigger.
    queue_pattern: str | None
    max_records_per_trigger: int
    max_bytes_per_trigger: int
    num_partitions: int
    broker_timeout_ms: int
    fail_on_data_loss: bool
    lease_timeout_ms: int
    client_name: str
    #: CURVE keys from the options (None: the environment's, if any).
    curve: CurveFiles | None = None
    #: The query's checkpoint location, if given: the reader id is derived from it.
    checkpoint: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Read and check the source options.

        Raises:
            OptionError: an option is unknown, missing, malformed, or inconsistent.
        """
        options = _lower_keys(options)
        _refuse_unknown(options, SOURCE_OPTION_NAMES)
        queues, pattern = _queues_or_pattern(options)
        return cls(
            broker=_broker(options),
            queues=queues,
            queue_pattern=pattern,
            max_records_per_trigger=_records_per_trigger(options),
            max_bytes_per_trigger=_size(
                options, "maxBytesPerTrigger", DEFAULT_MAX_BYTES_PER_TRIGGER
            ),
            num_partitions=_partitions(options),
            broker_timeout_ms=broker_timeout_ms(options),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            lease_timeout_ms=_lease_timeout_ms(options),
            client_name=options.get("clientname") or "spark-source",
            curve=curve_files(options),
            checkpoint=options.get("checkpointlocation") or None,
        )

    def first_reader_id(self) -> str | None:
        """The reader id of a new checkpoint's first batch, when the checkpoint location is
        known: the same in every run, so a restart finds batch 1's leases even if Spark had
        not written them to its offset log (None: draw one)."""
        if self.checkpoint is None:
            return None
        return reader_id_for(self.checkpoint, self.describe())

    def describe(self) -> str:
        """The queues this source reads, as a user would name them."""
        if self.queue_pattern is not None:
            return f"queuePattern {self.queue_pattern!r}"
        return ", ".join(self.queues)


def _refuse_unknown(
    options: Mapping[str, str],
    known: tuple[str, ...],
    what: str = "source",
    hints: Mapping[str, str] | None = None,
) -> None:
    problem = unknown_option_problem(options, known, what, hints)
    if problem is not None:
        raise OptionError(problem)


def _lease_timeout_ms(options: Mapping[str, str]) -> int:
    value = _duration(options, "leaseTimeout", DEFAULT_LEASE_TIMEOUT_MS, 1, None)
    low, high = LEASE_TIMEOUT_RANGE_MS
    if value < low:
        raise OptionError(
            f"option leaseTimeout must be at least {low // 60_000} min: a shorter lease can"
            " run out while Spark schedules a healthy batch's tasks (docs/pipeline.md)"
        )
    if value > high:
        raise OptionError(f"option leaseTimeout must be at most {high // 3_600_000} h")
    return value


def _records_per_trigger(options: Mapping[str, str]) -> int:
    if "maxrecordspertrigger" in options and "maxrecordsperbatch" in options:
        raise OptionError("give maxRecordsPerTrigger or its old name maxRecordsPerBatch, not both")
    name = "maxRecordsPerBatch" if "maxrecordsperbatch" in options else "maxRecordsPerTrigger"
    return _int(options, name, DEFAULT_MAX_RECORDS_PER_TRIGGER)


def _partitions(options: Mapping[str, str]) -> int:
    if "numpartitions" in options and "minpartitions" in options:
        raise OptionError("give numPartitions or minPartitions (the same thing), not both")
    name = "minPartitions" if "minpartitions" in options else "numPartitions"
    return _int(options, name, DEFAULT_NUM_PARTITIONS)


def broker_timeout_ms(options: Mapping[str, str]) -> int:
    """The `brokerTimeout` option (lower-cased keys), in milliseconds."""
    return _duration(options, "brokerTimeout", DEFAULT_BROKER_TIMEOUT_MS, 1, None)


def _duration(
    options: Mapping[str, str], key: str, default: int, low: int, high: int | None
) -> int:
    text = options.get(key.lower())
    if text is None or str(text).strip() == "":
        return default
    value = duration_ms(str(text))
    if value is None:
        raise OptionError(
            f"option {key} must be milliseconds or a duration like 30s, 5m, 1h: {text!r}"
        )
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high} ms" if high is not None else f"at least {low} ms"
        raise OptionError(f"option {key} must be {bounds}: {text!r}")
    return value


def _size(options: Mapping[str, str], key: str, default: int) -> int:
    text = options.get(key.lower())
    if text is None or str(text).strip() == "":
        return default
    value = size_bytes(str(text))
    if value is None or value < 1:
        raise OptionError(
            f"option {key} must be a positive size in bytes, like 1048576 or 64m: {text!r}"
        )
    return value


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    text = options.get(key.lower())
    if text is None or str(text).strip() == "":
        return default
    lowered = str(text).strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"option {key} must be true or false: {text!r}")
    return lowered == "true"


def _queues_or_pattern(options: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    pattern = options.get("queuepattern") or None
    if pattern is None:
        return _queues(options), None
    if options.get("queue") or options.get("queues"):
        raise OptionError("give one of the options queue, queues or queuePattern")
    problem = regex_pattern_problem(pattern)
    if problem is not None:
        raise OptionError(problem)
    return (), pattern


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
    #: CURVE keys from the options (None: the environment's, if any).
    curve: CurveFiles | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Read and check the sink options.

        Raises:
            OptionError: an option is unknown or malformed.
        """
        options = _lower_keys(options)
        _refuse_unknown(options, SINK_OPTION_NAMES, "sink", SINK_HINTS)
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
            curve=curve_files(options),
        )


def curve_files(options: Mapping[str, str]) -> CurveFiles | None:
    """The CURVE key files named by curveSecret and curveServer (both or neither), checked."""
    secret, server = options.get("curvesecret"), options.get("curveserver")
    if not secret and not server:
        return None
    if not (secret and server):
        raise OptionError("give both curveSecret (this client's .key_secret file) and curveServer")
    files = CurveFiles(secret, server)
    try:
        files.keys()
    except CurveKeyError as exc:
        raise OptionError(f"option curveSecret/curveServer: {exc}") from None
    return files


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
    address = broker_address(options.get("broker"))  # as Client(): else PHPMQ_BROKER, else local
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
        raise OptionError(
            "give exactly one of the options queue (one name), queues (a list) or queuePattern"
        )
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
        option = "queue" if single else "queues"
        if GLOB_CHARACTERS & set(name):
            raise OptionError(
                f"option {option}: {name!r} is a pattern, not a queue name: use"
                f' .option("queuePattern", {name!r}) to read every queue it matches'
            )
        _check_queue_name(name, option)
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


# --------------------------------------------------------------------------- the sink's names

#: The options Spark itself puts among a writer's (pyspark 4.3, checked in the classic
#: DataStreamWriter and DataFrameWriter): `queryName` from `.queryName(...)`, and the
#: `checkpointLocation` a streaming write reads from them. (`path`, from `start(path)` or
#: `save(path)`, is the user's choice, refused with a hint; the partitioning and clustering
#: options go to V1 sources only, and a Python data source is a V2 one.)
SPARK_WRITER_OPTION_NAMES = ("checkpointLocation", "queryName")
#: The sink's options.
SINK_OPTION_NAMES = (
    "broker",
    "queue",
    "event",
    "ttl",
    "clientName",
    "keyScope",
    *SPARK_WRITER_OPTION_NAMES,
    *CURVE_OPTION_NAMES,
)
