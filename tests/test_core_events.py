"""Events in the pure core (docs/protocol.md §6.5): publish, bindings, consume with bindings,
cancel, delete at once and delete when unused; driven by a fake clock."""

from __future__ import annotations

import pytest

import phpmq.protocol as p
from harness import OPS, CoreHarness, dispatches, errors

PUB = b"publisher"
ALICE = b"alice"
BOB = b"bob"
CHARLIE = b"charlie"


def confirms(messages: list) -> list[p.Confirm]:
    return [m for m in messages if isinstance(m, p.Confirm)]


def cancels(messages: list) -> list[p.Cancel]:
    return [m for m in messages if isinstance(m, p.Cancel)]


def test_mqks_hello_world_shared_queue_and_own_copy(core: CoreHarness) -> None:
    """Alice and Bob share `greetings`, Charlie's queue is bound to more events: one publish
    reaches one of Alice/Bob and Charlie, each copy with its own ID and the event name."""
    core.send(ALICE, p.Consume("greetings", 10, None, "hi hello"))
    core.send(BOB, p.Consume("greetings", 10, None, "hi hello"))
    core.send(CHARLIE, p.Consume("greetings-and-byes", 10, None, "hi hello bye good-bye"))
    out = core.turn((PUB, p.Publish("hello", b"world", 0, 1)))
    [confirm] = confirms(out[PUB])
    assert (confirm.tag, confirm.count) == (1, 2)
    shared = dispatches(out.get(ALICE, [])) + dispatches(out.get(BOB, []))
    [own] = dispatches(out[CHARLIE])
    [copy] = shared
    assert (copy.content, copy.event, copy.queue) == (b"world", "hello", "greetings")
    assert (own.content, own.event, own.queue) == (b"world", "hello", "greetings-and-byes")
    assert copy.message_id != own.message_id
    assert confirm.message_id in (copy.message_id, own.message_id)
    out = core.turn((PUB, p.Publish("bye", b"later", 0, 2)))
    assert confirms(out[PUB])[0].count == 1
    assert [d.content for d in dispatches(out[CHARLIE])] == [b"later"]


@pytest.mark.parametrize(
    ("pattern", "event", "matches"),
    [
        ("*.updated", "user.updated", True),
        ("*.updated", "user.42.updated", False),
        ("user.*.connected", "user.123.connected", True),
        ("*.*.deleted", "post.123.deleted", True),
        ("*.*.deleted", "deleted", False),
        ("audit.#", "audit", True),
        ("audit.#", "audit.user.login", True),
        ("#.deleted", "a.b.c.deleted", True),
        ("#", "anything.at.all", True),
        ("a.#.z", "a.z", True),
        ("a.#.z", "a.b.y", False),
    ],
)
def test_wildcards_route_as_the_seed_says(
    core: CoreHarness, pattern: str, event: str, matches: bool
) -> None:
    core.admin("queue-bind", queue="q", patterns=[pattern])
    [confirm] = confirms(core.send(PUB, p.Publish(event, b"x", 0, 1)))
    assert confirm.count == int(matches)
    assert core.stats("q")["ready"] == int(matches)


def test_a_queue_bound_by_two_matching_patterns_gets_one_copy(core: CoreHarness) -> None:
    core.admin("queue-bind", queue="q", patterns=["user.*", "#", "user.created"])
    [confirm] = confirms(core.send(PUB, p.Publish("user.created", b"x", 0, 1)))
    assert confirm.count == 1
    assert core.stats("q")["ready"] == 1


def test_unrouted_events_are_counted_and_kept_if_configured() -> None:
    plain = CoreHarness()
    [confirm] = confirms(plain.send(PUB, p.Publish("nobody.listens", b"x", 0, 1)))
    assert confirm.count == 0
    assert plain.core.counters.unrouted == 1
    assert plain.core.queues == {}
    kept = CoreHarness(unrouted_queue="lost")
    [confirm] = confirms(kept.send(PUB, p.Publish("nobody.listens", b"x", 0, 1)))
    assert confirm.count == 0
    [dispatch] = dispatches(kept.send(ALICE, p.Hello({}), p.Consume("lost", 1)))
    assert (dispatch.content, dispatch.event, dispatch.message_id) == (
        b"x",
        "nobody.listens",
        confirm.message_id,
    )


def test_a_full_rejecting_queue_refuses_the_whole_publish() -> None:
    core = CoreHarness(max_queue_length=1)
    core.admin("queue-bind", queue="small", patterns=["e"])
    core.admin("queue-bind", queue="other", patterns=["e"])
    core.send(PUB, p.Publish("e", b"1", 0, 1))
    [error] = errors(core.send(PUB, p.Publish("e", b"2", 0, 2)))
    assert (error.code, error.tag, error.refused) == (429, 2, 108)
    assert "no queue got a copy" in error.reason
    assert core.stats("small")["ready"] == 1 and core.stats("other")["ready"] == 1


def test_publish_keys_ttl_headers_and_durable_journal() -> None:
    core = CoreHarness(durable=True)
    core.admin("queue-bind", queue="a", patterns=["e.*"])
    core.admin("queue-bind", queue="b", patterns=["e.#"])
    core.core.journal.take()
    first = core.send(PUB, p.Publish("e.x", b"body", 60, 1, "k1", b'{"h":1}'))
    puts = [op for op in core.core.journal.take() if op[0] == "put"]
    assert sorted(op[2] for op in puts) == ["a", "b"] and all(op[8] == b"e.x" for op in puts)
    assert first == []  # durable: the CONFIRM waits for the commit
    [confirm] = p.decode_frame(core.core.release_confirms()[0][1])[0]
    assert confirm.count == 2
    core.send(PUB, p.Publish("e.x", b"body", 60, 2, "k1"))
    [again] = p.decode_frame(core.core.release_confirms()[0][1])[0]
    assert (again.message_id, again.count) == (confirm.message_id, None)
    assert core.stats("a")["ready"] == 1
    [dispatch] = dispatches(core.send(ALICE, p.Hello({}), p.Consume("a", 1)))
    assert (dispatch.ttl, dispatch.headers, dispatch.event) == (60, b'{"h":1}', "e.x")


@pytest.mark.parametrize("event", ["", "a..b", "a b", "a.*", "x.#", "a" * 256, "user*"])
def test_bad_event_names_are_refused_with_422(core: CoreHarness, event: str) -> None:
    [error] = errors(core.send(PUB, p.Publish(event, b"x", 0, 7)))
    assert (error.code, error.tag) == (422, 7)


@pytest.mark.parametrize("pattern", ["", "a..b", "a b", "user*", "a#", "*x", "." * 3])
def test_bad_patterns_are_refused_everywhere(core: CoreHarness, pattern: str) -> None:
    reply = core.admin("queue-bind", queue="q", patterns=["ok", pattern])
    assert reply["error"]["code"] == 422
    assert "q" not in core.core.queues  # nothing of the request was done
    # In a PATTERNS packet a space separates patterns: "ok a b" would be three good ones.
    text = "ok " + pattern.replace(" ", "\t")
    [error] = errors(core.send(ALICE, p.Consume("q", 1, None, text)))
    assert error.code == 422
    assert core.core.peers[ALICE].windows == {}


def test_binding_limits() -> None:
    core = CoreHarness(max_bindings_per_queue=2, max_bindings=3)
    assert core.admin("queue-bind", queue="q", patterns=["a", "b"])["added"] == 2
    reply = core.admin("queue-bind", queue="q", patterns=["c"])
    assert reply["error"]["code"] == 422 and "max_bindings_per_queue" in reply["error"]["reason"]
    core.admin("queue-bind", queue="r", patterns=["a"])
    reply = core.admin("queue-bind", queue="s", patterns=["a"])
    assert "max_bindings is 3" in reply["error"]["reason"]


def test_rebind_replace_remove_mask_add(core: CoreHarness) -> None:
    core.admin("queue-bind", queue="q1", patterns=["e1", "e2"])
    reply = core.admin("queue-rebind", queue="q1", replace=["e3", "e4", "e5.id1.a1", "e5.id2.a2"])
    assert reply["bindings"] == ["e3", "e4", "e5.id1.a1", "e5.id2.a2"]
    assert (reply["added"], reply["removed"]) == (4, 2)
    reply = core.admin("queue-rebind", queue="q1", remove=["e3"], add=["e6", "e7"])
    assert reply["bindings"] == ["e4", "e5.id1.a1", "e5.id2.a2", "e6", "e7"]
    reply = core.admin("queue-rebind", queue="q1", remove_mask=["e5.*.a1", "e5.*.a2"], add=["e8"])
    assert reply["bindings"] == ["e4", "e6", "e7", "e8"]
    assert confirms(core.send(PUB, p.Publish("e5.id1.a1", b"x", 0, 1)))[0].count == 0
    assert confirms(core.send(PUB, p.Publish("e8", b"x", 0, 2)))[0].count == 1
    reply = core.admin("queue-unbind", queue="q1", patterns=["e4", "nope"])
    assert (reply["removed"], reply["bindings"]) == (1, ["e6", "e7", "e8"])
    assert core.admin("queue-rebind", queue="q1", replace=[])["bindings"] == []


def test_cancel_returns_what_the_consumer_held_and_keeps_its_other_windows(
    core: CoreHarness,
) -> None:
    for i in range(3):
        core.send(PUB, p.Send("jobs", b"%d" % i, 0), p.Send("other", b"o", 0))
    core.send(ALICE, p.Consume("jobs", 2), p.Consume("other", 1))
    out = core.send(ALICE, p.Cancel("jobs"))
    [answer] = cancels(out)
    assert (answer.queue, answer.reason, answer.count) == ("jobs", "cancelled", 2)
    assert core.stats("jobs") == {"ready": 3, "in_flight": 0, "dead": 0}
    assert list(core.core.peers[ALICE].windows) == ["other"]
    got = dispatches(core.send(BOB, p.Hello({}), p.Consume("jobs", 5)))
    assert [(d.content, d.delivery_count) for d in got] == [(b"0", 2), (b"1", 2), (b"2", 1)]
    [again] = cancels(core.send(ALICE, p.Cancel("jobs")))
    assert again.count == 0


def test_delete_at_once_tells_consumers_and_counts_what_went(core: CoreHarness) -> None:
    core.admin("queue-bind", queue="q", patterns=["e"])
    core.send(PUB, *[p.Send("q", b"%d" % i, 0) for i in range(4)])
    held = dispatches(core.send(ALICE, p.Hello({}), p.Consume("q", 1)))
    core.send(BOB, p.Consume("q", 1))  # a stock consumer: no CANCEL for it
    bob_message = core.core.peers[BOB].windows["q"].held
    assert len(bob_message) == 1
    out = core.turn((OPS, p.Admin({"command": "queue-delete", "queue": "q"})))
    [reply] = out[OPS]
    assert reply.options == {
        "queue": "q",
        "purged": 2,
        "in_flight": 2,
        "delayed": 0,
        "leased": 0,
        "dead_letters": 0,
        "consumers": 2,
        "bindings": 1,
    }
    [cancel] = cancels(out[ALICE])
    assert (cancel.reason, cancel.count) == ("queue deleted", 1)
    assert BOB not in out
    [error] = errors(core.send(ALICE, p.Ack("q", held[0].message_id)))
    assert error.code == 404
    assert confirms(core.send(PUB, p.Publish("e", b"x", 0, 1)))[0].count == 0
    assert core.core.ctx.held_bytes == 0
    assert core.core.counters.deleted_messages == 4
    reply = core.admin("queue-delete", queue="q")
    assert reply["error"]["code"] == 404


def test_a_delayed_message_of_a_deleted_queue_lets_go(core: CoreHarness) -> None:
    core.send(PUB, p.Send("q", b"x", 0))
    [held] = dispatches(core.send(ALICE, p.Consume("q", 1)))
    core.send(ALICE, p.Requeue("q", held.message_id, 0, 1000))
    assert core.admin("queue-delete", queue="q")["delayed"] == 1
    core.advance(2)
    core.turn()
    assert "q" not in core.core.queues
    assert core.core.ctx.held_bytes == 0


def test_delete_when_unused_without_grace(core: CoreHarness) -> None:
    core.send(ALICE, p.Consume("live.1", 10, None, "news.#", 0))
    core.send(PUB, p.Publish("news.sport", b"x", 0, 1))
    core.send(ALICE, p.Cancel("live.1"))
    core.turn()
    assert "live.1" not in core.core.queues
    assert confirms(core.send(PUB, p.Publish("news.sport", b"x", 0, 2)))[0].count == 0
    assert core.core.counters.queues_unused_deleted == 1


def test_delete_when_unused_with_grace_keeps_it_for_a_returning_consumer(
    core: CoreHarness,
) -> None:
    core.send(ALICE, p.Consume("q", 10, None, "e", 1000))
    core.send(ALICE, p.Disconnect(), p.Kbai())  # its last consumer leaves
    core.advance(0.5)
    core.send(PUB, p.Publish("e", b"during grace", 0, 1))
    [dispatch] = dispatches(core.send(BOB, p.Consume("q", 1)))
    assert dispatch.content == b"during grace"
    core.send(BOB, p.Cancel("q"))
    core.advance(0.9)
    core.turn()
    assert "q" in core.core.queues  # the grace started again when Bob left
    core.advance(0.2)
    core.turn()
    assert "q" not in core.core.queues


def test_a_durable_broker_answers_a_command_that_changed_the_store_after_the_commit() -> None:
    """The answer to `queue-bind` says the binding is kept: with a store, it waits with the
    CONFIRMs for the turn's commit (replicated: for the majority); `stats` changes nothing
    and is answered at once."""
    harness = CoreHarness(durable=True)
    core = harness.core
    peer = b"\x00ops"
    for command, held in (
        ({"command": "queue-bind", "queue": "q", "patterns": ["a.*"]}, True),
        ({"command": "stats"}, False),
    ):
        core.begin_turn()
        core.handle_frame(peer, p.encode(p.Admin(command)))
        now = [m for to, f in core.end_turn().frames if to == peer for m in p.decode_frame(f)[0]]
        later = [m for to, f in core.release_confirms() if to == peer for m in p.decode_frame(f)[0]]
        assert (len(now), len(later)) == ((0, 1) if held else (1, 0)), command
