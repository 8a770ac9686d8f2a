"""What a replica's Raft group tells the broker's loop (replication.py puts them, the loop takes
them: replicated_turns.py). Apart from replication.py so that a broker without replicas never
loads the consensus engine.
"""

from __future__ import annotations

import msgspec


class Committed(msgspec.Struct, frozen=True):
    """Batch `ticket` is in a majority's logs and applied here."""

    ticket: int


class Failed(msgspec.Struct, frozen=True):
    """Batch `ticket` will never be committed by this leader (it lost leadership)."""

    ticket: int
    reason: str


class RoleChanged(msgspec.Struct, frozen=True):
    leader: bool


class Broken(msgspec.Struct, frozen=True):
    """A committed batch could not be applied to this replica's store (a full disk): the
    store no longer matches the log, so the replica must stop (its next start rebuilds it)."""

    reason: str


Event = Committed | Failed | RoleChanged | Broken
