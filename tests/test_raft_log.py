"""The Raft log of a replica (broker/shell/replication.py) against Raft's rules, with the real
pysyncobj node a replica runs and its synced journal on disk, fed AppendEntries messages by
hand (ticked by the test, so no timer interferes).

Found by the replicated LAN test (tests/test_replication_lan.py): pysyncobj logged
"truncating already-applied log entries ... state machine may have diverged" on followers
after faults. Raft (Figure 2, AppendEntries rule 3) deletes a follower's entries only from
the first one that conflicts with the leader's (same index, another term): a late or
repeated AppendEntries whose entries the follower already holds must leave them alone.
pysyncobj deletes every entry after prevLogIdx whatever they are, so a stale AppendEntries
would erase entries the follower acknowledged, which the leader may have counted toward the
majority that committed (and confirmed) them: the replica's transport mends such a message
first (replication.py `_RaftTransport`).
"""

from __future__ import annotations

from pathlib import Path

from pysyncobj import SyncObjConf

from phpmq.broker.shell.durable import DurableStore
from phpmq.broker.shell.replication import RAFT_LOG_NAME, _StoreMachine
from phpmq.testing import free_port

NO_OP = b"\x01"  # pysyncobj's _COMMAND_TYPE.NO_OP: applied as nothing
LEADER_TERM = 1


def append_entries(prev: int, prev_term: int, entries: list[int], commit: int) -> dict:
    """An AppendEntries of the leader of LEADER_TERM with no-op entries at these indexes."""
    return {
        "type": "append_entries",
        "term": LEADER_TERM,
        "prevLogIdx": prev,
        "prevLogTerm": prev_term,
        "entries": [(NO_OP, index, LEADER_TERM) for index in entries],
        "commit_index": commit,
    }


def follower_of(tmp_path: Path) -> tuple[_StoreMachine, DurableStore]:
    store = DurableStore(tmp_path, synchronous="OFF")
    conf = SyncObjConf(autoTick=False, journalFile=str(tmp_path / RAFT_LOG_NAME))
    leader = f"127.0.0.1:{free_port()}"
    node = _StoreMachine(f"127.0.0.1:{free_port()}", [leader], conf, store, print, lambda: None)
    return node, store


def receive(follower: _StoreMachine, message: dict) -> None:
    """`message` from the leader, as the transport hands it on (through its mending)."""
    [leader_node] = follower._SyncObj__otherNodes
    follower._SyncObj__transport._onMessageReceivedCallback(leader_node, message)
    follower.doTick(0)


def test_a_stale_append_entries_leaves_the_entries_a_follower_acknowledged(
    tmp_path: Path,
) -> None:
    follower, store = follower_of(tmp_path)
    try:
        # The journal starts with pysyncobj's own entry 1 of term 0.
        receive(follower, append_entries(1, 0, [2, 3], commit=3))
        assert follower.getStatus()["last_applied"] == 3
        # The leader's first message for entry 2 alone, delivered late (or sent again).
        receive(follower, append_entries(1, 0, [2], commit=3))
        assert follower.getStatus()["log_len"] == 3, "entry 3, acknowledged, was erased"
        assert follower._SyncObj__transport.mended == 1
    finally:
        follower.destroy()
        store.close()


def test_a_conflicting_append_entries_still_replaces_what_conflicts(tmp_path: Path) -> None:
    """Raft's own rule stands: entries that conflict with the leader's go."""
    follower, store = follower_of(tmp_path)
    try:
        receive(follower, append_entries(1, 0, [2, 3], commit=1))  # 2 and 3 not committed
        newer = append_entries(2, LEADER_TERM, [3], commit=1)
        newer["term"] = LEADER_TERM + 1
        newer["entries"] = [(NO_OP, 3, LEADER_TERM + 1)]  # a new leader's entry 3
        receive(follower, newer)
        assert follower.getStatus()["log_len"] == 3
        assert follower.journals[0][-1][2] == LEADER_TERM + 1
        assert follower._SyncObj__transport.mended == 0
    finally:
        follower.destroy()
        store.close()
