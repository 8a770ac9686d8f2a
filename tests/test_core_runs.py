"""Frames read by their headers only (protocol/runs.py): a frame of acks for one queue is
settled (`ack_run`, `Core._acked_run`) and a frame of plain sends to one queue is put
(`send_run`, `Core._sent_run`) without decoding a message. Whatever such a frame holds (acks
of held messages, of messages held by another peer or on another queue, repeats, IDs never
dispatched; sends to a queue that fills up, over the memory limit, in both forms), the core
answers and counts exactly as it does when it decodes the frame."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import phpmq.protocol as p
from harness import CoreHarness, replaces_core_calls
from phpmq.broker import core as core_module
from phpmq.protocol.runs import ack_run, send_run

PRODUCER, CONSUMER, OTHER = b"producer", b"consumer", b"other"
NEVER_DISPATCHED = b"f" * 32

#: One ack: (how it names its message: "own" its dispatch's queue and ID, "other-queue" the
#: ID on the other queue, "never" an ID never dispatched; which dispatch, modulo their count).
acks = st.tuples(st.sampled_from(["own", "own", "own", "other-queue", "never"]), st.integers(0, 30))
scenarios = st.fixed_dictionaries(
    {
        "sends": st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=30),
        "window": st.integers(1, 12),
        "other_takes": st.booleans(),
        "hello": st.booleans(),
        "frames": st.lists(
            st.tuples(st.sampled_from([CONSUMER, OTHER]), st.lists(acks, min_size=1, max_size=12)),
            max_size=6,
        ),
    }
)


def _play(scenario: dict[str, Any]) -> tuple[list, dict]:
    """Run `scenario` on a new core: what every peer received, each ID replaced by its rank
    of first appearance, and the counters and queue figures after it."""
    core = CoreHarness()
    core.turn(
        (PRODUCER, [p.Send(queue, b"m%d" % n, 0) for n, queue in enumerate(scenario["sends"])])
    )
    if scenario["hello"]:  # an extension peer: refusals reach it as ERRORs
        core.send(CONSUMER, p.Hello({}))
    received = [core.send(CONSUMER, p.Consume("a", scenario["window"]), p.Consume("b", 4))]
    if scenario["other_takes"]:
        received.append(core.send(OTHER, p.Consume("a", 2)))
    sent = [m for batch in received for m in batch if isinstance(m, p.Dispatch)]
    for peer, picks in scenario["frames"]:
        frame = [_ack(how, sent[i % len(sent)]) for how, i in picks] if sent else []
        received.append(core.turn((peer, frame)).get(peer, []) if frame else [])
    ranks: dict[bytes, int] = {}

    def ranked(message: object) -> object:
        if isinstance(message, (p.Dispatch, p.Error)) and message.message_id:
            rank = ranks.setdefault(message.message_id, len(ranks))
            message = msgspec.structs.replace(message, message_id=b"#%d" % rank)
        if isinstance(message, p.Error):  # its reason names the ID too
            for raw, rank in ranks.items():
                message = msgspec.structs.replace(
                    message, reason=message.reason.replace(raw.decode(), f"#{rank}")
                )
        return message

    counters = core.core.counters
    figures = {
        "counters": {name: getattr(counters, name) for name in type(counters).__slots__},
        "queues": {q: core.stats(q) for q in ("a", "b") if q in core.core.queues},
        "acked_per_queue": {
            q: core.core.queues[q].acked for q in ("a", "b") if q in core.core.queues
        },
    }
    return [[ranked(m) for m in batch] for batch in received], figures


def _ack(how: str, dispatch: p.Dispatch) -> p.Ack:
    if how == "never":
        return p.Ack(dispatch.queue, NEVER_DISPATCHED)
    other = {"a": "b", "b": "a"}[dispatch.queue]
    return p.Ack(dispatch.queue if how == "own" else other, dispatch.message_id)


@replaces_core_calls
@settings(max_examples=200, deadline=None)
@given(scenarios)
def test_an_ack_run_is_settled_as_the_decoded_acks_would_be(scenario: dict[str, Any]) -> None:
    fast = _play(scenario)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core_module, "ack_run", lambda data: None)
        decoded = _play(scenario)
    assert fast == decoded


def test_a_consumers_acks_are_read_without_a_message_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = CoreHarness()
    core.send(PRODUCER, *[p.Send("jobs", b"x%d" % n, 0) for n in range(5)])
    ids = [d.message_id for d in core.send(CONSUMER, p.Consume("jobs", 5))]
    monkeypatch.setattr(core_module, "decode_frame", lambda *a: pytest.fail("decoded"))
    assert core.send(CONSUMER, *[p.Ack("jobs", i) for i in ids]) == []
    assert core.core.counters.acked == 5 and core.stats("jobs")["in_flight"] == 0


@pytest.mark.parametrize(
    "frame",
    [
        [p.Ack("a", b"1" * 32), p.Ack("b", b"2" * 32)],  # two queues
        [p.Ack("a", b"1" * 32), p.Ack("a", b"2" * 31)],  # two ID lengths
        [p.Ack("a", b"1" * 32), p.Send("a", b"x", 0)],  # not only acks
        [p.Ack("a", b"1" * 65)],  # an ID longer than the run reads
    ],
    ids=["two-queues", "two-id-lengths", "mixed", "long-id"],
)
def test_frames_that_are_not_one_run_are_left_to_the_decoder(frame: list) -> None:
    assert ack_run(p.encode_all(frame)) is None


def test_a_cut_short_ack_run_is_left_to_the_decoder() -> None:
    wire = p.encode_all([p.Ack("a", b"1" * 32)] * 3)
    assert ack_run(wire) == (b"a", [b"1" * 32] * 3)
    assert ack_run(wire[:-1]) is None
    assert ack_run(wire + b"H") is None


#: One frame of a producer: (its queue, its TTL: None the stock form, its contents' sizes,
#: whether each send has a tag (a confirmed send's), an idempotency key: None, or which of
#: a few each send takes, "" the bad one; and with keys, whether each send has headers and a
#: message key, either of them possibly empty, as a Spark sink's keyed rows).
send_frames = st.tuples(
    st.sampled_from(["a", "b", "bad name", "new"]),
    st.sampled_from([None, 0, 30]),
    st.lists(st.integers(0, 300), min_size=1, max_size=20),
    st.booleans(),
    st.none()
    | st.lists(st.sampled_from(["k1", "k2", "k3", "", "k\u00e9"]), min_size=20, max_size=20),
    st.none()
    | st.lists(
        st.tuples(st.sampled_from([b"", b'{"n":"1"}']), st.sampled_from([b"", b"mk", b"\xff"])),
        min_size=20,
        max_size=20,
    ),
)
send_scenarios = st.fixed_dictionaries(
    {
        "max_length": st.sampled_from([0, 3, 12]),
        "overflow": st.sampled_from(["reject", "drop-oldest"]),
        "max_memory": st.sampled_from(["1GB", "6KB"]),
        "hello": st.sampled_from([None, {}, {"confirm": True}]),
        "ttl_dialect": st.booleans(),
        "consumer": st.booleans(),
        "frames": st.lists(send_frames, min_size=1, max_size=6),
    }
)


def _play_sends(scenario: dict[str, Any]) -> tuple[list, dict]:
    """Run the producer's frames of `scenario` on a new core (queues a and b exist), then
    have it consume: what it received per turn, and every counter and queue figure after."""
    core = CoreHarness(
        scenario["ttl_dialect"],
        max_queue_length=scenario["max_length"],
        overflow=scenario["overflow"],
        max_memory=scenario["max_memory"],
    )
    core.send(OTHER, p.Send("a", b"first", 0), p.Send("b", b"first", 0))
    if scenario["consumer"]:  # a window on a: the turns dispatch too
        core.send(CONSUMER, p.Consume("a", 7))
    if scenario["hello"] is not None:
        core.send(PRODUCER, p.Hello(scenario["hello"]))
    received = []
    tags = iter(range(5, 10**6, 7))
    for n, (queue, ttl, sizes, tagged, keys, extras) in enumerate(scenario["frames"]):
        frame = [
            p.Send(
                queue, bytes([65 + n]) * size, ttl or 0, tag=next(tags),
                key=None if keys is None else keys[i] and f"{keys[i]}{n % 2}",
                headers=None if keys is None or extras is None else extras[i][0],
                message_key=None if keys is None or extras is None else extras[i][1],
            )
            if tagged or keys is not None
            else p.Send(queue, bytes([65 + n]) * size, ttl)
            for i, size in enumerate(sizes)
        ]  # fmt: skip
        out = core.turn((PRODUCER, frame))
        received.append(_ranked(out.get(PRODUCER, [])) + _ranked(out.get(CONSUMER, [])))
    core.advance(31)  # past the TTLs: they expire, each watched as a decoded send's
    core.turn()
    # The producer consumes too: its dispatches' form follows the form it sent in.
    received.append(_ranked(core.send(PRODUCER, p.Consume("b", 50))))
    counters = core.core.counters
    queues = core.core.queues
    figures = {
        "counters": {name: getattr(counters, name) for name in type(counters).__slots__},
        "queues": {
            name: (queue.ready_count, queue.published, queue.refused, len(queue.dead))
            for name, queue in queues.items()
        },
        "contents": {
            name: [(r.content, r.headers, r.message_key) for r in queues[name].ready]
            for name in queues
        },
        "held_bytes": core.core.ctx.held_bytes,
    }
    return received, figures


def _ranked(messages: list) -> list:
    """`messages` with each message ID replaced by its rank of first appearance."""
    ranks: dict[bytes, int] = {}
    out = []
    for message in messages:
        message_id = getattr(message, "message_id", None)
        if message_id:
            rank = ranks.setdefault(message_id, len(ranks))
            message = msgspec.structs.replace(message, message_id=b"#%d" % rank)
        out.append(message)
    return out


@replaces_core_calls
@settings(max_examples=200, deadline=None)
@given(send_scenarios)
def test_a_send_run_is_put_as_the_decoded_sends_would_be(scenario: dict[str, Any]) -> None:
    fast = _play_sends(scenario)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core_module, "send_run", lambda data, limit: None)
        decoded = _play_sends(scenario)
    assert fast == decoded


def test_a_producers_sends_are_read_without_a_message_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = CoreHarness()
    core.send(PRODUCER, p.Send("jobs", b"first", 0))
    monkeypatch.setattr(core_module, "decode_frame", lambda *a: pytest.fail("decoded"))
    core.send(PRODUCER, *[p.Send("jobs", b"x%d" % n) for n in range(5)])
    core.send(PRODUCER, *[p.Send("jobs", b"y" * n, 60) for n in range(5)])
    confirms = core.send(PRODUCER, *[p.Send("jobs", b"z", 0, tag=n * 100) for n in range(5)])
    assert [c.tag for c in confirms] == [0, 100, 200, 300, 400]
    rows = [
        p.Send("jobs", b"r", 0, tag=n, key=f"k{n}", headers=b'{"n":"1"}', message_key=b"m")
        for n in range(5)
    ]
    assert len(core.send(PRODUCER, *rows)) == 5  # a Spark sink's keyed rows: confirmed
    assert core.core.counters.received == 21 and core.stats("jobs")["ready"] == 21
    kept = core.core.queues["jobs"].ready[-1]
    assert (kept.headers, kept.message_key) == (b'{"n":"1"}', b"m")


@pytest.mark.parametrize(
    "frame",
    [
        [p.Send("a", b"x"), p.Send("b", b"x")],  # two queues
        [p.Send("a", b"x", 5), p.Send("a", b"x", 6)],  # two TTLs
        [p.Send("a", b"x"), p.Send("a", b"x", 5)],  # two forms
        [p.Send("a", b"x", 5, tag=1, key="k", headers=b"{}")],  # headers
        [p.Send("a", b"x", 5, key="k")],  # a key without a tag
        [p.Send("a", b"x", 5, tag=1, key="k"), p.Send("a", b"x", 5, tag=2)],  # a key, then none
        p.encode(p.Send("a", b"x", 5, tag=1, key="kk"))[:-2] + b"\xff\xfe",  # not UTF-8
        [p.Send("a", b"x", 5, tag=1), p.Send("a", b"x", 5)],  # a tag, then none
        [p.Send("a", b"x" * 101)],  # over the content limit
    ],
    ids=[
        "two-queues",
        "two-ttls",
        "two-forms",
        "headers",
        "key-without-tag",
        "key-then-none",
        "bad-utf8-key",
        "tag-then-none",
        "too-large",
    ],
)
def test_send_frames_that_are_not_one_run_are_left_to_the_decoder(frame: list | bytes) -> None:
    wire = frame if isinstance(frame, bytes) else p.encode_all(frame)
    assert send_run(wire, 100) is None
    assert send_run(wire[:-1], 1000) is None


@replaces_core_calls
def test_a_peer_with_rights_has_each_message_read_by_the_guard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run readers are for peers without a rights table: a peer with one has its frames
    decoded and checked message by message (and not scanned for a run first), so a send it
    may not make is refused even inside a frame that is a run."""
    from phpmq.broker.clock import FakeClock
    from phpmq.broker.config import BrokerConfig
    from phpmq.broker.core import Core
    from phpmq.broker.guard import Principal
    from phpmq.broker.model import PeerProfile
    from phpmq.broker.permissions import Permissions, Rights

    core = Core(BrokerConfig(), FakeClock())
    core.set_permissions(Permissions({"limited": Rights("limited", send=("jobs.*",))}))
    principal = Principal("limited", "10.0.0.1:1000", "router")
    profile = PeerProfile("router", ttl_form=True)
    scanned = []
    monkeypatch.setattr(core_module, "send_run", lambda *a: scanned.append(a) or None)
    for frame in ([p.Send("jobs.a", b"ok", 0)] * 3, [p.Send("billing", b"no", 0)] * 3):
        core.begin_turn()
        core.handle_frame(b"limited", p.encode_all([p.Hello({}), *frame]), profile, principal)
        core.begin_turn()
        core.handle_frame(b"limited", p.encode_all(frame), profile, principal)
        core.end_turn()
    assert scanned == []
    assert core.queues["jobs.a"].ready_count == 6 and "billing" not in core.queues
    assert core.guard.refused["send"] == 6
