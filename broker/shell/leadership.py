"""A replica's own admin part (docs/cluster.md "Moving a shard's leader"): its `replication`
figures, with the node and endpoint of each replica of its group, and `replica-lead`, which
moves the shard's leadership by hand (`phpmq cluster move`). The core knows nothing of Raft:
the shell registers both on the core's admin part.

`replica-lead` names a node. At the leader, for another replica, it hands leadership to that
replica (Raft's TimeoutNow: replication.py `hand_to`) if the leader is connected to it and it
has every committed entry, and refuses otherwise. pysyncobj checks again on its own thread
(every entry of the log, committed or not) and may drop the hand-over silently, so a tool
waits for the target to lead and asks again. At the replica it names, once that one leads,
the command makes the move stick: no hand-back to the shard's home replica
(replicated_turns.py) until it stops leading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import ErrorCode
from ...protocol import admin_commands as cmd
from ..errors import CommandError

if TYPE_CHECKING:
    from ..admin import Admin
    from ..config import BrokerConfig
    from .replicated_turns import ReplicatedTurns
    from .replication import ReplicaGroup


class ReplicaAdmin:
    def __init__(self, group: ReplicaGroup, turns: ReplicatedTurns, config: BrokerConfig) -> None:
        self._group = group
        self._turns = turns
        self._shard = config.shard
        #: Each replica's broker endpoint and node, by its Raft address.
        self._endpoints = config.replica_endpoints
        self._nodes = config.replica_nodes

    def set_replicas(self, endpoints: dict[str, str], nodes: dict[str, str]) -> None:
        """The shard's replicas after a change of membership (docs/cluster.md "Membership")."""
        self._endpoints = endpoints
        self._nodes = nodes

    def register(self, admin: Admin) -> None:
        admin.stats.add_section("replication", self.stats)
        admin.add_command(cmd.REPLICA_LEAD, self.lead)

    def stats(self) -> dict[str, Any]:
        """ReplicatedTurns' figures, with this replica's node and endpoint and the others'."""
        figures = self._turns.stats()
        figures.update(self._where(self._group.address))
        for address, replica in figures["replicas"].items():
            replica.update(self._where(address))
        return figures

    def _where(self, address: str) -> dict[str, Any]:
        return {"node": self._nodes.get(address, ""), "endpoint": self._endpoints.get(address)}

    def lead(self, options: dict[str, Any]) -> dict[str, Any]:
        """`replica-lead`: the replica on node `node` leads the shard (and keeps leading)."""
        node = options.get("node")
        if type(node) is not str:
            raise CommandError(f"{cmd.REPLICA_LEAD} needs a 'node' string")
        target = self._replica_on(node)
        answer = {"shard": self._shard, "node": node, "endpoint": self._endpoints.get(target)}
        if not self._turns.leading:
            raise CommandError(
                f"this replica does not lead shard {self._shard}: ask its leader",
                ErrorCode.SHUTTING_DOWN,
            )
        if target == self._group.address:
            self._turns.keep_leading()
            return {**answer, "leads": True}
        self._check_can_take_over(target, node)
        self._group.hand_to(target)
        return {**answer, "leads": False}

    def _replica_on(self, node: str) -> str:
        for address, name in self._nodes.items():
            if name == node:
                return address
        nodes = ", ".join(sorted(self._nodes.values()))
        raise CommandError(
            f"shard {self._shard} has no replica on node {node!r} (its nodes: {nodes})",
            ErrorCode.NOT_FOUND,
        )

    def _check_can_take_over(self, target: str, node: str) -> None:
        """Raft hands leadership only to a replica with every entry (else its election
        would fail): refused here at once rather than dropped by pysyncobj."""
        status = self._group.status()
        replica = status["replicas"].get(target)
        what = f"the replica of shard {self._shard} on node {node}"
        if replica is None:  # in the map, not yet (or no more) in the Raft group
            raise CommandError(
                f"{what} is not in the shard's Raft group now (its membership is changing):"
                " ask again once the change is done",
                ErrorCode.CONFLICT,
            )
        if not replica["connected"]:
            raise CommandError(
                f"{what} is not connected to the leader: it cannot take over",
                ErrorCode.SHUTTING_DOWN,
            )
        behind = (status["commit_index"] or 0) - (replica["match_index"] or 0)
        if behind > 0:
            raise CommandError(
                f"{what} lacks {behind} committed log entries: it cannot take over before it"
                " has them all",
                ErrorCode.CONFLICT,
            )
