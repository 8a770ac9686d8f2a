"""Key holds: idempotency keys kept for as long as a writer may send them again, however long
that is, instead of for the dedup window (docs/protocol.md §6.3, "Key holds").

A hold is named by a scope (the Spark sink's query id) and records the last batch its writer
committed (-1: none yet). A keyed send whose key reads `<scope>/<batch>/...`, for a held scope
and a batch at or after the committed one, is held: remembered without expiry. Committing
batch B releases the keys of the batches before B: they get the dedup window from then on,
like any key (Spark may replay batch B until it wrote commits/B, and it commits B only after
the writer's commit of B; so once B is committed nothing before it comes again).

Released keys are let go LET_GO_PER_TURN a turn (`take_released`), so that a batch of millions
of rows does not stop the broker for seconds at its commit. Until then they stay held, in
memory and on disk: the store deletes a writer batch's held keys once all of them are let go
(HELD_GONE, by `held_batch`), and a restart gives the window to what a crash left held of a
batch committed or released. They no longer count against `max_held_keys` or their owner's
quota (those past `max_held_keys` of them do count), and a new hold of their scope waits
until they are let go (a writer batch on disk never mixes two holds' keys).

Pure bookkeeping: the intake decides what is held and journals it (broker/intake.py); the
commands live in broker/hold_commands.py.
"""

from __future__ import annotations

from collections import deque

from .idempotency import split_entry

#: Digits of a batch number at most (a longer one is no batch: the key gets the window).
MAX_BATCH_DIGITS = 18

#: Released keys let go per turn (each is remembered for the window and journaled: about
#: 2 us on a durable broker, so a few milliseconds a turn).
LET_GO_PER_TURN = 2_000

#: One held key: (its entry, owner). The entry is the key and its scope in the key window (a
#: queue, or `event NAME`) as one string (broker/idempotency.py); the owner is whose quota it
#: counts against.
HeldKey = tuple[str, str]


def held_batch(key: str) -> str:
    """The writer batch a held key is let go with: its `<scope>/<batch>` (a hold holds only
    keys that start so). The store keeps a batch's held keys together by it."""
    scope, _, rest = key.partition("/")
    return f"{scope}/{rest.partition('/')[0]}"


class WriterBatches:
    """(target, `held_batch`) of keys that come a writer batch in a row (a hold's release,
    a turn's held keys in the store): worked out again only when the batch changes."""

    __slots__ = ("_group", "_prefix")

    def __init__(self) -> None:
        self._group = ("", "")
        self._prefix = "\x00"  # `<scope>/<batch>/`: what the batch's keys start with

    def of(self, queue: str, key: str) -> tuple[str, str]:
        if queue != self._group[0] or not key.startswith(self._prefix):
            self._group = (queue, held_batch(key))
            self._prefix = self._group[1] + "/"
        return self._group


class Hold:
    """One writer's hold: its last committed batch and the keys it holds, by batch, with how
    many each owner holds of each batch (its quota is given back at the release)."""

    __slots__ = ("batches", "committed", "created_wall", "held", "owner", "owners", "scope")

    def __init__(self, scope: str, owner: str, committed: int, created_wall: float) -> None:
        self.scope = scope
        #: Whose quota of holds it counts against ("" the broker's: restored, or loopback).
        self.owner = owner
        self.committed = committed
        self.created_wall = created_wall
        self.batches: dict[int, list[HeldKey]] = {}
        self.owners: dict[int, dict[str, int]] = {}
        self.held = 0

    @property
    def committed_or_none(self) -> int | None:
        return self.committed if self.committed >= 0 else None


class _Released:
    """One released batch of a hold: its keys, how many are let go, and the writer batches
    (target, held_batch) of those let go."""

    __slots__ = ("groups", "keys", "let_go", "scope")

    def __init__(self, scope: str, keys: list[HeldKey]) -> None:
        self.scope = scope
        self.keys = keys
        self.let_go = 0
        self.groups: dict[tuple[str, str], None] = {}


class KeyHolds:
    """Every hold by scope, and every held key's first message ID, within their limits."""

    __slots__ = (
        "_last",
        "by_scope",
        "ids",
        "max_held_keys",
        "max_holds",
        "refused",
        "released",
        "releasing",
    )

    def __init__(self, max_holds: int, max_held_keys: int) -> None:
        self.max_holds = max_holds
        self.max_held_keys = max_held_keys
        self.by_scope: dict[str, Hold] = {}
        #: A key's entry -> the ID the key was first accepted with.
        self.ids: dict[str, bytes] = {}
        #: Refusals by the broker-wide limit that refused them, for stats.
        self.refused = {"max_key_holds": 0, "max_held_keys": 0}
        #: Released batches not let go yet, oldest first; their keys stay in `ids` (still
        #: deduplicated as held) and are `releasing` in all.
        self.released: deque[_Released] = deque()
        self.releasing = 0
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

    @property
    def held(self) -> int:
        """Keys held, those released and waiting to be let go left out."""
        return len(self.ids) - self.releasing

    def hold_problem(self) -> str | None:
        """Why one more key cannot be held (the broker-wide limit), counted; or None."""
        # Released keys waiting to be let go count only past as many again: a commit frees
        # room at once, and memory stays within twice the limit however fast a writer goes.
        held = len(self.ids) - min(self.releasing, self.max_held_keys)
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
            hold.owners[batch] = {}
        keys.append(held)
        owners = hold.owners[batch]
        owners[held[1]] = owners.get(held[1], 0) + 1
        hold.held += 1

    def commit(self, hold: Hold, batch: int) -> dict[str, int]:
        """Batch `batch` is committed: the keys of earlier batches are released (let go by
        `take_released`); returns how many each owner held of them."""
        hold.committed = max(hold.committed, batch)
        done = [earlier for earlier in hold.batches if earlier < batch]
        return self._release(hold, done)

    def drop(self, scope: str) -> tuple[Hold, dict[str, int]] | None:
        """The hold is removed, every key it held released (let go by `take_released`), with
        how many each owner held."""
        hold = self.by_scope.pop(scope, None)
        if hold is None:
            return None
        return hold, self._release(hold, list(hold.batches))

    def _release(self, hold: Hold, batches: list[int]) -> dict[str, int]:
        owners: dict[str, int] = {}
        for batch in batches:
            keys = hold.batches.pop(batch)
            for owner, count in hold.owners.pop(batch).items():
                owners[owner] = owners.get(owner, 0) + count
            hold.held -= len(keys)
            self.releasing += len(keys)
            self.released.append(_Released(hold.scope, keys))
        return owners

    def take_released(
        self, limit: int
    ) -> tuple[list[tuple[HeldKey, bytes]], list[tuple[str, str]]]:
        """Up to `limit` released keys, oldest first, with their IDs: no longer held (the
        caller gives them the window); and the writer batches (target, held_batch) all of
        whose keys are now let go (the caller journals HELD_GONE for each)."""
        let_go: list[tuple[HeldKey, bytes]] = []
        gone: list[tuple[str, str]] = []
        released = self.released
        while released and len(let_go) < limit:
            entry = released[0]
            start = entry.let_go
            chunk = entry.keys[start : start + limit - len(let_go)]
            entry.let_go += len(chunk)
            self._let_go(entry, chunk, let_go)
            if entry.let_go == len(entry.keys):
                released.popleft()
                gone.extend(entry.groups)
        return let_go, gone

    def releasing_of(self, scope: str) -> int:
        """How many released keys of hold `scope` wait to be let go."""
        return sum(len(e.keys) - e.let_go for e in self.released if e.scope == scope)

    def _let_go(
        self, entry: _Released, chunk: list[HeldKey], into: list[tuple[HeldKey, bytes]]
    ) -> None:
        ids, groups = self.ids, entry.groups
        self.releasing -= len(chunk)
        writer_batch = WriterBatches().of
        for held in chunk:
            into.append((held, ids.pop(held[0])))
            groups[writer_batch(*split_entry(held[0]))] = None

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
            "held_keys": self.held,
            "released_not_let_go": self.releasing,
            "max_key_holds": self.max_holds,
            "max_held_keys": self.max_held_keys,
            "refused": dict(self.refused),
        }
