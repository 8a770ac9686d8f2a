"""The loop's side of a replicated shard (broker/shell/replicated_turns.py) with a scripted
Raft group: promotion only with a barrier committed while still leading, output held for
its batch and released in order, PUT and DROP of one batch cancelled, stepping down."""

from __future__ import annotations

from typing import Any

from phpmq.broker.journal import DROP, FLY, PUT
from phpmq.broker.shell.replica_events import Committed, Event, RoleChanged
from phpmq.broker.shell.replicated_turns import ReplicatedTurns


class ScriptedGroup:
    address = "10.0.0.1:6000"

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.batches: list[list[Any]] = []
        self.leader = False

    def submit(self, operations: list[Any]) -> int:
        self.batches.append(list(operations))
        return len(self.batches) - 1

    def take_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    def is_leader(self) -> bool:
        return self.leader

    def leader_address(self) -> str | None:
        return None

    def hand_to(self, address: str) -> None:
        pass


def elected(group: ScriptedGroup, turns: ReplicatedTurns) -> None:
    group.leader = True
    group.events.append(RoleChanged(True))
    turns.on_events()
    group.events.append(Committed(len(group.batches) - 1))  # the barrier
    turns.on_events()
    assert turns.take_promotion()


def test_a_barrier_committed_after_losing_the_election_promotes_nothing() -> None:
    group = ScriptedGroup()
    turns = ReplicatedTurns(group, {})  # type: ignore[arg-type]
    group.leader = True
    group.events.append(RoleChanged(True))
    turns.on_events()
    barrier = len(group.batches) - 1
    group.leader = False
    group.events += [RoleChanged(False), Committed(barrier)]  # another leader committed it
    turns.on_events()
    assert not turns.take_promotion() and not turns.leading and turns.lost is None


def test_a_barrier_that_lands_once_leadership_is_gone_promotes_nothing() -> None:
    group = ScriptedGroup()
    turns = ReplicatedTurns(group, {})  # type: ignore[arg-type]
    group.leader = True
    group.events.append(RoleChanged(True))
    turns.on_events()
    group.leader = False  # deposed; its RoleChanged not yet taken
    group.events.append(Committed(len(group.batches) - 1))
    turns.on_events()
    assert not turns.take_promotion() and not turns.leading


def test_held_output_waits_for_its_batch_and_leaves_in_order() -> None:
    group = ScriptedGroup()
    turns = ReplicatedTurns(group, {})  # type: ignore[arg-type]
    elected(group, turns)
    put = (PUT, b"id-1", "q", 1, b"x", b"", 0.0, 0, None, None, None, 0.0, None)
    assert turns.add([put], [(b"p", b"confirm-1")]) == []
    assert turns.add([(FLY, "q", 1, 1)], [(b"p", b"confirm-2")]) == []  # second batch
    assert turns.add([], [(b"p", b"heartbeat")]) == []  # behind both
    first, second = len(group.batches) - 2, len(group.batches) - 1
    group.events.append(Committed(first))
    assert turns.on_events() == [(b"p", b"confirm-1")]
    group.events.append(Committed(second))
    assert turns.on_events() == [(b"p", b"confirm-2"), (b"p", b"heartbeat")]
    assert turns.idle


def test_a_message_sent_and_acked_within_one_batch_never_reaches_the_group() -> None:
    group = ScriptedGroup()
    turns = ReplicatedTurns(group, {})  # type: ignore[arg-type]
    elected(group, turns)
    turns.add([(FLY, "q", 0, 0)], [])  # a batch in flight ...
    turns.add([(FLY, "q", 0, 0)], [])  # ... and a second: the rest waits for one
    put = (PUT, b"id-2", "q", 2, b"x", b"", 0.0, 0, None, None, None, 0.0, None)
    turns.add([put], [(b"p", b"confirm")])
    turns.add([(FLY, "q", 2, 2), (DROP, b"id-2")], [])
    group.events.append(Committed(len(group.batches) - 2))
    turns.on_events()
    assert group.batches[-1] == [(FLY, "q", 2, 2)] and turns.cancelled == 1


def test_a_leader_that_loses_its_role_stops_and_sends_nothing_more() -> None:
    group = ScriptedGroup()
    turns = ReplicatedTurns(group, {})  # type: ignore[arg-type]
    elected(group, turns)
    turns.add([(FLY, "q", 0, 0)], [(b"p", b"confirm")])
    group.events.append(RoleChanged(False))
    assert turns.on_events() == [] and turns.lost is not None
    assert turns.add([(FLY, "q", 1, 1)], [(b"p", b"more")]) == []
