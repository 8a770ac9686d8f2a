"""The server loop around the core: the only broker module, with its transports, that touches
sockets or reads the clock. Each loop turn polls, drains what is readable (up to
`batch_frames` per transport), runs the core, commits the turn's journal (durable mode), and
sends each peer one frame holding everything the core has for it.
"""

from __future__ import annotations

import errno
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable

import zmq

from .clock import Clock, SystemClock
from .config import BrokerConfig
from .core import Core, Turn
from .durable import DurableStore, StorageError
from .journal import Journal, NullJournal
from .transports import RouterTransport, TcpEndpoint

log = logging.getLogger("phpmq.broker")

#: Longest poll, so that signal flags are seen promptly (pyzmq resumes an interrupted poll).
MAX_POLL_MS = 250
#: How long frames already queued may still leave once the broker exits.
CLOSE_LINGER_MS = 500
#: Poll timeout while libzmq refuses frames for a slow peer (its high-water mark is reached).
BACKLOG_RETRY_MS = 5


class BrokerError(Exception):
    """Raised when the broker cannot start (e.g. the bind address is taken)."""


class BrokerServer:
    def __init__(self, config: BrokerConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self._stop_requests = 0
        self._context = zmq.Context()
        try:
            self.router = RouterTransport(self._context, config)
        except zmq.ZMQError as exc:
            self._context.term()
            raise BrokerError(f"cannot bind {config.bind}: {exc}") from None
        self.endpoint = self.router.endpoint
        self.store: DurableStore | None = None
        if config.data_dir:
            try:
                self.store = DurableStore(config.data_dir)
            except StorageError as exc:
                self._close_sockets()
                raise BrokerError(str(exc)) from None
        journal = Journal() if self.store is not None else NullJournal()
        self.core = Core(config, self.clock, journal=journal)
        #: Journal operations a failed commit could not write; retried first next turn.
        self._unwritten: list[tuple] = []
        if self.store is not None:
            self._recover(self.store)
        self.tcp: TcpEndpoint | None = None
        if config.tcp_bind:
            try:
                self.tcp = TcpEndpoint(
                    self._context,
                    config.tcp_bind,
                    config.max_content_bytes,
                    ttl_form=config.tcp_dialect == "ttl",
                )
            except zmq.ZMQError as exc:
                self._close_sockets()
                raise BrokerError(f"cannot bind {config.tcp_bind}: {exc}") from None
        #: Frames libzmq would not take yet, per peer, sent in order before anything newer.
        self._backlog: dict[bytes, deque[bytes]] = {}

    def _close_sockets(self) -> None:
        self.router.close(0)
        self._context.term()

    def _recover(self, store: DurableStore) -> None:
        started = time.monotonic()
        try:
            messages, dead = store.load()
            keys = store.load_keys()
        except StorageError as exc:
            self._close_sockets()
            raise BrokerError(str(exc)) from None
        core = self.core
        core.admin.storage_stats = store.stats
        ready, were_in_flight, dead_count = core.restore(messages, dead)
        key_count = core.restore_keys(keys)
        self._commit()
        log.info(
            "recovered %d messages (%d were in flight: back as ready, delivery count +1),"
            " %d dead letters and %d idempotency keys in %d queues from %s in %.0f ms",
            ready,
            were_in_flight,
            dead_count,
            key_count,
            len(core.queues),
            store.directory,
            (time.monotonic() - started) * 1000,
        )

    def _commit_and_send(self, turn: Turn) -> None:
        """Commit the turn, then send: what goes out is on disk. CONFIRMs go out only after
        a commit that succeeded; the rest of the turn goes out either way, so consumers are
        served while the store fails."""
        committed = self._commit()
        self._send(turn.frames)
        if committed:
            self._send(self.core.release_confirms())
        # A TCP peer the broker gave up on (silent) loses its connection too, or it would
        # later read dispatches of messages already taken back.
        self._close(turn.close)

    def _close(self, peer_ids: list[bytes]) -> None:
        if self.tcp is not None:
            for peer_id in peer_ids:
                self.tcp.close_peer(peer_id)

    def _commit(self) -> bool:
        """One transaction and one fsync for everything the turn changed (group commit).
        While the store cannot write, sends are refused (507) and the operations are kept to
        be written when it can again; consumers are served meanwhile. Returns False while
        something is left unwritten."""
        core = self.core
        if self.store is None or not (core.journal or self._unwritten):
            return True
        operations = self._unwritten + core.journal.take()
        try:
            self.store.commit(operations)
        except StorageError as exc:
            if core.storage_problem is None:
                log.error("storage write failed, refusing sends until it recovers: %s", exc)
            core.set_storage_problem(f"storage unavailable: {exc}")
            self._unwritten = operations
            return False
        if core.storage_problem is not None:
            log.warning("storage writes again (%d pending operations written)", len(operations))
            core.set_storage_problem(None)
        self._unwritten = []
        return True

    # ------------------------------------------------------------------ control

    def request_stop(self) -> None:
        """First call: drain gracefully. Second call: stop at once. Safe from signal handlers."""
        self._stop_requests += 1

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: self.request_stop())

    # ------------------------------------------------------------------ loop

    def run(self, on_ready: Callable[[str], None] | None = None) -> None:
        if self.store is None:
            log.info(
                "phpmq broker listening on %s (in memory: queued messages do not survive a"
                " restart; --data-dir keeps them)",
                self.endpoint,
            )
        else:
            log.info("phpmq broker listening on %s (durable: %s)", self.endpoint, self.store.path)
        if on_ready is not None:
            on_ready(self.endpoint)
        if self.tcp is not None:
            log.info("raw TCP endpoint for stock PHPMQ clients on %s", self.tcp.endpoint)
        poller = zmq.Poller()
        poller.register(self.router.socket, zmq.POLLIN)
        if self.tcp is not None:
            poller.register(self.tcp.socket, zmq.POLLIN)
        drain_deadline: float | None = None
        try:
            while True:
                if self._stop_requests >= 2:
                    log.warning("second stop signal: exiting without waiting for acks")
                    break
                if self._stop_requests == 1 and drain_deadline is None:
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
                self._turn(poller)
        finally:
            self._report_losses()
            # A moment for the last frames (DISCONNECTs, final acks' effects) to leave.
            self.router.close(CLOSE_LINGER_MS)
            if self.tcp is not None:
                self.tcp.shutdown()
            self._context.term()

    def _turn(self, poller: zmq.Poller) -> None:
        readable = poller.poll(self._poll_timeout_ms())
        self.core.begin_turn()
        if readable:
            self.router.receive(self.core, self.config.batch_frames)
            if self.tcp is not None:
                self.tcp.receive(self.core, self.config.batch_frames)
        self._commit_and_send(self.core.end_turn())
        if self._backlog:
            self._flush_backlog()
        if self.tcp is not None:
            # Peers given up on while sending (not reading, unreachable) lose their
            # connection in this turn: read again, it would come back as a new peer.
            self._close(self.core.take_closes())
            self.tcp.retry_closes()

    def _poll_timeout_ms(self) -> int:
        if self._backlog:
            return BACKLOG_RETRY_MS
        deadline = self.core.next_deadline()
        if deadline is None:
            return MAX_POLL_MS
        wait_ms = (deadline - self.clock.monotonic_ns()) // 1_000_000 + 1
        return max(0, min(MAX_POLL_MS, wait_ms))

    def _send(self, outgoing: list[tuple[bytes, bytes]]) -> None:
        for peer_id, frame in outgoing:
            backlog = self._backlog.get(peer_id)
            if backlog is not None:
                if len(backlog) >= self.config.max_backlog_frames:
                    self._unreadable(peer_id)
                else:
                    backlog.append(frame)
                continue
            try:
                self._send_one(peer_id, frame)
            except zmq.Again:
                self._backlog[peer_id] = deque([frame])
            except zmq.ZMQError as exc:
                self._unreachable(peer_id, exc)

    def _flush_backlog(self) -> None:
        for peer_id in list(self._backlog):
            frames = self._backlog[peer_id]
            while frames:
                try:
                    self._send_one(peer_id, frames[0])
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:
                    self._unreachable(peer_id, exc)
                    break
                frames.popleft()
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
        dropped = len(self._backlog.pop(peer_id, ()))
        returned = self.core.peer_gone(peer_id)
        log.warning(
            "peer %s is not reading (%d frames waiting): treated as gone, %d messages back to"
            " their queues",
            peer_id.hex(),
            dropped,
            returned,
        )

    def _unreachable(self, peer_id: bytes, exc: zmq.ZMQError) -> None:
        if exc.errno != errno.EHOSTUNREACH:
            log.error("send to peer %s failed: %s", peer_id.hex(), exc)
        self._backlog.pop(peer_id, None)
        self.core.begin_turn()
        self.core.peer_gone(peer_id)

    def _report_losses(self) -> None:
        ready, in_flight = self.core.ready, self.core.in_flight
        if self.store is not None:
            if self._commit():
                self._send(self.core.release_confirms())
            if self._unwritten:
                log.error(
                    "exiting with %d operations the store could not write", len(self._unwritten)
                )
            log.info(
                "exiting: %d ready and %d unacked messages are kept in %s",
                ready,
                in_flight,
                self.store.directory,
            )
            self.store.close()
            return
        if ready or in_flight:
            log.warning(
                "exiting with %d ready and %d unacked messages in memory: they are lost",
                ready,
                in_flight,
            )
        else:
            log.info("exiting: no messages held")
