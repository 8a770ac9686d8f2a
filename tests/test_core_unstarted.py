"""005 REQUEUE with FLAGS = unstarted: a consumer hands back a message it never started
(docs/protocol.md §3.6). It goes back to the head as it was: no delivery counted, its TTL kept,
`max_deliveries` not used up (issue 33, item 3). Pure core, fake clock."""

from __future__ import annotations

import phpmq.protocol as p
from harness import REPO, CoreHarness, dispatches, errors

PRODUCER = b"producer"
CONSUMER = b"consumer"
OTHER = b"other"
HELLO = p.Hello({"name": "test"})


def _unstarted(queue: str, message_id: bytes) -> p.Requeue:
    return p.Requeue(queue, message_id, 0, None, p.REQUEUE_UNSTARTED)


def test_an_unstarted_return_goes_to_the_head_with_its_delivery_count_unchanged(
    core: CoreHarness,
) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0), p.Send("jobs", b"b", 0), p.Send("jobs", b"c", 0))
    held = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 2)))
    assert [d.content for d in held] == [b"a", b"b"]
    # Handed back last-first, so the head keeps the order they were dispatched in.
    core.send(
        CONSUMER,
        p.Consume("jobs", 0),
        _unstarted("jobs", held[1].message_id),
        _unstarted("jobs", held[0].message_id),
    )
    again = dispatches(core.send(OTHER, HELLO, p.Consume("jobs", 3)))
    assert [(d.content, d.delivery_count) for d in again] == [(b"a", 1), (b"b", 1), (b"c", 1)]
    counters = core.core.counters
    assert (counters.returned_unstarted, counters.requeued, counters.redelivered) == (2, 0, 0)


def test_an_unstarted_return_keeps_the_ttl_and_ignores_the_requeue_ttl_and_delay(
    core: CoreHarness,
) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 100))
    [first] = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    core.advance(10)
    returned = p.Requeue("jobs", first.message_id, 5, 60_000, p.REQUEUE_UNSTARTED)
    [again] = dispatches(core.send(CONSUMER, returned))
    assert (again.message_id, again.ttl, again.delivery_count) == (first.message_id, 90, 1)


def test_unstarted_returns_never_use_up_max_deliveries(core: CoreHarness) -> None:
    core = CoreHarness(max_deliveries=1)
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    [dispatch] = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    for _ in range(5):
        [dispatch] = dispatches(core.send(CONSUMER, _unstarted("jobs", dispatch.message_id)))
        assert dispatch.delivery_count == 1
    assert core.stats("jobs") == {"ready": 0, "in_flight": 1, "dead": 0}
    # A plain requeue still counts: past max_deliveries 1 it is buried.
    assert dispatches(core.send(CONSUMER, p.Requeue("jobs", dispatch.message_id, 0))) == []
    assert core.stats("jobs") == {"ready": 0, "in_flight": 0, "dead": 1}


def test_an_unstarted_return_of_a_message_not_held_is_refused(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    [dispatch] = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    [error] = errors(core.send(OTHER, HELLO, _unstarted("jobs", dispatch.message_id)))
    assert error.code == p.ErrorCode.UNKNOWN_MESSAGE
    assert core.core.counters.returned_unstarted == 0


def test_the_flag_is_a_bit_other_bits_mean_a_plain_requeue(core: CoreHarness) -> None:
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    [first] = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    [again] = dispatches(core.send(CONSUMER, p.Requeue("jobs", first.message_id, 0, None, 2)))
    assert again.delivery_count == 2


def test_durable_unstarted_return_is_journaled_with_the_same_count() -> None:
    core = CoreHarness(durable=True)
    core.send(PRODUCER, p.Send("jobs", b"a", 0))
    [first] = dispatches(core.send(CONSUMER, HELLO, p.Consume("jobs", 1)))
    core.core.journal.take()
    core.send(CONSUMER, p.Consume("jobs", 0), _unstarted("jobs", first.message_id))
    backs = [op for op in core.core.journal.take() if op[0] == "back"]
    assert [(op[1], op[4]) for op in backs] == [(first.message_id, 1)]


def test_the_worked_example_in_the_protocol_is_what_the_codec_writes() -> None:
    lines = (REPO / "docs" / "protocol.md").read_text().splitlines()
    comment = lines.index(
        "# 005 REQUEUE with the extension FLAGS packet 1: handed back unstarted (§3.6)"
    )
    wire = lines[comment + 1].encode()
    message_id = b"d7e7f68761d34838494b233148b5486c"
    assert p.encode(_unstarted("Foo", message_id)) == wire
    assert p.decode_frame(wire) == ([_unstarted("Foo", message_id)], None)
