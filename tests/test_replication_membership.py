"""Membership without a restart (docs/cluster.md "Membership"), with real processes on
loopback: a fourth node joins a running three-node cluster under load and gets its replicas,
then a node leaves and its replicas move to the others, and no confirmed message is lost.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from harness import phpmq, wait_for
from replicated_cluster import Producer, ReplicatedCluster, drain

pytestmark = [pytest.mark.xdist_group("replication-b"), pytest.mark.timeout(300)]


class Load:
    """Confirmed, keyed sends to one queue of each shard, through node `entry`, in a thread,
    until stopped."""

    def __init__(self, address: str, queues: list[str]) -> None:
        self.producer = Producer(address)
        self.queues = queues
        self.unconfirmed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        index = 0
        while not self._stop.is_set():
            key = f"m-{index}"
            if not self.producer.send(
                self.queues[index % len(self.queues)], key, time.monotonic() + 20
            ):
                self.unconfirmed.append(key)
            index += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def members_settled(cluster: ReplicatedCluster) -> bool:
    """Whether every shard's leader is one of its replicas in the file, and has exactly the
    file's other replicas in its group, connected and caught up."""
    for shard, replicas in cluster.replica_sets.items():
        leader = cluster.leader(shard)
        if leader is None:
            return False
        figures = cluster.replication(leader) or {}
        group: dict[str, Any] = figures.get("replicas", {})
        wanted = {replica.raft for replica in replicas if replica is not leader}
        if set(group) != wanted:
            return False
        commit = figures.get("commit_index") or 0
        if any(
            not member["connected"] or (member["match_index"] or 0) < commit - 100
            for member in group.values()
        ):
            return False
    return True


def test_a_node_joins_under_load_and_another_leaves_and_nothing_is_lost(tmp_path: Path) -> None:
    cluster = ReplicatedCluster(tmp_path, nodes=3, replicas=3, spare=1)
    with cluster:
        leaders = cluster.wait_for_leaders()
        queues = [cluster.queue_of(shard) for shard in sorted(leaders)]
        load = Load(cluster.address("b"), queues)
        try:
            wait_for(lambda: len(load.producer.confirmed) >= 30, "the first confirmed sends")
            joined_at = time.monotonic()
            cluster.join("d")
            held = [
                r for replicas in cluster.replica_sets.values() for r in replicas if r.node == "d"
            ]
            assert held, "with four nodes and three replicas, d holds some"
            wait_for(lambda: members_settled(cluster), "every group to have its new members", 90)
            print(f"d joined: every group had it, caught up, {time.monotonic() - joined_at:.1f} s")
            before_leave = len(load.producer.confirmed)
            left_at = time.monotonic()
            cluster.leave("a")
            wait_for(lambda: members_settled(cluster), "every group without node a", 90)
            wait_for(lambda: cluster.nodes["a"].process.poll() is not None, "node a to stop", 60)
            print(f"a left: {time.monotonic() - left_at:.1f} s, node a stopped")
            wait_for(
                lambda: len(load.producer.confirmed) >= before_leave + 30,
                "sends confirmed after the leave",
                30,
            )

            def settled_status() -> list[dict] | None:
                # (Under load an election may be under way at any one moment: a candidate
                # for a while is no fault; staying one is.)
                status = phpmq("cluster", "status", "--json", "--broker", cluster.address("b"))
                rows = msgspec.json.decode(status.stdout)["replicas"]
                assert {row["node"] for row in rows} == {"b", "c", "d"}, rows
                settled = all(row["role"] in ("leader", "follower") for row in rows)
                return rows if settled else None

            wait_for(settled_status, "every replica a leader or a follower", 30, interval=0.5)
            stale = cluster.file.read_text().replace("epoch = 3", "epoch = 2")
            cluster.file.write_text(stale.replace("left = true\n", ""))
            cluster.reload()
            wait_for(
                lambda: "is older than the one this node runs" in cluster.log("b"), "b to refuse"
            )
        finally:
            load.stop()
        assert cluster.nodes["a"].process.returncode == 0
        assert not list((tmp_path / "a").glob("replica-*")), "a's stores are deleted"
        assert "disagree on the cluster" not in cluster.log("b")
        got = drain(cluster.address("c"), queues, expect=len(load.producer.confirmed))
        delivered = {content.decode() for content in got}
        missing = set(load.producer.confirmed) - delivered
        print(
            f"{len(load.producer.confirmed)} confirmed ({load.producer.retries} retries,"
            f" {len(load.unconfirmed)} never), {len(got)} delivered,"
            f" {len(got) - len(delivered)} twice"
        )
        assert not missing, sorted(missing)
        assert not load.unconfirmed, load.unconfirmed
