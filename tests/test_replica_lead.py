"""`replica-lead` at the leader (broker/shell/leadership.py), against a stand-in Raft group:
what it refuses before it asks pysyncobj to hand leadership over, and that it hands over
otherwise. The real hand-over, across processes, is in test_cli_cluster.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from phpmq.broker.errors import CommandError
from phpmq.broker.shell.leadership import ReplicaAdmin
from phpmq.protocol import ErrorCode

NODES = {"10.0.0.1:7001": "a", "10.0.0.2:7001": "b", "10.0.0.3:7001": "c"}


class StandInGroup:
    """The leader's group: its own address, the status it reports, the hand-overs asked."""

    address = "10.0.0.1:7001"

    def __init__(self, replicas: dict[str, dict[str, Any]]) -> None:
        self.replicas = replicas
        self.handed_to: list[str] = []

    def status(self) -> dict[str, Any]:
        return {"commit_index": 10, "replicas": self.replicas}

    def hand_to(self, address: str) -> None:
        self.handed_to.append(address)


def leader_admin(group: StandInGroup) -> ReplicaAdmin:
    turns = SimpleNamespace(leading=True, keep_leading=lambda: None)
    config = SimpleNamespace(
        shard="s/0",
        replica_endpoints={address: f"tcp://{address}" for address in NODES},
        replica_nodes=dict(NODES),
    )
    return ReplicaAdmin(group, turns, config)  # type: ignore[arg-type]


def test_a_replica_with_every_entry_is_handed_leadership() -> None:
    group = StandInGroup(
        {
            "10.0.0.2:7001": {"connected": True, "match_index": 10},
            "10.0.0.3:7001": {"connected": True, "match_index": 10},
        }
    )
    answer = leader_admin(group).lead({"node": "b"})
    assert answer["leads"] is False and answer["node"] == "b"
    assert group.handed_to == ["10.0.0.2:7001"]


@pytest.mark.parametrize(
    ("replica", "code", "words"),
    [
        (None, ErrorCode.CONFLICT, "not in the shard's Raft group"),
        ({"connected": False, "match_index": 10}, ErrorCode.SHUTTING_DOWN, "not connected"),
        ({"connected": True, "match_index": 7}, ErrorCode.CONFLICT, "lacks 3 committed"),
    ],
)
def test_a_replica_that_cannot_take_over_is_refused_with_a_code(
    replica: dict[str, Any] | None, code: ErrorCode, words: str
) -> None:
    # None: node b is in the map but not (yet, or no more) in the Raft group, as while a
    # change of membership is applied; it was a KeyError that escaped the command.
    replicas = {"10.0.0.3:7001": {"connected": True, "match_index": 10}}
    if replica is not None:
        replicas["10.0.0.2:7001"] = replica
    group = StandInGroup(replicas)
    with pytest.raises(CommandError) as refused:
        leader_admin(group).lead({"node": "b"})
    assert refused.value.code == code and words in str(refused.value)
    assert group.handed_to == []
