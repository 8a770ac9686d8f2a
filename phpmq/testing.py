"""A real broker for tests and benchmarks: `phpmq broker` in a subprocess on a port of its own.

    from phpmq import Client
    from phpmq.testing import BrokerProcess

    def test_orders_are_queued(tmp_path):
        with BrokerProcess("--max-window", "100", log_path=tmp_path / "broker.log") as broker:
            with Client(broker.address) as client:
                client.send("orders", b"order 17")
            assert broker.stats()["queues"]["orders"]["ready"] == 1

The broker is this Python's `python -m phpmq broker`. It binds `tcp://127.0.0.1:*` (a port the
system gives it, so no other process can race for it) and writes where it listens into a
`--ready-file` once it serves; BrokerProcess waits for that file, written by its own process,
and returns with `address` (and `tcp_address`, `metrics_address`) set from it. Its stdout and
stderr go to `log_path` (by default a temporary file, read back into memory and removed when
the broker stops), and a broker that exits at start-up or is not ready in time raises
BrokerStartError with its log. Leaving the `with` block stops it: SIGTERM, then SIGKILL after
`stop_timeout`. Needs no test framework.

`fork_brokers()` makes every later BrokerProcess a fork of one process that imported the broker
once (phpmq.testing_forks): the same broker, started for a tenth of the CPU, for a suite that
starts many.

`LocalCluster` starts a replicated cluster the same way (docs/cluster.md "Replicated queues"):
one node per loopback address 127.0.0.1, .2, .3, each a supervisor of its replicas.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import zmq

from .client import Client, Curve
from .protocol import admin_commands as cmd
from .protocol.cluster import ClusterMap, Shard
from .testing_forks import ForkedProcess, forked

__all__ = [
    "ANY_PORT",
    "BrokerProcess",
    "BrokerStartError",
    "LocalCluster",
    "fork_brokers",
    "free_port",
    "free_ports",
    "process_state",
]

#: A loopback endpoint on a port the system picks when the broker binds (ZeroMQ's `*`).
ANY_PORT = "tcp://127.0.0.1:*"
#: How often start-up looks for the ready file.
READY_POLL_S = 0.01
#: Where free_ports looks when the system does not say where its ephemeral ports start.
LOWEST_PICKED_PORT = 10_000
EPHEMERAL_START_DEFAULT = 32_768


def process_state(pid: int) -> str:
    """The process's state letter from /proc (R, S, D, T, t, Z, ...); "X": no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat.rpartition(")")[2].split()[0]


def _stopped(pid: int, deadline: float) -> bool:
    """Wait for a process sent SIGSTOP to be stopped: True once it is, False if it is gone
    (exited, or a zombie) or still runs at `deadline`."""
    while True:
        state = process_state(pid)
        if state in "Tt":
            return True
        if state in "XZ" or time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for what must know its port before
    it binds: a broker that comes back at the same address after a restart, a cluster file,
    an address where nothing should answer. A broker that needs none of that takes ANY_PORT.

    It is picked below the system's ephemeral range, which the ports the system gives for
    port 0 and for outgoing connections come from: no connection can take it meanwhile, and
    a client reconnecting to it while nothing listens cannot connect to itself. Only another
    such pick can race for it."""
    return _free_run(1)


def free_ports(count: int) -> str:
    """A loopback address whose port and the `count - 1` after it were free a moment ago: for
    a sharded broker (shard i binds port + i, and every shard is told all the addresses before
    any starts). Picked as free_port is."""
    return f"tcp://127.0.0.1:{_free_run(count)}"


def _free_run(count: int) -> int:
    """The first of `count` consecutive ports that can all be bound, below the ephemeral range
    (in this pytest-xdist worker's slice of it)."""
    lowest, highest = _picked_range(count)
    while True:
        port = random.randint(lowest, highest)
        try:
            for offset in range(count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + offset))
            return port
        except OSError:
            continue


def _picked_range(count: int) -> tuple[int, int]:
    """Where a run of `count` ports is picked from: below the ephemeral range, and under
    pytest-xdist in the calling worker's own slice of it, so that two workers never race
    for a port (a broker killed and started again on its port found it taken by another
    worker's pick)."""
    lowest, highest = LOWEST_PICKED_PORT, _ephemeral_start() - count
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker[:2] == "gw" and worker[2:].isdigit() and workers.isdigit() and int(workers) > 1:
        width = (highest + count - lowest) // int(workers)
        lowest += int(worker[2:]) % int(workers) * width
        highest = lowest + width - count
    return lowest, highest


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_START_DEFAULT


#: Whether BrokerProcess forks its brokers from a process that imported the broker once
#: (phpmq.testing_forks) instead of starting `python -m phpmq broker` each time.
_fork_brokers = False


def fork_brokers(on: bool = True) -> None:
    """Start every later BrokerProcess by forking it from a process of this one that imported
    the broker once (phpmq.testing_forks): the same command line, environment and log, with
    about 0.01 s of CPU to start instead of 0.13 s. For a suite that starts many brokers on a
    busy machine; the broker then runs as it would, only its start is cheaper."""
    global _fork_brokers
    _fork_brokers = on


class BrokerStartError(RuntimeError):
    """Raised when the broker exits during start-up or is not ready in time; the message
    ends with the broker's log (for a bad flag: its one-line error)."""


class BrokerProcess:
    """A `phpmq broker` subprocess on a loopback port of its own, serving when constructed.

    Args:
        *flags: more `phpmq broker` flags, e.g. "--grace-seconds", "0".
        log_path: file for the broker's stdout and stderr; default: a temporary file.
        address: the ZeroMQ address to bind; default: ANY_PORT. `address` is then where it
            listens (for a restart on the same address, pass the first broker's).
        tcp: also listen for stock PHPMQ clients on plain TCP (`--tcp-bind`) on a port of its
            own: see `tcp_port` and `tcp_address`.
        data_dir: keep messages in this directory (`--data-dir`); default: in memory.
        start_timeout: seconds the broker has to write its ready file.
        curve: keys for a broker started with `--curve-secret` (`client()` uses them).
        stop_timeout: seconds `stop()` waits after SIGTERM before it kills.

    `endpoints` is the broker's ready file (docs/cli.md, `--ready-file`): `bind`, and
    `tcp_bind`, `metrics_bind` and `shards` when on.

    Raises:
        BrokerStartError: the broker exited at start-up or was not ready in time (it is
            killed, and the error carries its log).
    """

    def __init__(
        self,
        *flags: str,
        log_path: str | Path | None = None,
        address: str | None = None,
        tcp: bool = False,
        data_dir: str | Path | None = None,
        start_timeout: float = 20.0,
        stop_timeout: float = 10.0,
        curve: Curve | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.address = address or ANY_PORT
        self.curve = curve
        self.stop_timeout = stop_timeout
        #: The ready file, and the log unless one is given; removed when the broker stops.
        self._scratch = Path(tempfile.mkdtemp(prefix="phpmq-broker-"))
        self._ready_path = self._scratch / "ready.json"
        self._temporary_log = log_path is None
        self.log_path = self._scratch / "broker.log" if log_path is None else Path(log_path)
        self._final_log: str | None = None
        command = [sys.executable, "-m", "phpmq", "broker", "--bind", self.address]
        command += ["--ready-file", str(self._ready_path)]
        if tcp:
            command += ["--tcp-bind", ANY_PORT]
        if data_dir is not None:
            command += ["--data-dir", str(data_dir)]
        self.process: subprocess.Popen[bytes] | ForkedProcess = self._start(command, flags, env)
        try:
            self.endpoints: dict[str, Any] = self._wait_until_ready(start_timeout)
        except BaseException:
            self.kill()
            raise
        self.address = self.endpoints["bind"]
        self.tcp_address: str | None = self.endpoints.get("tcp_bind")
        self.tcp_port = None if self.tcp_address is None else _port(self.tcp_address)
        #: Where /metrics is served (host:port) with `--metrics-bind`, else None.
        self.metrics_address: str | None = self.endpoints.get("metrics_bind")

    def _start(
        self, command: list[str], flags: tuple[str, ...], env: dict[str, str] | None
    ) -> subprocess.Popen[bytes] | ForkedProcess:
        """The broker's process: forked (`fork_brokers`) where the environment allows it."""
        if _fork_brokers:
            whole_environment = {**os.environ, **(env or {})}
            process = forked([*command[3:], *flags], whole_environment, str(self.log_path))
            if process is not None:
                return process
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of it
            return subprocess.Popen(
                [*command, *flags],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if env is None else {**os.environ, **env},
            )

    def _wait_until_ready(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            endpoints = self._ready_file()
            if endpoints is not None:
                return endpoints
            code = self.process.poll()
            if code is not None:
                raise BrokerStartError(
                    f"the broker exited at start-up (status {code}); its log:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"the broker was not ready within {timeout}s; its log:\n{self.log()}"
                )
            time.sleep(READY_POLL_S)

    def ready_endpoints(self) -> dict[str, Any] | None:
        """The ready file as the broker wrote it last (a supervisor writes it again when a
        shard it restarted serves again); None: not there."""
        return self._ready_file()

    def _ready_file(self) -> dict[str, Any] | None:
        """The ready file's endpoints once this process wrote it (it is renamed into place
        whole: never read half-written)."""
        try:
            endpoints = json.loads(self._ready_path.read_text())
        except FileNotFoundError:
            return None
        return endpoints if endpoints.get("pid") == self.process.pid else None

    def client(self, **options: Any) -> Client:
        """A new client of this broker; `options` are Client's keyword arguments."""
        return Client(self.address, **{"curve": self.curve, **options})

    def stats(self) -> dict[str, Any]:
        """The broker's `stats` answer, through a client opened for this call."""
        with self.client(name="phpmq-testing", close_timeout=1) as client:
            return client.admin(cmd.STATS)

    def wait_draining(self, timeout: float = 5.0) -> None:
        """Wait until the broker reports that it is draining (after a first SIGTERM)."""
        deadline = time.monotonic() + timeout
        while not self.stats()["draining"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the broker did not start draining within {timeout}s")
            time.sleep(0.02)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 20.0) -> int:
        """Wait for the broker to exit by itself; its exit status."""
        return self.process.wait(timeout)

    def log(self) -> str:
        """Everything the broker wrote so far."""
        if self._final_log is not None:
            return self._final_log
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM (the broker drains), SIGKILL after `stop_timeout`; its exit status.

        Stopping a stopped broker does nothing more."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._forget_temporary_log()
        return self.process.returncode

    def kill(self) -> int:
        """SIGKILL, as a crash: no drain, nothing flushed; its exit status."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._forget_temporary_log()
        return self.process.returncode

    def _forget_temporary_log(self) -> None:
        if self._temporary_log and self._final_log is None:
            self._final_log = self.log_path.read_text(errors="replace")
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<BrokerProcess {self.address} pid={self.process.pid}>"


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


#: A replica's Raft port in a LocalCluster: its broker port plus this.
RAFT_PORT_OFFSET = 1000


class LocalCluster:
    """A cluster of `nodes` nodes on 127.0.0.1, .2, ..., each with one shard of its own and
    `replicas` replicas of every shard, their stores in `directory`/NODE and their logs in
    `directory`/NODE.log. Nodes start with `start()` (all of them in `with`)."""

    def __init__(
        self,
        directory: str | Path,
        nodes: int = 3,
        replicas: int = 3,
        link_secret: str = "phpmq-local-cluster",
        flags: tuple[str, ...] = ("--grace-seconds", "1"),
        spare: int = 0,
    ) -> None:
        """`spare`: nodes that may join later (`join`), on the next loopback addresses."""
        from .broker.shell.cluster_file import read_cluster_file
        from .broker.shell.shards import shard_address

        self.directory = Path(directory)
        self.names = [chr(ord("a") + index) for index in range(nodes)]
        self._spare = [chr(ord("a") + index) for index in range(nodes, nodes + spare)]
        self.port = _free_on_hosts(nodes + spare, nodes + spare)
        self.file = self.directory / "cluster.toml"
        lines = [f"replicas = {replicas}", f"raft_port_offset = {RAFT_PORT_OFFSET}"]
        for name in self.names:
            lines += ["[[nodes]]", f'name = "{name}"', f'address = "{self.address(name)}"']
        self.file.write_text("\n".join(lines) + "\n")
        #: Each shard's replicas (broker/shell/cluster_file.py Replica), its home's first.
        self.replica_sets = read_cluster_file(str(self.file)).replica_sets(shard_address)
        self.map = ClusterMap(1, tuple(Shard(name, "") for name in self.replica_sets))
        self.nodes: dict[str, BrokerProcess] = {}
        self._env = {"PHPMQ_LINK_SECRET": link_secret}
        self._flags = flags

    def address(self, node: str) -> str:
        """Where node `node` answers: its first shard's home replica."""
        return f"tcp://127.0.0.{(self.names + self._spare).index(node) + 1}:{self.port}"

    def join(self, node: str) -> BrokerProcess:
        """`phpmq cluster join` of a spare node (docs/cluster.md "Membership"): the file
        gets it, the node starts, and every other node reads the file again (SIGHUP)."""
        from .broker.shell.cluster_file import read_cluster_file

        self._spare.remove(node)
        self.names.append(node)
        cluster = read_cluster_file(str(self.file)).with_node_joined(node, self.address(node))
        self._rewrite(cluster)
        broker = self.start(node)
        self.reload()
        return broker

    def leave(self, node: str) -> None:
        """`phpmq cluster leave`: the file marks the node as left, every node reads it again."""
        from .broker.shell.cluster_file import read_cluster_file

        self._rewrite(read_cluster_file(str(self.file)).with_node_left(node))
        self.reload()

    def reload(self) -> None:
        """SIGHUP to every running node's supervisor: it reads the cluster file again."""
        for broker in self.nodes.values():
            if broker.process.poll() is None:
                broker.process.send_signal(signal.SIGHUP)

    def _rewrite(self, cluster: Any) -> None:
        from .broker.shell.shards import shard_address

        self.file.write_text(cluster.to_toml())
        self.replica_sets = cluster.replica_sets(shard_address)

    def start(
        self, node: str, cluster_file: Path | None = None, env: dict[str, str] | None = None
    ) -> BrokerProcess:
        """Start node `node` (with another cluster file than the cluster's, if given, and
        more environment variables)."""
        broker = self.nodes[node] = BrokerProcess(
            "--cluster-file",
            str(cluster_file or self.file),
            "--node",
            node,
            *self._flags,
            address=self.address(node),
            data_dir=self.directory / node,
            log_path=self.directory / f"{node}.log",
            start_timeout=60,
            env={**self._env, **(env or {})},
        )
        return broker

    def stop(self) -> None:
        """Stop every node, all at once (each drains and stops its replicas)."""

        def stop_node(broker: BrokerProcess) -> None:
            with contextlib.suppress(Exception):
                broker.stop()

        _each_at_once(stop_node, list(self.nodes.values()))

    def log(self, node: str) -> str:
        return (self.directory / f"{node}.log").read_text(errors="replace")

    def queue_of(self, shard: str, index: int = 0) -> str:
        """The `index`-th queue name (q0, q1, ...) that `shard` owns."""
        owned = (f"q{i}" for i in range(100_000) if self.map.owner(f"q{i}").name == shard)
        for _ in range(index):
            next(owned)
        return next(owned)

    def replication(self, replica: Any) -> dict[str, Any] | None:
        """The replica's own `replication` figures (docs/protocol.md §9 `stats` with `here`);
        None: no answer. (Asked on a bare socket: a client would follow a follower to its
        leader.)"""
        from . import protocol

        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.linger = 0
        try:
            sock.connect(replica.address)
            options = {"command": cmd.STATS, "here": True, "limit": 0}
            sock.send(protocol.encode(protocol.Admin(options)))
            if not sock.poll(2000):
                return None
            messages, _ = protocol.decode_frame(sock.recv())
        finally:
            sock.close()
        for message in messages:
            if isinstance(message, protocol.AdminReply):
                return message.options.get("replication")
        return None

    def role(self, replica: Any) -> str | None:
        """What the replica says it is ("leader", "follower"); None: no answer."""
        figures = self.replication(replica)
        return None if figures is None else figures.get("role")

    def leader(self, shard: str) -> Any:
        """The replica leading `shard` now (None: none answers as leader)."""
        for replica in self.replica_sets[shard]:
            if self.role(replica) == "leader":
                return replica
        return None

    def wait_for_leaders(self, timeout: float = 60.0, at_home: bool = False) -> dict[str, Any]:
        """Each shard's leader, once every shard has one (`at_home`: its home replica)."""
        deadline = time.monotonic() + timeout
        while True:
            leaders = {shard: self.leader(shard) for shard in self.replica_sets}
            if all(
                leader is not None and (not at_home or leader == self.replica_sets[shard][0])
                for shard, leader in leaders.items()
            ):
                return leaders
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every shard had a leader within {timeout}s: {leaders}")
            time.sleep(0.2)

    def wait_settled(self, shard: str, timeout: float = 60.0) -> Any:
        """The shard's leader once every replica of it answers, one as the leader and the
        others as followers (a replica that handed leadership on exits and comes back as
        a follower: waited for)."""
        deadline = time.monotonic() + timeout
        while True:
            roles = [self.role(replica) for replica in self.replica_sets[shard]]
            if roles.count("leader") == 1 and roles.count("follower") == len(roles) - 1:
                return self.replica_sets[shard][roles.index("leader")]
            if time.monotonic() > deadline:
                raise TimeoutError(f"shard {shard} did not settle within {timeout}s: {roles}")
            time.sleep(0.2)

    def pid(self, replica: Any, timeout: float = 10.0) -> int:
        """The process id of the replica's latest start (its node's ready file, which the
        supervisor writes again once a restarted replica serves: waited for, up to
        `timeout`, while the file still names a process that is gone or a zombie: one that
        exited and that its supervisor has not reaped yet, which no signal reaches)."""
        deadline = time.monotonic() + timeout
        while True:
            endpoints = self.nodes[replica.node].ready_endpoints() or {}
            for shard in endpoints.get("shards", []):
                if shard["shard"] == replica.shard and process_state(shard["pid"]) not in "XZ":
                    return int(shard["pid"])
            if time.monotonic() > deadline:
                raise LookupError(f"replica of {replica.shard} on {replica.node} is not serving")
            time.sleep(0.05)

    def signal(self, replica: Any, signum: int, timeout: float = 10.0) -> None:
        """Send `signum` to the replica's process. SIGSTOP returns once the process is
        stopped; if it exited first (a replica that handed leadership on restarts), the
        signal goes to its next start."""
        deadline = time.monotonic() + timeout
        while True:
            pid = self.pid(replica, timeout=max(deadline - time.monotonic(), 0.0))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
                if signum != signal.SIGSTOP:
                    return
                if _stopped(pid, deadline):
                    return
            if time.monotonic() > deadline:
                raise LookupError(f"replica of {replica.shard} on {replica.node} did not stop")

    def kill_node(self, node: str) -> None:
        """kill -9 the node's supervisor and every replica process of it at once: the host
        died (restart it with `start`)."""
        broker = self.nodes[node]
        endpoints = broker.ready_endpoints() or {}
        for shard in endpoints.get("shards", []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(shard["pid"]), signal.SIGKILL)
        broker.kill()

    def __enter__(self) -> LocalCluster:
        """Every node started, all at once: a node's start (its supervisor and replicas
        importing the broker) is seconds of waiting that need not follow the others'."""
        try:
            _each_at_once(self.start, self.names)
        except BaseException:
            self.stop()
            raise
        self.nodes = {name: self.nodes[name] for name in self.names}  # in the nodes' order
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


T = TypeVar("T")


def _each_at_once(work: Callable[[T], object], items: list[T]) -> None:
    """`work(item)` for each item, in threads of their own; raises the first item's error
    once all are done."""
    with ThreadPoolExecutor(max_workers=max(len(items), 1)) as pool:
        for _ in pool.map(work, items):
            pass


def _free_on_hosts(hosts: int, count: int) -> int:
    """A port free with the `count - 1` after it, and their Raft ports, on 127.0.0.1 to
    127.0.0.`hosts`."""
    highest = _ephemeral_start() - count - RAFT_PORT_OFFSET
    while True:
        port = random.randint(LOWEST_PICKED_PORT, highest)
        if all(
            _bindable(f"127.0.0.{host}", port + offset + raft)
            for host in range(1, hosts + 1)
            for offset in range(count)
            for raft in (0, RAFT_PORT_OFFSET)
        ):
            return port


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
