"""Per-key quotas (docs/security.md, "Quotas"): queues, bindings, schedules and leases are
counted per key (per host without a key) and refused with 429 at the key's quota, before the
broker-wide limit, and given back when they go."""

from __future__ import annotations

import phpmq.protocol as p
from harness import CoreHarness, errors
from phpmq.broker.guard import Principal
from phpmq.broker.model import PeerProfile

ROUTER = PeerProfile("router", ttl_form=True)
HOG = Principal("hog", "10.0.0.1:1000", "router")
OTHER = Principal("other", "10.0.0.2:1000", "router")
SAME_HOST = Principal(None, "10.0.0.3:1000", "router")
SAME_HOST_AGAIN = Principal(None, "10.0.0.3:2000", "router")


def run(core: CoreHarness, peer: bytes, principal: Principal, *messages: p.Message) -> list:
    core.core.begin_turn()
    core.core.handle_frame(peer, p.encode_all(list(messages)), ROUTER, principal)
    out: list = []
    for peer_id, frame in core.core.end_turn().frames:
        if peer_id == peer:
            out += p.decode_frame(frame)[0]
    return out


def admin(core: CoreHarness, peer: bytes, principal: Principal, **options: object) -> dict:
    answers = run(core, peer, principal, p.Admin(options))
    [reply] = [m for m in answers if isinstance(m, p.AdminReply)]
    return reply.options


def test_queues_are_counted_per_key_and_given_back_when_deleted() -> None:
    core = CoreHarness(max_queues=8, quota_queues=3)
    sends = [p.Send(f"q{i}", b"x", 0, tag=i) for i in range(5)]
    refused = errors(run(core, b"h", HOG, p.Hello({}), *sends))
    assert [e.code for e in refused] == [429, 429]
    assert "key 'hog' holds 3 queues" in refused[0].reason
    assert errors(run(core, b"o", OTHER, p.Hello({}), p.Send("mine", b"x", 0, tag=1))) == []
    assert admin(core, b"h", HOG, command="queue-delete", queue="q0")["queue"] == "q0"
    assert errors(run(core, b"h", HOG, p.Send("q9", b"x", 0, tag=9))) == []


def test_peers_without_a_key_share_their_hosts_quota() -> None:
    core = CoreHarness(quota_queues=2)
    run(core, b"a", SAME_HOST, p.Hello({}), p.Send("a1", b"x", 0, tag=1))
    run(core, b"b", SAME_HOST_AGAIN, p.Hello({}), p.Send("b1", b"x", 0, tag=1))
    [error] = errors(run(core, b"b", SAME_HOST_AGAIN, p.Send("b2", b"x", 0, tag=2)))
    assert error.code == 429 and "host 10.0.0.3" in error.reason


def test_bindings_schedules_and_leases_have_quotas_too() -> None:
    core = CoreHarness(quota_bindings=2, quota_schedules=1, quota_leases=1)
    bound = admin(core, b"h", HOG, command="queue-bind", queue="q", patterns=["a", "b", "c"])
    assert bound["error"]["code"] == 429 and "quota_bindings is 2" in bound["error"]["reason"]
    two = admin(core, b"h", HOG, command="queue-bind", queue="q", patterns=["a", "b"])
    assert two["added"] == 2
    [error] = errors(run(core, b"h", HOG, p.Consume("r", 1, patterns="c")))
    assert error.code == 429
    admin(core, b"h", HOG, command="queue-unbind", queue="q", patterns=["a"])
    assert admin(core, b"h", HOG, command="queue-bind", queue="q", patterns=["c"])["added"] == 1
    # Another key's bindings are its own.
    assert admin(core, b"o", OTHER, command="queue-bind", queue="q", patterns=["d", "e"])["added"]

    job = {"command": "schedule-add", "queue": "jobs", "every_ms": 60_000, "content": "x"}
    assert "error" not in admin(core, b"h", HOG, name="s1", **job)
    assert "error" not in admin(core, b"h", HOG, name="s1", **job)  # replacing its own: no more
    second = admin(core, b"h", HOG, name="s2", **job)
    assert second["error"]["code"] == 429 and "quota_schedules is 1" in second["error"]["reason"]
    admin(core, b"h", HOG, command="schedule-remove", name="s1")
    assert "error" not in admin(core, b"h", HOG, name="s2", **job)

    run(core, b"o", OTHER, *[p.Send("work", b"x", 0) for _ in range(4)])
    lease = {"command": "lease", "queue": "work", "max_messages": 1, "max_bytes": 10**6}
    assert admin(core, b"h", HOG, lease="r/1", **lease)["messages"] == 1
    refused = admin(core, b"h", HOG, lease="r/2", **lease)
    assert refused["error"]["code"] == 429 and "quota_leases is 1" in refused["error"]["reason"]
    assert admin(core, b"o", OTHER, lease="o/1", **lease)["messages"] == 1
    admin(core, b"h", HOG, command="lease-commit", queue="work", lease="r/1")
    assert admin(core, b"h", HOG, lease="r/3", **lease)["messages"] == 1


def test_one_key_holds_at_most_its_share_of_a_queues_consumers() -> None:
    core = CoreHarness(max_consumers=4)  # quota_consumers: half of it
    for i in range(2):
        assert errors(run(core, b"h%d" % i, HOG, p.Hello({}), p.Consume("q", 1))) == []
    [error] = errors(run(core, b"h2", HOG, p.Hello({}), p.Consume("q", 1)))
    assert error.code == 429 and "quota_consumers is 2" in error.reason
    assert errors(run(core, b"o", OTHER, p.Hello({}), p.Consume("q", 1))) == []


def test_this_hosts_own_peers_without_a_key_count_only_against_the_broker() -> None:
    core = CoreHarness(max_queues=4, quota_queues=1)
    local = Principal(None, "127.0.0.1:5000", "router")
    sends = [p.Send(f"q{i}", b"x", 0, tag=i) for i in range(4)]
    assert errors(run(core, b"l", local, p.Hello({}), *sends)) == []


def test_a_key_holds_at_most_its_quota_of_unanswered_requests() -> None:
    core = CoreHarness(quota_requests=2)

    def request(i: int) -> p.Send:
        return p.Send("resize", b"img", 0, tag=i, reply_to="", correlation=f"c{i}")

    assert errors(run(core, b"h", HOG, p.Hello({}), request(1), request(2))) == []
    [error] = errors(run(core, b"h", HOG, request(3)))
    assert error.code == 429 and "quota_requests is 2" in error.reason
    assert errors(run(core, b"o", OTHER, p.Hello({}), request(4))) == []  # another key's own
    worker = run(core, b"w", OTHER, p.Hello({}), p.Consume("resize", 1))
    [job] = [m for m in worker if isinstance(m, p.Dispatch)]
    run(core, b"w", OTHER, p.Reply(b"done", "resize", job.message_id, job.correlation))
    assert job.correlation == "c1"  # the oldest: the worker answered one of HOG's requests
    assert errors(run(core, b"h", HOG, request(5))) == []  # so it has room for one more


def test_a_key_past_its_quota_of_connections_is_refused_and_forgotten() -> None:
    core = CoreHarness(quota_connections=2)
    for peer_id in (b"h1", b"h2"):
        assert errors(run(core, peer_id, HOG, p.Hello({}), p.Send("q", b"x", 0, tag=1))) == []
    answers = run(core, b"h3", HOG, p.Hello({}), p.Send("q", b"x", 0, tag=2))
    assert [e.code for e in errors(answers)] == [429, 429]
    assert "quota_connections is 2" in errors(answers)[0].reason
    assert b"h3" not in core.core.peers and core.core.queues["q"].ready_count == 2
    assert errors(run(core, b"o", OTHER, p.Hello({}), p.Send("q", b"x", 0, tag=3))) == []
    run(core, b"h1", HOG, p.Kbai())  # one goes: room for another
    assert errors(run(core, b"h4", HOG, p.Hello({}), p.Send("q", b"x", 0, tag=4))) == []


def test_at_its_quota_a_key_s_new_connection_takes_the_place_of_one_that_vanished_unseen() -> None:
    """A ZeroMQ peer that closed without KBAI leaves no trace: one without heartbeats that
    holds nothing and has been silent for reclaim_silent_seconds (15) makes room for a new one
    of its key. A peer that heartbeats, consumes, was paused and waits for RESUME, waits for
    a reply or asked for confirms is kept, and the new one refused as before; a look that
    found none is not repeated for a second; none while frames wait unread."""
    core = CoreHarness(quota_connections=5, max_queue_length=2)
    assert errors(run(core, b"beats", HOG, p.Hello({"heartbeat_ms": 60_000}))) == []
    assert errors(run(core, b"consumes", HOG, p.Hello({}), p.Consume("q", 1))) == []
    sends = [p.Send("full", b"x", 0, tag=tag) for tag in range(3)]
    answers = run(core, b"paused", HOG, p.Hello({}), *sends)
    assert any(isinstance(m, p.Pause) for m in answers)
    assert errors(run(core, b"confirms", HOG, p.Hello({"confirm": True}))) == []
    request = p.Send("jobs", b"x", 0, reply_to="", correlation="c1")
    assert errors(run(core, b"requests", HOG, p.Hello({}), request)) == []
    core.advance(20)
    [error] = errors(run(core, b"refused", HOG, p.Hello({})))
    assert error.code == 429 and core.core.counters.connections_reclaimed == 0
    run(core, b"paused", HOG, p.Kbai())
    assert errors(run(core, b"gone1", HOG, p.Hello({}))) == []
    core.advance(14.9)
    [error] = errors(run(core, b"gone2", HOG, p.Hello({})))  # gone1 is not silent long enough
    assert error.code == 429
    core.advance(0.1)
    [error] = errors(run(core, b"early", HOG, p.Hello({})))  # a second after the last look
    assert error.code == 429
    core.advance(0.9)
    assert errors(run(core, b"new", HOG, p.Hello({}), p.Send("q", b"x", 0, tag=1))) == []
    assert b"gone1" not in core.core.peers and b"new" in core.core.peers
    assert core.core.counters.connections_reclaimed == 1
    assert core.core.ctx.quotas.refused["connections"] == 3  # the admitted one is no refusal
    # The one forgotten, if it was only quiet, is told why when it speaks again (an ERROR, not
    # silence): here its key is at its quota with peers that count.
    [error] = errors(run(core, b"gone1", HOG, p.Heartbeat()))
    assert error.code == 429 and "quota_connections is 5" in error.reason
    core.advance(20)
    core.core.note_input_pending(True)  # "new" may have spoken in the frames unread
    [error] = errors(run(core, b"later", HOG, p.Hello({})))
    assert error.code == 429 and b"new" in core.core.peers


def test_a_requester_is_reclaimable_once_its_reply_came_and_an_admin_never() -> None:
    """Only while a reply is due to it is a quiet requester kept (a one-shot script's request
    and reply does not pin its peer for idle_peer_seconds); a HELLO with the admin secret is
    a right a new peer would not have."""
    core = CoreHarness(quota_connections=2, admin_secret="s3cret")
    assert errors(run(core, b"ops", HOG, p.Hello({"admin_secret": "s3cret"}))) == []  # oldest
    request = p.Send("jobs", b"x", 0, tag=1, reply_to="", correlation="c1")
    assert errors(run(core, b"asks", HOG, p.Hello({}), request)) == []
    core.advance(20)
    [error] = errors(run(core, b"new", HOG, p.Hello({})))
    assert error.code == 429
    worker = run(core, b"w", OTHER, p.Hello({"heartbeat_ms": 60_000}), p.Consume("jobs", 1))
    [job] = [m for m in worker if isinstance(m, p.Dispatch)]
    run(core, b"w", OTHER, p.Reply(b"done", "jobs", job.message_id, job.correlation))
    core.advance(1)
    assert errors(run(core, b"new", HOG, p.Hello({}))) == []
    assert b"asks" not in core.core.peers and b"ops" in core.core.peers
    assert core.core.ctx.awaiting_replies == {}


def test_reclaim_silent_seconds_sets_how_long_a_peer_is_silent_before_it_is_reclaimed() -> None:
    core = CoreHarness(quota_connections=1, reclaim_silent_seconds=0.5)
    run(core, b"a", SAME_HOST, p.Hello({}))
    core.advance(0.5)
    assert errors(run(core, b"b", SAME_HOST_AGAIN, p.Hello({}))) == []
    assert core.core.counters.connections_reclaimed == 1
