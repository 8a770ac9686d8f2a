"""A replicated cluster on a LAN of network namespaces (tests/lan.py), for the Jepsen-style
tests of issue #30: nodes a, b, c each in a namespace of their own, every shard on all three
(`replicas = 3`), and clients in a namespace of their own (tests/replicated_lan_agent.py).

    with lan.lan(4) as net, LanCluster(net, tmp_path) as cluster:
        leaders = cluster.wait_for_leaders()
        cluster.kill_node("a")     # kill -9 of every process in a's namespace
        cluster.start("a")         # the same data directory
        cluster.partition("b")     # b's cable pulled
        cluster.heal("b")

The nodes are the LAN's first three namespaces (then `spare` ones that may join later:
`join`, `leave`), the clients its last. Each node is
`phpmq broker --cluster-file F --node NAME`, a supervisor of its three replica processes;
its ready file names their pids. Roles are asked by a probe process in the clients'
namespace (the test's own namespace reaches none of the nodes).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lan
from phpmq.broker.shell.cluster_file import Replica, read_cluster_file
from phpmq.broker.shell.shards import shard_address
from phpmq.protocol.cluster import ClusterMap, Shard

NODE_NAMES = ("a", "b", "c")
BROKER_PORT = 5555
RAFT_PORT_OFFSET = 1000
LINK_SECRET = "phpmq-replicated-lan"
AGENT = str(Path(__file__).with_name("replicated_lan_agent.py"))


class LanCluster:
    """Three replicated nodes and a client namespace; `directory` holds the cluster file,
    each node's data (NODE/), log (NODE.log) and ready file (NODE.ready)."""

    def __init__(self, net: lan.Lan, directory: Path, spare: tuple[str, ...] = ()) -> None:
        self.net = net
        self.directory = directory
        names = (*NODE_NAMES, *spare)
        self.hosts = dict(zip(names, net.nodes[: len(names)], strict=True))
        self.client = net.nodes[len(names)]
        self.file = directory / "cluster.toml"
        lines = ["replicas = 3", f"raft_port_offset = {RAFT_PORT_OFFSET}"]
        for name in NODE_NAMES:
            lines += ["[[nodes]]", f'name = "{name}"', f'address = "{self.endpoint(name)}"']
        self.file.write_text("\n".join(lines) + "\n")
        #: Each shard's replicas (cluster_file.Replica), its home's first.
        self.replica_sets = read_cluster_file(str(self.file)).replica_sets(shard_address)
        self.map = ClusterMap(1, tuple(Shard(name, "") for name in self.replica_sets))
        self.supervisors: dict[str, subprocess.Popen] = {}
        self._probe: subprocess.Popen | None = None

    def endpoint(self, node: str) -> str:
        """Node `node`'s first endpoint (its home shard's replica)."""
        return f"tcp://{self.hosts[node].address}:{BROKER_PORT}"

    @property
    def endpoints(self) -> str:
        """Every node's first endpoint, as a client takes them (comma-separated): the nodes
        of the cluster file now, those that left aside."""
        live = read_cluster_file(str(self.file)).live_nodes()
        return ",".join(self.endpoint(node.name) for node in live)

    def queue_of(self, shard: str) -> str:
        """The first queue name (q0, q1, ...) that `shard` owns."""
        return next(f"q{i}" for i in range(100_000) if self.map.owner(f"q{i}").name == shard)

    # ------------------------------------------------------------------ the nodes

    def start(self, node: str) -> None:
        """Start node `node` (its supervisor, in its namespace) and wait until its replicas
        all serve (as leaders or followers)."""
        ready = self._ready_path(node)
        ready.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "phpmq", "broker", "--cluster-file", str(self.file)]
        argv += ["--node", node, "--data-dir", str(self.directory / node)]
        argv += ["--ready-file", str(ready), "--grace-seconds", "1"]
        with open(self.directory / f"{node}.log", "ab") as log:
            self.supervisors[node] = self.hosts[node].popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PHPMQ_LINK_SECRET": LINK_SECRET},
            )
        deadline = time.monotonic() + 60
        while self.ready(node) is None:
            if self.supervisors[node].poll() is not None or time.monotonic() > deadline:
                raise lan.LanError(f"node {node} did not start:\n{self.log(node)[-3000:]}")
            time.sleep(0.05)

    def ready(self, node: str) -> dict[str, Any] | None:
        """Node `node`'s ready file as its running supervisor wrote it last (None: not yet)."""
        try:
            endpoints = json.loads(self._ready_path(node).read_text())
        except FileNotFoundError:
            return None
        supervisor = self.supervisors.get(node)
        return endpoints if supervisor and endpoints.get("pid") == supervisor.pid else None

    def pid(self, replica: Replica) -> int:
        """The pid of the replica's latest start that serves."""
        for shard in (self.ready(replica.node) or {}).get("shards", []):
            if shard["shard"] == replica.shard:
                return int(shard["pid"])
        raise LookupError(f"replica of {replica.shard} on node {replica.node} is not serving")

    def kill(self, replica: Replica) -> int:
        """kill -9 one replica process (its supervisor starts it again); its pid."""
        pid = self.pid(replica)
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_node(self, node: str) -> None:
        """kill -9 every process in the node's namespace at once: the host died."""
        namespace = self.hosts[node].name
        for pid in lan.ip("netns", "pids", namespace).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        self.supervisors[node].wait(10)

    def join(self, node: str) -> None:
        """`phpmq cluster join` of a spare node: the file gets it, it starts, and the other
        nodes read the file again (SIGHUP)."""
        cluster = read_cluster_file(str(self.file)).with_node_joined(node, self.endpoint(node))
        self._rewrite(cluster)
        self.start(node)
        self.reload(exclude=node)

    def leave(self, node: str) -> None:
        """`phpmq cluster leave`: the file marks the node left; every node reads it again."""
        self._rewrite(read_cluster_file(str(self.file)).with_node_left(node))
        self.reload()

    def reload(self, exclude: str = "") -> None:
        for name, supervisor in self.supervisors.items():
            if name != exclude and supervisor.poll() is None:
                supervisor.send_signal(signal.SIGHUP)

    def _rewrite(self, cluster: Any) -> None:
        self.file.write_text(cluster.to_toml())
        self.replica_sets = cluster.replica_sets(shard_address)

    def partition(self, node: str) -> None:
        self.net.link_down(self.hosts[node])

    def heal(self, node: str) -> None:
        self.net.link_up(self.hosts[node])

    def store(self, replica: Replica) -> Path:
        """The replica's SQLite store (its group's state machine)."""
        name = f"replica-{replica.shard.replace('/', '-')}"
        return self.directory / replica.node / name / "phpmq.sqlite3"

    def log(self, node: str) -> str:
        return (self.directory / f"{node}.log").read_text(errors="replace")

    def _ready_path(self, node: str) -> Path:
        return self.directory / f"{node}.ready"

    # ------------------------------------------------------------------ roles

    def leaders(self) -> dict[str, Replica | None]:
        """Each shard's replica that answers as its leader now (None: none does, or more than
        one: a deposed leader that does not know it yet, while leadership moves)."""
        replicas = [replica for replicas in self.replica_sets.values() for replica in replicas]
        roles = self._ask_probe([replica.address for replica in replicas])
        claimants: dict[str, list[Replica]] = {shard: [] for shard in self.replica_sets}
        for replica, role in zip(replicas, roles, strict=True):
            if role == "leader":
                claimants[replica.shard].append(replica)
        return {shard: one[0] if len(one) == 1 else None for shard, one in claimants.items()}

    def wait_for_leaders(self, timeout: float = 60.0) -> dict[str, Replica]:
        deadline = time.monotonic() + timeout
        while True:
            leaders = self.leaders()
            if all(leaders.values()):
                return leaders  # type: ignore[return-value]
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every shard had a leader within {timeout}s: {leaders}")
            time.sleep(0.2)

    def _ask_probe(self, endpoints: list[str]) -> list[str | None]:
        if self._probe is None or self._probe.poll() is not None:
            self._probe = self.client.popen(
                [sys.executable, AGENT, "probe"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        assert self._probe.stdin is not None and self._probe.stdout is not None
        self._probe.stdin.write(json.dumps(endpoints) + "\n")
        self._probe.stdin.flush()
        return json.loads(self._probe.stdout.readline())

    # ------------------------------------------------------------------ clients

    def agent(self, where: lan.Node, *args: str, **kw: Any) -> subprocess.Popen:
        """tests/replicated_lan_agent.py with `args`, run in `where`."""
        return where.popen([sys.executable, AGENT, *args], **kw)

    def run_agent(self, where: lan.Node, *args: str, timeout: float) -> None:
        done = where.run([sys.executable, AGENT, *args], timeout=timeout, check=False)
        assert done.returncode == 0, f"agent {args[0]} exited with {done.returncode}"

    def start_agent(self, where: lan.Node, *args: str) -> subprocess.Popen:
        """The agent started in `where`, its stdin and stdout pipes of text (the minority
        mode says "ready" once it has started, and goes on at a line on its stdin)."""
        argv = [sys.executable, AGENT, *args]
        return where.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __enter__(self) -> LanCluster:
        try:
            for node in NODE_NAMES:
                self.start(node)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._probe is not None and self._probe.stdin is not None:
            with contextlib.suppress(OSError):
                self._probe.stdin.close()
        for supervisor in self.supervisors.values():
            if supervisor.poll() is None:
                supervisor.terminate()
        for supervisor in self.supervisors.values():
            try:
                supervisor.wait(15)
            except subprocess.TimeoutExpired:
                supervisor.kill()

    def __exit__(self, *_: object) -> None:
        self.stop()
