"""The `stats` admin command: read from the parts on demand, so the hot path keeps no
statistics of its own beyond plain counters.

Over the wire its queues come in pages (broker/pages.py; sorted by name, `offset`, `limit`,
`max_bytes`, `next_offset`) and each page is built and encoded at most once per loop turn,
however many peers ask for it in that turn: a frame of 100 `stats` requests against 10,000
queues costs one page, not 100 answers of every queue (issue 27, finding 9). Inside the
broker (`everything`: the metrics exporter, tests) it is one dict with every queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..protocol import AdminReply, encode
from . import browse
from .context import Context
from .events import Events
from .flow import Flow
from .intake import Intake
from .model import Peer, Queue
from .pages import PageRequest, page, page_request
from .peers import Peers
from .queues import Queues

#: Peers listed by `stats` at most: those that were refused most, then the most recent.
MAX_LISTED_CLIENTS = 50
#: Bridges (peers that sent `report`) and worker pools listed at most.
MAX_LISTED_REPORTS = 100
#: Bindings listed per queue by `stats` (`queue-bindings` lists them all).
LISTED_BINDINGS = 20
#: Distinct pages one turn keeps encoded (more in one turn are built each time).
CACHED_PAGES = 8


#: The sections of `stats` whose figures come from outside the core (the store, the server
#: loop, the security shell, a shard's forwarding), each registered once by its owner with
#: `Stats.add_section`; a section nobody registered is left out (`storage`: memory mode).
SECTIONS = ("storage", "replication", "server", "cluster", "security")


class Stats:
    __slots__ = (
        "_cached",
        "_cached_turn",
        "_ctx",
        "_events",
        "_flow",
        "_intake",
        "_names",
        "_peers",
        "_queues",
        "_sections",
    )

    def __init__(
        self,
        ctx: Context,
        queues: Queues,
        peers: Peers,
        intake: Intake,
        flow: Flow,
        events: Events,
    ) -> None:
        self._ctx = ctx
        self._queues = queues
        self._peers = peers
        self._intake = intake
        self._flow = flow
        self._events = events
        self._sections: dict[str, Callable[[], dict[str, Any]]] = {}
        #: This turn's encoded answers by page, and the queue names sorted once per turn.
        self._cached: dict[PageRequest, bytes] = {}
        self._cached_turn = -1
        self._names: list[str] = []

    def add_section(self, name: str, source: Callable[[], dict[str, Any]]) -> None:
        """`stats` shows `source()` as its section `name` (one of SECTIONS) from now on."""
        if name not in SECTIONS:
            raise ValueError(f"unknown stats section {name!r}; known: {', '.join(SECTIONS)}")
        self._sections[name] = source

    def everything(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Every queue's figures and the broker's, as one dict (inside the broker only)."""
        bindings = self._events.bindings
        queues = {
            name: _queue_entry(queue, bindings.patterns(name), bindings.count(name))
            for name, queue in sorted(self._queues.by_name.items())
        }
        return self._figures(queues, len(queues), None)

    def answer(self, options: dict[str, Any]) -> bytes:
        """The encoded ADMIN_REPLY to a peer's `stats`: the page of queues it asks for, built
        at most once per turn. CommandError for bad paging options."""
        request = page_request(options)
        ctx = self._ctx
        by_name = self._queues.by_name
        if self._cached_turn != ctx.turns or len(self._names) != len(by_name):
            self._cached_turn = ctx.turns
            self._cached = {}
            self._names = sorted(by_name)
        cached = self._cached.get(request)
        if cached is not None:
            return cached
        names = self._names
        bindings = self._events.bindings

        def entry_at(index: int) -> dict[str, Any]:
            name = names[index]
            queue = by_name.get(name)
            if queue is None:  # deleted (and another created) earlier in this turn
                return {"deleted": True}
            return _queue_entry(queue, bindings.patterns(name), bindings.count(name))

        entries, next_offset = page(len(names), entry_at, request)
        listed = names[request.offset : request.offset + len(entries)]
        answer = encode(
            AdminReply(
                self._figures(dict(zip(listed, entries, strict=True)), len(names), next_offset)
            )
        )
        if len(self._cached) < CACHED_PAGES:
            self._cached[request] = answer
        return answer

    def _figures(
        self, queues: dict[str, Any], queue_count: int, next_offset: int | None
    ) -> dict[str, Any]:
        ctx = self._ctx
        peers = self._peers.by_id
        keys = self._intake.keys
        sections = self._sections
        reports = [peer for peer in peers.values() if peer.report is not None]
        return {
            "queues": queues,
            "queue_count": queue_count,
            "next_offset": next_offset,
            "pools": _pools(peers.values()),
            "bridges": {
                peer.name or peer.id.hex(): peer.report for peer in reports[:MAX_LISTED_REPORTS]
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
            "bindings": len(self._events.bindings),
            "uptime_seconds": round((ctx.now - ctx.started_ns) / 1e9, 3),
            "storage": sections["storage"]() if "storage" in sections else {"mode": "memory"},
            "server": sections["server"]() if "server" in sections else {},
            **{
                name: sections[name]()
                for name in ("replication", "cluster", "security")
                if name in sections
            },
            "keys": {"remembered": len(keys), "keys_evicted": keys.evicted},
            "key_holds": self._intake.holds.stats(),
            "draining": ctx.draining,
        }


def _queue_entry(queue: Queue, patterns: list[str], binding_count: int) -> dict[str, Any]:
    return {
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
        "bindings": patterns[:LISTED_BINDINGS],
        "binding_count": binding_count,
        "delete_when_unused_ms": queue.unused_ms,
        "settings": {
            "max_deliveries": queue.max_deliveries,
            "max_length": queue.max_length,
            "overflow": queue.overflow,
        },
    }


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


def _pools(peers: Iterable[Peer]) -> dict[str, Any]:
    """Worker pools as their workers' HELLOs name them (`POOL/INDEX`, role `worker`): per
    queue, how many workers consume it and how many hold a message (busy); the first
    MAX_LISTED_REPORTS pools by name."""
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
    return dict(sorted(pools.items())[:MAX_LISTED_REPORTS])


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
