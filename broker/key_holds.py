"""Key holds: idempotency keys kept for as long as a writer may send them again, however long
that is, instead of for the dedup window (docs/protocol.md §6.3, "Key holds").

A hold is named by a scope (the Spark sink's query id) and records the last batch its writer
committed (-1: none yet). A keyed send whose key reads `<scope>/<batch>/...`, for a held scope
and a batch at or after the committed one, is held: remembered without expiry. Committing
batch B releases the keys of the batches before B: they get the dedup window from then on,
like any key (Spark may replay batch B until it wrote commits/B, and it commits B only after
the writer's commit of B; so once B is committed nothing before it comes again).

Pure bookkeeping: the intake decides what is held and journals it (broker/intake.py); the
commands live in broker/hold_commands.py.
"""

from __future__ import annotations

#: Digits of a batch number at most (a longer one is no batch: the key gets the window).
MAX_BATCH_DIGITS = 18

#: One held key: (its entry, owner). The entry is the key and its scope in the key window (a
#: queue, or `event NAME`) as one string (broker/idempotency.py); the owner is whose quota it
#: counts against.
HeldKey = tuple[str, str]


class Hold:
    """One writer's hold: its last committed batch and the keys it holds, by batch."""

    __slots__ = ("batches", "committed", "created_wall", "held", "owner", "scope")

    def __init__(self, scope: str, owner: str, committed: int, created_wall: float) -> None:
        self.scope = scope
        #: Whose quota of holds it counts against ("" the broker's: restored, or loopback).
        self.owner = owner
        self.committed = committed
        self.created_wall = created_wall
        self.batches: dict[int, list[HeldKey]] = {}
        self.held = 0

    @property
    def committed_or_none(self) -> int | None:
        return self.committed if self.committed >= 0 else None


class KeyHolds:
    """Every hold by scope, and every held key's first message ID, within their limits."""

    __slots__ = ("_last", "by_scope", "ids", "max_held_keys", "max_holds", "refused")

    def __init__(self, max_holds: int, max_held_keys: int) -> None:
        self.max_holds = max_holds
        self.max_held_keys = max_held_keys
        self.by_scope: dict[str, Hold] = {}
        #: A key's entry -> the ID the key was first accepted with.
        self.ids: dict[str, bytes] = {}
        #: Refusals by the broker-wide limit that refused them, for stats.
        self.refused = {"max_key_holds": 0, "max_held_keys": 0}
        #: The last key's `<scope>/<batch>/`, its scope, hold and batch: a writer sends a
        #: batch's keys in a row, so the next key is read by `startswith` alone.
        self._last: tuple[str, str, Hold | None, int] = ("\x00", "", None, 0)

    def batch_of(self, key: str) -> tuple[Hold, int] | None:
        """The hold and batch that would keep `key`, if any."""
        prefix, scope, hold, batch = self._last
        if key.startswith(prefix) and self.by_scope.get(scope) is hold and hold is not None:
            return (hold, batch) if batch >= hold.committed else None
        scope, slash, rest = key.partition("/")
        if not slash:
            return None
        hold = self.by_scope.get(scope)
        if hold is None:
            return None
        digits = rest.partition("/")[0]
        if not (digits.isascii() and digits.isdigit()) or len(digits) > MAX_BATCH_DIGITS:
            return None
        batch = int(digits)
        self._last = (f"{scope}/{digits}/", scope, hold, batch)
        return (hold, batch) if batch >= hold.committed else None

    def hold_problem(self) -> str | None:
        """Why one more key cannot be held (the broker-wide limit), counted; or None."""
        held = len(self.ids)
        return self._over(held, self.max_held_keys, "max_held_keys", "idempotency keys are held")

    def holds_problem(self) -> str | None:
        """Why one more hold cannot be made (the broker-wide limit), counted; or None."""
        return self._over(len(self.by_scope), self.max_holds, "max_key_holds", "key holds exist")

    def _over(self, count: int, limit: int, setting: str, what: str) -> str | None:
        if count < limit:
            return None
        self.refused[setting] += 1
        return f"{count} {what}, the broker's limit ({setting} is {limit})"

    def add(self, scope: str, owner: str, committed: int, created_wall: float) -> Hold:
        hold = self.by_scope[scope] = Hold(scope, owner, committed, created_wall)
        return hold

    def keep(self, hold: Hold, batch: int, held: HeldKey, message_id: bytes) -> None:
        self.ids[held[0]] = message_id
        keys = hold.batches.get(batch)
        if keys is None:
            keys = hold.batches[batch] = []
        keys.append(held)
        hold.held += 1

    def commit(self, hold: Hold, batch: int) -> list[tuple[HeldKey, bytes]]:
        """Batch `batch` is committed: the keys of earlier batches are let go, returned with
        their IDs (the caller gives them the window)."""
        hold.committed = max(hold.committed, batch)
        done = [earlier for earlier in hold.batches if earlier < batch]
        return self._let_go(hold, done)

    def drop(self, scope: str) -> tuple[Hold, list[tuple[HeldKey, bytes]]] | None:
        """The hold is removed, every key it held let go (returned with their IDs)."""
        hold = self.by_scope.pop(scope, None)
        if hold is None:
            return None
        return hold, self._let_go(hold, list(hold.batches))

    def _let_go(self, hold: Hold, batches: list[int]) -> list[tuple[HeldKey, bytes]]:
        released: list[tuple[HeldKey, bytes]] = []
        ids = self.ids
        for batch in batches:
            keys = hold.batches.pop(batch)
            hold.held -= len(keys)
            released.extend((held, ids.pop(held[0])) for held in keys)
        return released

    def entry(self, hold: Hold) -> dict[str, object]:
        """A hold as `key-holds` lists it."""
        batches = sorted(hold.batches)
        return {
            "scope": hold.scope,
            "committed": hold.committed_or_none,
            "held_keys": hold.held,
            "batches": [batches[0], batches[-1]] if batches else [],
            "owner": hold.owner,
            "created": hold.created_wall,
        }

    def stats(self) -> dict[str, object]:
        """`stats`' `key_holds` section."""
        return {
            "holds": len(self.by_scope),
            "held_keys": len(self.ids),
            "max_key_holds": self.max_holds,
            "max_held_keys": self.max_held_keys,
            "refused": dict(self.refused),
        }
