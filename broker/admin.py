"""Operator commands carried by the ADMIN extension message (what `phpmq stats`, `phpmq dlq`
and `phpmq queue` send). Each takes the command's JSON options, returns a JSON-able dict, and
raises ValueError for a bad command (answered as a 422 inside the ADMIN_REPLY).

`stats` only reads: it builds its answer from the parts on demand, so the hot path keeps no
statistics of its own beyond plain counters. The dead-letter commands act through the part
that owns dead letters, the queue commands through the queue table, the schedule commands
through the schedules part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..protocol import AdminReply, ErrorCode
from . import browse
from .context import Context
from .deadletters import DeadLetters
from .errors import CommandError
from .events import Events, pattern_list
from .flow import Flow
from .intake import Intake
from .leases import Leases
from .lifecycle import Lifecycle
from .model import Peer, Queue
from .peers import Peers
from .queues import Queues
from .schedules import Schedules

#: Peers listed by `stats` at most: those that were refused most, then the most recent.
MAX_LISTED_CLIENTS = 50
MAX_REPORT_KEYS = 50
#: Bindings listed per queue by `stats` (`queue-bindings` lists them all).
LISTED_BINDINGS = 20


class Admin:
    def __init__(
        self,
        ctx: Context,
        queues: Queues,
        peers: Peers,
        dead_letters: DeadLetters,
        intake: Intake,
        flow: Flow,
        events: Events,
        lifecycle: Lifecycle,
        schedules: Schedules,
        leases: Leases,
    ) -> None:
        self._ctx = ctx
        self._events = events
        self._lifecycle = lifecycle
        self._flow = flow
        self._queues = queues
        self._peers = peers
        self._dead = dead_letters
        self._intake = intake
        #: The durable store's `stats()`, for the stats command (None in memory mode).
        self.storage_stats: Callable[[], dict[str, Any]] | None = None
        #: The server loop's own figures (turns, budget, backlogs), for the stats command.
        self.server_stats: Callable[[], dict[str, Any]] | None = None
        #: A shard's forwarding and links (docs/cluster.md), for the stats command.
        self.cluster_stats: Callable[[], dict[str, Any]] | None = None
        #: Refusals by right and what is enforced (broker/guard.py), for the stats command.
        self.security_stats: Callable[[], dict[str, Any]] | None = None
        self._commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "stats": self._stats,
            "dlq-list": self._dlq_list,
            "dlq-replay": self._dlq_replay,
            "dlq-purge": self._dlq_purge,
            "queue-peek": self._queue_peek,
            "queue-purge": self._queue_purge,
            "queue-delete": self._queue_delete,
            "queue-bind": self._queue_bind,
            "queue-unbind": self._queue_unbind,
            "queue-rebind": self._queue_rebind,
            "queue-bindings": self._queue_bindings,
            "schedule-add": schedules.add,
            "schedule-remove": schedules.remove,
            "schedule-list": schedules.listing,
            **leases.commands(),
        }

    def on_admin(self, peer: Peer, message: Any) -> None:
        """The answer is always an ADMIN_REPLY, so a client can tell it from other refusals."""
        ctx = self._ctx
        ctx.owner = peer.owner
        try:
            result = self.run(message.options, peer)
        except ValueError as exc:
            ctx.counters.errors += 1
            code = exc.code if isinstance(exc, CommandError) else int(ErrorCode.INVALID_VALUE)
            result = {"error": {"code": code, "reason": str(exc)}}
        finally:
            ctx.owner = ""
        ctx.reply(peer, AdminReply(result))

    def run(self, options: dict[str, Any], peer: Peer | None = None) -> dict[str, Any]:
        command = options.get("command")
        if command == "report":
            return _report(peer, options)
        handler = self._commands.get(command) if isinstance(command, str) else None
        if handler is None:
            known = ", ".join([*self._commands, "report"])
            raise ValueError(f"unknown admin command {command!r}; known: {known}")
        return handler(options)

    def _stats(self, options: dict[str, Any]) -> dict[str, Any]:
        ctx = self._ctx
        bindings = self._events.bindings
        queues = {
            name: {
                "ready": queue.ready_count,
                "in_flight": queue.in_flight,
                "delayed": queue.delayed,
                "consumers": len(queue.windows),
                "dead_letters": len(queue.dead),
                "leased": queue.leased,
                "leases": len(queue.leases),
                "oldest_sent_at": browse.oldest_sent_at(queue),
                "refused": queue.refused,
                "totals": _queue_totals(queue),
                "paused_producers": len(queue.paused),
                "bindings": bindings.patterns(name)[:LISTED_BINDINGS],
                "binding_count": bindings.count(name),
                "delete_when_unused_ms": queue.unused_ms,
                "settings": {
                    "max_deliveries": queue.max_deliveries,
                    "max_length": queue.max_length,
                    "overflow": queue.overflow,
                },
            }
            for name, queue in sorted(self._queues.by_name.items())
        }
        peers = self._peers.by_id
        keys = self._intake.keys
        return {
            "queues": queues,
            "pools": _pools(peers.values()),
            "bridges": {
                peer.name or peer.id.hex(): peer.report
                for peer in peers.values()
                if peer.report is not None
            },
            "peers": len(peers),
            "clients": _clients(peers.values(), ctx.now),
            "memory": {
                "held_bytes": ctx.held_bytes,
                "limit_bytes": self._flow.limit,
                "alarm": self._flow.memory_high,
                "paused_producers": self._flow.paused_producers,
            },
            "counters": ctx.counters.as_dict(),
            "refusals": {str(int(code)): count for code, count in sorted(ctx.refusals.items())},
            "bindings": len(bindings),
            "uptime_seconds": round((ctx.now - ctx.started_ns) / 1e9, 3),
            "storage": self.storage_stats() if self.storage_stats else {"mode": "memory"},
            "server": self.server_stats() if self.server_stats else {},
            **({"cluster": self.cluster_stats()} if self.cluster_stats else {}),
            **({"security": self.security_stats()} if self.security_stats else {}),
            "keys": {"remembered": len(keys), "keys_evicted": keys.evicted},
            "draining": ctx.draining,
        }

    def _named_queue(self, options: dict[str, Any]) -> Queue:
        queue = self._queues.get(_queue_name(options))
        if queue is None:
            raise CommandError(f"no queue named {options['queue']!r}", ErrorCode.NOT_FOUND)
        return queue

    def _dlq_list(self, options: dict[str, Any]) -> dict[str, Any]:
        return browse.dead_letters(self._named_queue(options), self._ctx.config, options)

    def _dlq_replay(self, options: dict[str, Any]) -> dict[str, Any]:
        """Put dead letters back at the tail of their queue, same ID, no TTL."""
        queue = self._named_queue(options)
        wanted = options.get("ids")
        if wanted is not None and not (
            isinstance(wanted, list) and all(isinstance(i, str) for i in wanted)
        ):
            raise ValueError("'ids' must be a list of message IDs")
        ids = None if wanted is None else [i.encode() for i in wanted]
        return {"queue": queue.name, "replayed": self._dead.replay(queue, ids)}

    def _dlq_purge(self, options: dict[str, Any]) -> dict[str, Any]:
        queue = self._named_queue(options)
        return {"queue": queue.name, "purged": self._dead.purge(queue)}

    def _queue_peek(self, options: dict[str, Any]) -> dict[str, Any]:
        """Ready messages, left where they are."""
        queue = self._named_queue(options)
        return browse.peek(queue, self._ctx.config, self._ctx.now, options)

    def _queue_purge(self, options: dict[str, Any]) -> dict[str, Any]:
        queue = self._named_queue(options)
        return {"queue": queue.name, "purged": self._queues.purge(queue)}

    def _queue_delete(self, options: dict[str, Any]) -> dict[str, Any]:
        return self._lifecycle.delete(self._named_queue(options))

    def _queue_bind(self, options: dict[str, Any]) -> dict[str, Any]:
        name = _queue_name(options)
        _, added = self._events.bind(name, pattern_list(options))
        return {"queue": name, "added": added, "bindings": self._events.bindings.patterns(name)}

    def _queue_unbind(self, options: dict[str, Any]) -> dict[str, Any]:
        queue = self._named_queue(options)
        removed = self._events.unbind(queue, pattern_list(options))
        bindings = self._events.bindings.patterns(queue.name)
        return {"queue": queue.name, "removed": removed, "bindings": bindings}

    def _queue_rebind(self, options: dict[str, Any]) -> dict[str, Any]:
        name = _queue_name(options)
        result = self._events.rebind(name, options)
        result["bindings"] = self._events.bindings.patterns(name)
        return result

    def _queue_bindings(self, options: dict[str, Any]) -> dict[str, Any]:
        queue = self._named_queue(options)
        return {"queue": queue.name, "bindings": self._events.bindings.patterns(queue.name)}


def _queue_name(options: dict[str, Any]) -> str:
    name = options.get("queue")
    if not isinstance(name, str):
        raise CommandError("this command needs a 'queue' string")
    return name


def _queue_totals(queue: Queue) -> dict[str, int]:
    """What went through a queue since it was created (or the broker started)."""
    return {
        "published": queue.published,
        "delivered": queue.delivered,
        "acked": queue.acked,
        "requeued": queue.requeued,
        "expired": queue.expired,
        "dead_lettered": queue.dead_lettered,
    }


def _report(peer: Peer | None, options: dict[str, Any]) -> dict[str, Any]:
    """A bridge (or any client) states its counters; `stats` lists them under `bridges`."""
    counters = options.get("counters")
    if peer is None or not isinstance(counters, dict) or len(counters) > MAX_REPORT_KEYS:
        raise ValueError(f"'counters' must be an object of at most {MAX_REPORT_KEYS} entries")
    peer.report = {"kind": str(options.get("kind", ""))[:50], "counters": counters}
    return {"reported": len(counters)}


def _pools(peers: Iterable[Peer]) -> dict[str, Any]:
    """Worker pools as their workers' HELLOs name them (`POOL/INDEX`, role `worker`): per
    queue, how many workers consume it and how many hold a message (busy)."""
    pools: dict[str, Any] = {}
    for peer in peers:
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


def _clients(peers: Iterable[Peer], now: int) -> list[dict[str, Any]]:
    """The peers worth a look (most refused first, then the most recently heard), each with
    what it holds, what it was refused, and whether it is paused or stalled."""
    listed = sorted(peers, key=lambda peer: (-peer.refused, -peer.last_seen))[:MAX_LISTED_CLIENTS]
    return [
        {
            "id": peer.id.hex(),
            "name": peer.name,
            "role": peer.role,
            "transport": peer.profile.transport,
            "address": peer.principal.address if peer.principal is not None else "",
            "key": peer.principal.key if peer.principal is not None else None,
            "hello": peer.hello,
            "windows": len(peer.windows),
            "held": sum(len(window.held) for window in peer.windows.values()),
            "refused": peer.refused,
            "paused_on": ["*" if queue is None else queue.name for queue in peer.paused_on],
            "stalled": peer.stalled,
            "silent_seconds": round((now - peer.last_seen) / 1e9, 1),
        }
        for peer in listed
    ]
