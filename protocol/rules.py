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


def clamp_liveness(liveness: object, default: int = DEFAULT_LIVENESS) -> int:
    """The liveness a peer gets for what it asked (not an int: the default)."""
    if type(liveness) is not int:
        return default
    return min(max(liveness, MIN_LIVENESS), MAX_LIVENESS)
