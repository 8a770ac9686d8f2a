"""The queue-to-shard map (protocol/cluster.py, docs/cluster.md): stable, order-free, and
moving only what it must when shards come and go."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phpmq.protocol.cluster import ClusterMap, Shard, decode_map, encode_map, replica_nodes

QUEUES = [f"queue-{i}" for i in range(10_000)]


def cluster(count: int, epoch: int = 1, node: str = "a") -> ClusterMap:
    shards = tuple(Shard(f"{node}/{i}", f"tcp://127.0.0.1:{5555 + i}") for i in range(count))
    return ClusterMap(epoch, shards)


def test_owners_are_fixed_across_versions() -> None:
    """Brokers and clients of any version agree: these owners must never change."""
    three = cluster(3)
    owners = {q: three.owner(q).name for q in ("orders", "emails", "jobs", "q-42")}
    assert owners == {"orders": "a/1", "emails": "a/2", "jobs": "a/1", "q-42": "a/1"}


def test_the_order_of_shards_does_not_matter() -> None:
    forward = cluster(5)
    backward = ClusterMap(1, tuple(reversed(forward.shards)))
    assert all(forward.owner(q) == backward.owner(q) for q in QUEUES[:2_000])


def test_queues_spread_evenly() -> None:
    counts = Counter(cluster(4).owner(q).name for q in QUEUES)
    assert set(counts) == {"a/0", "a/1", "a/2", "a/3"}
    assert all(2_200 <= n <= 2_800 for n in counts.values()), counts


@pytest.mark.parametrize("before", [1, 2, 3, 7])
def test_adding_a_shard_moves_about_one_in_n_plus_one_all_to_it(before: int) -> None:
    old, new = cluster(before), cluster(before + 1, epoch=2)
    moved = [q for q in QUEUES if old.owner(q) != new.owner(q)]
    assert all(new.owner(q).name == f"a/{before}" for q in moved)
    share = len(moved) / len(QUEUES)
    assert abs(share - 1 / (before + 1)) < 0.03, share


def test_removing_a_shard_moves_only_its_own_queues() -> None:
    full = cluster(4)
    without = ClusterMap(2, full.shards[:2] + full.shards[3:])
    for queue in QUEUES[:3_000]:
        if full.owner(queue).name != "a/2":
            assert without.owner(queue) == full.owner(queue)


@given(st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=8, unique=True), st.text())
def test_every_queue_has_exactly_the_owner_with_the_highest_score(
    names: list[str], queue: str
) -> None:
    from phpmq.protocol.cluster import score

    shards = tuple(Shard(name, "tcp://x") for name in names)
    owner = ClusterMap(1, shards).owner(queue)
    assert score(owner.name, queue) == max(score(name, queue) for name in names)


def test_maps_travel_as_json_and_bad_ones_are_refused() -> None:
    original = cluster(3, epoch=7)
    assert decode_map(encode_map(original)) == original
    assert original.newer_than(cluster(3, epoch=6)) and not original.newer_than(original)
    bad_utf8 = b'{"epoch": 1, "shards": [{"name": "\xff"}]}'
    deep = b'{"x":' + b"[" * 3000 + b"]" * 3000 + b"}"  # RecursionError, in msgspec
    for raw in (b"[]", b'{"epoch": 1, "shards": []}', b"{", b'{"epoch": 1}', bad_utf8, deep):
        with pytest.raises(ValueError):
            decode_map(raw)
    twice = b'{"epoch":1,"shards":[{"name":"a","address":"x"},{"name":"a","address":"y"}]}'
    with pytest.raises(ValueError, match="unique"):
        decode_map(twice)


# ---------------------------------------------------------------- replica placement

NODES = ["a", "b", "c", "d", "e"]


def test_replica_placement_is_fixed_across_versions() -> None:
    """Every node places replicas alike, whatever its version: these must never change."""
    placed = {shard: replica_nodes(shard, shard[0], NODES[:4], 3) for shard in ("a/0", "b/0")}
    assert placed == {"a/0": ("a", "d", "c"), "b/0": ("b", "c", "a")}


@given(st.integers(min_value=1, max_value=5), st.text(min_size=1, max_size=20))
def test_replicas_start_at_home_and_never_share_a_node(count: int, suffix: str) -> None:
    shard = f"c/{suffix}"
    nodes = replica_nodes(shard, "c", NODES, count)
    assert nodes[0] == "c" and len(nodes) == count == len(set(nodes))
    assert replica_nodes(shard, "c", list(reversed(NODES)), count) == nodes  # order-free


def test_a_new_node_takes_replicas_only_onto_itself() -> None:
    shards = [f"{node}/{index}" for node in NODES[:4] for index in range(50)]
    for shard in shards:
        before = replica_nodes(shard, shard[0], NODES[:4], 3)
        after = replica_nodes(shard, shard[0], NODES, 3)
        assert set(after) - set(before) <= {"e"}


def test_impossible_placements_are_refused() -> None:
    with pytest.raises(ValueError, match="need 1 to 3 nodes"):
        replica_nodes("a/0", "a", ["a", "b", "c"], 4)
    with pytest.raises(ValueError, match="home node"):
        replica_nodes("a/0", "z", ["a", "b"], 1)
