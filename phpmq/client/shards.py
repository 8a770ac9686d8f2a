"""Which shard a client's queue-addressed calls go to (docs/client.md "Sharded brokers"),
sans-IO: the cluster map in use and its epoch, the home shard's name, the connections to
other shards by name, and the subscriptions to move when the map changes. No sockets: the
drivers (sync.py, aio.py) make the connections this module says they need.

Shards are told apart by NAME (the HELLO answer's `shard` against the map's entries), never
by address: the user may have given 127.0.0.1 where the map advertises a host name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

import msgspec

from ..protocol.cluster import ClusterMap, Shard

P = ParamSpec("P")
R = TypeVar("R")
Link = TypeVar("Link")


def cluster_in(options: dict[str, Any]) -> ClusterMap | None:
    """The cluster map a HELLO answer carries (None: none, or not a valid map)."""
    raw = options.get("cluster")
    if raw is None:
        return None
    try:
        return msgspec.convert(raw, ClusterMap)
    except (msgspec.ValidationError, ValueError):
        return None


@dataclass(frozen=True)
class Subscription:
    """A subscription made through a routing client: where it is, and how to make it again
    at a new owner."""

    shard: str
    window: int
    bind: tuple[str, ...]
    delete_when_unused: float | None


@dataclass(frozen=True)
class Move:
    """A subscription whose owner changed with the map: cancel at `old`, make at `new`."""

    queue: str
    old: str
    new: Shard
    subscription: Subscription

    def subscribe_options(self) -> dict[str, Any]:
        """The arguments of `subscribe` after the queue that make it again at `new`."""
        subscription = self.subscription
        return {
            "window": subscription.window,
            "bind": subscription.bind,
            "delete_when_unused": subscription.delete_when_unused,
        }


class ShardRouting(Generic[Link]):
    """The routing state of one client (the home connection and its links)."""

    def __init__(self) -> None:
        #: The map in use (the highest epoch heard on any connection).
        self.cluster: ClusterMap | None = None
        #: The home shard's name, from the home connection's HELLO answer.
        self.home: str | None = None
        #: The home connection's HELLO answer came (or was waited for in vain).
        self.decided = False
        #: Connections to other shards, by shard name, made the first time one is needed.
        self.links: dict[str, Link] = {}
        self.subscriptions: dict[str, Subscription] = {}
        #: A newer map was adopted: subscriptions may have to move.
        self.moves_due = False
        #: Where the next merged receive starts among the connections (`in_turn`).
        self._turn = -1

    def heard(self, options: dict[str, Any], *, from_home: bool) -> None:
        """A HELLO answer came on a connection: adopt its map if the epoch is newer."""
        cluster = cluster_in(options)
        if from_home:
            shard = options.get("shard")
            self.home = shard if isinstance(shard, str) else None
            self.decided = True
        if cluster is not None and cluster.newer_than(self.cluster):
            self.moves_due = self.cluster is not None and bool(self.subscriptions)
            self.cluster = cluster

    @property
    def sharded(self) -> bool:
        """Queue-addressed calls go to the owners: the home shard named itself in a map of
        more than one shard."""
        cluster = self.cluster
        return cluster is not None and len(cluster.shards) > 1 and self.home is not None

    def owner(self, queue: str) -> Shard | None:
        """The shard that owns `queue` (None: not sharded)."""
        return self.cluster.owner(queue) if self.sharded else None  # type: ignore[union-attr]

    def elsewhere(self, queue: str) -> Shard | None:
        """The owner of `queue` when it is not the home shard (None: home)."""
        owner = self.owner(queue)
        return None if owner is None or owner.name == self.home else owner

    def shard_of(self, queue: str) -> str | None:
        owner = self.owner(queue)
        return None if owner is None else owner.name

    def home_name(self, make_name: Callable[[], str]) -> str:
        """A name from `make_name` for a queue the home shard owns (a live feed's, so that
        the publishes of its client reach it; docs/client.md "Sharded brokers")."""
        name = make_name()
        while self.elsewhere(name) is not None:
            name = make_name()
        return name

    def others(self) -> list[Shard]:
        """Every shard of the map but the home one."""
        if not self.sharded:
            return []
        return [s for s in self.cluster.shards if s.name != self.home]  # type: ignore[union-attr]

    def in_turn(self, home: Link) -> list[Link]:
        """`home` and the links, starting one further on each call, so that a busy
        connection does not keep the others' messages waiting."""
        connections = [home, *self.links.values()]
        self._turn = start = (self._turn + 1) % len(connections)
        return connections[start:] + connections[:start]

    def subscribed(
        self, queue: str, window: int, bind: Iterable[str], delete_when_unused: float | None
    ) -> None:
        """Remember where `queue` is consumed, to move it if its owner changes."""
        if window <= 0 or not self.sharded:
            self.subscriptions.pop(queue, None)
            return
        shard = self.shard_of(queue) or ""
        self.subscriptions[queue] = Subscription(shard, window, tuple(bind), delete_when_unused)

    def unsubscribed(self, queue: str) -> None:
        self.subscriptions.pop(queue, None)

    def take_moves(self) -> list[Move]:
        """The subscriptions whose owner the adopted map changed; they count as moved."""
        self.moves_due = False
        moves = []
        for queue, subscription in list(self.subscriptions.items()):
            owner = self.owner(queue)
            if owner is not None and owner.name != subscription.shard:
                moves.append(Move(queue, subscription.shard, owner, subscription))
                self.subscriptions[queue] = Subscription(
                    owner.name,
                    subscription.window,
                    subscription.bind,
                    subscription.delete_when_unused,
                )
        return moves


class Routed(Protocol):
    """What the `to_owner` decorators need of a client."""

    _routing: ShardRouting[Any] | None

    def _link_for(self, queue: str) -> Any: ...


def to_owner(
    method: Callable[Concatenate[Any, str, P], R],
) -> Callable[Concatenate[Any, str, P], R]:
    """A blocking client's method whose first argument is a queue: on a sharded broker it
    runs on the connection to the queue's owner (one attribute check when not routing)."""
    name = method.__name__

    @functools.wraps(method)
    def routed(self: Routed, queue: str, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._routing is not None:
            link = self._link_for(queue)
            if link is not None:
                return getattr(link, name)(queue, *args, **kwargs)  # type: ignore[no-any-return]
        return method(self, queue, *args, **kwargs)

    return routed


def to_owner_async(
    method: Callable[Concatenate[Any, str, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Any, str, P], Coroutine[Any, Any, R]]:
    """`to_owner` for the asyncio client's coroutines."""
    name = method.__name__

    @functools.wraps(method)
    async def routed(self: Routed, queue: str, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._routing is not None:
            link = await self._link_for(queue)
            if link is not None:
                return await getattr(link, name)(queue, *args, **kwargs)  # type: ignore[no-any-return]
        return await method(self, queue, *args, **kwargs)

    return routed
