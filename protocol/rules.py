"""Rules both sides of the wire need: what a valid queue name and idempotency key are, and
the ranges heartbeats are agreed in (docs/protocol.md §3, §6.2, §6.3).

The broker refuses what breaks them; clients check before sending, so a user's mistake is
reported where it was made instead of as an ERROR later.
"""

from __future__ import annotations

#: Where a broker listens unless told otherwise, and where clients look for it: loopback, so
#: that opening a broker to the LAN is a choice.
DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"

#: Queue names: 1-255 bytes of UTF-8, no whitespace or control characters.
MAX_QUEUE_NAME_BYTES = 255
#: Idempotency keys are short producer-chosen strings (a UUID, "batch-7:row-42").
MAX_KEY_BYTES = 255

#: Liveness (eMQP/1.0 heartbeating): a peer is dead after interval x liveness of silence.
#: The broker clamps an asked-for liveness into this range; 3 is the Paranoid Pirate default.
MIN_LIVENESS = 2
MAX_LIVENESS = 10
DEFAULT_LIVENESS = 3
#: Heartbeat intervals a broker accepts by default (its config may narrow or widen them).
DEFAULT_HEARTBEAT_MS = 1_000
MIN_HEARTBEAT_MS = 50
MAX_HEARTBEAT_MS = 60_000


def queue_name_problem(name: str) -> str | None:
    """Why `name` is not a valid queue name, or None if it is."""
    if not name:
        return "queue name is empty"
    if len(name.encode()) > MAX_QUEUE_NAME_BYTES:
        return f"queue name is longer than {MAX_QUEUE_NAME_BYTES} bytes"
    if not name.isprintable() or any(ch.isspace() for ch in name):
        return "queue name contains whitespace or control characters"
    return None


def key_problem(key: str) -> str | None:
    """Why `key` is not a valid idempotency key, or None if it is."""
    if not key:
        return "idempotency key is empty"
    if len(key.encode()) > MAX_KEY_BYTES:
        return f"idempotency key is longer than {MAX_KEY_BYTES} bytes"
    return None


def hold_scope_problem(scope: object) -> str | None:
    """Why `scope` cannot name a key hold (§6.3: the keys `<scope>/<batch>/...` it keeps), or
    None if it can."""
    if not isinstance(scope, str) or not scope:
        return "'scope' must be a non-empty string"
    if "/" in scope:
        return f"a key hold's scope has no '/' (its keys are <scope>/<batch>/...): {scope!r}"
    if len(scope.encode()) > MAX_KEY_BYTES:
        return f"a key hold's scope is longer than {MAX_KEY_BYTES} bytes"
    return None


def clamp_liveness(liveness: object, default: int = DEFAULT_LIVENESS) -> int:
    """The liveness a peer gets for what it asked (not an int: the default)."""
    if type(liveness) is not int:
        return default
    return min(max(liveness, MIN_LIVENESS), MAX_LIVENESS)


#: Event names and binding patterns (issue "Events"): dot-separated segments, 1-255 bytes.
MAX_EVENT_BYTES = 255
#: In a pattern, a segment that is exactly one of these matches one segment / zero or more.
ONE_SEGMENT = "*"
ANY_SEGMENTS = "#"


def event_name_problem(name: str) -> str | None:
    """Why `name` is not a valid event name (what a publish names), or None if it is."""
    return _segments_problem(name, "event name", wildcards=False)


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` is not a valid binding pattern, or None if it is: an event name whose
    segments may also be `*` (exactly one segment) or `#` (zero or more)."""
    return _segments_problem(pattern, "pattern", wildcards=True)


#: Patterns in one 002 PATTERNS packet are separated by single spaces (a pattern has none).
PATTERN_SEPARATOR = " "


def split_patterns(text: str) -> tuple[list[str], str | None]:
    """The patterns of a PATTERNS packet, and why they are not valid (None if they are)."""
    patterns = text.split(PATTERN_SEPARATOR)
    for pattern in patterns:
        problem = pattern_problem(pattern)
        if problem is not None:
            return patterns, problem
    return patterns, None


def _segments_problem(text: str, what: str, wildcards: bool) -> str | None:
    if not text:
        return f"{what} is empty"
    if len(text.encode()) > MAX_EVENT_BYTES:
        return f"{what} is longer than {MAX_EVENT_BYTES} bytes"
    if not text.isprintable() or any(ch.isspace() for ch in text):
        return f"{what} contains whitespace or control characters"
    for segment in text.split("."):
        if not segment:
            return f"{what} {text!r} has an empty segment (two dots, or a dot at an end)"
        if segment in (ONE_SEGMENT, ANY_SEGMENTS):
            if not wildcards:
                return f"event name {text!r} has a wildcard segment {segment!r}"
        elif ONE_SEGMENT in segment or ANY_SEGMENTS in segment:
            return (
                f"{what} {text!r}: '*' and '#' stand alone as a whole segment, not inside"
                f" {segment!r}"
            )
    return None


#: Requests (docs/protocol.md §6.6): the requester's correlation id, 1-255 bytes.
MAX_CORRELATION_BYTES = 255


def correlation_problem(correlation: str) -> str | None:
    """Why `correlation` is not a valid correlation id, or None if it is."""
    if not correlation:
        return "correlation id is empty"
    if len(correlation.encode()) > MAX_CORRELATION_BYTES:
        return f"correlation id is longer than {MAX_CORRELATION_BYTES} bytes"
    return None


#: Schedules (§6.7): names like queue names; intervals of at least 100 ms; what a schedule
#: does about runs missed while the broker was down.
MAX_SCHEDULE_NAME_BYTES = 255
MIN_SCHEDULE_INTERVAL_MS = 100
CATCH_UP_POLICIES = ("run-once", "skip")


def schedule_name_problem(name: str) -> str | None:
    """Why `name` is not a valid schedule name, or None if it is."""
    problem = queue_name_problem(name)
    return None if problem is None else problem.replace("queue name", "schedule name")
