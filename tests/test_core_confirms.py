"""Publisher confirms and idempotent keys in the pure core (docs/protocol.md §6.4)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import phpmq.protocol as p
from harness import CoreHarness, dispatches, errors
from phpmq.broker.clock import FakeClock
from phpmq.broker.config import BrokerConfig
from phpmq.broker.core import Core
from phpmq.broker.journal import KEY, Journal
from phpmq.broker.shell.durable import DurableStore

PRODUCER = b"producer"
CONSUMER = b"consumer"


def confirms(messages: list) -> list[p.Confirm]:
    return [m for m in messages if isinstance(m, p.Confirm)]


def tagged(tag: int, queue: str = "jobs", content: bytes = b"x", **fields: object) -> p.Send:
    return p.Send(queue, content, 0, tag=tag, **fields)  # type: ignore[arg-type]


def test_a_tagged_send_is_confirmed_with_the_id_consumers_see() -> None:
    core = CoreHarness()
    [confirm] = core.send(PRODUCER, tagged(7, content=b"a"))
    assert confirm.tag == 7 and len(confirm.message_id) == 32
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    assert dispatch.message_id == confirm.message_id


def test_confirms_come_in_send_order_in_one_frame() -> None:
    core = CoreHarness()
    core.core.begin_turn()
    core.core.handle_frame(PRODUCER, p.encode_all([tagged(n) for n in range(50)]))
    [(peer, frame)] = core.core.end_turn().frames
    messages, error = p.decode_frame(frame)
    assert peer == PRODUCER and error is None
    assert [m.tag for m in messages] == list(range(50))
    assert len({m.message_id for m in messages}) == 50


def test_hello_with_confirm_answers_every_send_even_untagged() -> None:
    core = CoreHarness()
    [answer] = core.send(PRODUCER, p.Hello({"confirm": True}))
    assert answer.options["confirm"] is True and answer.options["durable"] is False
    assert answer.options["dedup_window_ms"] == 120_000
    [confirm] = core.send(PRODUCER, p.Send("jobs", b"a", 0))
    assert confirm.tag is None
    [answer] = core.send(PRODUCER, p.Hello({}))  # a later HELLO without it turns it off
    assert answer.options["confirm"] is False
    assert core.send(PRODUCER, p.Send("jobs", b"b", 0)) == []


def test_an_untagged_send_from_a_peer_that_did_not_opt_in_gets_no_confirm() -> None:
    core = CoreHarness()
    assert core.send(PRODUCER, p.Send("jobs", b"a", 0), p.Send("jobs", b"b")) == []
    assert core.core.counters.confirmed == 0


@pytest.mark.parametrize(
    ("setup", "send", "code"),
    [
        ({}, tagged(3, queue="bad name"), p.ErrorCode.INVALID_VALUE),
        ({"max_queue_length": 1}, tagged(3), p.ErrorCode.LIMIT_REACHED),
        ({"max_queues": 1}, tagged(3, queue="other"), p.ErrorCode.LIMIT_REACHED),
        ({}, tagged(3, key=""), p.ErrorCode.INVALID_VALUE),
        ({}, tagged(3, key="k" * 256), p.ErrorCode.INVALID_VALUE),
    ],
    ids=["bad-queue", "queue-full", "too-many-queues", "empty-key", "long-key"],
)
def test_a_refused_send_gets_an_error_with_its_tag(
    setup: dict, send: p.Send, code: p.ErrorCode
) -> None:
    core = CoreHarness(**setup)
    [first] = core.send(PRODUCER, tagged(1))
    assert isinstance(first, p.Confirm)
    [error] = core.send(PRODUCER, send)  # a tag opts the peer in: it gets ERRORs
    assert (error.code, error.tag) == (code, 3)


def test_a_send_while_draining_is_refused_with_its_tag() -> None:
    core = CoreHarness()
    core.core.start_drain()
    [error] = errors(core.send(PRODUCER, tagged(9)))
    assert (error.code, error.tag) == (p.ErrorCode.SHUTTING_DOWN, 9)


def test_a_repeated_key_is_confirmed_with_the_first_id_and_queued_once() -> None:
    core = CoreHarness()
    [first] = core.send(PRODUCER, tagged(1, key="order-17", content=b"first"))
    [again] = core.send(PRODUCER, tagged(2, key="order-17", content=b"retry"))
    assert (again.message_id, again.tag) == (first.message_id, 2)
    [elsewhere] = core.send(PRODUCER, tagged(3, queue="other", key="order-17"))
    assert elsewhere.message_id != first.message_id  # keys are per queue
    assert core.stats("jobs")["ready"] == 1
    assert core.core.counters.deduplicated == 1
    got = dispatches(core.send(CONSUMER, p.Consume("jobs", 10)))
    assert [d.content for d in got] == [b"first"]


def test_a_key_repeated_in_the_same_frame_is_queued_once() -> None:
    core = CoreHarness()
    out = core.send(PRODUCER, tagged(1, key="k"), tagged(2, key="k"), p.Send("jobs", b"u", 0))
    assert [c.tag for c in out] == [1, 2] and out[0].message_id == out[1].message_id
    assert core.stats("jobs")["ready"] == 2


def test_a_key_is_still_known_after_its_message_was_acked() -> None:
    core = CoreHarness()
    [first] = core.send(PRODUCER, tagged(1, key="k"))
    [dispatch] = dispatches(core.send(CONSUMER, p.Consume("jobs", 1)))
    core.send(CONSUMER, p.Ack("jobs", dispatch.message_id))
    [again] = core.send(PRODUCER, tagged(2, key="k"))
    assert again.message_id == first.message_id
    assert core.stats("jobs") == {"ready": 0, "in_flight": 0, "dead": 0}


def test_a_key_is_forgotten_after_the_window() -> None:
    core = CoreHarness(dedup_window_seconds=10)
    [first] = core.send(PRODUCER, tagged(1, key="k"))
    core.advance(9.9)
    [inside] = core.send(PRODUCER, tagged(2, key="k"))
    core.advance(0.2)
    [after] = core.send(PRODUCER, tagged(3, key="k"))
    assert inside.message_id == first.message_id != after.message_id
    assert core.stats("jobs")["ready"] == 2


def test_a_zero_window_keeps_no_keys() -> None:
    core = CoreHarness(dedup_window_seconds=0)
    out = core.send(PRODUCER, tagged(1, key="k"), tagged(2, key="k"))
    assert out[0].message_id != out[1].message_id and len(core.core.intake.keys) == 0


def test_the_oldest_keys_go_first_when_the_window_is_full() -> None:
    core = CoreHarness(max_dedup_keys=3)
    ids = [c.message_id for c in core.send(PRODUCER, *[tagged(n, key=f"k{n}") for n in range(4)])]
    again = core.send(PRODUCER, tagged(10, key="k0"), tagged(11, key="k3"))
    assert again[0].message_id not in ids  # k0 was evicted: queued anew
    assert again[1].message_id == ids[3]
    assert core.core.intake.keys.evicted == 2  # k0, then k1 to make room for k0's new entry


def test_durable_mode_holds_confirms_until_the_commit() -> None:
    core = CoreHarness(durable=True)
    out = core.send(PRODUCER, tagged(1, key="k"), tagged(2, queue="bad name"))
    [error] = out  # refusals go out with the turn; the confirm waits for the fsync
    assert error.tag == 2
    assert any(op[0] == KEY for op in core.core.journal)
    [(peer, frame)] = core.core.release_confirms()
    assert peer == PRODUCER and p.decode_frame(frame)[0][0].tag == 1
    assert core.core.release_confirms() == []


def test_keys_survive_a_restart_through_the_store(tmp_path: Path) -> None:
    clock = FakeClock()
    core = Core(BrokerConfig(dedup_window_seconds=60), clock, journal=Journal())
    store = DurableStore(tmp_path)
    core.begin_turn()
    core.handle_frame(PRODUCER, p.encode_all([tagged(1, key="a"), tagged(2, key="b")]))
    core.end_turn()
    [(_, frame)] = core.release_confirms()
    first_ids = [m.message_id for m in p.decode_frame(frame)[0]]
    store.commit(core.journal.take())
    clock.advance(30)
    fresh = Core(BrokerConfig(dedup_window_seconds=60), clock, journal=Journal())
    assert fresh.restore_keys(store.load_keys()) == 2
    fresh.restore(*store.load())
    fresh.begin_turn()
    fresh.handle_frame(PRODUCER, p.encode_all([tagged(3, key="a"), tagged(4, key="c")]))
    fresh.end_turn()
    [(_, frame)] = fresh.release_confirms()
    again = p.decode_frame(frame)[0]
    assert again[0].message_id == first_ids[0] and again[1].message_id not in first_ids
    assert fresh.queues["jobs"].ready_count == 3
    clock.advance(31)  # past the window of a and b: gone, also from the store
    fresh.begin_turn()
    fresh.end_turn()
    store.commit(fresh.journal.take())
    assert [k.key for k in store.load_keys()] == ["c"]
    assert fresh.restore_keys(store.load_keys()) == 1
    store.close()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),  # queue
            st.sampled_from(["k1", "k2", "k3", None]),  # key
            st.sampled_from([0, 0, 0.5, 4, 11]),  # seconds before this send
        ),
        max_size=40,
    )
)
def test_keys_dedupe_exactly_within_the_window(sends: list) -> None:
    """Against a model: a keyed send is queued iff its key was not accepted on its queue in
    the last 10 s, and is otherwise confirmed with the ID the key was first given."""
    core = CoreHarness(dedup_window_seconds=10)
    model: dict[tuple[str, str], tuple[float, str]] = {}
    now = 0.0
    queued = Counter()
    for tag, (queue, key, wait) in enumerate(sends):
        core.advance(wait)
        now += wait
        [confirm] = core.send(PRODUCER, tagged(tag, queue=queue, key=key))
        known = model.get((queue, key)) if key is not None else None
        if known is not None and now - known[0] < 10:
            assert confirm.message_id == known[1]
        else:
            queued[queue] += 1
            if key is not None:
                model[(queue, key)] = (now, confirm.message_id)
    for queue, count in queued.items():
        assert core.stats(queue)["ready"] == count


def test_restored_keys_follow_a_shortened_window_and_are_deleted_when_keys_are_off(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = DurableStore(tmp_path)
    core = Core(BrokerConfig(dedup_window_seconds=600), clock, journal=Journal())
    core.begin_turn()
    core.handle_frame(PRODUCER, p.encode(tagged(1, key="a")))
    core.end_turn()
    store.commit(core.journal.take())
    shorter = Core(BrokerConfig(dedup_window_seconds=10), clock, journal=Journal())
    assert shorter.restore_keys(store.load_keys()) == 1
    clock.advance(10)
    shorter.begin_turn()
    shorter.end_turn()
    assert len(shorter.intake.keys) == 0  # gone after today's 10 s, not the 600 s it was given
    off = Core(BrokerConfig(dedup_window_seconds=0), clock, journal=Journal())
    assert off.restore_keys(store.load_keys()) == 0
    store.commit(off.journal.take())
    assert store.load_keys() == []
    store.close()
