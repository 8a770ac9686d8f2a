"""The names of the ADMIN commands (110, docs/protocol.md §9): one constant each, for the
broker that runs them and every tool that sends them."""

from __future__ import annotations

from typing import Any

STATS = "stats"
REPORT = "report"
DLQ_LIST = "dlq-list"
DLQ_REPLAY = "dlq-replay"
DLQ_PURGE = "dlq-purge"
QUEUE_PEEK = "queue-peek"
QUEUE_PURGE = "queue-purge"
QUEUE_DELETE = "queue-delete"
QUEUE_BIND = "queue-bind"
QUEUE_UNBIND = "queue-unbind"
QUEUE_REBIND = "queue-rebind"
QUEUE_BINDINGS = "queue-bindings"
SCHEDULE_ADD = "schedule-add"
SCHEDULE_REMOVE = "schedule-remove"
SCHEDULE_LIST = "schedule-list"
LEASE = "lease"
LEASE_READ = "lease-read"
LEASE_COMMIT = "lease-commit"
LEASE_RELEASE = "lease-release"
LEASES = "leases"
KEY_HOLD = "key-hold"
KEY_COMMIT = "key-commit"
KEY_HOLDS = "key-holds"
KEY_RELEASE = "key-release"
REPLICA_LEAD = "replica-lead"

#: Commands only a replica of a replicated shard runs: its shell registers them
#: (broker/shell/leadership.py), the core knows none of them.
REPLICA = (REPLICA_LEAD,)

#: Commands that change nothing: a client whose connection was replaced while it waited
#: for the answer (it followed a new leader, or failed over) asks again on the new one.
READ_ONLY = frozenset(
    {STATS, REPORT, DLQ_LIST, QUEUE_PEEK, QUEUE_BINDINGS, SCHEDULE_LIST, LEASES, KEY_HOLDS}
)

#: Every command, in the order `stats`' error message lists them.
ALL = (
    STATS,
    REPORT,
    DLQ_LIST,
    DLQ_REPLAY,
    DLQ_PURGE,
    QUEUE_PEEK,
    QUEUE_PURGE,
    QUEUE_DELETE,
    QUEUE_BIND,
    QUEUE_UNBIND,
    QUEUE_REBIND,
    QUEUE_BINDINGS,
    SCHEDULE_ADD,
    SCHEDULE_REMOVE,
    SCHEDULE_LIST,
    LEASE,
    LEASE_READ,
    LEASE_COMMIT,
    LEASE_RELEASE,
    LEASES,
    KEY_HOLD,
    KEY_COMMIT,
    KEY_HOLDS,
    KEY_RELEASE,
    *REPLICA,
)


#: The option a client numbers its commands with. The broker echoes it at the top of the
#: command's ADMIN_REPLY (docs/protocol.md §9), so an answer that arrives after its asker
#: gave up waiting is never taken for the answer to the next command.
REF = "ref"
#: Refs are integers from 0 to below this (what a JSON number holds exactly everywhere).
REF_LIMIT = 2**53


def ref_of(options: dict[str, Any]) -> int | None:
    """The command's ref, or None when it has none or one that is not an integer in range."""
    ref = options.get(REF)
    return ref if type(ref) is int and 0 <= ref < REF_LIMIT else None


def bad_ref(options: dict[str, Any]) -> bool:
    """True when the command has a `ref` that is not one (it is refused, 422)."""
    return REF in options and ref_of(options) is None


def answering(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """`answer` as the ADMIN_REPLY to `request`: with the request's ref, if it had one."""
    ref = ref_of(request)
    return answer if ref is None else {REF: ref, **answer}
