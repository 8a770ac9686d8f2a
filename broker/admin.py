"""Operator commands carried by the ADMIN extension message (what `phpmq stats` and
`phpmq dlq` send). Each takes the core and the command's JSON options, returns a JSON-able
dict, and raises ValueError for a bad command (the core turns that into a 422 ERROR)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import Core, Peer

DEFAULT_LIST_LIMIT = 100
MAX_REPORT_KEYS = 50
#: JSON keys, ID, numbers and punctuation of one listed dead letter, rounded up.
ENTRY_OVERHEAD_BYTES = 200


def run_admin(core: Core, options: dict[str, Any], peer: Peer | None = None) -> dict[str, Any]:
    command = options.get("command")
    if command == "report":
        return _report(peer, options)
    handler = COMMANDS.get(command) if isinstance(command, str) else None
    if handler is None:
        known = ", ".join([*COMMANDS, "report"])
        raise ValueError(f"unknown admin command {command!r}; known: {known}")
    return handler(core, options)


def _report(peer: Peer | None, options: dict[str, Any]) -> dict[str, Any]:
    """A bridge (or any client) states its counters; `stats` lists them under `bridges`."""
    counters = options.get("counters")
    if peer is None or not isinstance(counters, dict) or len(counters) > MAX_REPORT_KEYS:
        raise ValueError(f"'counters' must be an object of at most {MAX_REPORT_KEYS} entries")
    peer.report = {"kind": str(options.get("kind", ""))[:50], "counters": counters}
    return {"reported": len(counters)}


def _stats(core: Core, options: dict[str, Any]) -> dict[str, Any]:
    queues = {
        name: {
            "ready": queue.ready_count,
            "in_flight": queue.in_flight,
            "delayed": queue.delayed,
            "consumers": len(queue.windows),
            "dead_letters": len(queue.dead),
            "settings": {
                "max_deliveries": queue.max_deliveries,
                "max_length": queue.max_length,
                "overflow": queue.overflow,
            },
        }
        for name, queue in sorted(core.queues.items())
    }
    return {
        "queues": queues,
        "pools": _pools(core),
        "bridges": {
            peer.name or peer.id.hex(): peer.report
            for peer in core.peers.values()
            if peer.report is not None
        },
        "peers": len(core.peers),
        "counters": dict(core.counters),
        "uptime_seconds": round((core.now - core.started_ns) / 1e9, 3),
        "storage": core.storage_stats() if core.storage_stats else {"mode": "memory"},
        "keys": {"remembered": len(core.keys), "keys_evicted": core.keys.evicted},
        "draining": core.draining,
    }


def _pools(core: Core) -> dict[str, Any]:
    """Worker pools as their workers' HELLOs name them (`POOL/INDEX`, role `worker`): per
    queue, how many workers consume it and how many hold a message (busy)."""
    pools: dict[str, Any] = {}
    for peer in core.peers.values():
        if peer.role != "worker":
            continue
        pool_name = peer.name.rpartition("/")[0] or peer.name
        pool = pools.setdefault(pool_name, {"workers": 0, "queues": {}})
        pool["workers"] += 1
        for queue_name, window in peer.windows.items():
            entry = pool["queues"].setdefault(queue_name, {"workers": 0, "busy": 0, "held": 0})
            entry["workers"] += 1
            entry["held"] += len(window.held)
            entry["busy"] += bool(window.held)
    return dict(sorted(pools.items()))


def _dead_queue(core: Core, options: dict[str, Any]):
    name = options.get("queue")
    if not isinstance(name, str):
        raise ValueError("this command needs a 'queue' string")
    queue = core.queues.get(name)
    if queue is None:
        raise ValueError(f"no queue named {name!r}")
    return queue


def _dlq_list(core: Core, options: dict[str, Any]) -> dict[str, Any]:
    queue = _dead_queue(core, options)
    limit = options.get("limit", DEFAULT_LIST_LIMIT)
    if type(limit) is not int or limit < 0:
        raise ValueError("'limit' must be a non-negative integer")
    # The reply is one packet: keep it under the broker's own packet limit (JSON carries the
    # content as base64, 4/3 of its size), and say when the list was cut for that reason.
    budget = core.config.max_content_bytes // 2
    entries = []
    for entry in itertools.islice(queue.dead, limit):
        budget -= len(entry.content) * 4 // 3 + len(entry.reason) + ENTRY_OVERHEAD_BYTES
        if budget < 0:
            break
        entries.append(
            {
                "id": entry.id,
                "reason": entry.reason,
                "deliveries": entry.deliveries,
                "dead_at": entry.dead_at,
                "content": entry.content,
            }
        )
    return {
        "queue": queue.name,
        "total": len(queue.dead),
        "dropped": queue.dead_dropped,
        "truncated": budget < 0,
        "entries": entries,
    }


def _dlq_replay(core: Core, options: dict[str, Any]) -> dict[str, Any]:
    """Put dead letters back at the tail of their queue, same ID, no TTL."""
    queue = _dead_queue(core, options)
    wanted = options.get("ids")
    if wanted is not None and not (
        isinstance(wanted, list) and all(isinstance(i, str) for i in wanted)
    ):
        raise ValueError("'ids' must be a list of message IDs")
    keep = []
    replayed = 0
    for entry in queue.dead:
        if wanted is None or entry.id in wanted:
            core.replay_dead(queue, entry)
            replayed += 1
        else:
            keep.append(entry)
    queue.dead.clear()
    queue.dead.extend(keep)
    core.mark_dirty(queue)
    return {"queue": queue.name, "replayed": replayed}


def _dlq_purge(core: Core, options: dict[str, Any]) -> dict[str, Any]:
    queue = _dead_queue(core, options)
    return {"queue": queue.name, "purged": core.purge_dead(queue)}


COMMANDS = {
    "stats": _stats,
    "dlq-list": _dlq_list,
    "dlq-replay": _dlq_replay,
    "dlq-purge": _dlq_purge,
}
