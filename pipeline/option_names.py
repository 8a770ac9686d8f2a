"""Which option names the `phpmq` source and sink know, and what to say about the others.

Spark passes a data source every `.option(...)` the user gave, lower-cased, and nothing of its
own for `readStream.format(...).load()` / `read.format(...).load()` (checked in pyspark 4.3:
only `path` when `load(path)` is given). So every unknown name is a user's mistake: the source
refuses it, naming the known ones, and a Kafka source's option gets a hint to our equivalent.

Nothing here imports pyspark or raises: the functions return the problem as a sentence, and
pipeline.options raises it as an OptionError.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

#: Options of Spark's Kafka source (lower-cased) -> what to use with phpmq instead.
KAFKA_HINTS = {
    "subscribe": "use queue (one name) or queues (a list)",
    "subscribepattern": "use queuePattern (a glob such as 'orders.*')",
    "assign": "use queue or queues: a queue has no partitions to assign",
    "kafka.bootstrap.servers": "use broker (a ZeroMQ address such as tcp://127.0.0.1:5555)",
    "startingoffsets": "a queue has no offsets to start from: the source reads what is ready",
    "startingoffsetsbytimestamp": "a queue has no offsets to start from",
    "startingtimestamp": "a queue has no offsets to start from",
    "endingoffsets": "a stream reads until stopped; use trigger(availableNow=True) to stop",
    "endingoffsetsbytimestamp": "a stream reads until stopped; use trigger(availableNow=True)",
    "endingtimestamp": "a stream reads until stopped; use trigger(availableNow=True) to stop",
    "startingoffsetsbytimestampstrategy": "a queue has no offsets to start from",
    "maxrecordsperpartition": "use maxRecordsPerTrigger and numPartitions",
    "fetchoffset.retryintervalms": "use brokerTimeout",
    "maxoffsetspertrigger": "use maxRecordsPerTrigger (and maxBytesPerTrigger)",
    "minoffsetspertrigger": "not supported: a trigger takes what is ready, up to the limits",
    "maxtriggerdelay": "not supported: a trigger takes what is ready, up to the limits",
    "groupidprefix": "not needed: batches are broker leases named after the query",
    "kafka.group.id": "not needed: batches are broker leases named after the query",
    "includeheaders": "not needed: the headers column is always there",
    "kafkaconsumer.polltimeoutms": "use brokerTimeout",
    "fetchoffset.numretries": "use brokerTimeout",
    "kafka.security.protocol": "use curveSecret and curveServer (CURVE, docs/security.md)",
}
#: Options this source had before its batches became broker leases.
RETIRED_HINTS = {
    "window": "not needed any more: each batch is a broker lease (see maxRecordsPerTrigger)",
    "heartbeatms": "not needed any more: a lease is not tied to a connection",
    "liveness": "not needed any more: a lease is not tied to a connection",
    "availablenowwaitms": "not needed any more: availableNow reads the ready messages",
}

SOURCE_HINTS = {**KAFKA_HINTS, **RETIRED_HINTS}
#: Options of Spark's Kafka sink (lower-cased) -> what to use with the phpmq sink instead.
KAFKA_SINK_HINTS = {
    "topic": "use queue (or a column `queue`, or event to publish)",
    "kafka.bootstrap.servers": KAFKA_HINTS["kafka.bootstrap.servers"],
    "includeheaders": "not needed: a column `headers` (map<string,string>) is sent as headers",
}

#: What the sink says about names it does not know, Kafka's and Spark's `path`.
SINK_HINTS = {
    **KAFKA_SINK_HINTS,
    "path": "the phpmq sink writes to queues: give option queue (or a column `queue`) and"
    " call start() / save() without a path",
}

#: Regular-expression syntax that means nothing special in a glob: `^` / `$` anchors, a
#: backslash class (`\d`), a group or alternative, a repeat (`+`, `{2}`), and `.*` right
#: after the start or a character a dotted queue name would not put before a dot.
_REGEX_LOOK = re.compile(r"^\^|\$$|\\|[()|+{}]|(?:^|[^\w*\]?])\.\*")
_BRACKETS = re.compile(r"\[[^\]]*\]")

_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|m|min|h)?\s*", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def unknown_option_problem(
    given: Iterable[str],
    known: Iterable[str],
    what: str = "source",
    hints: Mapping[str, str] | None = None,
) -> str | None:
    """None if every name in `given` is one of `known` (case-insensitive); otherwise what is
    wrong with the first unknown one, with a hint when `hints` (lower-cased names; default:
    the source's) has one. `what` names the side that refuses it ("source", "sink")."""
    by_lower = {name.lower(): name for name in known}
    for name in sorted(given):
        lower = name.lower()
        if lower in by_lower:
            continue
        hint = (SOURCE_HINTS if hints is None else hints).get(lower)
        if hint is not None:
            return f"option {name} is not a phpmq option: {hint}"
        names = ", ".join(sorted(by_lower.values(), key=str.lower))
        return f"unknown option {name}; the phpmq {what} knows: {names}"
    return None


def regex_pattern_problem(pattern: str) -> str | None:
    """What to say about a queuePattern that looks like a regular expression (Kafka's
    subscribePattern), or None. Characters inside `[...]` are taken as meant for the glob, so
    a queue name with such characters is matched with `[(]`, `[+]` and the like."""
    if _REGEX_LOOK.search(_BRACKETS.sub("x", pattern)) is None:
        return None
    return (
        f"option queuePattern {pattern!r} looks like a regular expression, but it is a glob"
        " (fnmatch: * any characters, ? one, [...] one of): for example 'orders-*' or"
        " 'orders.*' (a dot, then anything)"
    )


def duration_ms(text: str) -> int | None:
    """Milliseconds from "30000" (ms), "30s", "5m", "1h" or "250ms"; None if not like that."""
    match = _DURATION.fullmatch(text)
    if match is None:
        return None
    unit = (match.group(2) or "ms").lower()
    return int(match.group(1)) * _UNIT_MS[unit]


_SIZE = re.compile(r"\s*(\d+)\s*([kmg]i?b?|b)?\s*", re.IGNORECASE)
_SIZE_UNIT = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def size_bytes(text: str) -> int | None:
    """Bytes from "1048576", "512k", "64m", "64MiB", "1g"; None if not like that."""
    match = _SIZE.fullmatch(text)
    if match is None:
        return None
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * _SIZE_UNIT[unit]
