"""Forwarding between shards, pure: two cores wired by hand (docs/cluster.md "Forwarding").
A stock peer at shard 0 sends, consumes and acks a queue shard 1 owns; the answers come back
unchanged; a peer or a link that goes away lets go of what it held; only links may FORWARD."""

from __future__ import annotations

import pytest

import phpmq.broker.core as core_module
import phpmq.protocol as p
from harness import CoreHarness, replaces_core_calls
from phpmq.broker.copies import COPY_TIMEOUT_S
from phpmq.broker.core import Turn
from phpmq.broker.forwarding import OWN_FORWARD_MESSAGES
from phpmq.broker.guard import Principal
from phpmq.protocol.cluster import ClusterMap, Shard, encode_map

MAP = ClusterMap(1, (Shard("t/0", "tcp://127.0.0.1:1"), Shard("t/1", "tcp://127.0.0.1:2")))
REMOTE = next(f"q{i}" for i in range(100) if MAP.owner(f"q{i}").name == "t/1")
REMOTE_TOO = next(
    f"q{i}" for i in range(100) if MAP.owner(f"q{i}").name == "t/1" and f"q{i}" != REMOTE
)
LOCAL = next(f"q{i}" for i in range(100) if MAP.owner(f"q{i}").name == "t/0")
PEER = b"\x00peer"
LINK = b"\x00link"
SECRET = "the-cluster-s-own"
LINK_HELLO = p.Hello(
    {"role": "link", "name": "t/0", "heartbeat_ms": 1000, "liveness": 3, "link_secret": SECRET}
)
#: Who a forwarded peer is: the entry shard's word (packet 28), checked again at the owner.
ANYONE = b'[null,"10.0.0.1:1000","router",false]'


def shard(name: str, **config: object) -> CoreHarness:
    return CoreHarness(cluster=encode_map(MAP).decode(), shard=name, link_secret=SECRET, **config)


class Pair:
    """Shard 0 (where the peer talks) and shard 1 (the owner), the link carried by hand."""

    def __init__(self, **config: object) -> None:
        self.entry = shard("t/0", **config)
        self.owner = shard("t/1", **config)
        self.owner.send(LINK, LINK_HELLO)

    def peer_turn(self, *messages: p.Message) -> list:
        """One turn at the entry with `messages` from the peer, the forwards carried to the
        owner, the owner's answers carried back; what the peer got."""
        entry = self.entry.core
        entry.begin_turn()
        entry.handle_frame(PEER, p.encode_all(list(messages)))
        return self._carry(entry.end_turn())

    def owner_turn(self) -> list:
        """A turn at the owner with nothing new (dispatch), its answers carried back."""
        self.entry.core.begin_turn()
        return self._carry(self.entry.core.end_turn())

    def _carry(self, turn: Turn) -> list:
        got = [m for peer, frame in turn.frames if peer == PEER for m in p.decode_frame(frame)[0]]
        owner = self.owner.core
        limit = owner.config.max_frame_bytes  # libzmq would drop a link sending more
        owner.begin_turn()
        for name, frame in turn.forwards:
            assert name == "t/1"
            assert len(frame) <= limit
            owner.handle_frame(LINK, frame)
        back = owner.end_turn().frames
        entry = self.entry.core
        entry.begin_turn()
        for link, frame in back:
            assert link == LINK, "the owner answers relayed peers over their link"
            assert len(frame) <= limit
            messages, error = p.decode_frame(frame)
            assert error is None
            for message in messages:
                if type(message) is p.Forward:
                    entry.forwarding.on_link_message(message, "t/1")  # type: ignore[union-attr]
        turn = entry.end_turn()
        got += [m for peer, frame in turn.frames if peer == PEER for m in p.decode_frame(frame)[0]]
        return got


def test_a_stock_peer_sends_consumes_and_acks_a_queue_of_another_shard() -> None:
    pair = Pair()
    assert pair.peer_turn(p.Send(REMOTE, b"one", 0), p.Send(LOCAL, b"two", 0)) == []
    assert REMOTE not in pair.entry.core.queues
    assert pair.owner.stats(REMOTE)["ready"] == 1
    assert pair.entry.stats(LOCAL)["ready"] == 1
    [dispatch] = pair.peer_turn(p.Consume(REMOTE, 5))
    assert type(dispatch) is p.Dispatch
    assert (dispatch.queue, dispatch.content) == (REMOTE, b"one")
    assert pair.owner.stats(REMOTE)["in_flight"] == 1
    pair.peer_turn(p.Ack(REMOTE, dispatch.message_id))
    assert pair.owner.stats(REMOTE) == {"ready": 0, "in_flight": 0, "dead": 0}
    assert pair.entry.core.forwarding.forwarded == 3  # type: ignore[union-attr]


def test_an_extension_peer_gets_its_confirms_and_errors_from_the_owner() -> None:
    pair = Pair()
    pair.peer_turn(p.Hello({"confirm": True}))
    [confirm] = pair.peer_turn(p.Send(REMOTE, b"x", 0, tag=7))
    assert type(confirm) is p.Confirm and confirm.tag == 7
    [error] = pair.peer_turn(p.Ack(REMOTE, b"0" * 32))
    assert type(error) is p.Error and error.code == 404


@replaces_core_calls
def test_a_frame_for_one_queue_of_another_shard_goes_there_without_being_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pair = Pair()
    pair.peer_turn(p.Hello({"confirm": True}))
    got = pair.peer_turn(p.Send(REMOTE, b"first", 0), p.Consume(REMOTE, 5))
    [dispatch] = [m for m in got if type(m) is p.Dispatch]

    def no_decoding(*_: object) -> None:
        raise AssertionError("the entry shard decoded a frame it only passes on")

    entry_core = pair.entry.core
    monkeypatch.setattr(entry_core, "handle_messages", no_decoding)
    # A frame of OWN_FORWARD_MESSAGES or more, a FORWARD of its own (a smaller one is decoded
    # here first, to be sure it may share one with the peer's next frames).
    sends = [p.Send(REMOTE, b"x%d" % i, 0, tag=i) for i in range(OWN_FORWARD_MESSAGES)]
    confirms = pair.peer_turn(p.Ack(REMOTE, dispatch.message_id), *sends)
    count = len(sends)
    assert [(type(c), c.tag) for c in confirms[:count]] == [(p.Confirm, i) for i in range(count)]
    assert pair.owner.stats(REMOTE)["ready"] == count - 5  # 5 more dispatched to the window
    assert [d.content for d in confirms[count:]] == [b"x%d" % i for i in range(5)]
    # A malformed packet inside such a frame is the owner's to refuse, and its ERROR comes back.
    bad = p.encode(p.Send(REMOTE, b"y", 0)).replace(b"P02", b"P99", 1)
    good = p.encode_all([p.Send(REMOTE, b"z", 0)] * OWN_FORWARD_MESSAGES)
    entry_core.begin_turn()
    entry_core.handle_frame(PEER, good + bad)
    got = pair._carry(entry_core.end_turn())
    errors = [m for m in got if type(m) is p.Error]
    assert len(errors) == 1 and "packet type 99" in errors[0].reason


@replaces_core_calls
def test_acks_for_several_queues_of_one_other_shard_go_there_without_being_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer's acks of dispatches from several queues (one frame, as they came): read by
    their headers only; a frame that also names a queue of this shard is decoded and split."""
    pair = Pair()
    half = OWN_FORWARD_MESSAGES // 2  # acks of two queues: a frame of OWN_FORWARD_MESSAGES
    pair.peer_turn(
        *[p.Send(REMOTE, b"a", 0)] * half, *[p.Send(REMOTE_TOO, b"b", 0)] * half,
        p.Send(LOCAL, b"c", 0),
    )  # fmt: skip
    got = pair.peer_turn(p.Consume(REMOTE, half), p.Consume(REMOTE_TOO, half), p.Consume(LOCAL, 5))
    acks = [p.Ack(m.queue, m.message_id) for m in got if type(m) is p.Dispatch]
    local = [a for a in acks if a.queue == LOCAL]
    entry_core = pair.entry.core
    decode = entry_core.handle_messages
    forwarded = entry_core.forwarding.forwarded  # type: ignore[union-attr]

    def no_decoding(*_: object) -> None:
        raise AssertionError("the entry shard decoded a frame it only passes on")

    monkeypatch.setattr(entry_core, "handle_messages", no_decoding)
    assert pair.peer_turn(*[a for a in acks if a.queue != LOCAL]) == []
    assert pair.owner.stats(REMOTE)["in_flight"] == pair.owner.stats(REMOTE_TOO)["in_flight"] == 0
    assert entry_core.forwarding.forwarded == forwarded + 2 * half  # type: ignore[union-attr]
    monkeypatch.setattr(entry_core, "handle_messages", decode)
    pair.peer_turn(p.Send(REMOTE, b"d", 0), *local)
    assert pair.entry.stats(LOCAL)["in_flight"] == 0
    assert pair.owner.stats(REMOTE)["in_flight"] == 1  # the window took it at once


def test_a_peer_that_goes_lets_go_of_what_it_held_at_the_owner() -> None:
    pair = Pair()
    pair.peer_turn(p.Send(REMOTE, b"one", 0))
    [dispatch] = pair.peer_turn(p.Consume(REMOTE, 5))
    assert pair.owner.stats(REMOTE)["in_flight"] == 1
    pair.entry.core.begin_turn()
    pair.entry.core.peer_gone(PEER)
    pair._carry(pair.entry.core.end_turn())
    assert pair.owner.stats(REMOTE) == {"ready": 1, "in_flight": 0, "dead": 0}
    assert dispatch.content == b"one"


def test_a_link_that_goes_lets_go_of_every_peer_behind_it() -> None:
    pair = Pair()
    pair.peer_turn(p.Send(REMOTE, b"one", 0))
    pair.peer_turn(p.Consume(REMOTE, 5))
    assert pair.owner.stats(REMOTE)["in_flight"] == 1
    pair.owner.send(LINK, p.Kbai())
    assert pair.owner.stats(REMOTE) == {"ready": 1, "in_flight": 0, "dead": 0}


def test_a_restarted_owner_gets_the_windows_again() -> None:
    pair = Pair()
    pair.peer_turn(p.Consume(REMOTE, 5))
    pair.owner = shard("t/1")  # a new process: it knows nobody
    pair.owner.send(LINK, LINK_HELLO)
    pair.entry.core.forwarding.link_up("t/1")  # type: ignore[union-attr]
    pair.owner.send(b"\x00prod", p.Send(REMOTE, b"again", 0))
    [dispatch] = pair.owner_turn()
    assert dispatch.content == b"again"


def test_a_lost_owner_refuses_its_queues_with_503_naming_it() -> None:
    pair = Pair()
    pair.peer_turn(p.Hello({}))
    pair.entry.core.forwarding.link_down("t/1", "silent for 3.2s")  # type: ignore[union-attr]
    [error] = pair.peer_turn(p.Send(REMOTE, b"x", 0))
    assert type(error) is p.Error and error.code == 503
    assert "t/1" in error.reason and "silent" in error.reason
    assert pair.peer_turn(p.Send(LOCAL, b"y", 0)) == []  # its own queues keep working
    assert pair.entry.stats(LOCAL)["ready"] == 1


def test_only_links_may_forward_and_relayed_peers_are_never_forwarded_again() -> None:
    owner = shard("t/1")
    inner = p.encode(p.Send(REMOTE, b"x", 0))
    out = owner.send(b"\x00else", p.Hello({}), p.Forward(b"r", inner, 1, ANYONE))
    assert [e.code for e in out if type(e) is p.Error] == [403]
    posing = p.Hello({"role": "link", "name": "t/0"})  # says it is a link, cannot prove it
    out = owner.send(b"\x00poser", posing, p.Forward(b"r", inner, 1, ANYONE))
    assert [e.code for e in out if type(e) is p.Error] == [403]
    assert REMOTE not in owner.core.queues
    # A FORWARD for a queue this shard does not own (maps that disagree) is kept here,
    # never sent on: no loops between shards.
    owner.send(LINK, LINK_HELLO)
    owner.send(LINK, p.Forward(b"r", p.encode(p.Send(LOCAL, b"x", 0)), 0, ANYONE))
    assert owner.stats(LOCAL)["ready"] == 1
    assert owner.core.forwarding.forwarded == 0  # type: ignore[union-attr]


def test_a_publish_reaches_the_bound_queues_of_every_shard_once() -> None:
    pair = Pair()
    pair.peer_turn(p.Hello({}))
    pair.peer_turn(p.Consume(REMOTE, 1, patterns="user.*"), p.Consume(LOCAL, 1, patterns="user.#"))
    assert pair.owner.core.events.bindings.patterns(REMOTE) == ["user.*"]
    assert pair.entry.core.events.bindings.patterns(LOCAL) == ["user.#"]
    got = pair.peer_turn(p.Publish("user.42", b"hi", tag=3))
    [confirm] = [m for m in got if type(m) is p.Confirm]
    assert confirm.tag == 3 and confirm.count == 2  # once both shards have their copies
    assert sorted(m.queue for m in got if type(m) is p.Dispatch) == sorted([REMOTE, LOCAL])
    assert pair.owner.stats(REMOTE)["in_flight"] == 1
    assert pair.entry.stats(LOCAL)["in_flight"] == 1
    pair.entry.core.forwarding.link_down("t/1", "silent for 3.0s")  # type: ignore[union-attr]
    [error] = pair.peer_turn(p.Publish("user.43", b"no", tag=4))
    assert type(error) is p.Error and error.code == 503 and "t/1" in error.reason
    assert pair.entry.stats(LOCAL)["ready"] == 0  # all or none


def test_an_admin_command_about_a_queue_runs_at_its_owner() -> None:
    pair = Pair()
    [reply] = pair.peer_turn(
        p.Admin({"command": "queue-bind", "queue": REMOTE, "patterns": ["a.b"]})
    )
    assert type(reply) is p.AdminReply and reply.options["bindings"] == ["a.b"], reply
    assert REMOTE not in pair.entry.core.queues
    assert pair.owner.core.events.bindings.patterns(REMOTE) == ["a.b"]
    [stats] = pair.peer_turn(p.Admin({"command": "stats", "queue": REMOTE}))
    assert stats.options["cluster"]["shard"] == "t/0"  # stats stay where they are asked


def test_what_the_owner_learned_of_a_peer_s_dialect_stays() -> None:
    """A pre-TTL broker: the peer's 005 (TTL form only), forwarded whole, switches it to the
    TTL form at the owner; a later frame, whose flags come from a shard that never read the
    005, must not switch it back."""
    pair = Pair(ttl_form_default=False)
    pair.peer_turn(p.Send(REMOTE, b"one"), p.Send(REMOTE, b"two"))
    [first, second] = pair.peer_turn(p.Consume(REMOTE, 2))
    assert first.ttl is None  # the pre-TTL form: 3 packets
    assert pair.peer_turn(p.Requeue(REMOTE, first.message_id, 0, delay_ms=1000)) == []
    assert pair.peer_turn(p.Ack(REMOTE, second.message_id)) == []
    pair.owner.advance(2)
    [again] = pair.owner_turn()
    assert again.content == b"one" and again.ttl is not None


def test_a_publish_is_confirmed_only_once_every_shard_confirmed_its_copy() -> None:
    pair = Pair()
    pair.peer_turn(p.Hello({}))
    pair.peer_turn(p.Consume(REMOTE, 1, patterns="user.*"))
    entry = pair.entry.core
    entry.begin_turn()
    entry.handle_frame(PEER, p.encode(p.Publish("user.1", b"a", tag=5, key="k1")))
    turn = entry.end_turn()
    to_peer = [m for peer, frame in turn.frames if peer == PEER for m in p.decode_frame(frame)[0]]
    assert not any(type(m) is p.Confirm for m in to_peer), "confirmed before the copy"
    assert [name for name, _ in turn.forwards] == ["t/1"]
    # The copy's shard is lost before it answers: the publish fails with 503 ...
    entry.begin_turn()
    entry.forwarding.link_down("t/1", "silent for 3.0s")  # type: ignore[union-attr]
    got = [
        m
        for peer, frame in entry.end_turn().frames
        if peer == PEER
        for m in p.decode_frame(frame)[0]
    ]
    [error] = got
    assert error.code == 503 and error.tag == 5 and "publish it again" in error.reason
    # ... and, sent again with its key once the shard is back, it is copied again.
    entry.forwarding.link_up("t/1")  # type: ignore[union-attr]
    got = pair.peer_turn(p.Publish("user.1", b"a", tag=6, key="k1"))
    [confirm] = [m for m in got if type(m) is p.Confirm]
    assert confirm.tag == 6
    assert pair.owner.stats(REMOTE)["ready"] + pair.owner.stats(REMOTE)["in_flight"] == 1


def test_a_copy_refused_by_its_shard_fails_the_publish() -> None:
    pair = Pair(max_bindings_per_queue=10)
    pair.peer_turn(p.Hello({}))
    pair.owner.send(
        b"\x00ops", p.Admin({"command": "queue-bind", "queue": REMOTE, "patterns": ["user.*"]})
    )
    pair.owner.core.queues[REMOTE].max_length = 1
    pair.owner.core.queues[REMOTE].overflow = "reject"
    pair.peer_turn(p.Publish("user.1", b"a", tag=1))  # fills it
    got = pair.peer_turn(p.Publish("user.2", b"b", tag=2))
    [error] = [m for m in got if type(m) is p.Error]
    assert error.tag == 2 and error.code == 503 and "t/1 refused its copy" in error.reason


def test_a_copy_without_an_answer_fails_its_publish_after_the_timeout() -> None:
    pair = Pair()
    pair.peer_turn(p.Hello({}))
    entry = pair.entry.core
    entry.begin_turn()
    entry.handle_frame(PEER, p.encode(p.Publish("user.1", b"a", tag=9)))
    assert entry.end_turn().forwards  # the copy left; its answer never comes
    pair.entry.advance(COPY_TIMEOUT_S + 1)
    entry.begin_turn()
    turn = entry.end_turn()
    [error] = [m for peer, f in turn.frames if peer == PEER for m in p.decode_frame(f)[0]]
    assert error.code == 503 and error.tag == 9 and "no answer from shard t/1" in error.reason


def test_publishes_waiting_for_their_copies_count_against_the_key_s_quota() -> None:
    pair = Pair(quota_publishes=2)
    entry = pair.entry.core
    keyed = Principal("publisher", "10.0.0.9:1000", "router")
    entry.begin_turn()
    for tag in (1, 2, 3):  # the copies' answers never come: all three would wait
        entry.handle_frame(PEER, p.encode(p.Publish("user.1", b"a", tag=tag)), principal=keyed)
    got = [m for peer, f in entry.end_turn().frames if peer == PEER for m in p.decode_frame(f)[0]]
    [error] = [m for m in got if type(m) is p.Error]
    assert error.tag == 3 and error.code == 429 and "quota_publishes is 2" in error.reason


def test_forwarded_admin_commands_are_answered_with_their_refs_even_when_the_owner_is_lost() -> (
    None
):
    """docs/protocol.md §9 `ref`: the owner's answer carries it; so do the entry shard's own
    503s, for a command to an owner that is down and for commands a lost owner never answered
    (each with its own ref, in order)."""
    pair = Pair()
    pair.peer_turn(p.Send(REMOTE, b"x", 0))
    [answered] = pair.peer_turn(p.Admin({"command": "queue-peek", "queue": REMOTE, "ref": 7}))
    assert answered.options["ref"] == 7 and "error" not in answered.options, answered
    entry = pair.entry.core
    entry.begin_turn()  # two commands forwarded, and the owner never answers them
    entry.handle_frame(
        PEER,
        p.encode_all(
            [p.Admin({"command": "queue-peek", "queue": REMOTE, "ref": ref}) for ref in (8, 9)]
        ),
    )
    assert entry.end_turn().forwards
    entry.forwarding.link_down("t/1", "silent for 3.2s")  # type: ignore[union-attr]
    entry.begin_turn()
    lost = [
        m
        for peer, frame in entry.end_turn().frames
        if peer == PEER
        for m in p.decode_frame(frame)[0]
    ]
    assert [(m.options["ref"], m.options["error"]["code"]) for m in lost] == [(8, 503), (9, 503)]
    [down] = pair.peer_turn(p.Admin({"command": "queue-peek", "queue": REMOTE, "ref": 10}))
    assert down.options["ref"] == 10 and down.options["error"]["code"] == 503, down


def test_a_relayed_peers_runs_of_sends_and_acks_are_read_as_a_direct_peers_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner takes a forwarded frame of sends (or acks) to one queue unread, as it would
    from the peer itself: the FORWARD just made the relayed peer, not identified yet, and a
    producer's frames of one turn to two queues come in a FORWARD each, not joined."""
    pair = Pair()
    pair.peer_turn(p.Send(REMOTE, b"first", 0), p.Send(REMOTE_TOO, b"first", 0))  # queues made
    decode = core_module.decode_frame

    def sends_and_acks_unread(data: bytes, *args: object) -> object:
        assert not data.startswith((b"H01001", b"H01004")), "a run was decoded"
        return decode(data, *args)

    monkeypatch.setattr(core_module, "decode_frame", sends_and_acks_unread)
    entry = pair.entry.core
    entry.begin_turn()
    batch = range(OWN_FORWARD_MESSAGES)  # a producer's batch: a FORWARD of its own
    for queue in (REMOTE, REMOTE_TOO, REMOTE):
        entry.handle_frame(PEER, p.encode_all([p.Send(queue, b"x%d" % n) for n in batch]))
    pair._carry(entry.end_turn())
    remote = 1 + 2 * len(batch)
    assert pair.owner.stats(REMOTE)["ready"] == remote
    assert pair.owner.stats(REMOTE_TOO)["ready"] == 1 + len(batch)
    dispatched = [m for m in pair.peer_turn(p.Consume(REMOTE, 100)) if type(m) is p.Dispatch]
    assert len(dispatched) == remote
    pair.peer_turn(*[p.Ack(REMOTE, m.message_id) for m in dispatched])
    assert pair.owner.core.counters.acked == remote
    assert pair.owner.stats(REMOTE)["in_flight"] == 0


def test_a_forwarded_frame_mixing_shards_is_refused_as_a_direct_peer_would_be() -> None:
    """Messages of a frame for several shards are forwarded one by one, but to the owner
    they are one FORWARD still: sends to its full queue cost one ERROR with their count, as
    from a peer of its own; a frame sent whole is a FORWARD of its own."""
    pair = Pair(max_queue_length=3)
    pair.peer_turn(p.Hello({}))
    mixed = [p.Send(REMOTE, b"r%d" % n, 0) for n in range(5)]
    mixed += [p.Send(LOCAL, b"l%d" % n, 0) for n in range(2)]
    errors = [m for m in pair.peer_turn(*mixed) if type(m) is p.Error]
    assert [(e.code, e.queue, e.count) for e in errors] == [(429, REMOTE, 2)]
    direct = shard("t/1", max_queue_length=3)
    direct.send(b"\x00d", p.Hello({}))
    answers = direct.send(b"\x00d", *[p.Send(REMOTE, b"r%d" % n, 0) for n in range(5)])
    assert [(e.code, e.queue, e.count) for e in answers if type(e) is p.Error] == [(429, REMOTE, 2)]


def test_a_peer_that_says_goodbye_and_consumes_again_in_one_turn_is_served() -> None:
    """The owner learns that the peer went away where it did, in its FORWARDs' order: a
    CONSUME after its KBAI (the same routing id, a new peer) opens a window that stays."""
    pair = Pair()
    pair.peer_turn(p.Hello({}))
    pair.peer_turn(p.Send(REMOTE, b"a", 0), p.Send(REMOTE, b"b", 0))
    assert len([m for m in pair.peer_turn(p.Consume(REMOTE, 1)) if type(m) is p.Dispatch]) == 1
    got = pair.peer_turn(p.Kbai(), p.Hello({}), p.Consume(REMOTE, 5))
    assert sorted(m.content for m in got if type(m) is p.Dispatch) == [b"a", b"b"]
    assert pair.owner.stats(REMOTE)["in_flight"] == 2


def test_a_peers_small_frames_share_a_forward_and_its_batches_have_their_own() -> None:
    """A stock client's frame of one send each turn costs the owner one FORWARD for all of
    them; a producer's frames of OWN_FORWARD_MESSAGES or more are a FORWARD each (runs)."""
    pair = Pair()
    entry = pair.entry.core
    entry.begin_turn()
    for n in range(5):
        entry.handle_frame(PEER, p.encode(p.Send(REMOTE, b"s%d" % n, 0)))
    batch = [p.Send(REMOTE_TOO, b"b", 0)] * OWN_FORWARD_MESSAGES
    for _ in range(2):
        entry.handle_frame(PEER, p.encode_all(batch))
    [(owner, frame)] = entry.end_turn().forwards
    assert owner == "t/1"
    forwards = [m for m in p.decode_frame(frame)[0] if type(m) is p.Forward]
    assert [len(p.decode_frame(f.content)[0]) for f in forwards] == [5] + [len(batch)] * 2


def test_a_broken_small_frame_costs_only_itself_at_the_owner() -> None:
    """A frame the entry can only read by its headers is decoded there when it is small (it
    would share a FORWARD): its bad message is refused, and the peer's next frame is queued."""
    pair = Pair()
    bad = p.encode(p.Send(REMOTE, b"bad", 60))[:-2] + b"6x"  # a TTL that is no number
    entry = pair.entry.core
    entry.begin_turn()
    entry.handle_frame(PEER, bad)
    entry.handle_frame(PEER, p.encode(p.Send(REMOTE, b"good", 0)))
    pair._carry(entry.end_turn())
    assert pair.owner.stats(REMOTE)["ready"] == 1


def test_a_new_peer_behind_a_reused_id_speaks_for_itself_at_the_owner() -> None:
    """A peer that says goodbye and comes back on the same id in one frame, now asking for
    confirms: its send is confirmed, as from a peer of this shard (its FORWARD has its own
    flags)."""
    pair = Pair()
    pair.peer_turn(p.Hello({}))
    pair.peer_turn(p.Consume(REMOTE, 1))  # a window there: the goodbye goes there too
    got = pair.peer_turn(p.Kbai(), p.Hello({"confirm": True}), p.Send(REMOTE, b"x", 0))
    assert [type(m) for m in got if type(m) is p.Confirm] == [p.Confirm]


def test_a_publishers_copies_reach_the_owner_before_its_goodbye() -> None:
    """A confirmed publish with a copy for the owner, then KBAI in the same frame: the copy
    goes first, then the copy peer's goodbye, which leaves nothing behind at the owner."""
    from phpmq.broker.copies import copy_ref
    from phpmq.broker.relayed import relayed_id

    pair = Pair()
    pair.peer_turn(p.Hello({}))
    pair.peer_turn(p.Consume(REMOTE, 1, patterns="user.*"))
    pair.peer_turn(p.Publish("user.1", b"first", tag=1))  # the copy peer exists at the owner
    pair.peer_turn(p.Publish("user.2", b"last", tag=2), p.Kbai())
    assert relayed_id(LINK, copy_ref(PEER)) not in pair.owner.core._peers.by_id
    assert pair.owner.stats(REMOTE)["ready"] + pair.owner.stats(REMOTE)["in_flight"] == 2


def test_a_forward_may_carry_a_frame_as_big_as_its_messages_allow() -> None:
    """The owner reads a link's FORWARDs with the frame limit, and holds their messages to
    the content limit: a send near the limit, and small frames joined past it, arrive."""
    pair = Pair(max_content_bytes=1000)
    pair.peer_turn(p.Send(REMOTE, b"x" * 990, 0))
    entry = pair.entry.core
    entry.begin_turn()
    for _ in range(3):
        entry.handle_frame(PEER, p.encode(p.Send(REMOTE, b"y" * 600, 0)))
    pair._carry(entry.end_turn())
    assert pair.owner.stats(REMOTE)["ready"] == 4
    errors = [m for m in pair.peer_turn(p.Hello({}), p.Send(REMOTE, b"z" * 1001, 0))]
    assert [e.code for e in errors if type(e) is p.Error] == [413]  # still each message's


def test_a_small_frame_is_decoded_once_at_the_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    pair = Pair()
    pair.peer_turn(p.Send(REMOTE, b"a", 0), p.Send(LOCAL, b"b", 0))
    got = pair.peer_turn(p.Consume(REMOTE, 5), p.Consume(LOCAL, 5))
    acks = [p.Ack(m.queue, m.message_id) for m in got if type(m) is p.Dispatch]
    decode, frames = core_module.decode_frame, []

    def counting(data: bytes, *args: object) -> object:
        frames.append(data)
        return decode(data, *args)

    monkeypatch.setattr(core_module, "decode_frame", counting)
    entry = pair.entry.core
    entry.begin_turn()
    entry.handle_frame(PEER, p.encode_all(sorted(acks, key=lambda a: a.queue != REMOTE)))
    entry.end_turn()
    assert len(frames) == 1


def test_another_principal_on_a_relayed_reference_is_a_new_peer_with_its_own_terms() -> None:
    """The same routing id, another connection: at the owner a new relayed peer, which takes
    the FORWARD's flags (it asked for confirms) instead of losing them to its identification."""
    pair = Pair()
    first, second = Principal(None, "10.0.0.1:1", "router"), Principal(None, "10.0.0.2:2", "router")
    entry = pair.entry.core
    entry.begin_turn()
    entry.handle_frame(PEER, p.encode_all([p.Hello({}), p.Send(REMOTE, b"a", 0)]), None, first)
    pair._carry(entry.end_turn())
    entry.begin_turn()
    frame = p.encode_all([p.Hello({"confirm": True}), p.Send(REMOTE, b"x", 0)])
    entry.handle_frame(PEER, frame, None, second)
    got = pair._carry(entry.end_turn())
    assert [type(m) for m in got if type(m) is p.Confirm] == [p.Confirm]


def test_a_publisher_without_windows_elsewhere_leaves_no_copy_peer_behind() -> None:
    pair = Pair()
    pair.peer_turn(p.Hello({}))
    pair.peer_turn(p.Consume(LOCAL, 1, patterns="user.*"))  # (a window here only)
    pair.owner.send(
        LINK, p.Forward(b"b", p.encode(p.Consume(REMOTE, 1, patterns="user.*")), 1, ANYONE)
    )
    pair.peer_turn(p.Publish("user.1", b"x", tag=1), p.Kbai())
    forwarding = pair.entry.core.forwarding
    assert PEER not in forwarding._copy_shards  # type: ignore[union-attr]


def test_a_link_s_frames_stay_within_the_frame_limit_both_ways() -> None:
    """A turn's FORWARDs for one owner, and the owner's answers on one link, go as frames no
    longer than the shards take (max_frame_bytes: libzmq drops a link that sends more):
    many frames of a turn, a peer's frame near the limit (its FORWARD is longer), messages
    joined in one FORWARD, and a consumer's dispatch frame past the limit."""
    limit = 6000
    pair = Pair(max_content_bytes=1000, max_frame_bytes=limit)
    entry = pair.entry.core
    near = p.encode_all([p.Send(REMOTE, b"x" * 890, 0) for _ in range(6)])
    assert limit - 200 < len(near) <= limit
    batch = p.encode_all([p.Send(REMOTE, b"y" * 400, 0) for _ in range(OWN_FORWARD_MESSAGES)])
    whole = p.encode_all([p.Send(REMOTE, b"w" * 635, 0) for _ in range(OWN_FORWARD_MESSAGES)])
    assert limit - 200 < len(whole) <= limit  # a FORWARD of its own, cut
    entry.begin_turn()
    entry.handle_frame(PEER, near)
    for _ in range(3):
        entry.handle_frame(PEER, batch)
    entry.handle_frame(PEER, whole)
    for n in range(5):  # small frames: joined in one FORWARD
        entry.handle_frame(PEER, p.encode(p.Send(REMOTE, b"%d" % n * 900, 0)))
    turn = entry.end_turn()
    assert len(turn.forwards) >= 5  # about 27 kB in all
    pair._carry(turn)  # asserts every link frame's size
    sent = 6 + 4 * OWN_FORWARD_MESSAGES + 5
    assert pair.owner.stats(REMOTE)["ready"] == sent
    dispatched = [m for m in pair.peer_turn(p.Consume(REMOTE, 100)) if type(m) is p.Dispatch]
    assert [m.content for m in dispatched[-5:]] == [b"%d" % n * 900 for n in range(5)]
    assert len(dispatched) == sent
    pair.peer_turn(*[p.Ack(REMOTE, m.message_id) for m in dispatched])
    assert pair.owner.stats(REMOTE) == {"ready": 0, "in_flight": 0, "dead": 0}
