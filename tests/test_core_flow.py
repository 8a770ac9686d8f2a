"""Overload in the pure core: coalesced refusals, PAUSE/RESUME, the memory limit, consumer
slots of peers that are gone or frozen, and per-turn budgets."""

from __future__ import annotations

import pytest

import phpmq.protocol as p
from harness import CoreHarness, dispatches, errors
from phpmq.broker import core as core_module
from phpmq.broker.dispatch import DISPATCH_PER_TURN
from phpmq.broker.model import RECORD_OVERHEAD_BYTES

PRODUCER = b"producer"
CONSUMER = b"consumer"
OTHER = b"other"
HELLO = p.Hello({"name": "t"})


def of_type(messages: list, kind: type) -> list:
    return [m for m in messages if isinstance(m, kind)]


def test_a_frame_of_refused_sends_costs_one_error_with_its_count() -> None:
    core = CoreHarness(max_queue_length=10)
    core.send(PRODUCER, *[p.Send("q", b"x", 0) for _ in range(10)])
    out = core.send(b"flooder", p.Heartbeat(), *[p.Send("q", b"x", 0) for _ in range(256)])
    [error] = errors(out)
    assert (error.code, error.queue, error.count, error.tag) == (429, "q", 256, None)
    assert error.refused == p.MessageType.SEND
    assert core.core.counters.errors == 256
    assert core.core.queues["q"].refused == 256


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages the core decodes, per decoder call."""
    counts: list[int] = []

    def decode_frame(data: bytes, limit: int) -> tuple[list, p.ProtocolError | None]:
        messages, error = p.decode_frame(data, limit)
        counts.append(len(messages))
        return messages, error

    def decode_message(data: bytes, pos: int, limit: int) -> tuple[p.Message, int]:
        counts.append(1)
        return p.decode_message(data, pos, limit)

    monkeypatch.setattr(core_module, "decode_frame", decode_frame)
    monkeypatch.setattr(core_module, "decode_message", decode_message)
    return counts


@pytest.mark.parametrize("ttl", [None, 0])
def test_a_frame_of_sends_to_a_full_queue_is_refused_reading_one(
    decoded: list[int], ttl: int | None
) -> None:
    """Finding 10 of issue 27: the sends like the first refused one are counted from their
    headers, not decoded one by one, and refused with it: one ERROR, every counter right."""
    core = full_and_refusing()
    decoded.clear()
    packet = p.queue_packet("q")
    frame = b"".join(p.encode_send(packet, b"x" * (n % 5), ttl) for n in range(256))
    core.core.begin_turn()
    core.core.handle_frame(PRODUCER, p.encode(HELLO))
    core.core.handle_frame(PRODUCER, frame)
    out = [m for _, f in core.core.end_turn().frames for m in p.decode_frame(f)[0]]
    assert decoded == [1, 1]  # the HELLO, then the first send of the frame
    [error] = errors(out)
    assert (error.code, error.queue, error.count) == (429, "q", 256)
    assert [(m.code, m.queue) for m in of_type(out, p.Pause)] == [(429, "q")]
    counters = core.core.counters
    assert (counters.errors, counters.overflowed) == (257, 257)
    assert core.core.queues["q"].refused == 257
    assert core.core.ctx.refusals == {429: 257}


def full_and_refusing() -> CoreHarness:
    """A broker with a full queue `q` that refused a send to it in the last turn."""
    core = CoreHarness(max_queue_length=10)
    core.send(PRODUCER, *[p.Send("q", b"x", 0) for _ in range(10)])
    core.send(OTHER, p.Send("q", b"x", 0))
    return core


def test_a_broker_that_refuses_nothing_does_not_look_for_runs(decoded: list[int]) -> None:
    """Runs are looked for only while sends are refused (this turn or the last): the first
    refused frame is decoded as any, the next ones are not, and a quiet turn ends it."""
    core = CoreHarness(max_queue_length=10)
    core.send(PRODUCER, *[p.Send("q", b"x", 0) for _ in range(10)])
    decoded.clear()
    frame = p.encode_all([p.Send("q", b"x", 0)] * 50)
    turns = core.core.ctx.turns
    core.turn((PRODUCER, frame), (PRODUCER, frame))
    assert decoded == [50, 1]
    assert core.core.ctx.turns == turns + 1  # refusals leave the turn count alone
    core.turn()
    core.turn()
    decoded.clear()
    core.turn((PRODUCER, frame))
    assert decoded == [50]
    assert core.core.queues["q"].refused == 150


def test_what_follows_a_refused_run_in_its_frame_is_handled(decoded: list[int]) -> None:
    core = full_and_refusing()
    core.turn((PRODUCER, HELLO), (OTHER, p.Send("q", b"x", 0)))
    out = core.send(
        PRODUCER,
        *[p.Send("q", b"x", 0) for _ in range(100)],
        p.Send("other", b"y", 0),
        p.Send("q", b"x", 0, tag=1),
        *[p.Send("q", b"x", 0) for _ in range(5)],
    )
    assert [(e.code, e.queue, e.count, e.tag) for e in errors(out)] == [
        (429, "q", 100, None),
        (429, "q", None, 1),
        (429, "q", 5, None),
    ]
    assert core.stats("other")["ready"] == 1
    assert core.core.queues["q"].refused == 108
    assert decoded[-2:] == [1, 7]  # the run's first, then what follows it


def test_a_run_and_unlike_sends_after_it_refused_alike_are_still_one_error() -> None:
    core = full_and_refusing()
    core.turn((PRODUCER, HELLO), (OTHER, p.Send("q", b"x", 0)))
    out = core.send(PRODUCER, *[p.Send("q", b"x", 0)] * 3, *[p.Send("q", b"x", 5)] * 4)
    assert [(e.code, e.count) for e in errors(out)] == [(429, 7)]


def test_a_draining_broker_refuses_a_frame_of_sends_as_one(decoded: list[int]) -> None:
    core = CoreHarness()
    core.send(PRODUCER, HELLO)
    core.core.start_drain()
    core.send(OTHER, p.Send("q", b"x", 0))  # refused: a drain refuses every send
    decoded.clear()
    out = core.send(PRODUCER, *[p.Send("q", b"x", 0) for _ in range(50)])
    assert [(e.code, e.count) for e in errors(out)] == [(503, 50)]
    assert decoded == [1]


def test_at_the_memory_limit_a_frame_of_sends_is_refused_as_one(decoded: list[int]) -> None:
    size = 100 + RECORD_OVERHEAD_BYTES
    core = CoreHarness(max_memory=10 * size)
    core.send(PRODUCER, *[p.Send("q", b"x" * 100, 0) for _ in range(10)])
    decoded.clear()
    core.send(b"other-producer", HELLO)
    core.send(OTHER, p.Send("q", b"x", 0))  # refused: memory is at its limit
    decoded.clear()
    out = core.send(b"other-producer", *[p.Send("q", b"y", 0) for _ in range(50)])
    assert [(e.code, e.count) for e in errors(out)] == [(503, 50)]
    assert decoded == [1]
    assert core.core.counters.refused_memory == 51
    assert core.core.queues["q"].refused == 51


def test_refusals_of_tags_that_run_on_are_one_error_and_a_gap_starts_another() -> None:
    core = CoreHarness(max_queue_length=1)
    core.send(PRODUCER, p.Send("q", b"x", 0))
    tags = [5, 6, 7, 9, 10]
    out = core.send(b"confirming", *[p.Send("q", b"x", 0, tag=t) for t in tags])
    assert [(e.tag, e.count) for e in errors(out)] == [(5, 3), (9, 2)]


def test_a_refusal_with_another_reason_is_not_folded_in() -> None:
    core = CoreHarness(max_queue_length=1)
    core.send(PRODUCER, p.Send("q", b"x", 0))
    out = core.send(
        b"mixed",
        p.Heartbeat(),
        p.Send("q", b"x", 0),
        p.Send("bad name", b"x", 0),
        p.Send("q", b"x", 0),
        p.Send("q", b"x", 0),
    )
    assert [(e.code, e.count) for e in errors(out)] == [(429, None), (422, None), (429, 2)]


def test_a_hello_producer_is_paused_at_ninety_percent_and_resumed_under_eighty() -> None:
    core = CoreHarness(max_queue_length=10)
    out = core.send(PRODUCER, HELLO, *[p.Send("q", b"x", 0) for _ in range(8)])
    assert of_type(out, p.Pause) == []
    [pause] = of_type(core.send(PRODUCER, p.Send("q", b"x", 0)), p.Pause)
    assert (pause.code, pause.queue) == (429, "q")
    assert "wait for RESUME" in pause.reason
    # Still taken up to the limit, and paused only once.
    out = core.send(PRODUCER, p.Send("q", b"x", 0), p.Send("q", b"x", 0))
    assert of_type(out, p.Pause) == []
    [full] = errors(out)
    assert full.code == 429
    assert core.stats("q")["ready"] == 10
    core.send(CONSUMER, p.Consume("q", 2))
    assert core.core.queues["q"].paused  # 8 ready: not under 80% yet
    out = core.turn((CONSUMER, [p.Consume("q", 3)]))
    assert of_type(out[PRODUCER], p.Resume) == [p.Resume("q")]
    assert core.core.counters.pauses == 1 and core.core.counters.resumes == 1


def test_a_drop_oldest_queue_pauses_nobody() -> None:
    core = CoreHarness(max_queue_length=10, overflow="drop-oldest")
    out = core.send(PRODUCER, HELLO, *[p.Send("q", b"x", 0) for _ in range(20)])
    assert of_type(out, p.Pause) == [] and errors(out) == []
    assert core.stats("q")["ready"] == 10


def test_stock_producers_get_no_pause() -> None:
    core = CoreHarness(max_queue_length=10)
    assert core.send(b"stock", *[p.Send("q", b"x") for _ in range(20)]) == []
    assert core.stats("q")["ready"] == 10


def test_a_paused_producer_that_leaves_is_forgotten() -> None:
    core = CoreHarness(max_queue_length=10)
    core.send(PRODUCER, HELLO, *[p.Send("q", b"x", 0) for _ in range(9)])
    assert PRODUCER in {peer.id for peer in core.core.queues["q"].paused}
    core.send(PRODUCER, p.Kbai())
    assert core.core.queues["q"].paused == {}


def test_the_memory_limit_refuses_sends_until_under_eighty_percent() -> None:
    size = 100 + RECORD_OVERHEAD_BYTES
    core = CoreHarness(max_memory=10 * size)
    out = core.send(PRODUCER, HELLO, *[p.Send("q", b"x" * 100, 0) for _ in range(8)])
    assert of_type(out, p.Pause) == []
    [pause] = of_type(core.send(PRODUCER, p.Send("q", b"x" * 100, 0)), p.Pause)
    assert (pause.code, pause.queue) == (503, None)
    core.send(PRODUCER, p.Send("q", b"x" * 100, 0))  # the 10th: at the limit, alarm on
    [refused] = errors(core.send(b"other-producer", p.Heartbeat(), p.Send("q", b"y", 0)))
    assert refused.code == 503 and "memory" in refused.reason
    assert core.core.counters.refused_memory == 1
    assert core.core.admin.run({"command": "stats"})["memory"]["alarm"] is True
    consumed = dispatches(core.send(CONSUMER, p.Consume("q", 3)))
    out = core.turn((CONSUMER, [p.Ack("q", d.message_id) for d in consumed]))
    assert of_type(out[PRODUCER], p.Resume) == [p.Resume(None)]
    assert of_type(out.get(b"other-producer", []), p.Resume) == []  # never said HELLO
    assert errors(core.send(b"other-producer", p.Send("q", b"y", 0))) == []


def test_held_bytes_count_what_is_held_and_nothing_else() -> None:
    core = CoreHarness(max_queue_length=0)
    core.send(PRODUCER, *[p.Send("q", b"x" * 10, 0) for _ in range(5)])
    per_message = 10 + RECORD_OVERHEAD_BYTES
    assert core.core.ctx.held_bytes == 5 * per_message
    [first, *_] = dispatches(core.send(CONSUMER, p.Consume("q", 5)))
    assert core.core.ctx.held_bytes == 5 * per_message  # in flight still counts
    core.send(CONSUMER, p.Ack("q", first.message_id), p.DeadLetter("q", _[0].message_id))
    assert core.core.ctx.held_bytes == 3 * per_message
    core.send(CONSUMER, p.Kbai())
    core.core.admin.run({"command": "queue-purge", "queue": "q"})
    assert core.core.ctx.held_bytes == 0


def test_a_stock_consumers_idle_window_past_its_lease_frees_its_slot() -> None:
    core = CoreHarness(max_consumers=2, lease_ms=1000)
    core.send(b"stock-1", p.Consume("q", 1))
    core.send(b"stock-2", p.Consume("q", 1))
    [refused] = errors(core.send(CONSUMER, HELLO, p.Consume("q", 1)))
    assert refused.code == 429
    core.advance(1.5)
    core.send(b"stock-2", p.Consume("q", 1))  # still speaks: it counts
    assert errors(core.send(CONSUMER, p.Consume("q", 1))) == []
    assert core.core.counters.consumers_reclaimed == 1
    assert b"stock-1" not in core.core.peers
    core.send(PRODUCER, p.Send("q", b"x", 0))
    assert [w.peer.id for w in core.core.queues["q"].windows] == [b"stock-2", CONSUMER]


def test_a_stalled_consumers_slot_is_reclaimed_first() -> None:
    core = CoreHarness(max_consumers=1, lease_ms=1000)
    core.send(PRODUCER, p.Send("q", b"x", 0))
    [held] = dispatches(core.send(b"frozen", p.Consume("q", 1)))
    core.advance(1)
    core.turn()
    assert core.core.peers[b"frozen"].stalled
    [again] = dispatches(core.send(CONSUMER, HELLO, p.Consume("q", 1))[1:])
    assert again.message_id == held.message_id


def test_heartbeating_consumers_are_never_reclaimed() -> None:
    core = CoreHarness(max_consumers=1, lease_ms=1000, max_heartbeat_ms=60_000)
    core.send(b"live", p.Hello({"heartbeat_ms": 60_000}), p.Consume("q", 1))
    core.advance(30)
    [refused] = errors(core.send(CONSUMER, HELLO, p.Consume("q", 1)))
    assert refused.code == 429


def test_one_turn_dispatches_at_most_its_budget_and_the_next_goes_on() -> None:
    core = CoreHarness(max_queue_length=0, max_window=100_000)
    total = DISPATCH_PER_TURN + 100
    core.send(PRODUCER, *[p.Send("q", b"x", 0) for _ in range(total)])
    first = dispatches(core.send(CONSUMER, p.Consume("q", 100_000)))
    assert len(first) == DISPATCH_PER_TURN
    assert core.core.next_deadline() == core.core.now  # more to do at once
    assert len(dispatches(core.turn()[CONSUMER])) == 100
