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
its own shards at its port + 0, 1, ..., and a replica of another node's shard at its port +
its own shard count + that shard's place among the other nodes' shards in the file (so a node
added at the end, or one marked `left`, moves no replica of anyone else to another port); each
replica's Raft port is its port + `raft_port_offset`.

Membership changes while the cluster runs (docs/cluster.md "Membership"): `phpmq cluster join`
appends a node with `joined = true` (it holds replicas of the existing shards, no shard of its
own: new shards would move queues), `phpmq cluster leave` marks one `left = true` (its shards
stay, held by the other nodes); each bumps the epoch.

Every host runs `phpmq broker --cluster-file FILE --node NAME` with the same file. Node `a`'s
shard i is named `a/i` and binds a's address with its port + i. The map (protocol/cluster.py)
is every node's shards with the file's epoch: the same on every host, so two nodes started from
different files have different maps, and their links refuse each other (transports/links.py).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import msgspec

from ...protocol.cluster import ClusterMap, Shard, replica_nodes
from ...protocol.rules import queue_name_problem


class Node(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    name: str
    address: str
    shards: int = 1
    #: Added to a running cluster: its fresh replicas wait to hear their leader before they
    #: may stand for election (one that did not would depose the leader that adds it).
    joined: bool = False
    #: Left the cluster: it holds no replica; its shards live on, held by the other nodes.
    left: bool = False


class Replica(NamedTuple):
    """One replica of a shard: the node holding it, its broker endpoint, its Raft address."""

    shard: str
    node: str
    address: str
    raft: str


class ClusterFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
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

    def live_nodes(self) -> list[Node]:
        """The nodes that hold replicas: every one but those that left."""
        return [node for node in self.nodes if not node.left]

    def shard_names(self) -> list[str]:
        """Every shard, in the file's order: a node's shards are `NAME/0`, `NAME/1`, ..."""
        return [f"{node.name}/{index}" for node in self.nodes for index in range(node.shards)]

    def replica_sets(self, shard_address: Callable[[str, int], str]) -> dict[str, list[Replica]]:
        """Every shard's replicas, its home node's first (while it has not left);
        `shard_address(bind, index)` gives the endpoint of a node's process `index`."""
        live = [node.name for node in self.live_nodes()]
        homes = {f"{node.name}/{i}": node for node in self.nodes for i in range(node.shards)}
        placed = {
            shard: replica_nodes(shard, None if home.left else home.name, live, self.replicas)
            for shard, home in homes.items()
        }
        return {
            shard: [
                self.replica_on(self.node(name), shard, shard_address) for name in placed[shard]
            ]
            for shard in homes
        }

    def replica_on(
        self, node: Node, shard: str, shard_address: Callable[[str, int], str]
    ) -> Replica:
        """Where `node` holds (or would hold) a replica of `shard`: its own shards at its
        port + their index, another node's at its port + its shard count + that shard's
        place among the other nodes' shards in the file."""
        home, index = shard.split("/")
        if home == node.name:
            slot = int(index)
        else:
            others = [name for name in self.shard_names() if name.split("/")[0] != node.name]
            slot = node.shards + others.index(shard)
        address = shard_address(node.address, slot)
        return Replica(shard, node.name, address, self._raft(address))

    def with_node_joined(self, name: str, address: str) -> ClusterFile:
        """This cluster with node `name` added (docs/cluster.md "Membership"), next epoch.

        Raises:
            ValueError: not a replicated cluster, or the name is taken.
        """
        if self.replicas < 2:
            raise ValueError(
                "only a replicated cluster (replicas > 1) takes nodes while it runs: without"
                " replicas a new node's shards would take queues whose messages stay behind"
            )
        if any(node.name == name for node in self.nodes):
            raise ValueError(f"the cluster has a node {name!r} already")
        joined = Node(name, address, shards=0, joined=True)
        return msgspec.structs.replace(self, nodes=[*self.nodes, joined], epoch=self.epoch + 1)

    def with_node_left(self, name: str) -> ClusterFile:
        """This cluster with node `name` marked as left, next epoch.

        Raises:
            ValueError: not a replicated cluster, no such node, or too few nodes would stay.
        """
        if self.node(name).left:
            raise ValueError(f"node {name!r} has left the cluster already")
        if self.replicas < 2:
            raise ValueError(
                "only a replicated cluster (replicas > 1) lets a node leave while it runs:"
                " without replicas its queues would leave with it"
            )
        nodes = [
            msgspec.structs.replace(node, left=True) if node.name == name else node
            for node in self.nodes
        ]
        staying = sum(1 for node in nodes if not node.left)
        if staying < self.replicas:
            raise ValueError(
                f"{staying} nodes would stay for {self.replicas} replicas of every shard:"
                " add a node first (phpmq cluster join)"
            )
        return msgspec.structs.replace(self, nodes=nodes, epoch=self.epoch + 1)

    def to_toml(self) -> str:
        """The file's text (what `read_cluster_file` reads back as this cluster)."""
        raw = msgspec.to_builtins(self)
        nodes = raw.pop("nodes")
        lines = [f"{key} = {_toml_value(value)}" for key, value in raw.items()]
        if "epoch" not in raw:
            lines.insert(0, "epoch = 1")
        for node in nodes:
            lines += ["", "[[nodes]]"]
            lines += [f"{key} = {_toml_value(value)}" for key, value in node.items()]
        return "\n".join(lines) + "\n"

    def _raft(self, address: str) -> str:
        parts = urlsplit(address)
        return f"{parts.hostname}:{(parts.port or 0) + self.raft_port_offset}"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # a TOML basic string, for the names and addresses allowed


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
    problem = cluster_problem(cluster)
    if problem is not None:
        raise ValueError(f"cluster file {path}: {problem}")
    return cluster


def cluster_problem(cluster: ClusterFile) -> str | None:
    """What makes this not a valid cluster (None: nothing)."""
    names = [node.name for node in cluster.nodes]
    if not names:
        return "no nodes"
    if len(set(names)) != len(names):
        return "a node name appears twice"
    replicated = cluster.replicas > 1
    for node in cluster.nodes:
        if "/" in node.name or queue_name_problem(node.name):
            return f"bad node name {node.name!r}"
        if not (0 if replicated else 1) <= node.shards <= 256:
            return f"node {node.name} needs {0 if replicated else 1}-256 shards"
        if node.left and not replicated:
            return f"node {node.name} left: only a replicated cluster (replicas > 1) lets nodes go"
    live = len(cluster.live_nodes())
    if not 1 <= cluster.replicas <= live:
        return f"replicas must be 1 to {live} (one per node at most, nodes that left not counted)"
    if not cluster.shard_names():
        return "no shards: at least one node needs shards = 1 or more"
    if not 1 <= cluster.raft_port_offset <= 60_000:
        return "raft_port_offset must be 1 to 60000"
    if cluster.epoch < 1:
        return "epoch must be at least 1"
    return None
