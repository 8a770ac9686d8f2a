"""A cluster of several hosts from one shared file (docs/cluster.md "Several hosts"):

    epoch = 1
    [[nodes]]
    name = "a"
    address = "tcp://10.0.0.1:5555"
    shards = 2
    [[nodes]]
    name = "b"
    address = "tcp://10.0.0.2:5555"
    shards = 1

With `replicas = N` at the top (docs/cluster.md "Replicated queues"), every shard is held by N
nodes (protocol/cluster.py `replica_nodes`): each node runs one process per replica it holds,
its own shards first (ports + 0, 1, ...), then its replicas of other nodes' shards in name
order (the next ports); each replica's Raft port is its port + `raft_port_offset`.

Every host runs `phpmq broker --cluster-file FILE --node NAME` with the same file. Node `a`'s
shard i is named `a/i` and binds a's address with its port + i. The map (protocol/cluster.py)
is every node's shards with the file's epoch: the same on every host, so two nodes started from
different files have different maps, and their links refuse each other (transports/links.py).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import msgspec

from ...protocol.cluster import ClusterMap, Shard, replica_nodes
from ...protocol.rules import queue_name_problem


class Node(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    address: str
    shards: int = 1


class Replica(NamedTuple):
    """One replica of a shard: the node holding it, its broker endpoint, its Raft address."""

    shard: str
    node: str
    address: str
    raft: str


class ClusterFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    nodes: list[Node]
    epoch: int = 1
    #: Nodes holding each shard (1: each shard only on its own node).
    replicas: int = 1
    #: A replica's Raft port is its broker port plus this.
    raft_port_offset: int = 1000

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(node.name for node in self.nodes)
        raise ValueError(f"node {name!r} is not in the cluster file (its nodes: {known})")

    def cluster_map(self, shard_address: object) -> ClusterMap:
        """Every node's shards; `shard_address(bind, index)` gives shard i's endpoint."""
        shards = tuple(
            Shard(f"{node.name}/{index}", shard_address(node.address, index))  # type: ignore[operator]
            for node in self.nodes
            for index in range(node.shards)
        )
        return ClusterMap(self.epoch, shards)

    def replica_sets(self, shard_address: Callable[[str, int], str]) -> dict[str, list[Replica]]:
        """Every shard's replicas, its home node's first; `shard_address(bind, index)` gives
        the endpoint of a node's process `index`."""
        names = [node.name for node in self.nodes]
        homes = {
            f"{node.name}/{index}": node.name for node in self.nodes for index in range(node.shards)
        }
        placed = {
            shard: replica_nodes(shard, home, names, self.replicas) for shard, home in homes.items()
        }
        sets: dict[str, list[Replica]] = {shard: [] for shard in homes}
        for node in self.nodes:
            own = [shard for shard, home in homes.items() if home == node.name]
            others = sorted(shard for shard, held_by in placed.items() if node.name in held_by[1:])
            for index, shard in enumerate(own + others):
                address = shard_address(node.address, index)
                sets[shard].append(Replica(shard, node.name, address, self._raft(address)))
        for shard, replicas in sets.items():
            replicas.sort(key=lambda replica: placed[shard].index(replica.node))
        return sets

    def _raft(self, address: str) -> str:
        parts = urlsplit(address)
        return f"{parts.hostname}:{(parts.port or 0) + self.raft_port_offset}"


def read_cluster_file(path: str) -> ClusterFile:
    """The file, checked.

    Raises:
        ValueError: unreadable, not TOML, or not a valid cluster (says what is wrong).
    """
    try:
        raw = tomllib.loads(Path(path).read_text())
        cluster = msgspec.convert(raw, ClusterFile)
    except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"cluster file {path}: {exc}") from None
    names = [node.name for node in cluster.nodes]
    if not names:
        raise ValueError(f"cluster file {path}: no nodes")
    if len(set(names)) != len(names):
        raise ValueError(f"cluster file {path}: a node name appears twice")
    for node in cluster.nodes:
        if "/" in node.name or queue_name_problem(node.name):
            raise ValueError(f"cluster file {path}: bad node name {node.name!r}")
        if not 1 <= node.shards <= 256:
            raise ValueError(f"cluster file {path}: node {node.name} needs 1-256 shards")
    if not 1 <= cluster.replicas <= len(names):
        raise ValueError(
            f"cluster file {path}: replicas must be 1 to {len(names)} (one per node at most)"
        )
    if not 1 <= cluster.raft_port_offset <= 60_000:
        raise ValueError(f"cluster file {path}: raft_port_offset must be 1 to 60000")
    if cluster.epoch < 1:
        raise ValueError(f"cluster file {path}: epoch must be at least 1")
    return cluster
