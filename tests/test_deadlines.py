"""The deadline heap (broker/deadlines.py): a compaction of a big heap is spread over turns,
and nothing due waits for it."""

from __future__ import annotations

import gc
from typing import Any

import phpmq.protocol as p
from harness import CoreHarness
from phpmq.broker.deadlines import COMPACT_MIN_ENTRIES, COMPACT_SLICE, TTL, Deadlines

SIZE = 4 * COMPACT_MIN_ENTRIES


def moot_every_other(due: int, kind: int, target: Any) -> bool:
    return target % 2 == 0


def test_a_big_heap_is_compacted_a_slice_a_turn_and_keeps_the_live_entries() -> None:
    deadlines = Deadlines()
    for n in range(SIZE):
        deadlines.arm(1_000 + n, TTL, n)
    assert deadlines.needs_compaction()
    turns = 0
    looked_at = []
    while deadlines.needs_compaction():
        before = len(deadlines)
        deadlines.compact(moot_every_other)
        looked_at.append(before - len(deadlines))
        turns += 1
        deadlines.arm(10**9 + turns, TTL, -2 * turns)  # armed meanwhile: kept, and live
    assert turns == SIZE // COMPACT_SLICE
    assert max(looked_at) <= COMPACT_SLICE // 2 + 1  # half of a slice dropped, no more
    popped = [target for _, _, target in deadlines.pop_due(10**10)]
    assert popped == [*range(0, SIZE, 2), *(-2 * turn for turn in range(1, turns + 1))]


def test_what_is_due_during_a_compaction_is_popped_in_due_order_from_both_heaps() -> None:
    deadlines = Deadlines()
    for n in range(SIZE):
        deadlines.arm(1_000 + n, TTL, 2 * n)  # all live
    deadlines.compact(moot_every_other)  # one slice moved: the heap's end
    deadlines.arm(1_000 + 5, TTL, -1)  # due between two entries still in the old heap
    assert deadlines.next_due() == 1_000
    popped = [(due, target) for due, _, target in deadlines.pop_due(1_000 + 6)]
    assert popped == [
        (1_000, 0),
        (1_001, 2),
        (1_002, 4),
        (1_003, 6),
        (1_004, 8),
        (1_005, 10),
        (1_005, -1),
        (1_006, 12),
    ]
    while deadlines.needs_compaction():
        deadlines.compact(moot_every_other)
    dues = [due for due, _, _ in deadlines.pop_due(10**10)]
    assert dues == sorted(dues) and len(dues) == SIZE - 7


def test_a_million_ttls_give_the_gc_nothing_to_walk() -> None:
    """A TTL's deadline names its queue by number: the entry holds only numbers and a record
    (a type the GC does not track), so CPython untracks it, and a big queue of messages with
    a TTL does not make every full collection walk two tuples a message (0.2-0.5 s pauses)."""
    core = CoreHarness()
    core.send(b"producer", p.Send("jobs", b"warm", 60))
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(20):
        core.send(b"producer", *[p.Send("jobs", b"m", 60) for _n in range(1_000)])
    gc.collect()
    assert len(gc.get_objects()) - before < 1_000
    core.advance(61)
    for _ in range(30):  # expiry as before: every one of them a dead letter
        core.turn()
        core.advance(0.001)
    assert core.core.counters.expired == 20_001
