"""Only a proven shard link may FORWARD (issue #27): a peer with the broker's own key, or
one whose HELLO carried the cluster's link secret; the proof lasts for its connection,
across a SIGHUP; anyone else is refused, or asked to say HELLO again."""

from __future__ import annotations

import phpmq.protocol as p
from phpmq.broker.clock import FakeClock
from phpmq.broker.config import BrokerConfig
from phpmq.broker.core import Core
from phpmq.broker.guard import Principal
from phpmq.broker.model import PeerProfile
from phpmq.broker.permissions import Permissions
from phpmq.protocol.cluster import ClusterMap, Shard, encode_map

ROUTER = PeerProfile("router", ttl_form=True)
SOMEONE = Principal(None, "10.0.0.5:1000", "router")
CLIENT_WIRE = b'[null,"10.0.0.6:2000","router",false]'


def shard() -> Core:
    cluster = ClusterMap(1, (Shard("a", "tcp://127.0.0.1:1"),))
    config = BrokerConfig(cluster=encode_map(cluster).decode(), shard="a", link_secret="s3")
    return Core(config, FakeClock())


def turn(core: Core, peer: bytes, *messages: p.Message) -> list[p.Message]:
    core.begin_turn()
    core.handle_frame(peer, p.encode_all(list(messages)), ROUTER, SOMEONE)
    out: list[p.Message] = []
    for peer_id, frame in core.end_turn().frames:
        if peer_id == peer:
            out += p.decode_frame(frame)[0]
    return out


def forward(content: p.Message) -> p.Forward:
    return p.Forward(b"r1", p.encode(content), p.FORWARD_EXTENSIONS, CLIENT_WIRE)


def test_a_link_proven_by_its_secret_forwards_and_stays_proven_after_sighup() -> None:
    core = shard()
    link = p.Hello({"role": "link", "name": "b", "link_secret": "s3"})
    turn(core, b"L", link, forward(p.Send("q", b"x", 0)))
    assert core.queues["q"].ready_count == 1
    core.set_permissions(Permissions())
    turn(core, b"L", forward(p.Send("q", b"y", 0)))
    assert core.queues["q"].ready_count == 2


def test_a_role_without_proof_cannot_forward_and_a_stranger_is_asked_for_hello() -> None:
    core = shard()
    [told] = turn(core, b"S", forward(p.Send("q", b"x", 0)))
    assert isinstance(told, p.Disconnect)
    wrong = p.Hello({"role": "link", "name": "b", "link_secret": "guess"})
    answers = turn(core, b"W", wrong, forward(p.Send("q", b"x", 0)))
    [error] = [m for m in answers if isinstance(m, p.Error)]
    assert error.code == 403 and "FORWARD" in error.reason
    assert "q" not in core.queues
    assert core.guard.refused["link"] == 1


def test_a_forward_without_a_principal_runs_nothing() -> None:
    core = shard()
    link = p.Hello({"role": "link", "name": "b", "link_secret": "s3"})
    bare = p.Forward(b"r1", p.encode(p.Send("q", b"x", 0, tag=1)), p.FORWARD_EXTENSIONS)
    answers = turn(core, b"L", link, bare)
    inner = [m for f in answers if isinstance(f, p.Forward) for m in p.decode_frame(f.content)[0]]
    [error] = [m for m in inner if isinstance(m, p.Error)]
    assert error.code == 403 and "q" not in core.queues
