"""The replica's Raft log (broker/shell/replication.py SyncedJournal): a fresh log withholds
its vote in the first terms it learns of, and never keeps an entry it could not write."""

from __future__ import annotations

from pathlib import Path

import pytest

from phpmq.broker.shell.replication import NoRoom, SyncedJournal, VoteWithheld

ME, PEER = "10.0.0.1:6000", "10.0.0.2:6000"


def journal(path: Path, problem: list[str | None] | None = None) -> SyncedJournal:
    return SyncedJournal(str(path), lambda: (problem or [None])[0], ME)


def test_a_fresh_log_withholds_its_vote_in_the_first_two_terms_it_learns_of(
    tmp_path: Path,
) -> None:
    log = journal(tmp_path / "raft.log")
    log.setCurrentTerm(5, None)  # a leader's heartbeat, or a candidate's request: term 5
    for term in (5, 6):
        with pytest.raises(VoteWithheld):
            log.setCurrentTerm(term, PEER)
    log.setCurrentTerm(6, ME)  # its own candidacy is not a vote it may have given before
    log.setCurrentTerm(7, PEER)
    assert log.getVotedForNodeId() == PEER and log.getCurrentTerm() == 7


def test_a_log_that_existed_votes_as_raft_says(tmp_path: Path) -> None:
    path = tmp_path / "raft.log"
    journal(path).setCurrentTerm(3, None)
    again = journal(path)  # a restart with its disk: it remembers its votes
    again.setCurrentTerm(3, PEER)
    assert again.getVotedForNodeId() == PEER


def test_no_entry_is_kept_without_room(tmp_path: Path) -> None:
    problem: list[str | None] = [None]
    log = journal(tmp_path / "raft.log", problem)
    log.add(b"first", 1, 1)
    problem[0] = "disk space low"
    with pytest.raises(NoRoom, match="disk space low"):
        log.add(b"second", 2, 1)
    assert len(log) == 1 and log[0][0] == b"first"
