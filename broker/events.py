"""Events: publishing (108) into every queue bound to a matching pattern, and the bindings
themselves (docs/protocol.md §6.5).

A publish is a send to many queues at once: it passes the same checks (draining, storage,
keys, memory), and then either every bound queue gets a copy or, when one of them is full and
refuses, none does. Each copy is an ordinary message of its queue with its own ID and the
event name. Matching is the routing part's (broker/routing.py); this part owns what a
binding means to the queue table and the journal, and the limits on how many there are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..protocol import ErrorCode, Publish, event_name_problem, pattern_problem
from ..protocol.rules import queue_name_problem, split_patterns
from .context import Context
from .errors import CommandError
from .flow import Flow
from .intake import Intake
from .model import Peer, Queue
from .queues import Queues
from .quotas import BINDINGS
from .routing import Bindings, mask_matches

#: Idempotency keys of publishes are remembered per event, in a scope no queue name can
#: take (queue names have no spaces).
KEY_SCOPE = "event "


class Events:
    __slots__ = ("_binder", "_ctx", "_flow", "_intake", "_queues", "bindings")

    def __init__(self, ctx: Context, queues: Queues, intake: Intake, flow: Flow) -> None:
        self._ctx = ctx
        self._queues = queues
        self._intake = intake
        self._flow = flow
        self.bindings = Bindings()
        #: (queue, pattern) -> whose quota the binding counts against (bounded like the
        #: bindings themselves by `max_bindings`).
        self._binder: dict[tuple[str, str], str] = {}

    # ----------------------------------------------------------------- publish

    def on_publish(self, peer: Peer, message: Publish) -> None:
        ctx = self._ctx
        intake = self._intake
        tag = message.tag
        if intake.refuses_now(peer, None, tag):
            return
        event = message.event
        problem = event_name_problem(event)
        if problem is not None:
            ctx.refuse(peer, ErrorCode.INVALID_VALUE, problem, None, None, tag)
            return
        key = message.key
        if key is not None and intake.is_repeat(peer, KEY_SCOPE + event, key, tag):
            return
        flow = self._flow
        if flow.memory_high and not flow.admits(peer, None, tag):
            return
        by_name = self._queues.by_name
        queues = [by_name[name] for name in self.bindings.match(event)]
        if not queues:
            self._unrouted(peer, message)
            return
        for queue in queues:
            if self._refuses(peer, queue, event, tag):
                return
        event_bytes = event.encode()
        first_id = b""
        for queue in queues:
            if queue.max_length:
                intake.has_room(peer, queue, tag)  # a drop-oldest queue makes room
            message_id = intake.put(
                peer,
                queue,
                message.content,
                message.ttl,
                message.headers,
                event_bytes,
                message_key=message.message_key or b"",
            )
            first_id = first_id or message_id
        counters = ctx.counters
        counters.published += 1
        counters.routed += len(queues)
        if key is not None:
            intake.keep_key(peer, first_id)
        intake.confirm(peer, first_id, tag, len(queues))

    def _refuses(self, peer: Peer, queue: Queue, event: str, tag: int | None) -> bool:
        """A bound queue that is full and rejects: the whole publish is refused (429)."""
        if not queue.max_length or queue.overflow != "reject":
            return False
        if queue.ready_count + queue.delayed_sends < queue.max_length:
            return False
        ctx = self._ctx
        ctx.counters.overflowed += 1
        queue.refused += 1
        self._flow.pause(peer, queue)
        ctx.refuse(
            peer,
            ErrorCode.LIMIT_REACHED,
            f"queue {queue.name!r}, bound to event {event!r}, is full ({queue.max_length}"
            " ready messages): no queue got a copy",
            None,
            queue.name,
            tag,
        )
        return True

    def _unrouted(self, peer: Peer, message: Publish) -> None:
        """No binding matches: counted, and kept in the unrouted queue if there is one."""
        ctx = self._ctx
        intake = self._intake
        tag = message.tag
        name = ctx.config.unrouted_queue
        if not name:
            message_id = ctx.new_id()  # names no message: nothing was stored
        else:
            queue = self._queues.open(peer, name, tag)
            if queue is None or (queue.max_length and not intake.has_room(peer, queue, tag)):
                return
            message_id = intake.put(
                peer,
                queue,
                message.content,
                message.ttl,
                message.headers,
                message.event.encode(),
                message_key=message.message_key or b"",
            )
        ctx.counters.published += 1
        ctx.counters.unrouted += 1
        if message.key is not None:
            intake.keep_key(peer, message_id)
        intake.confirm(peer, message_id, tag, 0)

    # ----------------------------------------------------------------- consume with bindings

    def consume_patterns(self, peer: Peer, queue_name: str, text: str) -> list[str] | None:
        """The patterns of a 002's PATTERNS packet, checked against the limits; None (and the
        peer refused with 422) if they are bad or too many."""
        patterns, problem = split_patterns(text)
        code = ErrorCode.INVALID_VALUE
        if problem is None:
            problem, code = self._room_problem(queue_name, patterns, owner=peer.owner)
        if problem is not None:
            self._ctx.refuse(peer, code, problem, None, queue_name)
            return None
        return patterns

    # ----------------------------------------------------------------- binding commands

    def bind(self, queue_name: str, patterns: Iterable[str]) -> tuple[Queue, int]:
        """Bind a queue (created if need be) to the patterns; (queue, how many were new).

        Raises:
            CommandError: a bad pattern or name, or a limit (nothing is bound then).
        """
        wanted = list(dict.fromkeys(patterns))
        for pattern in wanted:
            _check_pattern(pattern)
        owner = self._ctx.owner
        problem, code = self._room_problem(queue_name, wanted, owner=owner)
        if problem is not None:
            raise CommandError(problem, code)
        queue = self._open(queue_name)
        return queue, self.bind_checked(queue, wanted, owner)

    def bind_checked(self, queue: Queue, patterns: list[str], owner: str = "") -> int:
        """Bind patterns already checked (valid, within the limits); how many were new. Each
        new binding counts against `owner`'s quota until it is unbound."""
        added = 0
        journal = self._ctx.journal
        quotas = self._ctx.quotas
        for pattern in patterns:
            if self.bindings.bind(queue.name, pattern):
                journal.bound(queue.name, pattern)
                added += 1
                if owner:
                    self._binder[(queue.name, pattern)] = owner
                    quotas.take(BINDINGS, owner)
        return added

    def unbind(self, queue: Queue, patterns: Iterable[str]) -> int:
        removed = 0
        journal = self._ctx.journal
        for pattern in patterns:
            if self.bindings.unbind(queue.name, pattern):
                journal.unbound(queue.name, pattern)
                removed += 1
                self._unbound(queue.name, pattern)
        return removed

    def _unbound(self, queue_name: str, pattern: str) -> None:
        owner = self._binder.pop((queue_name, pattern), None)
        if owner is not None:
            self._ctx.quotas.give_back(BINDINGS, owner)

    def rebind(self, queue_name: str, options: dict[str, Any]) -> dict[str, Any]:
        """MQKS `rebind`: replace, then remove, then remove by mask, then add. Checked as a
        whole first: a bad list or a limit changes nothing."""
        lists = {name: _pattern_list(options, name) for name in REBIND_LISTS}
        replace = lists["replace"]
        current = self.bindings.patterns(queue_name)
        after = dict.fromkeys(current if replace is None else replace)
        for pattern in lists["remove"] or ():
            after.pop(pattern, None)
        for mask in lists["remove_mask"] or ():
            _check_pattern(mask)
            for pattern in [p for p in after if mask_matches(mask, p)]:
                del after[pattern]
        after.update(dict.fromkeys(lists["add"] or ()))
        for pattern in after:
            _check_pattern(pattern)
        bound = set(current)
        new = [pattern for pattern in after if pattern not in bound]
        owner = self._ctx.owner
        problem, code = self._room_problem(queue_name, new, len(after), owner)
        if problem is not None:
            raise CommandError(problem, code)
        queue = self._open(queue_name)
        removed = self.unbind(queue, [pattern for pattern in current if pattern not in after])
        added = self.bind_checked(queue, list(after), owner)
        return {"queue": queue.name, "added": added, "removed": removed}

    def forget(self, queue_name: str) -> None:
        """The queue was deleted: its bindings go (the store deletes them with the queue)."""
        for pattern in self.bindings.unbind_all(queue_name):
            self._unbound(queue_name, pattern)

    def restore(self, bindings: Iterable[tuple[str, str]]) -> int:
        """Bindings read back from the store: bound, their queues created, not journaled."""
        restored = 0
        for queue_name, pattern in bindings:
            if self._queues.get(queue_name) is None:
                self._queues.create(queue_name)
            restored += self.bindings.bind(queue_name, pattern)
        return restored

    # ----------------------------------------------------------------- limits

    def _room_problem(
        self, queue_name: str, patterns: list[str], after: int | None = None, owner: str = ""
    ) -> tuple[str | None, ErrorCode]:
        """Why binding these patterns (new ones count) would pass `owner`'s quota (429) or a
        limit (422), or None. `after` is the queue's number of bindings afterwards, when the
        caller knows it."""
        config = self._ctx.config
        bindings = self.bindings
        current = set(bindings.patterns(queue_name))
        new = sum(1 for pattern in dict.fromkeys(patterns) if pattern not in current)
        quota = self._ctx.quotas.problem(BINDINGS, owner, new) if new else None
        if quota is not None:
            return f"{quota}: unbind some first", ErrorCode.LIMIT_REACHED
        total = len(current) + new if after is None else after
        if total > config.max_bindings_per_queue:
            return (
                f"queue {queue_name!r} would have {total} bindings"
                f" (max_bindings_per_queue is {config.max_bindings_per_queue})"
            ), ErrorCode.INVALID_VALUE
        if bindings.total + new > config.max_bindings:
            return (
                f"the broker would hold {bindings.total + new} bindings"
                f" (max_bindings is {config.max_bindings})"
            ), ErrorCode.INVALID_VALUE
        return None, ErrorCode.INVALID_VALUE

    def _open(self, name: str) -> Queue:
        queue = self._queues.get(name)
        if queue is not None:
            return queue
        problem = queue_name_problem(name)
        if problem is not None:
            raise CommandError(problem)
        owner = self._ctx.owner
        room = self._queues.room_problem(owner)
        if room is not None:
            raise CommandError(room, ErrorCode.LIMIT_REACHED)
        return self._queues.create(name, owner)


REBIND_LISTS = ("replace", "remove", "remove_mask", "add")


def _pattern_list(options: dict[str, Any], name: str) -> list[str] | None:
    value = options.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise CommandError(f"{name!r} must be a list of strings")
    return value


def pattern_list(options: dict[str, Any], name: str = "patterns") -> list[str]:
    """The (required) list of patterns of an admin command."""
    value = _pattern_list(options, name)
    if value is None:
        raise CommandError(f"this command needs {name!r}: a list of patterns")
    return value


def _check_pattern(pattern: str) -> None:
    problem = pattern_problem(pattern)
    if problem is not None:
        raise CommandError(problem)
