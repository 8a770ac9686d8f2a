"""`phpmq cluster status` and `phpmq cluster move` (docs/cli.md "Clusters"), against real
processes: a replicated cluster of three nodes on loopback (phpmq.testing's LocalCluster),
a sharded broker without replicas, and a lone broker."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import phpmq, wait_for
from phpmq import BrokerRefused, Client
from phpmq.broker.shell.replicated_turns import HAND_BACK_AFTER_S
from phpmq.cli.replicas import shard_rows
from phpmq.protocol.cluster import Shard
from phpmq.testing import BrokerProcess, free_ports
from replicated_cluster import ReplicatedCluster, replicated_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedCluster]:
    """One cluster for the file's replicated tests: each waits for every shard to have a
    leader first, and leaves every replica running."""
    with replicated_cluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started


def status(cluster: ReplicatedCluster, *flags: str) -> list[dict[str, Any]]:
    result = phpmq("cluster", "status", "--json", "--broker", cluster.address("a"), *flags)
    assert result.returncode == 0 and not result.stderr, result.stderr
    answer = json.loads(result.stdout)
    assert answer["epoch"] == 1
    return answer["replicas"]


def move(cluster: ReplicatedCluster, shard: str, node: str, *flags: str) -> Any:
    return phpmq("cluster", "move", shard, "--to", node, "--broker", cluster.address("a"), *flags)


@pytest.mark.xdist_group("replication-cli")
@pytest.mark.timeout(240)
def test_status_shows_each_shards_leader_and_its_followers_with_their_lag(
    cluster: ReplicatedCluster,
) -> None:
    leaders = cluster.wait_for_leaders(at_home=True)  # no hand-back while the test runs
    wait_for(
        lambda: table_shows(cluster, leaders=3, followers=6), "a table of 3 leaders, 6 followers"
    )
    shard = "b/0"
    stopped, caught_up = (r for r in cluster.replica_sets[shard] if r != leaders[shard])
    cluster.signal(stopped, signal.SIGSTOP)
    try:
        # Committed by the leader and the other follower: the stopped one lacks them.
        with Client(leaders[shard].address, follow_leader=False) as client:
            for i in range(5):
                client.send(cluster.queue_of(shard), b"%d" % i, confirm=True)
        rows = status(cluster, "--timeout", "2")
    finally:
        cluster.signal(stopped, signal.SIGCONT)
    assert [row["shard"] for row in rows] == [s for s in ("a/0", "b/0", "c/0") for _ in range(3)]
    for name, replicas in cluster.replica_sets.items():
        mine = [row for row in rows if row["shard"] == name]
        assert [row["endpoint"] for row in mine] == [r.address for r in replicas]
        assert [row["node"] for row in mine] == [r.node for r in replicas]
        assert [row["endpoint"] for row in mine if row["role"] == "leader"] == [
            leaders[name].address
        ]
    by_endpoint = {row["endpoint"]: row for row in rows}
    assert by_endpoint[stopped.address]["role"] == "unreachable"
    assert by_endpoint[stopped.address]["lag"] >= 5
    assert by_endpoint[caught_up.address]["role"] == "follower"
    assert by_endpoint[caught_up.address]["lag"] == 0
    assert by_endpoint[leaders[shard].address]["lag"] == 0


def table_shows(cluster: ReplicatedCluster, leaders: int, followers: int) -> bool:
    table = phpmq("cluster", "status", "--broker", cluster.address("b"))
    assert table.returncode == 0, table.stderr
    assert "cluster of" in table.stdout and "map epoch 1" in table.stdout
    return (table.stdout.count(" leader "), table.stdout.count(" follower ")) == (
        leaders,
        followers,
    )


@pytest.mark.xdist_group("replication-cli")
@pytest.mark.timeout(240)
def test_a_move_hands_the_shard_to_the_replica_on_the_node_and_it_stays_there(
    cluster: ReplicatedCluster,
) -> None:
    shard = "c/0"
    home = cluster.replica_sets[shard][0]
    assert cluster.wait_for_leaders(at_home=True)[shard] == home
    target = cluster.replica_sets[shard][1]
    wait_for(
        lambda: leader_sees(home, target) and lag_of(status(cluster), target.address) == 0,
        "the target to be connected and have every entry",
    )
    result = move(cluster, shard, target.node, "--timeout", "20")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"shard {shard} is led by node {target.node} ({target.address})\n"
    assert not result.stderr
    moved_at = time.monotonic()
    assert cluster.role(target) == "leader"
    rows = {row["endpoint"]: row for row in status(cluster) if row["shard"] == shard}
    assert [e for e, row in rows.items() if row["role"] == "leader"] == [target.address]
    # The home replica follows now: a command given its endpoint is answered all the same
    # (the client leaves it for its leader, once its answer came).
    wait_for(
        lambda: figures(home).get("leader_endpoint") == target.address,
        "the old leader to follow the new one",
    )
    # (The whole cluster's stats: another shard between leaders on a busy machine is asked
    # again, as a user would.)
    wait_for(
        lambda: phpmq("stats", "--json", "--broker", home.address).returncode == 0,
        "the cluster's stats through the old leader's endpoint",
        timeout=30,
        interval=1,
    )
    # Without being told to stay, a leader that is not the home replica hands back after
    # HAND_BACK_AFTER_S.
    time.sleep(max(0.0, moved_at + HAND_BACK_AFTER_S + 3 - time.monotonic()))
    assert cluster.leader(shard) == target
    back = wait_for(
        lambda: (r := move(cluster, shard, home.node, "--timeout", "20")).returncode == 0 and r,
        "the move back home (the old leader restarts, then catches up)",
        timeout=60,
        interval=1,
    )
    assert back.stdout == f"shard {shard} is led by node {home.node} ({home.address})\n"
    assert cluster.role(home) == "leader"


def lag_of(rows: list[dict[str, Any]], endpoint: str) -> int | None:
    return next(row["lag"] for row in rows if row["endpoint"] == endpoint)


@pytest.mark.xdist_group("replication-cli")
@pytest.mark.timeout(240)
def test_a_move_to_a_replica_that_lacks_entries_or_is_cut_off_is_refused(
    cluster: ReplicatedCluster,
) -> None:
    leaders = cluster.wait_for_leaders(at_home=True)
    shard = "a/0"
    leader = leaders[shard]
    behind = next(r for r in cluster.replica_sets[shard] if r != leader)
    cluster.signal(behind, signal.SIGSTOP)
    try:
        with Client(leader.address, follow_leader=False) as client:
            for i in range(3):
                client.send(cluster.queue_of(shard), b"%d" % i, confirm=True)
            # Still connected (pysyncobj drops a silent peer after 3 s), but behind.
            with pytest.raises(BrokerRefused) as refused:
                client.move_leadership(behind.node)
        assert refused.value.error.code == 409
        assert "lacks" in refused.value.error.reason
        wait_for(
            lambda: not leader_sees(leader, behind),
            "the leader to drop its connection to the stopped replica",
            timeout=30,
            interval=0.5,
        )
        result = move(cluster, shard, behind.node, "--timeout", "2")
    finally:
        cluster.signal(behind, signal.SIGCONT)
    assert result.returncode == 1
    assert result.stderr == (
        f"phpmq: the replica of shard {shard} on node {behind.node} is not connected to the"
        " leader: it cannot take over\n"
    )


def figures(replica: Any) -> dict[str, Any]:
    """The replica's own `replication` figures."""
    with Client(replica.address, follow_leader=False) as client:
        return client.replication() or {}


def leader_sees(leader: Any, replica: Any) -> bool:
    """Whether the leader says it is connected to the replica."""
    return any(
        peer["endpoint"] == replica.address and peer["connected"]
        for peer in figures(leader).get("replicas", {}).values()
    )


def test_a_broker_that_is_not_a_cluster_says_so(tmp_path: Path) -> None:
    with BrokerProcess(log_path=tmp_path / "broker.log") as broker:
        for command in (["status"], ["move", "a/0", "--to", "b"]):
            result = phpmq("cluster", *command, "--broker", broker.address)
            assert result.returncode == 1
            assert result.stderr == (
                f"phpmq: the broker at {broker.address} is not part of a cluster (its HELLO"
                " answer has no map)\n"
            )


def test_the_shards_of_a_cluster_without_replicas_are_each_their_own_replica(
    tmp_path: Path,
) -> None:
    address = free_ports(2)
    with BrokerProcess("--shards", "2", address=address, log_path=tmp_path / "broker.log"):
        result = phpmq("cluster", "status", "--json", "--broker", address)
        assert result.returncode == 0, result.stderr
        rows = json.loads(result.stdout)["replicas"]
        assert [(row["shard"], row["node"], row["role"]) for row in rows] == [
            ("local/0", "local", "single"),
            ("local/1", "local", "single"),
        ]
        refused = phpmq("cluster", "move", "local/1", "--to", "local", "--broker", address)
        assert refused.returncode == 1
        assert refused.stderr == (
            "phpmq: shard local/1 is not replicated: it has no other replica to lead it\n"
        )


def test_without_a_leader_the_lag_is_the_commit_index_behind_the_furthest_replica() -> None:
    shard = Shard("a/0", "tcp://a:1", ("tcp://a:1", "tcp://b:1", "tcp://c:1"))
    follower = {"role": "follower", "node": "b", "commit_index": 7, "replicas": {}}
    behind = {"role": "follower", "node": "c", "commit_index": 4, "replicas": {}}
    rows = shard_rows(
        shard, {"tcp://a:1": TimeoutError(), "tcp://b:1": follower, "tcp://c:1": behind}
    )
    assert [(row["role"], row["lag"]) for row in rows] == [
        ("unreachable", None),
        ("follower", 0),
        ("follower", 3),
    ]
