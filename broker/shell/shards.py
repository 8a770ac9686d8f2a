"""Shards on one host (docs/cluster.md): `phpmq broker --shards N` supervises N broker
processes, each a whole broker (core, store in its own sub-directory of --data-dir) that owns
the queues the cluster map gives it (protocol/cluster.py).

Shard i binds the --bind address with its port + i, so shard 0 answers at the address users
give; with --metrics-bind, shard i serves its own /metrics at that port + i (port 0: each at a
free port of its own). Every shard knows the map and tells HELLO peers (they go to the owner
themselves). The supervisor restarts a shard that dies, after a pause that doubles while it
keeps dying, with its durable data; on SIGTERM/SIGINT it asks every shard to drain and stop,
and waits.

A shard never outlives its supervisor: it watches multiprocessing's pipe from its parent, which
reads end-of-file once the parent is gone (even by kill -9), and then drains and stops as on
SIGTERM. A new supervisor waits for such shards to let go of their ports before it starts its
own, rather than restarting shards that cannot bind.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from ...protocol.cluster import ClusterMap, Shard, decode_map, encode_map
from ..config import BrokerConfig
from . import membership
from .cluster_file import read_cluster_file
from .membership import replica_configs
from .shard_addresses import advertised, shard_address, shard_metrics_bind

if TYPE_CHECKING:
    from .replication import ReplicaGroup

log = logging.getLogger("phpmq.shards")

#: How often the supervisor looks at its shards.
POLL_S = 0.2
#: A shard that died waits this long before its restart, doubled while it keeps dying.
FIRST_RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 30.0
#: A shard that ran this long before dying starts again with the first delay.
STABLE_AFTER_S = 10.0
#: After the drain grace, how long a shard may take to exit before it is killed.
EXIT_MARGIN_S = 5.0
#: How often a new supervisor looks whether an earlier shard still holds a port.
PORT_POLL_S = 0.1
#: The supervisor's log line for each start of a shard: what tools read its pids from.
_STARTED = re.compile(r"shard (\S+) started \(pid (\d+)\)")


def started_pids(log_text: str) -> dict[str, int]:
    """Each shard's latest pid, from the supervisor's log ("shard NAME started (pid N)")."""
    return {name: int(pid) for name, pid in _STARTED.findall(log_text)}


def cluster_map(config: BrokerConfig, node: str = "local") -> ClusterMap:
    shards = tuple(
        Shard(f"{node}/{index}", advertised(shard_address(config.bind, index)))
        for index in range(config.shard_count())
    )
    return ClusterMap(1, shards)


def shard_configs(config: BrokerConfig) -> list[BrokerConfig]:
    """This host's shards' own settings: endpoint, store, name and the map. The raw TCP
    endpoint for stock PHPMQ clients is shard 0's (forwarding takes them everywhere).

    Raises:
        ValueError: a bad --bind address, cluster file or node name.
    """
    if config.cluster_file:
        cluster = read_cluster_file(config.cluster_file)
        node = cluster.node(config.node)
        if node.left:
            raise ValueError(
                f"node {node.name} has left the cluster (left = true in {config.cluster_file}):"
                " it holds no replica"
            )
        if not config.curve_secret and not config.link_secret:
            raise ValueError(
                "a cluster file needs CURVE (--curve-secret) or a link secret (link_secret in"
                " the TOML file, or PHPMQ_LINK_SECRET), the same on every node: shards take"
                " forwarded messages only from links that prove they are the cluster's"
            )
        if cluster.replicas > 1:
            return replica_configs(config, cluster)
        mapping = cluster.cluster_map(shard_address)
        bind, count = node.address, node.shards
        prefix = f"{node.name}/"
    else:
        mapping = cluster_map(config)
        bind, count, prefix = config.bind, len(mapping.shards), "local/"
    encoded = encode_map(mapping).decode()
    # Links prove themselves with it (without CURVE); one host's shards make one up.
    link_secret = config.link_secret or ("" if config.cluster_file else secrets.token_hex(16))
    # The memory limit is the host's: each shard gets its share of it.
    memory = config.max_memory_bytes // count
    return [
        msgspec.structs.replace(
            config,
            max_memory=memory,
            bind=shard_address(bind, index),
            data_dir=str(Path(config.data_dir) / f"shard-{index}") if config.data_dir else "",
            tcp_bind=config.tcp_bind if index == 0 else "",
            metrics_bind=shard_metrics_bind(config.metrics_bind, index),
            shards=1,
            cluster=encoded,
            shard=f"{prefix}{index}",
            cluster_file="",
            node="",
            link_secret=link_secret,
        )
        for index in range(count)
    ]


#: A replica that stopped leading exits with this, and is started again at once as a follower.
STEPPED_DOWN = 75
#: A replica that left its group (docs/cluster.md "Membership") exits with this: its
#: supervisor forgets it and deletes its store.
LEFT = 76
#: What a shard process runs, imported once by multiprocessing's fork server (an interpreter
#: of its own that runs no thread and opens no ZeroMQ context, so it is safe to fork): each
#: shard, and each restart of one, is a fork of it instead of a new interpreter importing
#: the broker again (about 0.3 s of CPU, and the time a restarted replica takes to come back).
SHARD_MODULES = ["phpmq.broker.shell.server", "phpmq.broker.shell.replication"]


def run_shard(
    config: BrokerConfig, ready: Queue | None = None, control: Queue | None = None
) -> None:
    """A shard process: one whole broker until SIGTERM; once it serves it puts
    (its name, its endpoints) into `ready`. A replica of a replicated shard first waits,
    as a follower, until its group elects it leader."""
    from .server import BrokerError, BrokerServer

    logging.basicConfig(
        level=config.log_level,
        format=f"%(asctime)s %(levelname)s %(name)s [{config.shard}]: %(message)s",
    )
    replica = None
    if config.raft_bind:
        replica = _join_group(config)
        if replica is None:
            return
    try:
        server = BrokerServer(config, replica=replica)
    except BrokerError as exc:
        log.error("%s cannot start: %s", config.shard, exc)
        if replica is not None:
            replica.close()
        raise SystemExit(1) from None
    server.install_signal_handlers()
    server.control = control
    _on_parent_gone(server.request_stop)
    try:
        if ready is None:
            server.run()
        else:
            pid = os.getpid()
            server.run(
                on_ready=lambda endpoints: ready.put((config.shard, {**endpoints, "pid": pid}))
            )
    finally:
        if replica is not None:
            replica.close()
    if replica is not None and replica.removed:
        raise SystemExit(LEFT)
    if server.stepped_down:
        raise SystemExit(STEPPED_DOWN)


def _join_group(config: BrokerConfig) -> ReplicaGroup | None:
    """This replica's place in its shard's Raft group, once its volume has room for the log
    (None: stopped while waiting for it). The group's traffic is authenticated with the link
    secret and the map: replicas started from different cluster files never talk."""
    from .disk import free_and_total, min_free_bytes
    from .replication import ReplicaGroup, wait_for_room

    directory = Path(config.data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    floor = min_free_bytes(config.min_free_disk, free_and_total(directory)[1])
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    if not wait_for_room(directory, floor, stop.is_set):
        return None
    # The shards, not the whole map: a change of membership (a new epoch, replicas moved)
    # keeps the groups talking while the nodes take it one after the other.
    shards = [shard.name for shard in decode_map(config.cluster.encode()).shards]
    digest = hashlib.blake2b(" ".join(shards).encode(), digest_size=16).hexdigest()
    return ReplicaGroup(
        directory,
        config.raft_bind,
        config.raft_peers,
        f"{config.link_secret}/{digest}",
        floor,
        config.raft_role,
        config.raft_candidates,
    )


def _on_parent_gone(stop: Callable[[], None]) -> None:
    """Drain and stop, as on SIGTERM, once the supervisor is gone: the end of multiprocessing's
    pipe from the parent reads end-of-file when the parent's end closes, which the kernel does
    however the parent dies (a parent-death signal would be Linux-only)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        log.warning("the supervisor (pid %s) is gone: stopping", parent.pid)
        stop()

    threading.Thread(target=watch, name="phpmq-parent-watch", daemon=True).start()


def address_in_use(address: str) -> bool:
    """Whether a listening socket holds this tcp://host:port address now (a host ZeroMQ
    resolves by itself, such as an interface name, counts as free: the bind will tell)."""
    parts = urlsplit(address)
    host = None if parts.hostname in (None, "*") else parts.hostname
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host, parts.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, ValueError):
        return False
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as libzmq binds
        try:
            probe.bind(where)
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


class _Slot:
    """One shard: its settings, its process, and when it may be started again."""

    __slots__ = (
        "config",
        "control",
        "delay",
        "endpoints",
        "process",
        "restart_at",
        "started_at",
    )

    def __init__(self, config: BrokerConfig, control: Queue) -> None:
        self.config = config
        #: Its new settings after a change of membership (docs/cluster.md "Membership").
        self.control = control
        self.process: BaseProcess | None = None
        #: Where its latest start listens (BrokerServer.endpoints); empty until it serves.
        self.endpoints: dict[str, str] = {}
        self.started_at = 0.0
        self.restart_at = 0.0
        self.delay = FIRST_RESTART_DELAY_S


class ShardSupervisor:
    def __init__(
        self,
        config: BrokerConfig,
        on_ready: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """`on_ready` gets `endpoints()` once every shard serves, and again after a shard
        that was restarted serves again.

        Raises ValueError for a bad --bind address, cluster file or node name."""
        self._grace = config.grace_seconds
        self._config = config
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(SHARD_MODULES)
        self._slots = [_Slot(shard, self._context.Queue()) for shard in shard_configs(config)]
        self._stopping = False
        self._on_ready = on_ready
        self._reload_requested = False
        #: The cluster file marks this node as left: it stops once its replicas have.
        self._node_left = False
        #: (shard name, endpoints) from each shard once it serves.
        self._ready: Queue = self._context.Queue()
        #: The signal that asked for the first stop.
        self.stopped_by: int | None = None

    def wait_for_addresses(self) -> None:
        """Wait, up to a drain's grace and margin, until no shard's address is held: the
        shards of a supervisor that was killed drain and stop by themselves meanwhile.

        Raises:
            ValueError: an address is still held at the end (another program has it).
        """
        deadline = time.monotonic() + self._grace + EXIT_MARGIN_S
        addresses = [a for slot in self._slots for a in (slot.config.bind, slot.config.tcp_bind)]
        held = [address for address in addresses if address and address_in_use(address)]
        if held:
            log.warning(
                "%s still in use (the shards of an earlier supervisor draining?): waiting up"
                " to %.0f s",
                ", ".join(held),
                deadline - time.monotonic(),
            )
        for address in held:
            while address_in_use(address):
                if time.monotonic() >= deadline:
                    raise ValueError(f"cannot bind {address}: the address is in use")
                time.sleep(PORT_POLL_S)

    def run(self) -> int:
        """Start the shards, keep them running until a signal, stop them; the exit status."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)
        signal.signal(signal.SIGHUP, self._pass_on)
        for slot in self._slots:
            self._start(slot)
        while not self._stopping:
            self._take_ready_reports(POLL_S)
            if self._reload_requested:
                self._reload_requested = False
                self._reload_cluster()
            for slot in list(self._slots):
                self._watch(slot)
        return self._stop_all()

    def _reload_cluster(self) -> None:
        """Take a changed cluster file: start the replicas this node holds now, tell the
        running ones their shard's new replicas, and those no longer held here to leave."""
        if not self._config.cluster_file:
            return
        if self._slots and not any(slot.config.raft_bind for slot in self._slots):
            log.info("without replicas, a changed cluster file takes effect at a restart")
            return
        try:
            cluster = read_cluster_file(self._config.cluster_file)
            change = membership.plan(self._config, cluster, [s.config for s in self._slots])
        except ValueError as exc:
            log.error("the cluster file is not taken: %s", exc)
            return
        self._node_left = cluster.node(self._config.node).left
        by_shard = {slot.config.shard: slot for slot in self._slots}
        for config in change.settings:
            slot = by_shard.get(config.shard)
            if slot is None:
                slot = _Slot(config, self._context.Queue())
                self._slots.append(slot)
                self._start(slot)
                continue
            slot.config = config
            slot.control.put(config)
        log.info(
            "cluster file of epoch %d taken: %d replicas here, %d of them new, %d leaving",
            cluster.epoch,
            len(self._slots),
            change.started,
            change.leaving,
        )

    def endpoints(self) -> dict[str, Any]:
        """Shard 0's endpoints (the address users give) and, under `shards`, every shard's
        with its name and process id."""
        shards = [{"shard": slot.config.shard, **slot.endpoints} for slot in self._slots]
        held = self._slots[0].endpoints if self._slots else {}
        first = {key: value for key, value in held.items() if key != "pid"}
        return {**first, "shards": shards}

    def _take_ready_reports(self, wait: float) -> None:
        """Wait up to `wait` seconds for shards that now serve; tell `on_ready` when all do."""
        by_name = {slot.config.shard: slot for slot in self._slots}
        reported = False
        try:
            while True:
                name, endpoints = self._ready.get(timeout=0 if reported else wait)
                if name in by_name:  # (not a replica that left meanwhile)
                    by_name[name].endpoints = endpoints
                    reported = True
        except queue.Empty:
            pass
        if reported and self._on_ready is not None and all(s.endpoints for s in self._slots):
            self._on_ready(self.endpoints())

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._stopping:  # a second signal: stop at once
            for slot in self._slots:
                if slot.process is not None and slot.process.is_alive():
                    slot.process.kill()
        else:
            self.stopped_by = signum
        self._stopping = True

    def _pass_on(self, signum: int, _frame: object) -> None:
        """SIGHUP: every shard reads its keys and permissions again; a replicated cluster's
        node reads its cluster file again (docs/cluster.md "Membership")."""
        self._reload_requested = True
        for slot in self._slots:
            if slot.process is not None and slot.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid, signum)

    def _start(self, slot: _Slot) -> None:
        process = self._context.Process(
            target=run_shard,
            args=(slot.config, self._ready, slot.control),
            name=slot.config.shard,
            daemon=False,
        )
        process.start()
        slot.process = process
        slot.started_at = time.monotonic()
        log.info(
            "shard %s started (pid %d) on %s", slot.config.shard, process.pid, slot.config.bind
        )

    def _watch(self, slot: _Slot) -> None:
        process = slot.process
        now = time.monotonic()
        if process is not None:
            if process.is_alive():
                return
            ran = now - slot.started_at
            slot.process = None
            slot.endpoints = {}
            if process.exitcode == LEFT:
                self._forget(slot, now)
                return
            if process.exitcode == STEPPED_DOWN:
                # Not a crash: a replica that stopped leading (or must rebuild its store)
                # rejoins its group as a follower at once.
                log.info("replica %s stepped down: starting it again", slot.config.shard)
                slot.restart_at = now
                return
            if ran > STABLE_AFTER_S:
                slot.delay = FIRST_RESTART_DELAY_S
            slot.restart_at = now + slot.delay
            log.warning(
                "shard %s (pid %d) exited with %s after %.1f s: restarting in %.1f s",
                slot.config.shard,
                process.pid,
                process.exitcode,
                ran,
                slot.delay,
            )
            slot.delay = min(slot.delay * 2, MAX_RESTART_DELAY_S)  # if it dies again soon
            return
        if now >= slot.restart_at:
            self._start(slot)

    def _forget(self, slot: _Slot, now: float) -> None:
        """A replica that left its group: its store goes, and a node left with none stops.
        One held here again meanwhile (a later change) starts over, as a new replica."""
        shutil.rmtree(slot.config.data_dir, ignore_errors=True)
        if slot.config.raft_role != "leaving":
            log.info(
                "replica %s left its group but is wanted again: it joins anew", slot.config.shard
            )
            slot.config = msgspec.structs.replace(slot.config, raft_role="joining")
            slot.restart_at = now
            return
        self._slots.remove(slot)
        log.info("replica %s left its group: its store is deleted", slot.config.shard)
        if not self._slots and self._node_left:
            log.info("this node holds no replica any more: it has left the cluster; stopping")
            self._stopping = True

    def _stop_all(self) -> int:
        running = [slot.process for slot in self._slots if slot.process is not None]
        for process in running:
            if process.is_alive() and process.pid is not None:
                process.terminate()  # SIGTERM: the shard drains as a lone broker does
        deadline = time.monotonic() + self._grace + EXIT_MARGIN_S
        for process in running:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("shard %s did not stop in time: killed", process.name)
                process.kill()
                process.join()
        log.info("all %d shards stopped", len(self._slots))
        return 0
