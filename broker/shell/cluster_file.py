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

Every host runs `phpmq broker --cluster-file FILE --node NAME` with the same file. Node `a`'s
shard i is named `a/i` and binds a's address with its port + i. The map (protocol/cluster.py)
is every node's shards with the file's epoch: the same on every host, so two nodes started from
different files have different maps, and their links refuse each other (transports/links.py).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from ...protocol.cluster import ClusterMap, Shard
from ...protocol.rules import queue_name_problem


class Node(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    address: str
    shards: int = 1


class ClusterFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    nodes: list[Node]
    epoch: int = 1

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
    if cluster.epoch < 1:
        raise ValueError(f"cluster file {path}: epoch must be at least 1")
    return cluster
