"""The key-hold commands (docs/protocol.md §9, "Key holds"): a writer's tasks make a hold
before their rows (`key-hold`), its driver commits each batch (`key-commit`), an operator
lists holds (`key-holds`) and releases an abandoned one (`key-release`). What a hold keeps is
decided at each send (broker/intake.py, broker/key_holds.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..protocol import ErrorCode
from ..protocol import admin_commands as cmd
from ..protocol.rules import hold_scope_problem
from .context import Context
from .errors import CommandError
from .intake import Intake
from .key_holds import MAX_BATCH_DIGITS, Hold
from .pages import page, page_request
from .quotas import KEY_HOLDS


class HoldCommands:
    __slots__ = ("_ctx", "_intake")

    def __init__(self, ctx: Context, intake: Intake) -> None:
        self._ctx = ctx
        self._intake = intake

    def commands(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {
            cmd.KEY_HOLD: self.hold,
            cmd.KEY_COMMIT: self.commit,
            cmd.KEY_HOLDS: self.listing,
            cmd.KEY_RELEASE: self.release,
        }

    def hold(self, options: dict[str, Any]) -> dict[str, Any]:
        """Make the hold `scope` if there is none (idempotent: every task of a batch asks)."""
        scope = _scope(options)
        _target(options)
        if not self._intake.keys.window_ns:
            raise CommandError("idempotency keys are off (dedup_window_seconds is 0)")
        holds = self._intake.holds
        hold = holds.by_scope.get(scope)
        made = hold is None
        if hold is None:
            hold = self._new(scope)
        return {**_figures(hold), "made": made}

    def _new(self, scope: str) -> Hold:
        ctx = self._ctx
        holds = self._intake.holds
        owner = ctx.owner
        problem = holds.holds_problem() or ctx.quotas.problem(KEY_HOLDS, owner)
        if problem is not None:
            raise CommandError(
                f"{problem}: release abandoned ones (phpmq keys holds)", ErrorCode.LIMIT_REACHED
            )
        waiting = holds.releasing_of(scope)
        if waiting:  # a writer batch on disk must not mix this hold's keys with those
            raise CommandError(
                f"{waiting} keys of an earlier hold {scope!r} are still being let go: ask"
                " again shortly",
                ErrorCode.OVERLOADED,
            )
        hold = holds.add(scope, owner, -1, ctx.clock.wall())
        ctx.quotas.take(KEY_HOLDS, owner)
        ctx.journal.hold(scope, owner, hold.committed, hold.created_wall)
        return hold

    def commit(self, options: dict[str, Any]) -> dict[str, Any]:
        """Batch `batch` of the hold's writer is committed: the keys of earlier batches are
        released, and get the window from the turns that let them go
        (Intake.released). A scope without a hold has nothing to let go."""
        scope = _scope(options)
        _target(options)
        batch = options.get("batch")
        if type(batch) is not int or not 0 <= batch < 10**MAX_BATCH_DIGITS:
            raise CommandError(
                f"'batch' must be an integer of at least 0 and at most {MAX_BATCH_DIGITS} digits"
            )
        hold = self._intake.holds.by_scope.get(scope)
        if hold is None:
            return {"scope": scope, "committed": None, "held_keys": 0, "released": 0}
        released = 0
        if batch > hold.committed:
            owners = self._intake.holds.commit(hold, batch)
            self._intake.released(owners)
            released = sum(owners.values())
            self._ctx.journal.hold(scope, hold.owner, hold.committed, hold.created_wall)
        return {**_figures(hold), "released": released}

    def release(self, options: dict[str, Any]) -> dict[str, Any]:
        """An operator drops a hold (its writer was abandoned): its keys get the window."""
        scope = _scope(options)
        dropped = self._intake.holds.drop(scope)
        if dropped is None:
            raise CommandError(f"no key hold named {scope!r}", ErrorCode.NOT_FOUND)
        hold, owners = dropped
        self._intake.released(owners)
        self._ctx.quotas.give_back(KEY_HOLDS, hold.owner)
        self._ctx.journal.unhold(scope)
        return {"scope": scope, "released": sum(owners.values())}

    def listing(self, options: dict[str, Any]) -> dict[str, Any]:
        holds = self._intake.holds
        listed = list(holds.by_scope.values())
        entries, next_offset = page(
            len(listed), lambda index: holds.entry(listed[index]), page_request(options)
        )
        return {"holds": entries, "next_offset": next_offset, "held_keys": holds.held}


def _scope(options: dict[str, Any]) -> str:
    scope = options.get("scope")
    problem = hold_scope_problem(scope)
    if problem is not None:
        raise CommandError(problem)
    return scope  # type: ignore[return-value]


def _target(options: dict[str, Any]) -> None:
    """A writer's command names a queue or an event it writes to: the rights check reads it,
    and a sharded client sends the command to the shard that owns it."""
    queue, event = options.get("queue"), options.get("event")
    if not isinstance(queue, str) and not isinstance(event, str):
        raise CommandError("this command needs a 'queue' or an 'event' string (one it sends to)")


def _figures(hold: Hold) -> dict[str, Any]:
    return {"scope": hold.scope, "committed": hold.committed_or_none, "held_keys": hold.held}
