"""The deadlines: the one heap of everything the core does by itself at a given time: message TTLs,
delayed requeues and sends, leases, peer expiry, heartbeats owed, idempotency-key expiry, and
the runs of scheduled jobs.

One heap of (due_ns, seq, kind, target) (a pair target armed flat: `arm_pair`), driven by the
core's injected clock. Entries are never removed when they become moot (a message was acked, a
peer spoke again): the part that owns the kind checks, when the entry comes due, whether it
still applies. So arming is one heap push and cancelling costs nothing. Moot entries are
dropped (`compact`, a slice a turn) when the heap grows past twice the entries still live,
so a fast queue with long TTLs does not keep an entry per message for the whole TTL.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any

#: Entry kinds, and the target each carries.
TTL = 0  # (queue serial, Record), armed flat (arm_pair): a ready message's TTL may be over
DELAY_OVER = 1  # (queue serial, Record), flat: a delayed requeue or send goes into its queue
LEASE = 2  # Window: has its earliest lease run out?
PEER_EXPIRY = 3  # Peer: silent past its expiry (or, without heartbeats, idle)?
HEARTBEAT = 4  # Peer: has the broker been silent towards it for an interval?
KEY_EXPIRY = 5  # None: the oldest idempotency keys' window is over
UNUSED_QUEUE = 6  # Queue: has it been without consumers for its delete-when-unused time?
SCHEDULE_RUN = 7  # schedule entry (broker/schedules.py): a named schedule is due to run
BATCH_LEASE_TIMEOUT = 8  # Lease (broker/leases.py): untouched for its timeout?
KEY_LET_GO = 9  # None: keys a hold released wait to be let go (key_holds.LET_GO_PER_TURN a turn)
PURGE_SLICE = 10  # None: ready records a purge set aside wait to be retired (queues.py)

#: The heap is never compacted below this many entries (compacting is O(n))...
COMPACT_MIN_ENTRIES = 65_536
#: ...and a compaction looks at this many entries a turn at most: a heap of a million (a
#: big queue's TTLs) took 120 ms and more in one turn; a slice is 1-4 ms.
COMPACT_SLICE = 8_192

#: (due_ns, seq, kind, target), or (due_ns, seq, kind, first, second) armed flat (arm_pair).
Entry = tuple[Any, ...]


class Deadlines:
    __slots__ = ("_compact_at", "_compacting", "_heap", "_seq", "_seq_at_slice")

    def __init__(self) -> None:
        self._heap: list[Entry] = []
        #: While a compaction runs: the heap it compacts, from which entries are still popped
        #: when due, and whose end it cuts a slice at a time (what is left of a heap's array
        #: after its end is cut is still a heap); new entries go to `_heap`.
        self._compacting: list[Entry] = []
        self._seq = 0
        #: `_seq` at the last slice: what was armed since, a slice must outrun.
        self._seq_at_slice = 0
        self._compact_at = COMPACT_MIN_ENTRIES

    def __len__(self) -> int:
        return len(self._heap) + len(self._compacting)

    def arm(self, due_ns: int, kind: int, target: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due_ns, self._seq, kind, target))

    def arm_pair(self, due_ns: int, kind: int, first: int, second: Any) -> None:
        """`arm` with the target (first, second), kept flat in the entry: an entry of numbers
        and an object the GC does not track is untracked at its first collection, where a
        tuple inside it may be looked at after it and keep it tracked (a TTL a message:
        promoted, they made the GC's full passes over big queues frequent)."""
        self._seq += 1
        heapq.heappush(self._heap, (due_ns, self._seq, kind, first, second))

    def next_due(self) -> int | None:
        heap, old = self._heap, self._compacting
        if old and (not heap or old[0] < heap[0]):
            return old[0][0]
        return heap[0][0] if heap else None

    def pop_due(self, now_ns: int) -> Iterator[tuple[int, int, Any]]:
        """Pop and yield (due, kind, target) for every entry due at `now_ns`, including
        entries armed while iterating that are already due, in due order."""
        heap, old = self._heap, self._compacting
        while True:
            if old and old[0][0] <= now_ns and (not heap or old[0] < heap[0]):
                entry = heapq.heappop(old)
            elif heap and heap[0][0] <= now_ns:
                entry = heapq.heappop(heap)
            else:
                return
            yield entry[0], entry[2], entry[3] if len(entry) == 4 else entry[3:]

    def needs_compaction(self) -> bool:
        return bool(self._compacting) or len(self._heap) > self._compact_at

    def compact(self, is_live: Callable[[int, int, Any], bool]) -> None:
        """One turn's share of a compaction: COMPACT_SLICE entries looked at, or four times
        what was armed since the last slice if more (the entries armed meanwhile are not
        looked at, and a compaction that let them outgrow it would never end), those for
        which is_live(due, kind, target) holds kept, the others dropped."""
        if not self._compacting:
            self._compacting, self._heap = self._heap, []
            self._seq_at_slice = self._seq
        old, heap = self._compacting, self._heap
        size = max(COMPACT_SLICE, 4 * (self._seq - self._seq_at_slice))
        self._seq_at_slice = self._seq
        push = heapq.heappush
        for entry in old[-size:]:
            if is_live(entry[0], entry[2], entry[3] if len(entry) == 4 else entry[3:]):
                push(heap, entry)
        del old[-size:]
        if not old:
            self._compact_at = max(COMPACT_MIN_ENTRIES, 2 * len(heap))


class NextTurn:
    """A part's one entry of `kind` for work it does a slice a turn (keys let go, a purge's
    records retired): armed for the next turn while work waits, never twice at once."""

    __slots__ = ("_deadlines", "_kind", "_due")

    def __init__(self, deadlines: Deadlines, kind: int) -> None:
        self._deadlines = deadlines
        self._kind = kind
        self._due = 0

    def arm(self, now_ns: int) -> None:
        """Due after this turn's pass over the deadlines (none armed yet)."""
        if not self._due:
            self._due = now_ns + 1
            self._deadlines.arm(self._due, self._kind, None)

    def is_live(self, due: int, target: None) -> bool:
        return due == self._due

    def take(self, due: int) -> bool:
        """Whether `due` is the armed entry's (then it is armed no more)."""
        if due != self._due:
            return False
        self._due = 0
        return True
