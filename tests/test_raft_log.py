"""The Raft log of a replica (broker/shell/replication.py) against Raft's rules, with the real
pysyncobj node a replica runs and its synced journal on disk, fed AppendEntries messages by
hand (ticked by the test, so no timer interferes).

Found by the replicated LAN test (tests/test_replication_lan.py): pysyncobj logged
"truncating already-applied log entries ... state machine may have diverged" on followers
after faults. Raft (Figure 2, AppendEntries rule 3) deletes a follower's entries only from
the first one that conflicts with the leader's (same index, another term): a late or
repeated AppendEntries whose entries the follower already holds must leave them alone.
pysyncobj deletes every entry after prevLogIdx whatever they are, so a stale AppendEntries
erases entries the follower acknowledged, which the leader may have counted toward the
majority that committed (and confirmed) them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
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


@pytest.mark.xfail(
    strict=True,
    reason="pysyncobj 0.3.17 truncates a follower's log after prevLogIdx even where it matches"
    " the leader's (a stale AppendEntries erases acknowledged entries); a fix belongs in"
    " pysyncobj's append_entries handler",
)
def test_a_stale_append_entries_leaves_the_entries_a_follower_acknowledged(
    tmp_path: Path,
) -> None:
    store = DurableStore(tmp_path, synchronous="OFF")
    conf = SyncObjConf(autoTick=False, journalFile=str(tmp_path / RAFT_LOG_NAME))
    leader = f"127.0.0.1:{free_port()}"
    follower = _StoreMachine(f"127.0.0.1:{free_port()}", [leader], conf, store, print)
    try:
        [leader_node] = follower._SyncObj__otherNodes
        receive = follower._SyncObj__onMessageReceived
        # The journal starts with pysyncobj's own entry 1 of term 0.
        receive(leader_node, append_entries(1, 0, [2, 3], commit=3))
        follower.doTick(0)
        assert follower.getStatus()["last_applied"] == 3
        # The leader's first message for entry 2 alone, delivered late (or sent again).
        receive(leader_node, append_entries(1, 0, [2], commit=3))
        follower.doTick(0)
        assert follower.getStatus()["log_len"] == 3, "entry 3, acknowledged, was erased"
    finally:
        follower.destroy()
        store.close()
