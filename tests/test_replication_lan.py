"""Replicated queues under faults, Jepsen-style (issue #30), on a LAN of network namespaces:
three nodes, every shard on all three, clients in a fourth namespace.

The nemesis test runs producers (confirmed sends with idempotency keys, each retried with
its key until confirmed) and a consumer (acking) while, for ten cycles, one fault at a time
hits the cluster and is healed: the kill -9 of the leader's whole node (restarted with its
data), the kill -9 of a follower's process, and the leader's node cut off from the rest.
Its checker: nothing confirmed is lost (all drained at the end), nothing is delivered that
was never sent, a producer that reaches only the cut-off leader gets no confirm, and once
the clients stop, each shard's three replica stores hold the same messages and keys.
Duplicates are allowed (at-least-once) and counted; failover times are printed.

The wiped test: a node's data directory wiped while it is down; it rejoins, catches up, and
nothing is lost when the other nodes are killed one by one afterwards.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import lan
from harness import read_folded, wait_for, wait_until
from phpmq.broker.shell.cluster_file import Replica
from phpmq.broker.shell.store_schema import read_keys
from replicated_lan import NODE_NAMES, LanCluster

# The LAN tests build network namespaces and run brokers in them: one LAN at a time.
pytestmark = [pytest.mark.xdist_group("lan"), pytest.mark.timeout(420)]

CYCLES = 10
#: How long a cut-off's set-up waits for the shard's preferred replica to lead (it takes its
#: shard back within seconds of being up again; the cut goes ahead either way).
PREFERRED_S = 30.0
#: How long a fault lasts before it is healed (a cut-off leader steps down within 3 s).
FAULT_S = 5.0
#: A confirm this soon after a kill left its broker before it (a veth's delay is far less).
IN_FLIGHT_S = 0.02
#: How long the cluster has to serve every shard again after a heal.
RECOVERY_S = 60.0


@dataclass
class History:
    """Every attempt, confirm and delivery the clients wrote (tests/replicated_lan_agent.py)."""

    attempted: set[str] = field(default_factory=set)
    confirmed: dict[str, float] = field(default_factory=dict)  # key -> first confirm's time
    confirms: list[tuple[str, float]] = field(default_factory=list)  # (queue, time)
    delivered: list[tuple[str, str]] = field(default_factory=list)  # (queue, key)
    minority_confirmed: list[str] = field(default_factory=list)
    #: Keys whose cut-off producer was answered by a leader (not a follower) first.
    minority_greeted_by_leader: set[str] = field(default_factory=set)
    errors: int = 0

    @classmethod
    def read(cls, path: Path) -> History:
        history = cls()
        # The clients may be writing: a last line without its newline is not whole yet.
        for line in path.read_text().splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            event = json.loads(line)
            kind, key = event["e"], event["key"]
            if kind == "attempt":
                history.attempted.add(key)
            elif kind == "confirmed":
                history.confirmed.setdefault(key, event["t"])
                history.confirms.append((event["queue"], event["t"]))
                if event.get("minority"):
                    history.minority_confirmed.append(key)
            elif kind == "delivered":
                history.delivered.append((event["queue"], key))
            elif kind == "error":
                history.errors += 1
            elif kind == "greeted" and not event["standby"]:
                history.minority_greeted_by_leader.add(key)
        return history

    def first_confirm_after(self, queue: str, moment: float) -> float | None:
        return min((t for q, t in self.confirms if q == queue and t > moment), default=None)

    def lost(self) -> set[str]:
        return set(self.confirmed) - {key for _, key in self.delivered}

    def never_sent(self) -> list[tuple[str, str]]:
        """Deliveries of keys no producer tried, or delivered from another queue."""
        return [
            (queue, key)
            for queue, key in self.delivered
            if key not in self.attempted or not key.startswith(f"{queue}-")
        ]

    def duplicates(self) -> int:
        return len(self.delivered) - len({key for _, key in self.delivered})


@dataclass
class Nemesis:
    """One fault at a time, each healed before the next; what it did, and when."""

    cluster: LanCluster
    queues: dict[str, str]  # shard -> its queue
    events: Path
    kills: list[tuple[str, float]] = field(default_factory=list)  # (queue, kill time)
    cut_offs: list[str] = field(default_factory=list)  # the minority producers' keys

    def kill_leaders_node(self, shard: str, cycle: int) -> None:
        leaders = self.cluster.wait_for_leaders(RECOVERY_S)
        node = leaders[shard].node
        killed_at = time.monotonic()
        self.cluster.kill_node(node)
        self.kills += [(self.queues[s], killed_at) for s, r in leaders.items() if r.node == node]
        time.sleep(FAULT_S)
        self.cluster.start(node)
        self.recovered(killed_at)

    def kill_a_follower(self, shard: str, cycle: int) -> None:
        leaders = self.cluster.wait_for_leaders(RECOVERY_S)
        follower = next(r for r in self.cluster.replica_sets[shard] if r != leaders[shard])
        killed_at = time.monotonic()
        pid = self.cluster.kill(follower)
        time.sleep(FAULT_S)
        wait_for(
            lambda: self.cluster.ready(follower.node) and self.cluster.pid(follower) != pid,
            f"the supervisor to restart the follower of {shard} on {follower.node}",
            timeout=RECOVERY_S,
        )
        self.recovered(killed_at)

    def cut_off_leaders_node(self, shard: str, cycle: int) -> None:
        """The leader's node alone on its side: a producer there, which reaches only the
        leader's endpoint, must get no confirm; once healed, its key is sent again from the
        majority's side (a confirm then means the message must not be lost)."""
        queue, key = self.queues[shard], f"{self.queues[shard]}-minority-{cycle}"
        leader, agent = self._minority_agent(shard, queue, key)
        assert agent.stdin is not None and agent.stdout is not None
        try:
            cut_at = time.monotonic()
            self.cluster.partition(leader.node)
            try:
                agent.stdin.write("go\n")
                agent.stdin.flush()
                assert agent.wait(FAULT_S + 30) == 0, f"agent minority exited {agent.returncode}"
            finally:
                self.cluster.heal(leader.node)
        finally:
            if agent.poll() is None:
                agent.kill()
        self.cut_offs.append(key)
        self.cluster.run_agent(
            self.cluster.client,
            "send",
            str(self.events),
            self.cluster.endpoints,
            str(RECOVERY_S),
            f"{queue}:{key}",
            timeout=RECOVERY_S + 30,
        )
        self.recovered(cut_at)

    def _minority_agent(self, shard: str, queue: str, key: str) -> tuple[Replica, subprocess.Popen]:
        """The shard's leader, and a minority agent started on its node and ready. A
        preferred replica takes its shard back once it is up again after a kill (by design),
        and an agent aimed at the node the leadership left would be greeted by a follower: so
        the preferred replica is waited for to lead first (for up to PREFERRED_S), and the
        leader is asked again once the agent is ready, the agent started anew if it moved."""
        preferred = self.cluster.replica_sets[shard][0]
        wait_until(lambda: self.cluster.leaders()[shard] == preferred, PREFERRED_S, 0.5)
        for _ in range(3):
            leader = self.cluster.wait_for_leaders(RECOVERY_S)[shard]
            agent = self.cluster.start_agent(
                self.cluster.hosts[leader.node],
                "minority",
                str(self.events),
                leader.address,
                str(FAULT_S),
                queue,
                key,
            )
            assert agent.stdout is not None
            assert agent.stdout.readline().strip() == "ready", "the minority agent did not start"
            if self.cluster.wait_for_leaders(RECOVERY_S)[shard].address == leader.address:
                return leader, agent
            agent.kill()
            agent.communicate()  # (closes its pipes)
        raise AssertionError(f"shard {shard}'s leader kept moving")

    def recovered(self, since: float) -> None:
        """Every shard has a leader, and the producers got a confirm on every queue since."""
        self.cluster.wait_for_leaders(RECOVERY_S)
        wait_for(
            lambda: all(
                History.read(self.events).first_confirm_after(queue, since) is not None
                for queue in self.queues.values()
            ),
            "a confirmed send on every queue after the heal",
            timeout=RECOVERY_S,
            interval=0.5,
        )


FAULTS: list[Callable[[Nemesis, str, int], None]] = [
    Nemesis.kill_leaders_node,
    Nemesis.kill_a_follower,
    Nemesis.cut_off_leaders_node,
]


def test_nothing_confirmed_is_lost_under_a_nemesis(lan_capable: None, tmp_path: Path) -> None:
    started = time.monotonic()
    with lan.lan(4, prefix="prep") as net, LanCluster(net, tmp_path) as cluster:
        cluster.wait_for_leaders()
        shards = sorted(cluster.replica_sets)
        queues = {shard: cluster.queue_of(shard) for shard in shards}
        events = tmp_path / "events.jsonl"
        workload = start_workload(cluster, events, queues)
        nemesis = Nemesis(cluster, queues, events)
        try:
            nemesis.recovered(since=0.0)  # the clients are up
            for cycle in range(CYCLES):
                fault = FAULTS[cycle % len(FAULTS)]
                shard = shards[(cycle + cycle // len(FAULTS)) % len(shards)]  # each pair
                print(f"cycle {cycle}: {fault.__name__} of {shard}", flush=True)
                fault(nemesis, shard, cycle)
        finally:
            status = stop_workload(workload)
        assert status == 0, "the workload's clients crashed (their error is above)"
        wait_for(
            lambda: replicas_agree(cluster),
            "every shard's replicas to hold the same messages and keys",
            timeout=RECOVERY_S,
            interval=0.5,
        )
        history = drain_until_complete(cluster, events, list(queues.values()))
    report(history, nemesis, time.monotonic() - started)
    assert not history.minority_confirmed, "a leader cut off from its majority confirmed"
    assert set(nemesis.cut_offs) <= history.minority_greeted_by_leader, (
        "a producer on a cut-off node never reached its leader: its silence proves nothing"
    )
    assert not history.lost(), f"confirmed and never delivered: {sorted(history.lost())}"
    assert not history.never_sent(), f"delivered, never sent: {history.never_sent()[:20]}"


def start_workload(cluster: LanCluster, events: Path, queues: dict[str, str]) -> subprocess.Popen:
    """The clients (tests/replicated_lan_agent.py `workload`), writing to `events`."""
    events.touch()
    return cluster.agent(
        cluster.client,
        "workload",
        str(events),
        cluster.endpoints,
        *queues.values(),
        stdin=subprocess.PIPE,
    )


def stop_workload(workload: subprocess.Popen) -> int:
    """Stop the clients; their exit status."""
    assert workload.stdin is not None
    workload.stdin.close()
    return workload.wait(30)


def drain_until_complete(cluster: LanCluster, events: Path, queues: list[str]) -> History:
    """Drain the queues (from the clients' namespace), again while a confirmed key has not
    come (a message held by a consumer that is gone comes back late), four times at most;
    the history then."""
    history = History.read(events)
    for _ in range(4):
        cluster.run_agent(
            cluster.client, "drain", str(events), cluster.endpoints, "60", *queues, timeout=90
        )
        history = History.read(events)
        if not history.lost():
            break
    return history


def report(history: History, nemesis: Nemesis, took: float) -> None:
    failovers = []
    for queue, killed_at in nemesis.kills:
        first = history.first_confirm_after(queue, killed_at + IN_FLIGHT_S)
        if first is not None:
            failovers.append(first - killed_at)
    print(
        f"{len(history.confirmed)} sends confirmed, {len(history.delivered)} deliveries"
        f" ({history.duplicates()} duplicates), {history.errors} client errors retried,"
        f" {len(nemesis.cut_offs)} sends tried on a cut-off leader; {took:.0f} s in all"
    )
    if failovers:
        print(
            f"failover (kill -9 to the first confirmed send on the shard) over"
            f" {len(failovers)} kills: median {statistics.median(failovers):.2f} s,"
            f" max {max(failovers):.2f} s"
        )


#: Messages per queue sent while the wiped node is down.
WIPED_SENDS = 30


def test_a_node_whose_data_is_wiped_rejoins_and_nothing_is_lost(
    lan_capable: None, tmp_path: Path
) -> None:
    with lan.lan(4, prefix="pwip") as net, LanCluster(net, tmp_path) as cluster:
        leaders = cluster.wait_for_leaders()
        shards = sorted(cluster.replica_sets)
        queues = {shard: cluster.queue_of(shard) for shard in shards}
        wiped = leaders[shards[0]].node  # a leader's node: the others must take over
        cluster.kill_node(wiped)
        shutil.rmtree(tmp_path / wiped)
        events = tmp_path / "events.jsonl"
        send_to_every_queue(cluster, events, queues, "while-wiped", WIPED_SENDS)
        cluster.start(wiped)
        for shard in shards:
            store = cluster.store(next(r for r in cluster.replica_sets[shard] if r.node == wiped))
            wait_for(
                lambda store=store: stored_messages(store) == WIPED_SENDS,
                f"the wiped node's replica of {shard} to hold every message again",
                timeout=60,
                interval=0.5,
            )
        # Each other node dies in turn, and what is sent meanwhile is on the wiped node and
        # one other only: the second death (right after the first node's restart) leaves the
        # wiped node the one live holder of what the restarted node has not caught up on.
        for node in NODE_NAMES:
            if node != wiped:
                cluster.kill_node(node)
                send_to_every_queue(cluster, events, queues, f"while-{node}-down", 10)
                cluster.start(node)
        history = drain_until_complete(cluster, events, list(queues.values()))
    assert not history.lost(), f"confirmed and never delivered: {sorted(history.lost())}"
    assert not history.never_sent(), history.never_sent()[:20]


def send_to_every_queue(
    cluster: LanCluster, events: Path, queues: dict[str, str], label: str, count: int
) -> None:
    """`count` keyed sends to each queue, from the clients' namespace, all confirmed."""
    sends = [f"{queue}:{queue}-{label}-{n}" for queue in queues.values() for n in range(count)]
    cluster.run_agent(
        cluster.client, "send", str(events), cluster.endpoints, "120", *sends, timeout=150
    )
    confirmed = History.read(events).confirmed
    assert all(send.partition(":")[2] in confirmed for send in sends), f"unconfirmed: {label}"


def replicas_agree(cluster: LanCluster) -> bool:
    """Whether each shard's replica stores (its Raft group's state machines) hold the same
    messages and idempotency keys: a replica that applied an entry the others did not (or
    missed one) never agrees."""
    for replicas in cluster.replica_sets.values():
        contents = {stored_contents(cluster.store(replica)) for replica in replicas}
        if len(contents) != 1 or None in contents:
            return False
    return True


def stored_contents(store: Path) -> tuple[frozenset, frozenset] | None:
    """A replica store's message IDs and queues, and its idempotency keys (None: not
    readable now)."""
    try:
        db = read_folded(store)  # the turn log folded in: what the store holds
    except sqlite3.Error:
        return None
    with contextlib.closing(db):
        messages = frozenset(db.execute("SELECT id, queue, content FROM messages"))
        keys = frozenset((k.queue, k.key, k.id) for k in read_keys(db))
    return messages, keys


def stored_messages(store: Path) -> int | None:
    """Messages in a replica's store (None: not readable yet)."""
    try:
        db = read_folded(store)
    except sqlite3.Error:
        return None
    with contextlib.closing(db):
        return int(db.execute("SELECT count(*) FROM messages").fetchone()[0])


def test_a_node_joins_and_another_leaves_under_load_and_nothing_is_lost(
    lan_capable: None, tmp_path: Path
) -> None:
    """Membership on a LAN (docs/cluster.md "Membership"): with the workload running, node d
    joins (every shard it now holds catches up from a snapshot), then node a leaves (its
    replicas hand over, its broker exits 0); nothing confirmed is lost, and every shard's
    new replicas end up holding the same messages."""
    with (
        lan.lan(5, prefix="pmem") as net,
        LanCluster(net, tmp_path, spare=("d",)) as cluster,
    ):
        cluster.wait_for_leaders()
        queues = {shard: cluster.queue_of(shard) for shard in sorted(cluster.replica_sets)}
        events = tmp_path / "events.jsonl"
        workload = start_workload(cluster, events, queues)
        nemesis = Nemesis(cluster, queues, events)
        try:
            nemesis.recovered(since=0.0)
            joined_at = time.monotonic()
            cluster.join("d")
            held = [
                r for replicas in cluster.replica_sets.values() for r in replicas if r.node == "d"
            ]
            wait_for(
                lambda: all(has_keys(cluster.store(replica)) for replica in held),
                f"d's {len(held)} replicas to hold what their groups committed",
                timeout=RECOVERY_S,
                interval=0.5,
            )
            took = time.monotonic() - joined_at
            print(f"d joined: its {len(held)} replicas caught up {took:.1f} s after the join")
            nemesis.recovered(joined_at)
            left_at = time.monotonic()
            cluster.leave("a")
            wait_for(
                lambda: cluster.supervisors["a"].poll() is not None,
                "node a's broker to hand over and exit",
                timeout=RECOVERY_S,
                interval=0.5,
            )
            print(f"a left: its broker exited {time.monotonic() - left_at:.1f} s after the change")
            nemesis.recovered(left_at)
        finally:
            status = stop_workload(workload)
        assert status == 0, "the workload's clients crashed (their error is above)"
        assert cluster.supervisors["a"].returncode == 0
        wait_for(
            lambda: replicas_agree(cluster),
            "every shard's new replicas to hold the same messages and keys",
            timeout=RECOVERY_S,
            interval=0.5,
        )
        history = drain_until_complete(cluster, events, list(queues.values()))
    print(
        f"{len(history.confirmed)} sends confirmed, {len(history.delivered)} deliveries"
        f" ({history.duplicates()} duplicates), {history.errors} client errors retried"
    )
    assert not history.lost(), f"confirmed and never delivered: {sorted(history.lost())}"
    assert not history.never_sent(), f"delivered, never sent: {history.never_sent()[:20]}"


def has_keys(store: Path) -> bool:
    """Whether a replica's store holds idempotency keys (the producers' keyed sends)."""
    contents = stored_contents(store)
    return contents is not None and bool(contents[1])
