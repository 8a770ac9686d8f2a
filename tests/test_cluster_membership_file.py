"""A replicated cluster's members in its file (docs/cluster.md "Membership"): `phpmq cluster
join` and `leave` change the file with a new epoch and move no replica of anyone else to
another port, and a node's supervisor plans its replicas from the new file, refusing what
cannot change while the cluster runs. (The change on running brokers:
test_replication_membership.py.)"""

from __future__ import annotations

import itertools
from pathlib import Path

import msgspec
import pytest

from harness import phpmq
from phpmq.broker.config import BrokerConfig
from phpmq.broker.shell.cluster_file import ClusterFile, Node, read_cluster_file
from phpmq.broker.shell.membership import plan, replica_configs
from phpmq.broker.shell.shard_addresses import shard_address


def three_nodes(replicas: int = 3) -> ClusterFile:
    return ClusterFile(
        [Node(name, f"tcp://10.0.0.{i + 1}:5555") for i, name in enumerate("abc")],
        replicas=replicas,
    )


def placed(cluster: ClusterFile) -> dict[tuple[str, str], tuple[str, str]]:
    """(shard, node) -> (endpoint, Raft address) of every replica."""
    return {
        (replica.shard, replica.node): (replica.address, replica.raft)
        for replicas in cluster.replica_sets(shard_address).values()
        for replica in replicas
    }


def test_a_join_and_a_leave_move_no_other_replica_to_another_port() -> None:
    before = three_nodes()
    joined = before.with_node_joined("d", "tcp://10.0.0.4:5555")
    assert joined.epoch == 2 and joined.nodes[-1] == Node("d", "tcp://10.0.0.4:5555", 0, True)
    left = joined.with_node_left("a")
    assert left.epoch == 3 and left.nodes[0].left
    stages = [placed(before), placed(joined), placed(left)]
    for earlier, later in itertools.pairwise(stages):
        for where in earlier.keys() & later.keys():
            assert earlier[where] == later[where], where
    assert any(node == "d" for _, node in stages[1]), "d holds replicas once it joined"
    assert not any(node == "a" for _, node in stages[2]), "a holds none once it left"
    for shard, replicas in left.replica_sets(shard_address).items():
        assert len({replica.node for replica in replicas}) == 3, shard  # a's shard too
    assert left.shard_names() == ["a/0", "b/0", "c/0"]  # shards stay: queues keep owners


def test_the_file_reads_back_as_written(tmp_path: Path) -> None:
    cluster = three_nodes().with_node_joined("d", "tcp://10.0.0.4:5555").with_node_left("b")
    path = tmp_path / "cluster.toml"
    path.write_text(cluster.to_toml())
    assert read_cluster_file(str(path)) == cluster


def test_what_a_running_cluster_cannot_do_is_refused() -> None:
    with pytest.raises(ValueError, match="only a replicated cluster"):
        three_nodes(replicas=1).with_node_joined("d", "tcp://10.0.0.4:5555")
    with pytest.raises(ValueError, match="only a replicated cluster"):
        three_nodes(replicas=1).with_node_left("a")
    with pytest.raises(ValueError, match="2 nodes would stay for 3 replicas"):
        three_nodes().with_node_left("a")
    with pytest.raises(ValueError, match="has left the cluster already"):
        three_nodes(2).with_node_left("a").with_node_left("a")
    with pytest.raises(ValueError, match="a node 'c' already"):
        three_nodes().with_node_joined("c", "tcp://10.0.0.9:5555")


def node_config(tmp_path: Path, node: str) -> BrokerConfig:
    return BrokerConfig(
        data_dir=str(tmp_path / node), cluster_file="cluster.toml", node=node, link_secret="s"
    )


def test_a_supervisor_plans_new_leaving_and_kept_replicas(tmp_path: Path) -> None:
    before = three_nodes()
    after = before.with_node_joined("d", "tcp://10.0.0.4:5555").with_node_left("a")
    for node in "bc":
        running = replica_configs(node_config(tmp_path, node), before)
        change = plan(node_config(tmp_path, node), after, running)
        kept = {config.shard: config for config in change.settings[: len(running)]}
        for old in running:  # same endpoint, store and Raft port; a's replica leaves
            new = kept[old.shard]
            assert (new.bind, new.data_dir, new.raft_bind) == (
                old.bind,
                old.data_dir,
                old.raft_bind,
            )
            assert new.raft_role == "" and "127" not in new.cluster
            assert all("10.0.0.1" not in peer for peer in new.raft_peers), new.raft_peers
    joining = plan(node_config(tmp_path, "d"), after, [])
    assert joining.started == 3 and {c.raft_role for c in joining.settings} == {"joining"}
    running = replica_configs(node_config(tmp_path, "a"), before)
    leaving = plan(node_config(tmp_path, "a"), after, running)
    assert leaving.leaving == 3 and leaving.started == 0
    for config in leaving.settings:
        assert config.raft_role == "leaving"
        assert config.raft_bind not in config.raft_peers and len(config.raft_peers) == 3


def test_a_plan_refuses_other_shards_an_older_epoch_and_a_change_without_one(
    tmp_path: Path,
) -> None:
    config = node_config(tmp_path, "b")
    current = three_nodes().with_node_joined("d", "tcp://10.0.0.4:5555")
    running = replica_configs(config, current)
    with pytest.raises(ValueError, match="older than the one this node runs"):
        plan(config, three_nodes(), running)
    more_shards = msgspec.structs.replace(
        current, nodes=[*current.nodes[:3], Node("d", "tcp://10.0.0.4:5555", 1)], epoch=3
    )
    with pytest.raises(ValueError, match="shards change only with every node restarted"):
        plan(config, more_shards, running)
    same_epoch = msgspec.structs.replace(current.with_node_left("a"), epoch=current.epoch)
    with pytest.raises(ValueError, match="but not its epoch"):
        plan(config, same_epoch, running)
    assert plan(config, current, running).settings == running  # the same file: no change


def test_phpmq_cluster_join_and_leave_change_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(three_nodes().to_toml())
    done = phpmq("cluster", "join", "d", "--address", "tcp://10.0.0.4:5555", "--file", str(path))
    assert done.returncode == 0, done.stderr
    assert "node d joins: epoch 1 -> 2" in done.stdout and "+d" in done.stdout
    assert "start node d" in done.stdout
    assert read_cluster_file(str(path)).nodes[-1].joined
    done = phpmq("cluster", "leave", "a", "--file", str(path))
    assert done.returncode == 0, done.stderr
    assert "-a" in done.stdout and read_cluster_file(str(path)).nodes[0].left
    done = phpmq("cluster", "leave", "b", "--file", str(path))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "2 nodes would stay for 3 replicas" in done.stderr
    assert read_cluster_file(str(path)).epoch == 3  # a refused change writes nothing
