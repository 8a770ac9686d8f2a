"""Which replicas a node of a replicated cluster holds, and how that changes with its
cluster file (docs/cluster.md "Replicated queues" and "Membership").

Each replica is a broker process with its own endpoint, store and Raft port
(`replica_configs`). When the file changes (a node joined or left; the supervisor reads it
again on SIGHUP), `plan` gives every replica's new settings: a replica still held here gets
its shard's new replicas (its group's leader adds and removes them one at a time), one held
here now is new ("joining"), and one held here no more is "leaving": it hands over and
stops once its group has removed it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import msgspec

from ...protocol.cluster import ClusterMap, Shard, decode_map, encode_map
from ..config import BrokerConfig
from .cluster_file import ClusterFile, Replica
from .shard_addresses import advertised, shard_address, shard_metrics_bind


def replica_configs(config: BrokerConfig, cluster: ClusterFile) -> list[BrokerConfig]:
    """A replicated cluster's processes on this node: one per replica it holds
    (docs/cluster.md "Replicated queues"), each with its own endpoint, store and Raft port.

    Raises:
        ValueError: no --data-dir (a replica's Raft log must be on disk).
    """
    if not config.data_dir:
        raise ValueError("a cluster with replicas > 1 needs --data-dir (the replicas' logs)")
    sets, encoded = replicated_map(cluster)
    held = [
        (replica, replicas)
        for replicas in sets.values()
        for replica in replicas
        if replica.node == config.node
    ]
    held.sort(key=lambda pair: int(urlsplit(pair[0].address).port or 0))
    role = "joining" if cluster.node(config.node).joined else ""
    return [
        replica_config(config, cluster, encoded, replicas, replica, len(held), role)
        for replica, replicas in held
    ]


def replicated_map(cluster: ClusterFile) -> tuple[dict[str, list[Replica]], str]:
    """Every shard's replicas, and the map (JSON) that lists them: clients and links reach a
    shard at its first replica's endpoint (its home's, docs/cluster.md)."""
    sets = cluster.replica_sets(shard_address)
    mapping = ClusterMap(
        cluster.epoch,
        tuple(
            Shard(
                name,
                advertised(replicas[0].address),
                tuple(advertised(replica.address) for replica in replicas),
            )
            for name, replicas in sets.items()
        ),
    )
    return sets, encode_map(mapping).decode()


def replica_config(
    config: BrokerConfig,
    cluster: ClusterFile,
    encoded: str,
    replicas: list[Replica],
    replica: Replica,
    held: int,
    role: str,
) -> BrokerConfig:
    """The settings of this node's process for `replica`, one of `held` it runs."""
    index = (urlsplit(replica.address).port or 0) - (
        urlsplit(cluster.node(config.node).address).port or 0
    )
    candidates = [
        cluster.replica_on(node, replica.shard, shard_address)
        for node in cluster.nodes
        if node.name != replica.node
    ]
    return msgspec.structs.replace(
        config,
        max_memory=config.max_memory_bytes // held,
        bind=replica.address,
        data_dir=str(Path(config.data_dir) / f"replica-{replica.shard.replace('/', '-')}"),
        tcp_bind=config.tcp_bind if index == 0 else "",
        metrics_bind=shard_metrics_bind(config.metrics_bind, index),
        shards=1,
        cluster=encoded,
        shard=replica.shard,
        cluster_file="",
        node="",
        raft_bind=replica.raft,
        raft_peers=[other.raft for other in replicas if other is not replica],
        # Every node's, so that a leader on a node that is leaving is found too.
        replica_endpoints={
            other.raft: advertised(other.address) for other in [*candidates, *replicas]
        },
        raft_preferred=replicas[0].raft,
        replica_nodes={other.raft: other.node for other in replicas},
        raft_role=role,
        raft_candidates=[candidate.raft for candidate in candidates],
        link_secret=config.link_secret or _secret_from_curve(config.curve_secret),
    )


def _secret_from_curve(curve_secret: str) -> str:
    """Without a link secret, the replicas authenticate their Raft traffic with one made from
    the cluster's shared CURVE secret key file."""
    return hashlib.blake2b(Path(curve_secret).read_bytes(), person=b"phpmq-raft").hexdigest()


class Change(NamedTuple):
    """A node's replicas after its cluster file changed: each one's settings (the running
    ones first, in their order), and how many are new and how many leave."""

    settings: list[BrokerConfig]
    started: int
    leaving: int


def plan(config: BrokerConfig, cluster: ClusterFile, running: list[BrokerConfig]) -> Change:
    """The settings of this node's replicas under `cluster`, given the `running` ones.

    Raises:
        ValueError: the file changes what cannot change while the cluster runs (its shards,
            or where a replica listens).
    """
    if running:
        current = decode_map(running[0].cluster.encode())
        if cluster.epoch < current.epoch:
            raise ValueError(
                f"its epoch {cluster.epoch} is older than the one this node runs"
                f" ({current.epoch}): an old copy of the file?"
            )
        shards = [shard.name for shard in current.shards]
        if shards != cluster.shard_names():
            raise ValueError(
                f"its shards ({', '.join(cluster.shard_names())}) are not the running ones"
                f" ({', '.join(shards)}): shards change only with every node restarted (and"
                " queues move to new owners: docs/cluster.md); a node joins with no shards"
            )
    node = cluster.node(config.node)
    sets, encoded = replicated_map(cluster)
    if running and cluster.epoch == current.epoch and encoded != running[0].cluster:
        raise ValueError(
            f"it changed the cluster but not its epoch ({cluster.epoch}): every change needs a"
            " new epoch (phpmq cluster join and leave bump it)"
        )
    held = {
        replica.shard: (replica, replicas)
        for replicas in sets.values()
        for replica in replicas
        if replica.node == node.name and not node.left
    }
    count = max(len(held), 1)
    settings = []
    leaving = 0
    for old in running:
        if old.shard not in held:
            leaving += 1
            settings.append(_leaving(old, sets[old.shard], encoded))
            continue
        replica, replicas = held.pop(old.shard)
        role = "" if old.raft_role == "" else "joining"
        new = replica_config(config, cluster, encoded, replicas, replica, count, role)
        if new.bind != old.bind or new.raft_bind != old.raft_bind:
            raise ValueError(
                f"the replica of {old.shard} here would move from {old.bind} to {new.bind}:"
                " nodes may only be added at the end of the file, and never removed (a node"
                " that goes is marked left = true)"
            )
        settings.append(
            msgspec.structs.replace(
                new,
                max_memory=old.max_memory,
                tcp_bind=old.tcp_bind,
                metrics_bind=old.metrics_bind,
            )
        )
    for replica, replicas in held.values():
        new = replica_config(config, cluster, encoded, replicas, replica, count, "joining")
        settings.append(new)
    return Change(settings, len(held), leaving)


def _leaving(old: BrokerConfig, replicas: list[Replica], encoded: str) -> BrokerConfig:
    """A replica held here no more: its group is the shard's new replicas, itself aside."""
    return msgspec.structs.replace(
        old,
        cluster=encoded,
        raft_peers=[replica.raft for replica in replicas],
        replica_endpoints={
            **{replica.raft: advertised(replica.address) for replica in replicas},
            old.raft_bind: old.replica_endpoints.get(old.raft_bind, advertised(old.bind)),
        },
        replica_nodes={
            **{replica.raft: replica.node for replica in replicas},
            old.raft_bind: old.replica_nodes.get(old.raft_bind, ""),
        },
        raft_preferred=replicas[0].raft,
        raft_role="leaving",
    )
