"""Events against real broker processes, spoken as bare PHPMQ bytes over DEALER sockets:
the MQKS hello world, bindings and copies that survive kill -9, and a property test that the
queues a publish reaches are exactly those a reference matcher picks."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import phpmq.protocol as p
from harness import BrokerProcess, free_port, raw_admin, raw_dealer, recv_messages, wait_until


def publish(sock: zmq.Socket, event: str, content: bytes, tag: int) -> p.Confirm:
    """The publish's CONFIRM (dispatches to the same socket may come first)."""
    sock.send(p.encode(p.Publish(event, content, 0, tag)))
    while True:
        for answer in recv_messages(sock):
            if not isinstance(answer, p.Dispatch):
                assert isinstance(answer, p.Confirm) and answer.tag == tag, answer
                return answer


def receive(sock: zmq.Socket, count: int) -> list[p.Dispatch]:
    got: list[p.Dispatch] = []
    while len(got) < count:
        got += [m for m in recv_messages(sock) if isinstance(m, p.Dispatch)]
    return got


def test_mqks_hello_world(broker: BrokerProcess) -> None:
    with (
        raw_dealer(broker.address) as alice,
        raw_dealer(broker.address) as bob,
        raw_dealer(broker.address) as charlie,
        raw_dealer(broker.address) as dave,
    ):
        for sock, queue, events in (
            (alice, "greetings", "hi hello"),
            (bob, "greetings", "hi hello"),
            (charlie, "greetings-and-byes", "hi hello bye good-bye"),
        ):
            sock.send(p.encode_all([p.Hello({}), p.Consume(queue, 10, None, events)]))
            recv_messages(sock)  # the HELLO answer: the window is open
        assert publish(dave, "hello", b"world", 1).count == 2
        [own] = receive(charlie, 1)
        assert (own.content, own.event) == (b"world", "hello")
        shared = [m for sock in (alice, bob) if sock.poll(1000) for m in recv_messages(sock, 0)]
        assert [(m.content, m.event, m.queue) for m in shared] == [(b"world", "hello", "greetings")]
        assert publish(dave, "good-bye", b"later", 2).count == 1
        assert receive(charlie, 1)[0].content == b"later"


def test_bindings_and_copies_survive_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    address = f"tcp://127.0.0.1:{free_port()}"
    with BrokerProcess(tmp_path / "first.log", "--data-dir", str(data), address=address) as first:
        with raw_dealer(address) as ops, raw_dealer(address) as live:
            raw_admin(ops, "queue-bind", queue="audit", patterns=["#"])
            raw_admin(ops, "queue-bind", queue="users", patterns=["user.*.updated", "user.created"])
            live.send(p.encode_all([p.Hello({}), p.Consume("live", 1, None, "user.#", 60_000)]))
            recv_messages(live)
            assert publish(ops, "user.7.updated", b"u7", 1).count == 3
            assert publish(ops, "order.paid", b"o1", 2).count == 1
            raw_admin(ops, "queue-rebind", queue="users", remove_mask=["user.*.*"])
        first.kill()
    second = BrokerProcess(tmp_path / "second.log", "--data-dir", str(data), address=address)
    with second, raw_dealer(address) as ops:
        stats = raw_admin(ops, "stats")["queues"]
        assert stats["audit"]["bindings"] == ["#"] and stats["audit"]["ready"] == 2
        assert stats["users"]["bindings"] == ["user.created"]
        assert stats["users"]["ready"] == 1
        assert stats["live"]["delete_when_unused_ms"] == 60_000
        ops.send(p.encode_all([p.Hello({}), p.Consume("audit", 10)]))
        got = receive(ops, 2)
        assert [(d.content, d.event) for d in got] == [
            (b"u7", "user.7.updated"),
            (b"o1", "order.paid"),
        ]
        assert publish(ops, "user.created", b"new", 3).count == 3


SEGMENTS = st.sampled_from(["a", "b", "c"])
EVENTS = st.lists(SEGMENTS, min_size=1, max_size=4).map(".".join)
PATTERNS = st.lists(st.sampled_from(["a", "b", "c", "*", "#"]), min_size=1, max_size=4).map(
    ".".join
)


def reference_match(pattern: str, event: str) -> bool:
    """Plain recursion over segments: `*` one, `#` zero or more."""

    def match(ps: list[str], es: list[str]) -> bool:
        if not ps:
            return not es
        if ps[0] == "#":
            return any(match(ps[1:], es[i:]) for i in range(len(es) + 1))
        return bool(es) and ps[0] in ("*", es[0]) and match(ps[1:], es[1:])

    return match(pattern.split("."), event.split("."))


_round = itertools.count()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    bindings=st.lists(st.lists(PATTERNS, min_size=1, max_size=3), min_size=1, max_size=5),
    events=st.lists(EVENTS, min_size=1, max_size=5),
)
def test_publish_reaches_exactly_the_queues_a_reference_matcher_picks(
    broker: BrokerProcess, bindings: list[list[str]], events: list[str]
) -> None:
    prefix = f"p{next(_round)}-"
    queues = {f"{prefix}{index}": patterns for index, patterns in enumerate(bindings)}
    with raw_dealer(broker.address) as sock:
        for queue, patterns in queues.items():
            raw_admin(sock, "queue-bind", queue=queue, patterns=patterns)
        for tag, event in enumerate(events):
            expected = {
                queue
                for queue, patterns in queues.items()
                if any(reference_match(pattern, event) for pattern in patterns)
            }
            before = {q: s["ready"] for q, s in raw_admin(sock, "stats")["queues"].items()}
            answer = publish(sock, event, b"e", tag)
            after = raw_admin(sock, "stats")["queues"]
            reached = {q for q in queues if after[q]["ready"] > before.get(q, 0)}
            assert reached == expected, (event, queues)
            assert answer.count == len(expected)
        for queue in queues:
            raw_admin(sock, "queue-delete", queue=queue)



def test_delete_when_unused_with_and_without_grace(broker: BrokerProcess) -> None:
    with raw_dealer(broker.address) as ops:

        def queues() -> dict:
            return raw_admin(ops, "stats")["queues"]

        with raw_dealer(broker.address) as first:
            first.send(p.encode_all([p.Hello({}), p.Consume("graced", 5, None, "job.#", 1500)]))
            first.send(p.encode(p.Consume("at-once", 5, None, "job.#", 0)))
            recv_messages(first)
            assert {"graced", "at-once"} <= set(queues())
            first.send(p.encode_all([p.Disconnect(), p.Kbai()]))
            recv_messages(first)  # the broker's KBAI: both windows are closed
        assert wait_until(lambda: "at-once" not in queues())
        assert "graced" in queues()
        assert publish(ops, "job.1", b"kept for a returning consumer", 1).count == 1
        with raw_dealer(broker.address) as second:
            second.send(p.encode_all([p.Hello({}), p.Consume("graced", 5)]))
            [got] = receive(second, 1)
            assert got.content == b"kept for a returning consumer"
            second.send(p.encode(p.Ack("graced", got.message_id)))
            second.send(p.encode(p.Cancel("graced")))
            [answer] = [m for m in recv_messages(second) if isinstance(m, p.Cancel)]
            assert (answer.reason, answer.count) == ("cancelled", 0)
        left_at = time.monotonic()
        assert "graced" in queues()
        assert wait_until(lambda: "graced" not in queues())
        assert time.monotonic() - left_at >= 1.0  # not before its grace (1.5 s) was nearly over
        counters = raw_admin(ops, "stats")["counters"]
        assert counters["queues_unused_deleted"] == 2


def test_unrouted_events_are_kept_where_the_flag_says(tmp_path: Path) -> None:
    with (
        BrokerProcess(tmp_path / "broker.log", "--unrouted-queue", "lost") as broker,
        raw_dealer(broker.address) as sock,
    ):
        assert publish(sock, "nobody.home", b"x", 1).count == 0
        assert raw_admin(sock, "stats")["queues"]["lost"]["ready"] == 1
