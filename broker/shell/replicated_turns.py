"""The loop's side of a replicated shard (docs/cluster.md "Replicated queues"): each batch of
journal operations goes to the shard's Raft group (replication.py), and what the loop turns
held meanwhile (CONFIRMs, the answers of commands that changed the store) waits until that
batch is committed by a majority, then goes out in the order it was made. So nothing a peer
is told is stored rests on an entry a failover could lose. (Dispatches go at once: a message
whose send is not confirmed yet may be lost with its leader; its producer sends it again.)

A message sent and acked while its batch waits for its turn never reaches the group: its
PUT and DROP cancel out (the pipe's common case, which then costs no replica any write).

Batches are cut as the group keeps up: at most MAX_IN_FLIGHT are uncommitted at once, and
the operations of the turns in between form the next one (group commit across turns, like
the single store's one fsync per turn). Past MAX_WAITING_OPERATIONS waiting, the server reads
no input until batches are committed (a group without a majority stalls its peers, which
then see a silent broker, rather than grow the broker's memory).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import TYPE_CHECKING

from ..core import Frames
from ..journal import DROP, PUT
from .replica_events import Broken, Committed, Failed, RoleChanged

if TYPE_CHECKING:
    from .replication import ReplicaGroup

log = logging.getLogger("phpmq.replication")

#: Batches handed to the group and not yet committed, at most.
MAX_IN_FLIGHT = 2
#: Operations waiting for a batch of their own beyond which the server reads no input.
MAX_WAITING_OPERATIONS = 200_000
#: A leader that is not its shard's preferred replica (the home one) hands leadership back
#: once it has led this long and the home replica has every entry; it tries again this often.
HAND_BACK_AFTER_S = 10.0
HAND_BACK_EVERY_S = 5.0


class ReplicatedTurns:
    """Starts as a follower: output goes out at once, and the core makes no operations (it
    serves none of the shard's queues). Once the group elects this replica, a barrier
    batch is committed (every earlier entry is then applied to the store) and `promoted`
    turns True: the server loads the store and serves; from then on batches go to the
    group. A leader that loses the group never follows again: `lost` says why, and the
    server exits (the replica starts over as a follower)."""

    def __init__(self, group: ReplicaGroup, endpoints: dict[str, str], preferred: str = "") -> None:
        """`endpoints`: each replica's broker endpoint by its Raft address; `preferred`: the
        Raft address of the replica that should lead when it can (the shard's home)."""
        self._group = group
        self._endpoints = endpoints
        self._preferred = preferred
        self._hand_back_at = 0.0
        self.hand_backs = 0
        self.leading = False
        #: Set once the barrier is committed, until the server takes it (`take_promotion`).
        self._promoted = False
        self._barrier: int | None = None
        #: Operations a follower's core made: none should exist (counted, never sent).
        self.dropped_operations = 0
        #: Operations and output of the turns since the last batch went to the group; a
        #: PUT cancelled by its DROP is None. Where each message's PUT is in it, by ID.
        self._operations: list[tuple | None] = []
        self._put_at: dict[bytes, int] = {}
        self.cancelled = 0
        self._output: Frames = []
        #: Batches in the group, oldest first: (ticket, the output that waits for it).
        self._in_flight: deque[tuple[int, Frames]] = deque()
        #: Why this replica can no longer lead (None while it can): the server stops.
        self.lost: str | None = None
        self.batches = 0
        self.operations = 0

    def add(self, operations: list[tuple], output: Frames) -> Frames:
        """A turn's operations and output; returns what may go out now."""
        if not self.leading:
            self.dropped_operations += len(operations)
            return output
        if operations:
            self._gather(operations)
        if output:
            self._output.extend(output)
        return self._next()

    def on_events(self) -> Frames:
        """What the group did since the last call; returns the output now committed."""
        ready: Frames = []
        for event in self._group.take_events():
            if not self.leading:
                self._follow(event)
            elif isinstance(event, Committed):
                if not self._in_flight or self._in_flight[0][0] != event.ticket:
                    self._lose(f"batch {event.ticket} was committed out of order")
                    continue
                ready.extend(self._in_flight.popleft()[1])
            elif isinstance(event, Failed):
                self._lose(f"batch {event.ticket} failed: {event.reason}")
            elif isinstance(event, RoleChanged) and not event.leader:
                self._lose("another replica was elected leader, or no majority answers")
            elif isinstance(event, Broken):
                self._lose(event.reason)
        if self.lost is None:
            ready.extend(self._next())
        return ready

    def _gather(self, operations: list[tuple]) -> None:
        waiting, put_at = self._operations, self._put_at
        for operation in operations:
            kind = operation[0]
            if kind == DROP:
                at = put_at.pop(operation[1], None)
                if at is not None:
                    waiting[at] = None  # sent and acked before either was replicated
                    self.cancelled += 1
                    continue
            elif kind == PUT:
                put_at[operation[1]] = len(waiting)
            waiting.append(operation)

    def _follow(self, event: object) -> None:
        """A follower's events: elected, it commits a barrier before it may serve. A barrier
        of a term it no longer leads (it lost the election's outcome meanwhile, and another
        leader committed the entry) promotes nothing: it must still lead when it lands."""
        if isinstance(event, RoleChanged):
            self._barrier = self._group.submit([]) if event.leader else None
        elif isinstance(event, Committed) and event.ticket == self._barrier:
            self._barrier = None
            if not self._group.is_leader():
                return
            self.leading = self._promoted = True
            self._hand_back_at = time.monotonic() + HAND_BACK_AFTER_S
        elif isinstance(event, Failed) and event.ticket == self._barrier:
            log.info("the barrier entry failed (%s): following again", event.reason)
            self._barrier = None
        elif isinstance(event, Broken):
            self._lose(event.reason)

    def tick(self, now: float) -> None:
        """Once a turn: a leader that is not the preferred replica offers to hand back."""
        preferred = self._preferred
        if (
            self.leading
            and preferred
            and preferred != self._group.address
            and now >= self._hand_back_at
            and self.lost is None
        ):
            self._hand_back_at = now + HAND_BACK_EVERY_S
            self.hand_backs += 1
            self._group.hand_to(preferred)

    def set_replicas(self, endpoints: dict[str, str], preferred: str) -> None:
        """The shard's replicas after a change of membership (docs/cluster.md "Membership")."""
        self._endpoints = endpoints
        self._preferred = preferred

    def keep_leading(self) -> None:
        """Leadership was moved here by hand (`replica-lead`, broker/shell/leadership.py): no
        hand-back to the preferred replica while this replica leads."""
        self._hand_back_at = math.inf

    def take_promotion(self) -> bool:
        """True once, when this replica may start serving its shard."""
        promoted, self._promoted = self._promoted, False
        return promoted

    def leader_endpoint(self) -> str | None:
        """The broker endpoint of the group's leader, when one is known."""
        leader = self._group.leader_address()
        return None if leader is None else self._endpoints.get(leader)

    @property
    def held_back(self) -> bool:
        """Whether input should wait: too many operations wait for a batch."""
        return len(self._operations) > MAX_WAITING_OPERATIONS

    @property
    def idle(self) -> bool:
        return not self._in_flight and not self._operations and not self._output

    def _next(self) -> Frames:
        if self.lost is not None:
            return []
        if self._operations:
            if len(self._in_flight) < MAX_IN_FLIGHT:
                batch = [operation for operation in self._operations if operation is not None]
                ticket = self._group.submit(batch)
                self.batches += 1
                self.operations += len(batch)
                self._in_flight.append((ticket, self._output))
                self._operations, self._output = [], []
                self._put_at.clear()
            return []
        if self._output and not self._in_flight:
            output, self._output = self._output, []
            return output
        return []

    def _lose(self, why: str) -> None:
        if self.lost is not None:
            return
        self.lost = why
        if not self.leading:
            log.warning("this replica stops (%s)", why)
            return
        held = sum(len(output) for _, output in self._in_flight) + len(self._output)
        log.warning(
            "this replica stops leading (%s): %d frames of answers were never sent",
            why,
            held,
        )

    def stats(self) -> dict[str, object]:
        return {
            **self._group.status(),
            "role": "leader" if self.leading else "follower",
            "leader_endpoint": self.leader_endpoint(),
            "dropped_operations": self.dropped_operations,
            "preferred": self._preferred,
            "hand_back_offers": self.hand_backs,
            "batches": self.batches,
            "operations": self.operations,
            "batches_in_flight": len(self._in_flight),
            "operations_waiting": len(self._operations),
            "cancelled_before_replication": self.cancelled,
        }
