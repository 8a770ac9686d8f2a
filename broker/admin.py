"""Operator commands carried by the ADMIN extension message (what `phpmq stats`, `phpmq dlq`
and `phpmq queue` send). Each takes the command's JSON options, returns a JSON-able dict, and
raises ValueError for a bad command (answered as a 422 inside the ADMIN_REPLY).

`stats` lives in broker/stats.py; the dead-letter commands act through the part that owns
dead letters, the queue commands through the queue table, the schedule commands through the
schedules part.

Admin work is bounded like any other (docs/security.md, "Bounds"): one peer runs at most
ADMIN_PER_PEER_TURN commands in a loop turn (more are refused, 429: a frame of many commands
is not how a client asks), and the answers built in one turn hold at most
ADMIN_BYTES_PER_TURN bytes: past it, commands wait for a later turn (at most MAX_WAITING of
them; more are refused). Lists come in pages (broker/pages.py), so no single answer grows
with the broker.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ..protocol import AdminReply, ErrorCode, encode
from ..protocol import admin_commands as cmd
from ..protocol.writer import admin_reply_with_ref
from . import browse
from .batch_leases import BatchLeases
from .context import Context
from .deadletters import DeadLetters
from .errors import CommandError
from .events import Events, pattern_list
from .flow import Flow
from .hold_commands import HoldCommands
from .intake import Intake
from .lifecycle import Lifecycle
from .model import Peer, Queue
from .peers import Peers
from .queues import Queues
from .schedules import Schedules
from .stats import Stats

MAX_REPORT_KEYS = 50
#: Admin commands one peer may run in one loop turn; more are refused (429): one frame of
#: many commands cannot hold the loop.
ADMIN_PER_PEER_TURN = 4
#: Bytes of admin answers one loop turn builds at most (each answer is bounded too); past it
#: commands wait for a later turn.
ADMIN_BYTES_PER_TURN = 16 * 1024 * 1024
#: Commands waiting for a later turn at most; past it they are refused (429).
MAX_WAITING = 1_024


class Admin:
    def __init__(
        self,
        ctx: Context,
        queues: Queues,
        peers: Peers,
        dead_letters: DeadLetters,
        intake: Intake,
        flow: Flow,
        events: Events,
        lifecycle: Lifecycle,
        schedules: Schedules,
        leases: BatchLeases,
    ) -> None:
        self._ctx = ctx
        self._events = events
        self._lifecycle = lifecycle
        self._flow = flow
        self._queues = queues
        self._peers = peers
        self._dead = dead_letters
        self._intake = intake
        #: The loop turn the counts below are of, the commands each peer ran in it, and the
        #: bytes of the answers built in it.
        self._turn = -1
        self._ran: dict[bytes, int] = {}
        self._answered_bytes = 0
        #: Commands waiting for a turn with room (the peer, its options), in order; how many
        #: each peer has waiting (its later ones wait behind them, so answers keep order).
        self.waiting: deque[tuple[Peer, dict[str, Any]]] = deque()
        self._waiting_of: dict[bytes, int] = {}
        #: `stats`; the sections from outside the core register with `stats.add_section`.
        self.stats = Stats(ctx, queues, peers, intake, flow, events)
        self._commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            cmd.STATS: self.stats.everything,
            cmd.DLQ_LIST: self._dlq_list,
            cmd.DLQ_REPLAY: self._dlq_replay,
            cmd.DLQ_PURGE: self._dlq_purge,
            cmd.QUEUE_PEEK: self._queue_peek,
            cmd.QUEUE_PURGE: self._queue_purge,
            cmd.QUEUE_DELETE: self._queue_delete,
            cmd.QUEUE_BIND: self._queue_bind,
            cmd.QUEUE_UNBIND: self._queue_unbind,
            cmd.QUEUE_REBIND: self._queue_rebind,
            cmd.QUEUE_BINDINGS: self._queue_bindings,
            cmd.SCHEDULE_ADD: schedules.add,
            cmd.SCHEDULE_REMOVE: schedules.remove,
            cmd.SCHEDULE_LIST: schedules.listing,
            **leases.commands(),
            **HoldCommands(ctx, intake).commands(),
        }

    def add_command(self, name: str, handler: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """A command the shell runs (a replica's, protocol/admin_commands.py REPLICA): the
        core answers it like its own; `handler` raises CommandError to refuse."""
        self._commands[name] = handler

    def on_admin(self, peer: Peer, message: Any) -> None:
        """The answer is always an ADMIN_REPLY, so a client can tell it from other refusals:
        now, or in a later turn when this one's answers are at their bound."""
        options = message.options
        self._count_turn()
        ran = self._ran.get(peer.id, 0) + 1
        self._ran[peer.id] = ran
        if ran > ADMIN_PER_PEER_TURN:
            self._refuse(
                peer,
                options,
                f"more than {ADMIN_PER_PEER_TURN} admin commands from one peer in one loop"
                " turn: send it again (one at a time, waiting for each answer)",
            )
        elif self._answered_bytes < ADMIN_BYTES_PER_TURN and not self._waiting_of:
            self._answer(peer, options)
        elif len(self.waiting) < MAX_WAITING:
            self.waiting.append((peer, options))
            self._waiting_of[peer.id] = self._waiting_of.get(peer.id, 0) + 1
        else:
            self._refuse(peer, options, f"{MAX_WAITING} admin commands are waiting: send it again")

    def run_waiting(self, may_run: Callable[[Peer, dict[str, Any]], bool]) -> None:
        """Answer the commands waiting for a turn with room (once per turn, by the core),
        those `may_run` refuses dropped (a peer gone, or refused since: it answered that)."""
        self._count_turn()
        waiting = self.waiting
        while waiting and self._answered_bytes < ADMIN_BYTES_PER_TURN:
            peer, options = waiting.popleft()
            left = self._waiting_of.pop(peer.id) - 1
            if left:
                self._waiting_of[peer.id] = left
            if may_run(peer, options):
                self._answer(peer, options)

    def _count_turn(self) -> None:
        turn = self._ctx.turns
        if turn != self._turn:
            self._turn = turn
            self._ran = {}
            self._answered_bytes = 0

    def _answer(self, peer: Peer, options: dict[str, Any]) -> None:
        ctx = self._ctx
        ctx.owner = peer.owner  # whose quotas what the command creates counts against
        changes = len(ctx.journal)
        try:
            if cmd.bad_ref(options):
                raise CommandError(f"'{cmd.REF}' must be an integer from 0 to 2**53 - 1")
            if options.get("command") == cmd.STATS:
                answer = admin_reply_with_ref(self.stats.answer(options), cmd.ref_of(options))
            else:
                answer = encode(AdminReply(cmd.answering(options, self.run(options, peer))))
        except ValueError as exc:
            self._ctx.counters.errors += 1
            code = exc.code if isinstance(exc, CommandError) else int(ErrorCode.INVALID_VALUE)
            error = {"error": {"code": code, "reason": str(exc)}}
            answer = encode(AdminReply(cmd.answering(options, error)))
        finally:
            self._ctx.owner = ""
        self._answered_bytes += len(answer)
        if len(ctx.journal) != changes and ctx.storage_problem is None:
            ctx.hold(peer, answer)  # it changed the store: answered once that is durable
        else:
            # (While the store cannot write, what it could not is kept and written first
            # once it can: the answer does not wait for that.)
            ctx.reply_encoded(peer, answer)

    def _refuse(self, peer: Peer, options: dict[str, Any], reason: str) -> None:
        """429 in the ADMIN_REPLY: nothing was done."""
        ctx = self._ctx
        ctx.counters.errors += 1
        error = {"code": int(ErrorCode.LIMIT_REACHED), "reason": reason}
        ctx.reply(peer, AdminReply(cmd.answering(options, {"error": error})))

    def run(self, options: dict[str, Any], peer: Peer | None = None) -> dict[str, Any]:
        command = options.get("command")
        if command == cmd.REPORT:
            return _report(peer, options)
        handler = self._commands.get(command) if isinstance(command, str) else None
        if handler is None:
            known = ", ".join([*self._commands, cmd.REPORT])
            raise ValueError(f"unknown admin command {command!r}; known: {known}")
        return handler(options)

    def _named_queue(self, options: dict[str, Any]) -> Queue:
        queue = self._queues.get(_queue_name(options))
        if queue is None:
            raise CommandError(f"no queue named {options['queue']!r}", ErrorCode.NOT_FOUND)
        return queue

    def _dlq_list(self, options: dict[str, Any]) -> dict[str, Any]:
        return browse.dead_letters(self._named_queue(options), self._ctx.config, options)

    def _dlq_replay(self, options: dict[str, Any]) -> dict[str, Any]:
        """Put dead letters back at the tail of their queue, same ID, no TTL."""
        queue = self._named_queue(options)
        wanted = options.get("ids")
        if wanted is not None and not (
            isinstance(wanted, list) and all(isinstance(i, str) for i in wanted)
        ):
            raise ValueError("'ids' must be a list of message IDs")
        ids = None if wanted is None else [i.encode() for i in wanted]
        return {"queue": queue.name, "replayed": self._dead.replay(queue, ids)}

    def _dlq_purge(self, options: dict[str, Any]) -> dict[str, Any]:
        queue = self._named_queue(options)
        return {"queue": queue.name, "purged": self._dead.purge(queue)}

    def _queue_peek(self, options: dict[str, Any]) -> dict[str, Any]:
        """Ready messages, left where they are."""
        queue = self._named_queue(options)
        return browse.peek(queue, self._ctx.config, self._ctx.now, options)

    def _queue_purge(self, options: dict[str, Any]) -> dict[str, Any]:
        queue = self._named_queue(options)
        return {"queue": queue.name, "purged": self._queues.purge(queue)}

    def _queue_delete(self, options: dict[str, Any]) -> dict[str, Any]:
        return self._lifecycle.delete(self._named_queue(options))

    def _queue_bind(self, options: dict[str, Any]) -> dict[str, Any]:
        name = _queue_name(options)
        _, added = self._events.bind(name, pattern_list(options))
        return {"queue": name, "added": added, "bindings": self._events.bindings.patterns(name)}

    def _queue_unbind(self, options: dict[str, Any]) -> dict[str, Any]:
        queue = self._named_queue(options)
        removed = self._events.unbind(queue, pattern_list(options))
        bindings = self._events.bindings.patterns(queue.name)
        return {"queue": queue.name, "removed": removed, "bindings": bindings}

    def _queue_rebind(self, options: dict[str, Any]) -> dict[str, Any]:
        name = _queue_name(options)
        result = self._events.rebind(name, options)
        result["bindings"] = self._events.bindings.patterns(name)
        return result

    def _queue_bindings(self, options: dict[str, Any]) -> dict[str, Any]:
        queue = self._named_queue(options)
        return {"queue": queue.name, "bindings": self._events.bindings.patterns(queue.name)}


def _queue_name(options: dict[str, Any]) -> str:
    name = options.get("queue")
    if not isinstance(name, str):
        raise CommandError("this command needs a 'queue' string")
    return name


def _report(peer: Peer | None, options: dict[str, Any]) -> dict[str, Any]:
    """A bridge (or any client) states its counters; `stats` lists them under `bridges`."""
    counters = options.get("counters")
    if peer is None or not isinstance(counters, dict) or len(counters) > MAX_REPORT_KEYS:
        raise ValueError(f"'counters' must be an object of at most {MAX_REPORT_KEYS} entries")
    peer.report = {"kind": str(options.get("kind", ""))[:50], "counters": counters}
    return {"reported": len(counters)}
