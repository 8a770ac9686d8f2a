"""The deadline heap (broker/deadlines.py): a compaction of a big heap is spread over turns,
and nothing due waits for it."""

from __future__ import annotations

import gc
from typing import Any

from test_core_liveness import CONSUMER, PRODUCER, hello

import phpmq.protocol as p
from harness import CoreHarness, dispatches
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


def test_ttl_deadlines_give_the_gc_nothing_to_walk() -> None:
    """A TTL's deadline names its queue by number and holds its record flat in the entry (a
    type the GC does not track): CPython untracks the entry the first time it looks at it,
    so a big queue of messages with a TTL neither adds to the GC's full passes nor makes
    them frequent. (With a (queue, record) tuple inside, entries stayed tracked; with even a
    (serial, record) tuple inside, a collection between the two allocations promoted the
    entry to the oldest generation: 12 full passes of up to 0.5 s while 800,000 were sent.)
    Small thresholds make collections fall between any two allocations."""
    core = CoreHarness()
    core.send(b"producer", p.Send("jobs", b"warm", 60))
    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(5, 1, 1)
    try:
        oldest = len(gc.get_objects(generation=2))
        for _ in range(20):
            core.send(b"producer", *[p.Send("jobs", b"m", 60) for _n in range(500)])
        grown = len(gc.get_objects(generation=2)) - oldest
    finally:
        gc.set_threshold(*thresholds)
    assert grown < 500, f"{grown} objects reached the oldest generation for 10,000 TTLs"
    core.advance(61)
    for _ in range(30):  # expiry as before: every one of them a dead letter
        core.turn()
        core.advance(0.001)
    assert core.core.counters.expired == 10_001


def test_a_fast_pipe_with_ttls_keeps_its_deadline_heap_bounded() -> None:
    """8,000 sends a turn (TTL 1 h), each acked the next turn: every TTL entry is moot
    within a turn, so compaction keeps the heap near COMPACT_MIN_ENTRIES. (Slices of a fixed
    size let the entries armed during a compaction outgrow it: the heap grew by 8,000 a
    turn, every acked message's record kept for its whole TTL.)"""
    core = CoreHarness()
    core.send(CONSUMER, hello(60_000), p.Consume("jobs", 50_000))
    acks: list = []
    sizes = []
    for _ in range(120):
        sends = [p.Send("jobs", b"x", 3600) for _ in range(8_000)]
        out = core.turn((PRODUCER, sends), (CONSUMER, acks))
        acks = [p.Ack("jobs", d.message_id) for d in dispatches(out.get(CONSUMER, []))]
        sizes.append(len(core.core.deadlines))
    assert core.core.counters.acked >= 110 * 8_000
    assert max(sizes) <= 4 * 65_536, sizes[-10:]


def test_ttls_of_a_deleted_queue_do_not_touch_its_successor() -> None:
    """TTL deadlines name a queue by its serial: those of a deleted queue find none."""
    core = CoreHarness()
    for n in (10, 20_000):  # a small delete (retired at once) and a big one (set aside)
        core.send(PRODUCER, *[p.Send("jobs", b"old", 1) for _ in range(n)])
        core.admin("queue-delete", queue="jobs")
        core.send(PRODUCER, *[p.Send("jobs", b"new", 5) for _ in range(n)])
        core.advance(2)
        for _ in range(10):
            core.turn()
            core.advance(0.001)
        assert core.stats("jobs")["ready"] == n
        assert core.core.counters.expired == 0
        core.advance(4)
        for _ in range(10):
            core.turn()
            core.advance(0.001)
        assert core.core.counters.expired == n and core.stats("jobs")["ready"] == 0
        assert core.core.queues["jobs"].stale == 0
        core.core.counters.expired = 0
        core.admin("queue-delete", queue="jobs")


def test_ttls_during_a_big_purge_and_head_trim_keep_stale_right() -> None:
    core = CoreHarness()
    core.send(PRODUCER, *[p.Send("jobs", b"a", 1) for _ in range(12_000)])
    core.admin("queue-purge", queue="jobs")
    core.send(PRODUCER, *[p.Send("jobs", b"b", 1) for _ in range(300)], p.Send("jobs", b"k", 0))
    core.advance(1)
    for _ in range(10):
        core.turn()
        core.advance(0.001)
    q = core.core.queues["jobs"]
    assert core.core.counters.expired == 300
    assert q.stale == sum(r.state != 0 for r in q.ready)
    assert core.stats("jobs")["ready"] == 1


def test_delayed_sends_of_a_deleted_queue_do_not_land_in_its_successor() -> None:
    """A delay's deadline names its queue by serial too: the one deleted is gone."""
    core = CoreHarness()
    core.send(PRODUCER, *[p.Send("jobs", b"old", 60, delay_ms=1_000) for _ in range(3)])
    core.admin("queue-delete", queue="jobs")
    core.send(PRODUCER, p.Send("jobs", b"new", 60))
    core.advance(2)
    core.turn()
    got = dispatches(core.send(CONSUMER, hello(60_000), p.Consume("jobs", 10)))
    assert [d.content for d in got] == [b"new"]
