"""Which shard owns a queue: the cluster map both brokers and clients hold (docs/cluster.md).

A cluster is a list of shards, each with a stable name (`node/index`) and an address, and an
epoch that grows with every change of the list. A queue's owner is chosen by rendezvous
(highest random weight) hashing: every shard scores the queue name with a fixed hash
(BLAKE2b, 8 bytes, of the shard name, a NUL and the queue name) and the highest score owns
it. So the owner depends only on the names in the map, never on their order or on
Python's `hash()`, and adding a shard to N takes about 1/(N+1) of the queues, each from the
shard that owned it, while the rest stay where they were; removing one moves only its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

import msgspec

#: Queue names resolved per map, at most (clients and brokers ask again and again).
OWNER_CACHE_SIZE = 65_536


class Shard(msgspec.Struct, frozen=True, omit_defaults=True):
    """One broker process of the cluster: `name` is stable across restarts (`node/index`).
    A replicated shard (docs/cluster.md "Replicated queues") lists every replica's endpoint
    in `replicas`, its home's (`address`) first: any of them serves its queues, a follower
    by forwarding to the leader."""

    name: str
    address: str
    replicas: tuple[str, ...] = ()


class ClusterMap(msgspec.Struct, frozen=True):
    """The shards of a cluster at one epoch; a newer epoch replaces an older map."""

    epoch: int
    shards: tuple[Shard, ...]

    def __post_init__(self) -> None:
        names = [shard.name for shard in self.shards]
        if not names:
            raise ValueError("a cluster map has at least one shard")
        if len(set(names)) != len(names):
            raise ValueError("shard names in a cluster map are unique")

    def owner(self, queue: str) -> Shard:
        """The shard that owns `queue`."""
        return _owner(self.shards, queue)

    def newer_than(self, other: ClusterMap | None) -> bool:
        return other is None or self.epoch > other.epoch


def score(shard_name: str, queue: str) -> int:
    """The shard's rendezvous weight for the queue: a fixed 64-bit hash of both names."""
    digest = hashlib.blake2b(shard_name.encode() + b"\0" + queue.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@lru_cache(maxsize=OWNER_CACHE_SIZE)
def _owner(shards: tuple[Shard, ...], queue: str) -> Shard:
    # Ties (two equal 64-bit hashes) go to the smaller name, so every side agrees.
    return max(shards, key=lambda shard: (score(shard.name, queue), _reverse(shard.name)))


def replica_nodes(
    shard_name: str, home: str | None, nodes: Sequence[str], count: int
) -> tuple[str, ...]:
    """The nodes that hold a shard's replicas (docs/cluster.md "Replicated queues"): its home
    node first, then the `count - 1` other nodes with the highest rendezvous score for the
    shard's name (the same hash as a queue's owner, ties to the smaller name). Never two
    on one node; adding a node moves a replica only to the new node. A shard whose home node
    has left the cluster (`home` None) is held by the `count` nodes with the highest score.

    Raises:
        ValueError: `count` is not between 1 and the number of nodes, or `home` is not one.
    """
    if home is not None and home not in nodes:
        raise ValueError(f"the home node {home!r} is not among the nodes")
    if not 1 <= count <= len(nodes):
        raise ValueError(f"{count} replicas need 1 to {len(nodes)} nodes")
    others = sorted(
        (node for node in nodes if node != home),
        key=lambda node: (score(node, shard_name), _reverse(node)),
        reverse=True,
    )
    if home is None:
        return tuple(others[:count])
    return (home, *others[: count - 1])


def _reverse(name: str) -> tuple[int, ...]:
    return tuple(-ord(ch) for ch in name)


_map_decoder = msgspec.json.Decoder(ClusterMap)


def encode_map(cluster: ClusterMap) -> bytes:
    """The map as JSON, as a HELLO answer carries it."""
    return msgspec.json.encode(cluster)


def decode_map(raw: bytes) -> ClusterMap:
    """A map from JSON.

    Raises:
        ValueError: not a valid map (bad JSON, no shards, a repeated name).
    """
    try:
        return _map_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a cluster map: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not a cluster map: {exc}") from None
