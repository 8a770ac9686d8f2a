"""One door for rights (issue #27), table-driven: every message that needs a right, through
every path a message reaches the core by (the ROUTER, the raw TCP endpoint, forwarded by a
shard link, after a KBAI, after a second HELLO, after a SIGHUP), is allowed with exactly the
rights it needs and refused with a 403 naming the right without one of them. A property test
then checks that random message sequences from a limited key change only queues its rights
cover.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import phpmq.protocol as p
from phpmq.broker.clock import FakeClock
from phpmq.broker.config import BrokerConfig
from phpmq.broker.core import Core
from phpmq.broker.guard import LINK_KEY_NAME, Guard, Principal
from phpmq.broker.model import Peer, PeerProfile
from phpmq.broker.permissions import PATTERN_RIGHTS, Permissions, Rights
from phpmq.protocol.cluster import ClusterMap, Shard, encode_map

KEY = "k"
ROUTER = PeerProfile("router", ttl_form=True)
TCP = PeerProfile("tcp", ttl_form=True, closable=True)
CLIENT = Principal(KEY, "10.0.0.1:4000", "router")
TCP_CLIENT = Principal(None, "10.0.0.2:4000", "tcp")
LINK = Principal(LINK_KEY_NAME, "10.0.0.3:4000", "router")


def rights(granted: dict[str, tuple[str, ...]], admin: bool) -> Rights:
    return Rights(KEY, admin=admin, **{right: granted.get(right, ()) for right in PATTERN_RIGHTS})


def everything_but(right: str, admin: bool = True) -> Rights:
    """Every right on everything but `right` (so the peer is checked, not waved through)."""
    granted = {name: ("#",) for name in PATTERN_RIGHTS if name != right}
    return rights(granted, admin=admin and right != "admin")


def exactly(needed: dict[str, str]) -> Rights:
    """Only the rights a case needs, each on its one target."""
    granted = {right: (target,) for right, target in needed.items() if right != "admin"}
    return rights(granted, admin="admin" in needed)


# A case: the message, and the rights (right -> target) it needs.
CASES: list[tuple[str, p.Message, dict[str, str]]] = [
    ("send", p.Send("jobs.a", b"x", 0, tag=1), {"send": "jobs.a"}),
    (
        "send with reply_to",
        p.Send("jobs.a", b"x", 0, tag=1, reply_to="replies.me", correlation="c"),
        {"send": "jobs.a"},
    ),
    ("publish", p.Publish("order.paid", b"x", 0, tag=1), {"publish": "order.paid"}),
    ("consume", p.Consume("jobs.a", 1), {"consume": "jobs.a"}),
    (
        "consume with bindings",
        p.Consume("jobs.a", 1, patterns="order.*"),
        {"consume": "jobs.a", "bind": "jobs.a", "subscribe": "order.*"},
    ),
    (
        "consume, delete when unused",
        p.Consume("jobs.a", 1, unused_ms=1000),
        {"consume": "jobs.a", "delete": "jobs.a"},
    ),
    ("queue-peek", p.Admin({"command": "queue-peek", "queue": "jobs.a"}), {"consume": "jobs.a"}),
    (
        "queue-bind",
        p.Admin({"command": "queue-bind", "queue": "jobs.a", "patterns": ["order.*"]}),
        {"bind": "jobs.a", "subscribe": "order.*"},
    ),
    ("queue-delete", p.Admin({"command": "queue-delete", "queue": "jobs.a"}), {"delete": "jobs.a"}),
    ("queue-purge", p.Admin({"command": "queue-purge", "queue": "jobs.a"}), {"admin": ""}),
    # A replica's own command (its shell registers it): the guard checks it all the same.
    ("replica-lead", p.Admin({"command": "replica-lead", "node": "b"}), {"admin": ""}),
    (
        "schedule-add",
        p.Admin(
            {"command": "schedule-add", "name": "s", "queue": "jobs.a", "every_ms": 60_000}
        ),
        {"admin": "", "send": "jobs.a"},
    ),
]
# The reply queue of a request needs `send` too: its own row, so that "without it" is tested.
CASES.append(
    (
        "reply queue",
        p.Send("jobs.a", b"x", 0, tag=1, reply_to="replies.me", correlation="c"),
        {"send": "replies.me"},
    )
)


class Path:
    """One way a message reaches the core, with the peer's rights set to `granted`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, granted: Rights, message: p.Message) -> list[p.Message]:
        sharded = self.name == "forwarded"
        config: dict[str, Any] = {}
        if sharded:
            cluster = ClusterMap(1, (Shard("a", "tcp://127.0.0.1:1"),))
            config = {"cluster": encode_map(cluster).decode(), "shard": "a"}
        core = Core(BrokerConfig(**config), FakeClock())
        permissions = Permissions({KEY: granted}, tcp=_renamed(granted, "tcp"))
        core.set_permissions(permissions)
        frames = self._frames(core, permissions, message)
        return self._answers(core, frames)

    def _frames(
        self, core: Core, permissions: Permissions, message: p.Message
    ) -> list[tuple[bytes, bytes, PeerProfile, Principal]]:
        hello = p.Hello({"confirm": True})
        name = self.name
        if name == "router":
            return [(b"c", p.encode_all([hello, message]), ROUTER, CLIENT)]
        if name == "tcp":  # one that spoke HELLO gets ERRORs; a stock peer's refusals are logged
            return [(b"t", p.encode_all([hello, message]), TCP, TCP_CLIENT)]
        if name == "after KBAI":
            return [(b"c", p.encode_all([hello, p.Kbai(), hello, message]), ROUTER, CLIENT)]
        if name == "after re-HELLO":
            again = p.Hello({"confirm": True, "name": "again"})
            return [(b"c", p.encode_all([hello, again, message]), ROUTER, CLIENT)]
        if name == "after SIGHUP":
            core.begin_turn()
            core.handle_frame(b"c", p.encode(hello), ROUTER, CLIENT)
            core.end_turn()
            core.set_permissions(permissions)
            return [(b"c", p.encode(message), ROUTER, CLIENT)]
        assert name == "forwarded"
        link = p.Hello({"role": "link", "name": "b"})
        fake = Peer(b"x", ROUTER, 0)
        fake.principal = CLIENT
        wire = Guard.principal_wire(fake)
        inner = p.encode_all([hello, message])
        forward = p.Forward(b"p1", inner, p.FORWARD_EXTENSIONS | p.FORWARD_CONFIRM, wire)
        return [(b"l", p.encode_all([link, forward]), ROUTER, LINK)]

    @staticmethod
    def _answers(
        core: Core, frames: list[tuple[bytes, bytes, PeerProfile, Principal]]
    ) -> list[p.Message]:
        core.begin_turn()
        for peer_id, frame, profile, principal in frames:
            core.handle_frame(peer_id, frame, profile, principal)
        out: list[p.Message] = []
        for _peer, frame in core.end_turn().frames:
            messages, error = p.decode_frame(frame)
            assert error is None
            for message in messages:
                if isinstance(message, p.Forward):  # to a relayed peer, through its link
                    inner, inner_error = p.decode_frame(message.content)
                    assert inner_error is None
                    out.extend(inner)
                else:
                    out.append(message)
        return out


def _renamed(granted: Rights, name: str) -> Rights:
    kwargs = {right: getattr(granted, right) for right in PATTERN_RIGHTS}
    return Rights(name, admin=granted.admin, **kwargs)


QUEUE_COMMAND_RIGHTS = ("consume", "bind", "delete")
PATHS = ["router", "tcp", "forwarded", "after KBAI", "after re-HELLO", "after SIGHUP"]


def forbidden(answers: list[p.Message]) -> list[str]:
    reasons = []
    for message in answers:
        if isinstance(message, p.Error) and message.code == 403:
            reasons.append(message.reason)
        elif isinstance(message, p.AdminReply):
            error = message.options.get("error")
            if isinstance(error, dict) and error.get("code") == 403:
                reasons.append(str(error["reason"]))
    return reasons


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("case", "message", "needed"), CASES, ids=[c[0] for c in CASES])
def test_allowed_with_exactly_the_rights_it_needs(
    path: str, case: str, message: p.Message, needed: dict[str, str]
) -> None:
    if "reply" in case:  # a request needs send on its queue and on its reply queue
        granted = rights({"send": ("jobs.a", "replies.me")}, admin=False)
    else:
        granted = exactly(needed)
    answers = Path(path).run(granted, message)
    assert forbidden(answers) == [], (path, case, answers)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("case", "message", "needed"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_a_403_naming_each_missing_right(
    path: str, case: str, message: p.Message, needed: dict[str, str]
) -> None:
    for right, target in needed.items():
        if case == "reply queue":  # send on the request's queue, not on its reply queue
            others = {name: ("#",) for name in PATTERN_RIGHTS if name != "send"}
            without = rights({**others, "send": ("jobs.a",)}, admin=True)
        else:
            # The admin right covers the queue commands (peek, bind, delete) by itself.
            covered_by_admin = isinstance(message, p.Admin) and right in QUEUE_COMMAND_RIGHTS
            without = everything_but(right, admin=not covered_by_admin)
        answers = Path(path).run(without, message)
        reasons = forbidden(answers)
        assert len(reasons) == 1, (path, case, right, answers)
        assert f"no {right} right" in reasons[0], (path, case, right, reasons)
        if target and right != "admin":
            assert repr(target) in reasons[0]


# ----------------------------------------------------------------------- property


QUEUES = ["jobs.a", "jobs.b", "billing", "payroll"]
LIMITED = rights(
    {"send": ("jobs.*",), "consume": ("jobs.a",), "bind": ("jobs.a",), "subscribe": ("order.*",)},
    admin=False,
)
#: What LIMITED may change: jobs.a anything but its existence (it consumes, binds and
#: settles there), jobs.b only by sending more (ready grows); nothing else, no deletion.
CONSUMED, SENT_ONLY = "jobs.a", "jobs.b"

messages = st.one_of(
    st.builds(lambda q: p.Send(q, b"x", 0, tag=1), st.sampled_from(QUEUES)),
    st.builds(
        lambda q, r: p.Send(q, b"x", 0, tag=1, reply_to=r, correlation="c"),
        st.sampled_from(QUEUES),
        st.sampled_from(QUEUES),
    ),
    st.builds(lambda q, n: p.Consume(q, n), st.sampled_from(QUEUES), st.integers(0, 3)),
    st.builds(
        lambda q, pat: p.Consume(q, 1, patterns=pat),
        st.sampled_from(QUEUES),
        st.sampled_from(["order.*", "#", "payroll.#", "order.paid"]),
    ),
    st.builds(lambda q: p.Consume(q, 1, unused_ms=0), st.sampled_from(QUEUES)),
    st.builds(lambda q: p.Cancel(q), st.sampled_from(QUEUES)),
    st.builds(
        lambda c, q: p.Admin({"command": c, "queue": q}),
        st.sampled_from(["queue-purge", "queue-delete", "queue-peek", "dlq-purge", "dlq-replay"]),
        st.sampled_from(QUEUES),
    ),
    st.just(p.Kbai()),
    st.just(p.Hello({"confirm": True})),
    st.just(p.Publish("payroll.salary", b"x", 0)),
)


def _snapshot(core: Core) -> dict[str, tuple[Any, ...]]:
    return {
        name: (queue.ready_count, queue.in_flight, len(queue.windows), len(queue.dead))
        for name, queue in core.queues.items()
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=12), st.sampled_from(["router", "tcp"]))
def test_a_limited_key_changes_only_queues_its_rights_cover(
    sequence: list[p.Message], transport: str
) -> None:
    core = Core(BrokerConfig(), FakeClock())
    limited_tcp = _renamed(LIMITED, "tcp")
    core.set_permissions(Permissions({KEY: LIMITED, "ops": _everything()}, tcp=limited_tcp))
    # Every queue exists with a message, sent by a key with every right.
    core.begin_turn()
    everyone = Principal("ops", "10.0.0.9:1", "router")
    setup = p.encode_all([p.Send(q, b"seed", 0) for q in QUEUES])
    core.handle_frame(b"ops", setup, ROUTER, everyone)
    core.end_turn()
    before = _snapshot(core)
    profile, principal = (ROUTER, CLIENT) if transport == "router" else (TCP, TCP_CLIENT)
    core.begin_turn()
    core.handle_frame(b"c", p.encode_all(sequence), profile, principal)
    core.end_turn()
    core.ctx.clock.advance(1.0)  # what comes due later (a queue unused for 0 ms) comes due
    core.begin_turn()
    core.end_turn()
    after = _snapshot(core)
    assert set(after) == set(before), ("a queue was deleted or created", sequence)
    for queue in QUEUES:
        if queue == CONSUMED:
            continue
        if queue == SENT_ONLY:
            ready, *rest = after[queue]
            assert ready >= before[queue][0] and rest == list(before[queue][1:]), sequence
        else:
            assert after[queue] == before[queue], (queue, sequence)


def _everything() -> Rights:
    return rights({name: ("#",) for name in PATTERN_RIGHTS}, admin=True)

