"""The server loop around the core: the only broker module, with its transports, that touches
sockets or reads the clock. Each loop turn polls, reads what is readable within the turn's
budget (up to `batch_frames` per transport and `turn_budget_ms` in all, the transports in
alternating slices), runs the core, commits the turn's journal (durable mode), and sends each
peer one frame holding everything the core has for it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
import zmq

from ...protocol import admin_commands as cmd
from ...protocol.cluster import decode_map
from ..build import hot_path
from ..clock import Clock, SystemClock
from ..config import BrokerConfig
from ..core import Core, Turn
from ..journal import Journal, NullJournal
from .clock_watch import ClockWatch
from .durable import DurableStore, StorageError
from .keeper import StoreKeeper
from .leadership import ReplicaAdmin
from .loop_stats import Backlog, LoopStats
from .replicated_turns import ReplicatedTurns
from .security import Security, SecurityError
from .transports import RouterTransport, TcpEndpoint
from .transports.links import Links

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    from .metrics import MetricsExporter
    from .replication import ReplicaGroup

log = logging.getLogger("phpmq.broker")

#: Longest poll (a stop request or a signal wakes the poll at once through the server's
#: waker socket: pyzmq resumes a poll a signal interrupted).
MAX_POLL_MS = 250
#: How long frames already queued may still leave once the broker exits.
CLOSE_LINGER_MS = 500
#: Poll timeout while libzmq refuses frames for a slow peer (its high-water mark is reached).
BACKLOG_RETRY_MS = 5
#: Poll timeout while the store has free pages to give back (one slice per idle turn).
RECLAIM_POLL_MS = 5
#: Frames a transport reads before the other gets its turn: neither endpoint starves the other.
READ_SLICE = 32


class BrokerError(Exception):
    """Raised when the broker cannot start (e.g. the bind address is taken)."""


class BrokerServer:
    def __init__(
        self, config: BrokerConfig, clock: Clock | None = None, replica: ReplicaGroup | None = None
    ) -> None:
        """`replica`: this broker leads a replicated shard (docs/cluster.md "Replicated
        queues"): its store is the group's, and what a turn changes is confirmed once the
        group committed it."""
        self.config = config
        self.clock = clock or SystemClock()
        self._stop_requests = 0
        #: A stop request writes to the waker: the loop's poll, which polls the other end,
        #: returns at once instead of at its timeout.
        self._stop_woken, self._stop_waker = socket.socketpair()
        self._stop_woken.setblocking(False)
        self._stop_waker.setblocking(False)
        self._signals_wake = False
        #: The signal that asked for the first stop (None: none did).
        self.stopped_by: int | None = None
        self._reload_requested = False
        #: Where a replica's supervisor puts its new settings after a change of membership
        #: (docs/cluster.md "Membership"), looked at once a second.
        self.control: Queue | None = None
        self._control_checked = 0.0
        self._context = zmq.Context()
        try:
            self.security = Security(config)
        except SecurityError as exc:
            self._context.term()
            raise BrokerError(str(exc)) from None
        self.security.start(self._context)  # before the bind: libzmq asks it from the start
        try:
            self.router = RouterTransport(self._context, config, self.security.keys)
        except zmq.ZMQError as exc:
            self.security.stop()
            self._context.term()
            raise BrokerError(f"cannot bind {config.bind}: {exc}") from None
        self.security.watch(self.router.socket)
        self.endpoint = self.router.endpoint
        #: The store, and what keeps it writing as disk space comes and goes.
        self.keeper: StoreKeeper | None = None
        self.store: DurableStore | None = None
        self.replicated: ReplicatedTurns | None = None
        #: Set when this replica stopped leading its group: the process exits to rejoin it.
        self.stepped_down = False
        if replica is not None:
            self.store = replica.store
            self.replicated = ReplicatedTurns(
                replica, config.replica_endpoints, config.raft_preferred
            )
            self._replica = replica
            self._replica_poller = zmq.Poller()
            self._replica_poller.register(replica.wake_fd, zmq.POLLIN)
            self._replica_poller.register(self._stop_woken, zmq.POLLIN)
        elif config.data_dir:
            try:
                self.keeper = StoreKeeper(config)
            except StorageError as exc:
                self._close_sockets()
                raise BrokerError(str(exc)) from None
            self.store = self.keeper.store
        #: The store this loop writes itself (a replica's is written by its Raft thread,
        #: which also gives its free pages back, a slice per commit).
        self._own_store = self.store if self.replicated is None else None
        journal = Journal() if self.store is not None else NullJournal()
        self.core = Core(config, self.clock, journal=journal)
        self.security.apply(self.core)
        #: The Prometheus exporter (--metrics-bind), served once everything is open.
        self.metrics: MetricsExporter | None = None
        if self.replicated is not None:
            # A follower until elected: its store follows the leader's, loaded once elected.
            self.core.set_standby(self._standby_reason(), None)
            self._replica_admin = ReplicaAdmin(replica, self.replicated, config)
            self._replica_admin.register(self.core.admin)
            store = replica.store
            self.core.admin.stats.add_section(
                "storage", lambda: {"mode": "replicated", **store.stats()}
            )
        elif self.store is not None:
            self._recover(self.store)
        self.tcp: TcpEndpoint | None = None
        if config.tcp_bind:
            try:
                self.tcp = TcpEndpoint(
                    self._context,
                    config.tcp_bind,
                    config.max_content_bytes,
                    ttl_form=config.tcp_dialect == "ttl",
                    networks=config.tcp_networks(),
                )
            except zmq.ZMQError as exc:
                self._close_sockets()
                raise BrokerError(f"cannot bind {config.tcp_bind}: {exc}") from None
        #: Frames libzmq would not take yet, per peer, sent in order before anything newer.
        self._backlog: dict[bytes, Backlog] = {}
        #: The transports, read in this order in alternating slices.
        self._sources: list[RouterTransport | TcpEndpoint | Links] = [self.router]
        if self.tcp is not None:
            self._sources.append(self.tcp)
        #: A shard's links to the other shards (forwarding, docs/cluster.md).
        self.links: Links | None = None
        self._polled_links: list[zmq.Socket] = []
        if self.core.forwarding is not None:
            self.links = Links(self._context, config, self.core, self.security.keys)
            self._sources.append(self.links)
        self._budget_s = config.turn_budget_ms / 1000
        #: Whether the last turn left frames unread (its budget ran out).
        self._input_pending = False
        self._loop = LoopStats()
        self._clock_watch = ClockWatch()
        self._reclaim_failing = False
        self.core.admin.stats.add_section("server", self.stats)
        if self.links is not None:
            self.core.admin.stats.add_section("cluster", self._cluster_stats)
        if config.metrics_bind:
            self.metrics = self._serve_metrics()

    def _serve_metrics(self) -> MetricsExporter:
        from .metrics import MetricsExporter  # prometheus-client loads only when asked for

        try:
            return MetricsExporter(
                self.config.metrics_bind,
                lambda: self.core.admin.run({"command": cmd.STATS}),
                self.config.shard,
            )
        except OSError as exc:
            # Everything opened so far closes, or the context's term() would wait for it.
            if self.links is not None:
                self.links.close()
            if self.tcp is not None:
                self.tcp.shutdown()
            if self.keeper is not None:
                self.keeper.close()
            self._close_sockets()
            raise BrokerError(
                f"cannot serve metrics on {self.config.metrics_bind}: {exc}"
            ) from None

    def _cluster_stats(self) -> dict[str, object]:
        assert self.core.forwarding is not None and self.links is not None
        return {**self.core.forwarding.stats(), "links": self.links.stats()}

    def _close_sockets(self) -> None:
        self.router.close(0)
        self.security.stop()
        self._context.term()

    def _recover(self, store: DurableStore) -> None:
        started = time.monotonic()
        try:
            messages, dead = store.load()
            purged_seqs = store.load_purged_seqs()
            keys = store.load_keys()
            holds = store.load_holds()
            bindings, unused = store.load_bindings()
            schedules = store.load_schedules()
        except StorageError as exc:
            if self.replicated is None:
                self._close_sockets()
            raise BrokerError(str(exc)) from None
        store.read_done()
        core = self.core
        if self.keeper is not None:
            core.admin.stats.add_section("storage", self.keeper.stats)
        ready, were_in_flight, dead_count = core.restore(messages, dead, purged_seqs)
        key_count = core.restore_keys(keys, holds)
        binding_count = core.restore_bindings(bindings, unused)
        schedule_count = core.restore_schedules(schedules)
        self._commit()
        log.info(
            "recovered %d messages (%d were in flight: back as ready, delivery count +1),"
            " %d dead letters, %d idempotency keys, %d bindings and %d schedules in %d queues"
            " from %s in %.0f ms",
            ready,
            were_in_flight,
            dead_count,
            key_count,
            binding_count,
            schedule_count,
            len(core.queues),
            store.directory,
            (time.monotonic() - started) * 1000,
        )

    def _standby_reason(self) -> str:
        return f"this broker is a follower replica of shard {self.config.shard}"

    def _promote(self) -> None:
        """Elected, with every committed batch in the store: load it and serve the shard."""
        assert self.store is not None and self.replicated is not None
        log.info("this replica leads shard %s now: loading its store", self.config.shard)
        try:
            self._recover(self.store)
        except BrokerError as exc:
            self.replicated.lost = f"the store could not be loaded: {exc}"
            return
        self.core.serve_own_shard()
        if self.links is not None:
            self.links.retire(self.config.shard)

    def _commit_and_send(self, turn: Turn) -> None:
        """Commit the turn, then send: what goes out is on disk. CONFIRMs go out only after
        a commit that succeeded; the rest of the turn goes out either way, so consumers are
        served while the store fails."""
        if self.replicated is not None:
            # Dispatches and the rest go now; what says something is stored (CONFIRMs, the
            # answers of commands that changed it) waits for its batch (replicated_turns.py).
            self._send(turn.frames)
            held = self.core.release_confirms()
            self._send(self.replicated.add(self.core.journal.take(), held))
        else:
            committed = self._commit()
            self._send(turn.frames)
            if committed:
                self._send(self.core.release_confirms())
        if self.links is not None and turn.forwards:
            self.links.send(turn.forwards)
        # A TCP peer the broker gave up on (silent) loses its connection too, or it would
        # later read dispatches of messages already taken back.
        self._close(turn.close)

    def _close(self, peer_ids: list[bytes]) -> None:
        if self.tcp is not None:
            for peer_id in peer_ids:
                self.tcp.close_peer(peer_id)

    def _commit(self) -> bool:
        """One transaction and one fsync for everything the turn changed (group commit).
        While the store cannot write, or the disk is under its floor, sends are refused
        (507); what could not be written is kept and written first when it can again;
        consumers are served meanwhile (broker/keeper.py). Returns False while something is
        left unwritten."""
        keeper, core = self.keeper, self.core
        if self.replicated is not None:
            self._send(self.replicated.add(core.journal.take(), core.release_confirms()))
            return self.replicated.idle
        if keeper is None:
            return True
        commits = keeper.store.commits
        committed = keeper.commit(core.journal.take() if core.journal else [])
        if self.metrics is not None and keeper.store.commits != commits:
            self.metrics.commit_took(keeper.store.last_commit_ms / 1000)
        problem = keeper.problem
        if problem != core.storage_problem:
            core.set_storage_problem(problem)
        return committed

    # ------------------------------------------------------------------ control

    def request_stop(self, signum: int | None = None) -> None:
        """First call: drain gracefully. Second call: stop at once. Safe from signal handlers."""
        if self.stopped_by is None:
            self.stopped_by = signum
        with contextlib.suppress(OSError):  # full: the loop is woken already; closed: it ended
            self._stop_waker.send(b"\0")
        self._stop_requests += 1

    def _empty_waker(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: empty
            while self._stop_woken.recv(4096):
                pass

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda number, _: self.request_stop(number))
            signal.signal(signal.SIGHUP, lambda *_: self.request_reload())
            # A signal may land in another thread (ZAP, Raft): the main thread's poll then
            # goes on to its timeout unless the signal itself wakes it.
            signal.set_wakeup_fd(self._stop_waker.fileno(), warn_on_full_buffer=False)
            self._signals_wake = True

    def request_reload(self) -> None:
        """Read the client keys and permissions again (SIGHUP), at the next turn."""
        self._reload_requested = True

    def _take_new_settings(self) -> None:
        """A replica's new settings from its supervisor, if any (at most once a second)."""
        assert self.control is not None
        now = time.monotonic()
        if now < self._control_checked + 1.0:
            return
        self._control_checked = now
        settings = None
        with contextlib.suppress(queue.Empty, OSError, EOFError):
            while True:
                settings = self.control.get_nowait()
        if settings is not None:
            self.apply_membership(settings)

    def apply_membership(self, config: BrokerConfig) -> None:
        """A replica's settings after a change of membership (docs/cluster.md "Membership"):
        the new map and its shard's replicas; its leader adds and removes them."""
        if self.replicated is None:
            return
        log.info(
            "the cluster map's epoch %s: shard %s has the replicas %s%s",
            msgspec.json.decode(config.cluster).get("epoch"),
            config.shard,
            ", ".join(sorted(config.replica_nodes.get(raft, raft) for raft in config.raft_peers)),
            "; this one leaves" if config.raft_role == "leaving" else "",
        )
        self.config = config
        self.core.set_cluster(config.cluster, config.shard)
        if self.links is not None:
            self.links.set_map(decode_map(config.cluster.encode()))
        self.replicated.set_replicas(config.replica_endpoints, config.raft_preferred)
        self._replica_admin.set_replicas(config.replica_endpoints, config.replica_nodes)
        self._replica.set_members(config.raft_peers, leaving=config.raft_role == "leaving")

    # ------------------------------------------------------------------ loop

    def endpoints(self) -> dict[str, str]:
        """Where this broker really listens, by setting: `bind`, and `tcp_bind` and
        `metrics_bind` when on. A `*` port in `bind` or `tcp_bind`, or port 0 in
        `metrics_bind`, is here the port the system gave."""
        endpoints = {"bind": self.endpoint}
        if self.tcp is not None:
            endpoints["tcp_bind"] = self.tcp.endpoint
        if self.metrics is not None:
            endpoints["metrics_bind"] = self.metrics.address
        return endpoints

    def run(self, on_ready: Callable[[dict[str, str]], None] | None = None) -> None:
        """Serve until stopped; `on_ready` gets `endpoints()` once every socket is open,
        before the first turn."""
        if self.store is None:
            log.info(
                "phpmq broker listening on %s (in memory: queued messages do not survive a"
                " restart; --data-dir keeps them)",
                self.endpoint,
            )
        else:
            log.info("phpmq broker listening on %s (durable: %s)", self.endpoint, self.store.path)
        log.info("hot path: %s (docs/performance.md)", hot_path())
        if self.tcp is not None:
            log.info("raw TCP endpoint for stock PHPMQ clients on %s", self.tcp.endpoint)
        poller = zmq.Poller()
        poller.register(self.router.socket, zmq.POLLIN)
        poller.register(self._stop_woken, zmq.POLLIN)
        if self.tcp is not None:
            poller.register(self.tcp.socket, zmq.POLLIN)
        if self.replicated is not None:
            poller.register(self._replica.wake_fd, zmq.POLLIN)
        drain_deadline: float | None = None
        try:
            if on_ready is not None:
                on_ready(self.endpoints())
            while True:
                if self.replicated is not None and self.replicated.lost is not None:
                    self.stepped_down = True
                    break
                if self._stop_requests >= 2:
                    log.warning("second stop signal: exiting without waiting for acks")
                    break
                if self._stop_requests == 1 and drain_deadline is None:
                    self._empty_waker()
                    drain_deadline = time.monotonic() + self.config.grace_seconds
                    self.core.begin_turn()
                    self.core.start_drain()
                    self._commit_and_send(self.core.end_turn())  # the DISCONNECTs go out now
                    log.info(
                        "stopping: no new sends; waiting up to %.1fs for %d unacked messages",
                        self.config.grace_seconds,
                        self.core.in_flight,
                    )
                if drain_deadline is not None and (
                    self.core.in_flight == 0 or time.monotonic() >= drain_deadline
                ):
                    break
                if self._reload_requested:
                    self._reload_requested = False
                    self._empty_waker()
                    self.security.reload(self.core)
                if self.control is not None:
                    self._take_new_settings()
                self._clock_watch.look()
                self._turn(poller)
        finally:
            self._report_losses()
            if self.metrics is not None:
                self.metrics.close()
            if self.links is not None:
                self.links.close()
            # A moment for the last frames (DISCONNECTs, final acks' effects) to leave.
            self.router.close(CLOSE_LINGER_MS)
            if self.tcp is not None:
                self.tcp.shutdown()
            self.security.stop()
            self._context.term()
            if self._signals_wake:
                signal.set_wakeup_fd(-1)
            self._stop_woken.close()
            self._stop_waker.close()

    def _turn(self, poller: zmq.Poller) -> None:
        links = self.links
        if links is not None and links.sockets_changed:
            for sock in self._polled_links:
                poller.unregister(sock)
            self._polled_links = links.sockets
            for sock in self._polled_links:
                poller.register(sock, zmq.POLLIN)
        replicated = self.replicated
        if replicated is not None and replicated.held_back:
            # Input waits for the group (replicated_turns.py): only its news is awaited.
            poller = self._replica_poller
        readable = poller.poll(self._poll_timeout_ms())
        started = time.perf_counter()
        core = self.core
        core.begin_turn()
        if replicated is not None:
            self._send(replicated.on_events())
            if replicated.take_promotion():
                self._promote()
            elif not replicated.leading:
                hint = replicated.leader_endpoint()
                if hint != core.ctx.leader_hint:
                    core.set_standby(self._standby_reason(), hint)
            if replicated.held_back:
                readable = []
        pending = self._read() if readable else False
        if pending != self._input_pending:
            self._input_pending = pending
            core.note_input_pending(pending)
        own = self._own_store
        committed = own.commits if own is not None else 0
        self._commit_and_send(core.end_turn())
        if own is not None and own.commits == committed and own.reclaimable:
            # Nothing to write this turn: give free pages back to the file system, one slice.
            self._reclaim(own)
        if self._backlog:
            self._flush_backlog()
        if self.tcp is not None:
            # Peers given up on while sending (not reading, unreachable) lose their
            # connection in this turn: read again, it would come back as a new peer.
            self._close(self.core.take_closes())
            self.tcp.retry_closes()
        if links is not None:
            links.tick()
        if replicated is not None:
            replicated.tick(time.monotonic())
        took, now = time.perf_counter() - started, time.monotonic()
        self._loop.turn_took(took, now)
        if self.metrics is not None:
            self.metrics.turn_took(took)

    def _read(self) -> bool:
        """Read what is readable within the turn's budget: `batch_frames` per transport and
        `turn_budget_ms` in all, the transports taking turns in slices of READ_SLICE frames
        (the ROUTER itself takes its peers' frames in turn). Returns whether frames were
        left unread because the budget ran out."""
        core = self.core
        deadline = time.perf_counter() + self._budget_s
        sources = self._sources
        left = [self.config.batch_frames] * len(sources)
        drained = [False] * len(sources)
        reading = list(range(len(sources)))
        while reading:
            for index in tuple(reading):
                read, drained[index] = sources[index].receive(
                    core, min(READ_SLICE, left[index]), deadline
                )
                left[index] -= read
                if drained[index] or not left[index]:
                    reading.remove(index)
            if time.perf_counter() >= deadline:
                break
        pending = any(
            not drained[index] and source.has_input() for index, source in enumerate(sources)
        )
        if pending:
            self._loop.turns_cut += 1
        return pending

    def _reclaim(self, store: DurableStore) -> None:
        try:
            store.reclaim()
        except StorageError as exc:
            # Housekeeping: retried in the next idle turn, logged once per streak.
            if not self._reclaim_failing:
                log.warning("giving free pages back failed (will retry): %s", exc)
            self._reclaim_failing = True
        else:
            self._reclaim_failing = False

    def _poll_timeout_ms(self) -> int:
        if self._input_pending:
            return 0
        if self._backlog:
            return BACKLOG_RETRY_MS
        if self._own_store is not None and self._own_store.reclaimable:
            return RECLAIM_POLL_MS
        deadline = self.core.next_deadline()
        if deadline is None:
            return MAX_POLL_MS
        wait_ms = (deadline - self.clock.monotonic_ns()) // 1_000_000 + 1
        return max(0, min(MAX_POLL_MS, wait_ms))

    def _send(self, outgoing: list[tuple[bytes, bytes]]) -> None:
        for peer_id, frame in outgoing:
            backlog = self._backlog.get(peer_id)
            if backlog is not None:
                if (
                    len(backlog.frames) >= self.config.max_backlog_frames
                    or backlog.bytes + len(frame) > self.config.max_backlog_bytes
                ):
                    self._loop.backlog_frames_dropped += 1  # this one, and those waiting
                    self._unreadable(peer_id)
                else:
                    backlog.frames.append(frame)
                    backlog.bytes += len(frame)
                continue
            try:
                self._send_one(peer_id, frame)
            except zmq.Again:
                self._backlog[peer_id] = Backlog(frame)
            except zmq.ZMQError as exc:
                self._unreachable(peer_id, exc)

    def _flush_backlog(self) -> None:
        for peer_id in list(self._backlog):
            backlog = self._backlog[peer_id]
            frames = backlog.frames
            while frames:
                try:
                    self._send_one(peer_id, frames[0])
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:
                    self._unreachable(peer_id, exc)
                    break
                backlog.bytes -= len(frames.popleft())
            else:
                del self._backlog[peer_id]

    def _send_one(self, peer_id: bytes, frame: bytes) -> None:
        if self.tcp is not None and self.tcp.owns(peer_id):
            self.tcp.send(peer_id, frame, zmq.NOBLOCK)
        else:
            self.router.send(peer_id, frame, zmq.NOBLOCK)

    def _unreadable(self, peer_id: bytes) -> None:
        """A peer that reads nothing while frames pile up for it is treated as gone: its
        messages go to others instead of the broker's memory growing without bound."""
        backlog = self._backlog.pop(peer_id, None)
        dropped, size = (len(backlog.frames), backlog.bytes) if backlog is not None else (0, 0)
        self._loop.backlog_frames_dropped += dropped
        self._loop.peers_unreadable += 1
        returned = self.core.peer_gone(peer_id)
        log.warning(
            "peer %s is not reading (%d frames, %d bytes waiting): treated as gone, %d messages"
            " back to their queues",
            peer_id.hex(),
            dropped,
            size,
            returned,
        )

    def _unreachable(self, peer_id: bytes, exc: zmq.ZMQError) -> None:
        if exc.errno != errno.EHOSTUNREACH:
            log.error("send to peer %s failed: %s", peer_id.hex(), exc)
        backlog = self._backlog.pop(peer_id, None)
        if backlog is not None:
            self._loop.backlog_frames_dropped += len(backlog.frames)
        self.core.begin_turn()
        self.core.peer_gone(peer_id)

    def _settle_replicated(self, ready: int, in_flight: int) -> None:
        """At a stop: what the group commits within the grace period is confirmed."""
        replicated = self.replicated
        assert replicated is not None
        if replicated.lost is None:
            self._commit()
            deadline = time.monotonic() + max(self.config.grace_seconds, 1.0)
            poller = self._replica_poller
            while not replicated.idle and replicated.lost is None:
                wait_ms = int((deadline - time.monotonic()) * 1000)
                if wait_ms <= 0:
                    break
                poller.poll(min(wait_ms, MAX_POLL_MS))
                self._send(replicated.on_events())
        log.info(
            "exiting: %d ready and %d unacked messages are kept by the shard's replicas",
            ready,
            in_flight,
        )

    def stats(self) -> dict[str, float | int]:
        """The loop's own figures (`stats` shows them under "server")."""
        loop = self._loop
        recent = loop.recent_longest_ms(time.monotonic())
        return {
            "turns": loop.turns,
            "turns_cut_by_budget": loop.turns_cut,
            "input_pending": self._input_pending,
            "longest_turn_ms": round(loop.longest_turn_ms, 3),
            "longest_turn_recent_ms": round(recent, 3),
            "turn_budget_ms": self.config.turn_budget_ms,
            "backlog_peers": len(self._backlog),
            "backlog_frames": sum(len(b.frames) for b in self._backlog.values()),
            "backlog_bytes": sum(b.bytes for b in self._backlog.values()),
            "backlog_frames_dropped": loop.backlog_frames_dropped,
            "peers_unreadable": loop.peers_unreadable,
            "wall_clock_steps": self._clock_watch.steps,
            "last_wall_clock_step_s": round(self._clock_watch.last_step_s, 3),
        }

    def _report_losses(self) -> None:
        ready, in_flight = self.core.ready, self.core.in_flight
        if self.replicated is not None:
            self._settle_replicated(ready, in_flight)
            return
        keeper = self.keeper
        if keeper is not None:
            # What the store could not write is waited for, then kept beside it if need be.
            if self._commit() or keeper.settle(max(self.config.grace_seconds, 1.0)):
                self._send(self.core.release_confirms())
            log.info(
                "exiting: %d ready and %d unacked messages are kept in %s",
                ready,
                in_flight,
                keeper.store.directory,
            )
            keeper.close()
            return
        if ready or in_flight:
            log.warning(
                "exiting with %d ready and %d unacked messages in memory: they are lost",
                ready,
                in_flight,
            )
        else:
            log.info("exiting: no messages held")
