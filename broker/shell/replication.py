"""A shard's replicas as one Raft group (docs/cluster.md "Replicated queues").

The consensus engine is pysyncobj (Raft, embedded, its own TCP port per replica). The group's
state machine is the shard's durable store: every committed log entry is one batch of the
core's journal operations (broker/journal.py), applied to every replica's SQLite store in log
order. So a batch is committed once a majority of the replicas wrote it to their Raft logs
(and synced them: see `SyncedJournal`), and the leader confirms what it holds only then.

The store is a cache of the log here: it is rebuilt at every start from the last snapshot
(pysyncobj's log compaction, written by `_write_snapshot`) and the log after it, so no batch
is ever applied to it twice. A follower too far behind gets the leader's snapshot, then the
log (Raft's catch-up).

Threads: pysyncobj runs its own (the Raft thread): it applies entries and calls back from
there. The broker's loop only submits batches (`submit`) and takes what happened
(`take_events`), woken through a pipe it polls (`wake_fd`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pysyncobj.syncobj
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.journal import FileJournal
from pysyncobj.pickle import dumps, loads
from pysyncobj.transport import TCPTransport

from .disk import free_and_total
from .durable import DurableStore, StorageError
from .replica_events import Broken, Committed, Event, Failed, RoleChanged

log = logging.getLogger("phpmq.replication")

RAFT_LOG_NAME = "raft.log"
SNAPSHOT_NAME = "raft.snapshot"
#: The group's other members as this replica last knew them (see ReplicaGroup.__init__).
MEMBERS_NAME = "raft.members"

#: Raft's timing (docs/cluster.md "Timeouts"): a follower that hears nothing from its leader
#: for a random time in [MIN, MAX] starts an election; the leader sends entries (or an empty
#: heartbeat) every PERIOD; a leader that hears from no majority for FALLBACK steps down.
RAFT_MIN_TIMEOUT_S = 1.0
RAFT_MAX_TIMEOUT_S = 2.0
APPEND_PERIOD_S = 0.1
LEADER_FALLBACK_S = 3.0
CONNECTION_TIMEOUT_S = 3.0
CONNECTION_RETRY_S = 0.5
#: Log entries kept before a snapshot lets the log start over (or this many seconds).
COMPACT_AFTER_ENTRIES = 20_000
COMPACT_AFTER_S = 600
#: How often the log's volume is looked at (at most), and a waiting replica's pause.
ROOM_CHECK_S = 0.1
ROOM_WAIT_S = 1.0
MIB = 1 << 20
#: Membership (docs/cluster.md "Membership"): a replica that must not stand for election
#: (a new one without its leader's snapshot yet, or one leaving) waits this long instead;
#: a leaving replica that has heard nothing from its group this long has been removed.
NEVER_S = 10.0**9
REMOVED_AFTER_S = 5.0
#: A member counts as caught up within this many entries of the commit index; a change of
#: membership that got no answer this long is given up (and tried again).
CAUGHT_UP_ENTRIES = 100
CHANGE_TIMEOUT_S = 10.0
#: A refused change is tried again after this.
CHANGE_RETRY_S = 1.0


class NoRoom(Exception):
    """The log cannot take an entry (the volume is under its floor, or a write failed): the
    replica acknowledges nothing more, and stops."""


class VoteWithheld(Exception):
    """A fresh log does not vote in the first terms it learns of (see SyncedJournal)."""


class SyncedJournal(FileJournal):  # type: ignore[misc]
    """pysyncobj's file journal, synced to disk before pysyncobj answers for what it wrote.

    pysyncobj writes its log through mmap and syncs it only when the process ends; a power
    loss could then lose an entry a follower already acknowledged. Each write below is
    msync'ed before it returns, and the term and vote are fsynced, as Raft requires.

    An entry is refused while `no_room()` names a reason (a volume under its floor: a write
    into a mapped page the volume cannot back would kill the process with SIGBUS), and one
    whose write failed is taken back out of pysyncobj's in-memory list, so that the replica
    never acknowledges an entry it does not hold on disk.

    A log that did not exist at start (a new replica, or one whose disk was lost) withholds
    its vote from other candidates in the first two terms it learns of: Raft requires a
    node to remember whom it voted for in a term, and one that lost its disk may have voted
    in those terms already (voting again there could elect two leaders in one term). A new
    cluster's first election takes a round or two longer for it."""

    def __init__(self, path: str, no_room: Callable[[], str | None], self_id: str) -> None:
        fresh = not os.path.exists(path)
        super().__init__(path)
        self._meta_path = path + ".meta"
        self._no_room = no_room
        self._self_id = self_id
        #: A fresh log votes for others only in terms above this (None: not fresh).
        self._vote_horizon: int | None = -1 if fresh else None

    def add(self, command: bytes, idx: int, term: int) -> None:
        problem = self._no_room()
        if problem is not None:
            raise NoRoom(problem)
        try:
            super().add(command, idx, term)
            self.flush()
        except (OSError, ValueError) as exc:
            # FileJournal appends to its list before it writes: that entry is not held.
            self._FileJournal__journal.pop()
            raise NoRoom(f"the Raft log could not be written: {exc}") from None

    def clear(self) -> None:
        super().clear()
        self.flush()

    def deleteEntriesFrom(self, entry_from: int) -> None:  # noqa: N802 (pysyncobj's name)
        super().deleteEntriesFrom(entry_from)
        self.flush()

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802, N803
        horizon = self._vote_horizon
        if horizon is not None:
            if horizon < 0 and term > 0:
                horizon = self._vote_horizon = term + 1  # the first term it learns of, +1
            if votedForNodeId not in (None, self._self_id) and term <= horizon:
                # Raised before the vote is written or answered: pysyncobj sends nothing.
                raise VoteWithheld(f"a fresh replica does not vote in term {term}")
        super().setCurrentTerm(term, votedForNodeId)
        _fsync(self._meta_path)

    def onOneSecondTimer(self) -> None:  # noqa: N802
        super().onOneSecondTimer()
        _fsync(self._meta_path)


def _fsync(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


_journal_lock = threading.Lock()


class _QuietVotes(logging.Filter):
    """pysyncobj logs every exception of its tick with a traceback: a withheld vote is
    expected, and not worth one."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, VoteWithheld)


logging.getLogger("pysyncobj.syncobj").addFilter(_QuietVotes())


@contextmanager
def _synced_journals(no_room: Callable[[], str | None], self_id: str, made: list[Any]):
    """pysyncobj makes its journal with a module-level factory and offers no other way in:
    swap it for the synced one while a group is made (and only then); the journal made is
    put into `made`."""

    def create(path: str) -> Any:
        made.append(SyncedJournal(path, no_room, self_id) if path else original(path))
        return made[-1]

    with _journal_lock:
        original = pysyncobj.syncobj.createJournal
        pysyncobj.syncobj.createJournal = create
        try:
            yield
        finally:
            pysyncobj.syncobj.createJournal = original


class _RaftTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport, which mends a stale AppendEntries before pysyncobj sees it.

    pysyncobj deletes every entry after an AppendEntries' prevLogIdx, even entries that match
    the leader's (Raft deletes only from the first conflicting one): a late or repeated
    AppendEntries would erase entries this replica acknowledged, which the leader may have
    counted toward a commit. One whose entries this log already holds, followed only by
    entries of the same leader's term (which can only be that leader's own), is rewritten as
    an empty AppendEntries after this log's last entry: nothing is deleted, and the answer
    is the one Raft gives (every entry up to the last matches)."""

    def __init__(self, sync: Any, self_node: Any, other_nodes: Any) -> None:
        super().__init__(sync, self_node, other_nodes)
        self.mended = 0

    def setOnMessageReceivedCallback(self, callback: Any) -> None:  # noqa: N802 (pysyncobj's)
        if callback is None:
            super().setOnMessageReceivedCallback(None)
            return

        def on_message(node: Any, message: Any) -> None:
            self._syncObj.heard_group_at = time.monotonic()
            if isinstance(message, dict) and message.get("type") == "append_entries":
                self._syncObj.heard_leader_at = time.monotonic()
                message = self._mended(message)
            callback(node, message)

        super().setOnMessageReceivedCallback(on_message)

    def _mended(self, message: dict[str, Any]) -> dict[str, Any]:
        entries = message.get("entries")
        journals = getattr(self._syncObj, "journals", None)
        if not entries or "prevLogIdx" not in message or not journals:
            return message
        log = journals[0]
        first, last = log[0][1], log[-1][1]
        if entries[-1][1] >= last or entries[0][1] < first:
            return message  # it reaches past this log's end (or into its compacted part)
        if any(log[index - first][2] != term for _, index, term in entries):
            return message  # a conflict: pysyncobj's truncation is Raft's here
        beyond = range(entries[-1][1] + 1 - first, last + 1 - first)
        if any(log[position][2] != message["term"] for position in beyond):
            return message
        self.mended += 1
        return {**message, "prevLogIdx": last, "prevLogTerm": log[-1][2], "entries": []}


_batch_encoder = msgspec.msgpack.Encoder()
#: Operations as lists, on purpose: the store writes a list PUT as a row, never in a put run.
#: Runs would differ in shape from replica to replica (each one's turn log leaves out the
#: PUTs it saw acked in time), and a new leader avoids handing out again only the positions
#: its own runs span: an ack at a position another replica's run spans would be lost there.
_batch_decoder = msgspec.msgpack.Decoder(list[list[Any]])


_FAILURES = {
    FAIL_REASON.QUEUE_FULL: "the Raft command queue is full",
    FAIL_REASON.MISSING_LEADER: "the group has no leader",
    FAIL_REASON.DISCARDED: "a new leader replaced the entry",
    FAIL_REASON.NOT_LEADER: "this replica is no longer the leader",
    FAIL_REASON.LEADER_CHANGED: "the leader changed before the entry was committed",
    FAIL_REASON.REQUEST_DENIED: "the entry was refused",
    FAIL_REASON.UNKNOWN_OUTCOME: "the entry's outcome is unknown",
}


class _StoreMachine(SyncObj):  # type: ignore[misc]
    """The Raft node; its one replicated command applies a batch to the store."""

    def __init__(
        self,
        self_address: str,
        others: list[str],
        conf: SyncObjConf,
        store: DurableStore,
        on_broken: Callable[[str], None],
        no_room: Callable[[], str | None],
    ) -> None:
        self._store = store
        self._on_broken = on_broken
        self.broken = False
        #: When a leader's AppendEntries, and any message of the group, last came
        #: (_RaftTransport sets them).
        self.heard_leader_at = 0.0
        self.heard_group_at = 0.0
        #: The Raft log, once pysyncobj made it (what _RaftTransport reads).
        self.journals: list[Any] = []
        with _synced_journals(no_room, self_address, self.journals):
            super().__init__(self_address, others, conf, transportClass=_RaftTransport)

    @replicated  # type: ignore[misc]
    def apply_batch(self, batch: bytes) -> None:
        if not batch or self.broken:
            return
        try:
            self._store.commit(_batch_decoder.decode(batch))
        except StorageError as exc:
            self.broken = True
            self._on_broken(f"a committed batch could not be applied to the store: {exc}")


class ReplicaGroup:
    """This process's replica of one shard: its store, its Raft node, and what the loop
    needs to know of them.

    `address` and `others` are Raft addresses (host:port) of this replica and the others;
    `secret` authenticates and encrypts the group's traffic (pysyncobj's password); every
    replica of the cluster must have the same.
    """

    def __init__(
        self,
        directory: str | Path,
        address: str,
        others: list[str],
        secret: str,
        min_free_bytes: int = 0,
        role: str = "",
        candidates: list[str] | None = None,
    ) -> None:
        """`min_free_bytes`: the floor of free space under which the log takes no entry
        and the replica stops (it waits for room before it joins again: `wait_for_room`).
        `role` (BrokerConfig.raft_role): "joining" or "leaving" hold back its elections;
        `candidates`: every replica that may lead the group (BrokerConfig.raft_candidates)."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.address = address
        #: The members the group should have (the cluster file's), and the ones this log
        #: started from. pysyncobj keeps a group's first members out of its log (they are
        #: what each replica is started with) and replays only the changes: a replica whose
        #: group changed since its log began must start from the members it last knew, or it
        #: would count a majority of the wrong group.
        self._wanted = frozenset(others)
        known = _read_members(self.directory / MEMBERS_NAME)
        self.others = list(others) if known is None else known
        #: A new replica of a running group stands for no election until it has its
        #: leader's snapshot, which names the group's members (its own election would depose
        #: the leader that is adding it). Until then it takes its leader's connection from
        #: any node's replica, and writes down no members (it knows none yet).
        self._waiting_for_leader = (
            role == "joining" and known is None and not (self.directory / SNAPSHOT_NAME).exists()
        )
        if self._waiting_for_leader and candidates:
            self.others = sorted(set(candidates) - {address})
        self._members_written: frozenset[str] | None = None
        self._leaving = role == "leaving"
        holding_back = self._waiting_for_leader or self._leaving
        _discard_cache(self.directory)
        # The Raft thread writes the store; the loop reads it once, at a promotion.
        self.store = DurableStore(self.directory, synchronous="OFF", fold_on_read=False)
        self._events: deque[Event] = deque()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._next_ticket = 0
        snapshot = str(self.directory / SNAPSHOT_NAME)
        conf = SyncObjConf(
            password=secret,
            bindAddress=address,  # only the given host (pysyncobj would take every one)
            journalFile=str(self.directory / RAFT_LOG_NAME),
            fullDumpFile=snapshot,
            serializer=self._write_snapshot,
            deserializer=self._read_snapshot,
            raftMinTimeout=RAFT_MIN_TIMEOUT_S,
            raftMaxTimeout=RAFT_MAX_TIMEOUT_S,
            appendEntriesPeriod=APPEND_PERIOD_S,
            leaderFallbackTimeout=LEADER_FALLBACK_S,
            connectionTimeout=CONNECTION_TIMEOUT_S,
            connectionRetryTime=CONNECTION_RETRY_S,
            logCompactionMinEntries=COMPACT_AFTER_ENTRIES,
            logCompactionMinTime=COMPACT_AFTER_S,
            commandsWaitLeader=False,
            # Our batches are already a turn's group commit: send each at once, no waiting.
            appendEntriesUseBatch=False,
            onStateChanged=self._on_state_changed,
            dynamicMembershipChange=True,
        )
        self._conf = conf
        self._floor = min_free_bytes
        self._room_checked = 0.0
        self._room_problem: str | None = None
        self._raft = _StoreMachine(
            address,
            self.others,
            conf,
            self.store,
            lambda reason: self._push(Broken(reason)),
            self._no_room,
        )
        #: A replica to hand leadership to, done on the Raft thread (pysyncobj's calls are
        #: not thread-safe but for submitting commands).
        self._hand_to: str | None = None
        self._change_started: float | None = None
        self._compaction_forced = False
        self._transfer_tried = 0.0
        self._leader_seen = self._group_seen = time.monotonic()
        #: Set once a leaving replica's group has removed it: the process stops.
        self.removed = False
        self.membership_changes = 0
        if holding_back:
            self._stand_for_election(False)
        self._raft.addOnTickCallback(self._on_tick)

    # ------------------------------------------------------------------ the loop's side

    @property
    def wake_fd(self) -> int:
        """Readable when events wait in `take_events` (the loop polls it)."""
        return self._read_fd

    def submit(self, operations: list[tuple]) -> int:
        """Hand a batch of journal operations to the group; returns its ticket, which a
        Committed (or Failed) event names later. Only the leader submits."""
        ticket = self._next_ticket
        self._next_ticket += 1
        batch = _batch_encoder.encode(operations) if operations else b""
        self._raft.apply_batch(batch, callback=lambda _, error: self._settled(ticket, error))
        return ticket

    def take_events(self) -> list[Event]:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass
        events = []
        while self._events:
            events.append(self._events.popleft())
        return events

    def hand_to(self, address: str) -> None:
        """Ask the replica at `address` to take over leadership (Raft's TimeoutNow; refused
        by pysyncobj unless it has every entry). This replica then steps down."""
        self._hand_to = address

    def set_members(self, others: list[str], leaving: bool) -> None:
        """The other replicas this shard's group should have (docs/cluster.md
        "Membership"); `leaving`: this replica is not one of them. Its leader makes it so."""
        self._wanted = frozenset(others)
        if leaving != self._leaving:
            self._leaving = leaving
            self._stand_for_election(not leaving and not self._waiting_for_leader)

    def _stand_for_election(self, may: bool) -> None:
        """Whether this replica may start elections. pysyncobj takes its timeouts from its
        settings each time it draws one, and checks them only when it starts (so they are
        changed here, after), and keeps its first deadline privately (pushed off too)."""
        conf = self._conf
        if may:
            conf.raftMinTimeout, conf.raftMaxTimeout = RAFT_MIN_TIMEOUT_S, RAFT_MAX_TIMEOUT_S
            return
        conf.raftMinTimeout, conf.raftMaxTimeout = NEVER_S, 2 * NEVER_S
        if hasattr(self._raft, "_SyncObj__raftElectionDeadline"):
            self._raft._SyncObj__raftElectionDeadline = time.monotonic() + NEVER_S

    def _on_tick(self) -> None:
        self._fold_when_quiet()
        address, self._hand_to = self._hand_to, None
        if address is not None:
            self._raft.transferLeadership(address)
        now = time.monotonic()
        members = frozenset(node.id for node in self._raft.otherNodes)
        if members != self._members_written and not self._waiting_for_leader:
            _write_members(self.directory / MEMBERS_NAME, members)
            self._members_written = members
        self._group_seen = max(self._group_seen, self._raft.heard_group_at)
        heard = self._raft.heard_leader_at
        if heard > self._leader_seen:
            self._leader_seen = heard
            if self._waiting_for_leader and (self.directory / SNAPSHOT_NAME).exists():
                self._waiting_for_leader = False
                log.info(
                    "replica %s has its leader's snapshot: it may stand for election",
                    self.address,
                )
                if not self._leaving:
                    self._stand_for_election(True)
        if self._raft._isLeader():
            self._group_seen = now
            self._change_membership(now)
        elif self._leaving and not self.removed and now - self._group_seen > REMOVED_AFTER_S:
            # A member hears its leader, or, without one, the candidates asking for its vote
            # (a leaving replica asks for none): silence is its group having removed it.
            log.info(
                "replica %s was removed from its group (nothing heard from it for %.0f s)",
                self.address,
                now - self._group_seen,
            )
            self.removed = True
            self._push(Broken("removed from its group"))

    def _fold_when_quiet(self) -> None:
        """On the Raft thread, the store's writer: logged turns come of age and are folded
        (and free pages given back) between batches, as a single broker does in its idle
        turns, so a replica promoted after its leader's death rarely has any left."""
        store = self.store
        if self._raft.broken or not store.reclaimable:
            return
        try:
            store.reclaim()
        except StorageError as exc:
            log.debug("folding the turn log failed (retried at the next tick): %s", exc)

    def _change_membership(self, now: float) -> None:
        """On the leader: one change at a time toward the wanted members. New members
        first, and none removed before every wanted one has caught up; a leaving leader
        then hands leadership to one of them, which removes it."""
        if self._change_started is not None:
            if now - self._change_started < CHANGE_TIMEOUT_S:
                return
            log.warning("replica %s: a membership change got no answer: trying again", self.address)
            self._change_started = None
        wanted = self._wanted
        current = {node.id for node in self._raft.otherNodes}
        missing = sorted(wanted - current)
        if missing:
            if self._has_snapshot():
                self._start_change("add", missing[0], now)
            return
        status = self._raft.getStatus()
        commit = status.get("commit_idx") or 0
        behind = [
            node
            for node in wanted
            if status.get(f"partner_node_status_server_{node}") != 2
            or (status.get(f"match_idx_server_{node}") or 0) < commit - CAUGHT_UP_ENTRIES
        ]
        if behind:
            return
        extra = sorted(current - wanted)
        if extra:
            self._start_change("remove", extra[0], now)
        elif self._leaving and wanted and now - self._transfer_tried >= 1.0:
            self._transfer_tried = now
            self._raft.transferLeadership(None)

    def _has_snapshot(self) -> bool:
        """Whether a new member would get a snapshot, which names the group's members (the
        log's first entries do not), before the log: once the log was compacted, the
        snapshot written and the entries before it gone (a member added before that would
        get the log from its first entry). If it was not, it is compacted now (on the Raft
        thread, over the next ticks)."""
        journal = self._raft.journals[0] if self._raft.journals else None
        first = journal[0][1] if journal is not None and len(journal) else 0
        if first > 1 and (self.directory / SNAPSHOT_NAME).exists():
            return True  # written, and the log's entries before it deleted
        if not self._compaction_forced:
            log.info("replica %s: a snapshot first, for the new member to start from", self.address)
            self._compaction_forced = True
            self._raft.forceLogCompaction()
        return False

    def _start_change(self, kind: str, node: str, now: float) -> None:
        log.info(
            "replica %s: %s %s %s its group",
            self.address,
            "adding" if kind == "add" else "removing",
            node,
            "to" if kind == "add" else "from",
        )
        self._change_started = now
        change = self._raft.addNodeToCluster if kind == "add" else self._raft.removeNodeFromCluster
        change(node, callback=lambda _, error: self._changed(kind, node, error))

    def _changed(self, kind: str, node: str, error: int) -> None:
        if error == FAIL_REASON.SUCCESS:
            self._change_started = None
            self.membership_changes += 1
            log.info(
                "replica %s: %s %s", self.address, "added" if kind == "add" else "removed", node
            )
        else:  # (refused at once while a change is uncommitted): tried again in a second
            self._change_started = time.monotonic() - CHANGE_TIMEOUT_S + CHANGE_RETRY_S
            log.warning(
                "replica %s: %s %s failed: %s",
                self.address,
                kind,
                node,
                _FAILURES.get(error, f"pysyncobj error {error}"),
            )

    def is_leader(self) -> bool:
        return bool(self._raft._isLeader())

    def leader_address(self) -> str | None:
        leader = self._raft._getLeader()
        return None if leader is None else str(leader)

    def status(self) -> dict[str, Any]:
        raw = self._raft.getStatus()
        return {
            "address": self.address,
            "leader": raw.get("leader") and str(raw["leader"]),
            "state": ("follower", "candidate", "leader")[raw.get("state", 0)],
            "term": raw.get("raft_term"),
            "commit_index": raw.get("commit_idx"),
            "applied_index": raw.get("last_applied"),
            "log_entries": raw.get("log_len"),
            "replicas": {
                str(node): {
                    "connected": raw.get(f"partner_node_status_server_{node}") == 2,
                    "match_index": raw.get(f"match_idx_server_{node}"),
                }
                for node in sorted(node.id for node in self._raft.otherNodes)
            },
            "membership_changes": self.membership_changes,
            **({"leaving": True} if self._leaving else {}),
        }

    def close(self) -> None:
        self._raft.destroy_synchronous()
        self.store.close()
        os.close(self._read_fd)
        os.close(self._write_fd)

    # ------------------------------------------------------------------ the Raft thread

    def _no_room(self) -> str | None:
        """Why the log may take no entry now (None: it may); the volume is looked at every
        ROOM_CHECK_S at most. The first refusal tells the loop, which stops the replica."""
        now = time.monotonic()
        if now - self._room_checked >= ROOM_CHECK_S:
            self._room_checked = now
            with contextlib.suppress(OSError):  # room_problem says so
                self.store.room_above_floor(free_and_total(self.directory)[0] - self._floor)
            problem = room_problem(self.directory, self._floor)
            if problem is not None and self._room_problem is None:
                log.error("%s: this replica takes no more entries and stops", problem)
                self._push(Broken(problem))
            self._room_problem = problem
        return self._room_problem

    def _settled(self, ticket: int, error: int) -> None:
        if error == FAIL_REASON.SUCCESS:
            self._push(Committed(ticket))
        else:
            self._push(Failed(ticket, _FAILURES.get(error, f"pysyncobj error {error}")))

    def _on_state_changed(self, old: int, new: int) -> None:
        leader = new == 2  # pysyncobj's _RAFT_STATE.LEADER
        if leader != (old == 2):
            log.info("replica %s is %s", self.address, "the leader" if leader else "a follower")
            self._push(RoleChanged(leader))

    def _push(self, event: Event) -> None:
        self._events.append(event)
        with contextlib.suppress(BlockingIOError):  # full of wake-ups already
            os.write(self._write_fd, b"\0")

    def _write_snapshot(self, path: str, raft_data: Any) -> None:
        """Log compaction: the store as it is now (every applied entry in it), with
        pysyncobj's own data beside it, in one SQLite file."""
        target = sqlite3.connect(path)
        try:
            self.store.backup_into(target)
            target.execute("CREATE TABLE IF NOT EXISTS raft (data BLOB)")
            target.execute("DELETE FROM raft")
            target.execute("INSERT INTO raft VALUES (?)", (dumps(raft_data),))
            target.commit()
        finally:
            target.close()
        _fsync(path)

    def _read_snapshot(self, path: str) -> Any:
        """A snapshot, at start or sent by the leader: it becomes the store."""
        source = sqlite3.connect(path)
        try:
            (data,) = source.execute("SELECT data FROM raft").fetchone()
            self.store.restore_from(source)
        finally:
            source.close()
        return loads(data)


def room_problem(directory: Path, floor: int) -> str | None:
    """Why a replica's volume has no room for its log (None: it has)."""
    try:
        free, _ = free_and_total(directory)
    except OSError as exc:
        return f"the volume of {directory} cannot be read: {exc}"
    if free < floor:
        return (
            f"disk space low: {free / MIB:.1f} MiB free on the volume of {directory}, under"
            f" min_free_disk {floor / MIB:.1f} MiB"
        )
    return None


def wait_for_room(directory: Path, floor: int, stop: Callable[[], bool]) -> bool:
    """Before a replica joins its group: wait while its volume is under the floor (one log
    line, then a look every ROOM_WAIT_S). False if `stop()` said so first."""
    problem = room_problem(directory, floor)
    if problem is not None:
        log.error("%s: the replica waits for room before it joins its group", problem)
    while problem is not None:
        if stop():
            return False
        time.sleep(ROOM_WAIT_S)
        problem = room_problem(directory, floor)
    return True


def _discard_cache(directory: Path) -> None:
    """The store is rebuilt from the snapshot and the log at every start."""
    for name in os.listdir(directory):
        if name.startswith("phpmq.sqlite3"):
            (directory / name).unlink()


def _read_members(path: Path) -> list[str] | None:
    try:
        members = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        return None
    return members


def _write_members(path: Path, members: frozenset[str]) -> None:
    """Written beside, synced and renamed: the file is the old list or the new one."""
    temporary = path.with_suffix(".new")
    with open(temporary, "w") as out:
        out.write(json.dumps(sorted(members)))
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    _fsync(str(path))
