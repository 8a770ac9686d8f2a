"""Quotas: what one key (or, for peers without a key, one host address) may hold at once,
before the broker-wide limits (docs/security.md, "Quotas"). One key that creates queues,
schedules or leases until its quota says no leaves the rest of the broker-wide room to
everyone else.

The owner is a string the guard gives each peer when it identifies it (`key NAME`, or
`host ADDRESS`); "" is the broker itself (restored state, its own jobs), never counted.
"""

from __future__ import annotations

from .config import BrokerConfig

QUEUES = "queues"
BINDINGS = "bindings"
SCHEDULES = "schedules"
LEASES = "leases"
#: Requests (001 with a correlation) a key has sent that are still held: until acked,
#: answered, buried or purged.
REQUESTS = "requests"
#: Peers a key (or host) has connected at once: ZeroMQ connections and raw TCP ones alike.
CONNECTIONS = "connections"
#: Confirmed publishes a key has waiting for their copies at other shards (copies.py).
PUBLISHES = "publishes"
#: Counted per queue, from its windows, when a window opens (dispatch.py): no bookkeeping.
CONSUMERS = "consumers"
#: Key holds a key has made (broker/key_holds.py), and idempotency keys it has held by them.
KEY_HOLDS = "key_holds"
HELD_KEYS = "held_keys"
KINDS = (
    QUEUES,
    BINDINGS,
    SCHEDULES,
    LEASES,
    REQUESTS,
    CONNECTIONS,
    PUBLISHES,
    KEY_HOLDS,
    HELD_KEYS,
)
#: Publishes that may wait for their copies at once, broker-wide (a shard's, copies.py).
MAX_WAITING_PUBLISHES = 100_000


def quota_limits(config: BrokerConfig) -> dict[str, int]:
    """Each kind's per-owner limit: the configured one, else half the broker-wide limit."""
    return {
        QUEUES: config.quota_queues or max(1, config.max_queues // 2),
        BINDINGS: config.quota_bindings or max(1, config.max_bindings // 2),
        SCHEDULES: config.quota_schedules or max(1, config.max_schedules // 2),
        LEASES: config.quota_leases or max(1, config.max_leases // 2),
        CONSUMERS: config.quota_consumers or max(1, config.max_consumers // 2),
        REQUESTS: config.quota_requests,
        CONNECTIONS: config.quota_connections,
        PUBLISHES: config.quota_publishes or MAX_WAITING_PUBLISHES // 2,
        KEY_HOLDS: config.quota_key_holds or max(1, config.max_key_holds // 2),
        HELD_KEYS: config.quota_held_keys or max(1, config.max_held_keys // 2),
    }


class Quotas:
    __slots__ = ("counts", "limits", "refused")

    def __init__(self, config: BrokerConfig) -> None:
        self.limits = quota_limits(config)
        #: kind -> owner -> how many it holds (an owner at 0 is removed: bounded by the
        #: broker-wide limits).
        self.counts: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}
        #: Refusals by kind, for stats.
        self.refused: dict[str, int] = dict.fromkeys((*KINDS, CONSUMERS), 0)

    def problem(self, kind: str, owner: str, more: int = 1) -> str | None:
        """Why `owner` may not take `more` of `kind`, or None."""
        limit = self.limits[kind]
        if not owner or not limit:  # (quota_requests 0: no quota)
            return None
        held = self.counts[kind].get(owner, 0)
        if held + more <= limit:
            return None
        self.refused[kind] += 1
        return f"{owner} holds {held} {kind}, its quota (quota_{kind} is {limit})"

    def full(self, kind: str, owner: str) -> bool:
        """Whether `owner` holds its quota of `kind` (nothing counted as refused)."""
        limit = self.limits[kind]
        return bool(owner and limit and self.counts[kind].get(owner, 0) >= limit)

    def take(self, kind: str, owner: str) -> None:
        if owner:
            counts = self.counts[kind]
            counts[owner] = counts.get(owner, 0) + 1

    def give_back(self, kind: str, owner: str, count: int = 1) -> None:
        if owner:
            counts = self.counts[kind]
            left = counts.get(owner, 0) - count
            if left > 0:
                counts[owner] = left
            else:
                counts.pop(owner, None)

    def stats(self) -> dict[str, object]:
        return {
            "limits": dict(self.limits),
            "refused": dict(self.refused),
            "owners": {kind: len(counts) for kind, counts in self.counts.items()},
        }
