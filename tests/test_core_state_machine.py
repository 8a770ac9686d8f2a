"""A stateful (hypothesis) test of the pure broker core: peers send, consume, ack, requeue,
dead-letter, disconnect, leave and vanish while a fake clock moves on; one core turn per step.

The invariant, checked after every step: every message ever accepted is in exactly one place -
ready in its queue, in flight in one consumer window, in a dead-letter store (rejected by a
consumer or expired), or acked. Nothing is lost and nothing is duplicated.

Besides: the queues' counters match their structures; a window is never dispatched past its
limit (it may hold more only after its limit was lowered); every held record is IN_FLIGHT; each
peer holds exactly the dispatches the model saw it get; delivery counts are exact and never go
down; an expired message is never dispatched; and the core's counters agree with the model.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import protocol as p
from broker.store import GONE, IN_FLIGHT, NS_PER_SECOND, READY
from harness import CoreHarness

CONSUMERS = (b"c0", b"c1", b"c2")
PRODUCER = b"producer"
SENDERS = (PRODUCER, *CONSUMERS)
QUEUES = ("q0", "q1")
TTLS = (0, 1, 5, 30)
#: An ID the broker never hands out (its IDs are random); acking it is always refused.
UNKNOWN_ID = "f" * 32

consumers = st.sampled_from(CONSUMERS)
queues = st.sampled_from(QUEUES)
ttls = st.sampled_from(TTLS)
counts = st.integers(0, 5)


@dataclass
class Msg:
    """What the model knows of one accepted message."""

    content: bytes
    queue: str
    #: Monotonic ns, 0 for never (as the core keeps it).
    expires_at: int
    #: The delivery count its next dispatch must carry.
    deliveries: int = 1
    #: Learnt from its first dispatch.
    id: str | None = None


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = CoreHarness(dead_letter_limit=10_000)
        self.msgs: dict[bytes, Msg] = {}
        self.by_id: dict[str, Msg] = {}
        self.held: dict[bytes, dict[str, Msg]] = {peer: {} for peer in CONSUMERS}
        self.limits: dict[tuple[bytes, str], int] = {}
        #: Windows whose limit was lowered below what they held at the time.
        self.overfull_ok: set[tuple[bytes, str]] = set()
        self.closing: set[bytes] = set()
        self.greeted: set[bytes] = set()
        self.acked: set[bytes] = set()
        self.rejected: dict[bytes, str] = {}
        self.last_delivery: dict[str, int] = {}
        self.expected = Counter[str]()
        #: False between a peer_gone() and the next turn, which does the dispatch it asks for.
        self.settled = True

    # ------------------------------------------------------------------ driving the core

    @property
    def now(self) -> int:
        return self.h.clock.monotonic_ns()

    def greet(self, peer: bytes, messages: list[p.Message]) -> list[p.Message]:
        """Consumers say HELLO before anything else, so they are told of refusals."""
        if peer in self.greeted:
            return messages
        self.greeted.add(peer)
        return [p.Hello({"name": peer.decode()}), *messages]

    def turn(
        self, *inputs: tuple[bytes, list[p.Message]]
    ) -> tuple[dict[bytes, list], list[tuple[bytes, p.Error]]]:
        """One core turn; every dispatch in the output (to whichever peer) is checked and
        recorded. Returns the output and the ERRORs in it."""
        out = self.h.turn(*inputs)
        self.settled = True
        refusals = []
        for peer, messages in out.items():
            for message in messages:
                if isinstance(message, p.Dispatch):
                    self.on_dispatch(peer, message)
                elif isinstance(message, p.Error):
                    refusals.append((peer, message))
        return out, refusals

    def quiet_turn(self, *inputs: tuple[bytes, list[p.Message]]) -> dict[bytes, list]:
        """A turn in which the core must refuse nothing."""
        out, refusals = self.turn(*inputs)
        assert refusals == [], f"unexpected refusals: {refusals}"
        return out

    def on_dispatch(self, peer: bytes, dispatch: p.Dispatch) -> None:
        msg = self.msgs.get(dispatch.content)
        assert msg is not None, f"dispatched content never sent: {dispatch.content!r}"
        assert dispatch.queue == msg.queue
        assert msg.content not in self.acked, f"acked message dispatched again: {msg}"
        assert msg.content not in self.rejected, f"dead-lettered message dispatched: {msg}"
        holders = [c for c in CONSUMERS if dispatch.message_id in self.held[c]]
        assert holders == [], f"{msg} dispatched to {peer!r} while {holders} hold it"
        if msg.id is None:
            assert dispatch.message_id not in self.by_id, "two messages share an ID"
            msg.id = dispatch.message_id
            self.by_id[msg.id] = msg
        assert dispatch.message_id == msg.id, "a message changed its ID"
        assert dispatch.delivery_count is not None
        assert dispatch.delivery_count >= self.last_delivery.get(msg.id, 0)
        assert dispatch.delivery_count == msg.deliveries
        self.last_delivery[msg.id] = dispatch.delivery_count
        now = self.now
        assert not msg.expires_at or now < msg.expires_at, f"expired message dispatched: {msg}"
        left = math.ceil((msg.expires_at - now) / NS_PER_SECOND) if msg.expires_at else 0
        assert dispatch.ttl == (max(1, left) if msg.expires_at else 0)
        assert peer in CONSUMERS and peer not in self.closing
        self.held[peer][msg.id] = msg
        on_queue = sum(1 for m in self.held[peer].values() if m.queue == msg.queue)
        assert on_queue <= self.limits.get((peer, msg.queue), 0), "window overfilled"
        self.expected["dispatched"] += 1

    def set_limit(self, peer: bytes, queue: str, limit: int) -> None:
        key = (peer, queue)
        self.limits[key] = limit
        if self.holding(peer, queue) > limit:
            self.overfull_ok.add(key)

    def holding(self, peer: bytes, queue: str) -> int:
        return sum(1 for m in self.held[peer].values() if m.queue == queue)

    def forget(self, peer: bytes) -> None:
        """KBAI or a vanished peer: what it held goes back, one delivery later."""
        for msg in self.held[peer].values():
            msg.deliveries += 1
            self.expected["redelivered"] += 1
        self.held[peer].clear()
        for key in [k for k in self.limits if k[0] == peer]:
            del self.limits[key]
            self.overfull_ok.discard(key)
        self.closing.discard(peer)
        self.greeted.discard(peer)

    def pick_held(self, data: st.DataObject) -> tuple[bytes, Msg]:
        held = sorted(
            ((peer, msg) for peer in CONSUMERS for msg in self.held[peer].values()),
            key=lambda pair: pair[1].content,
        )
        return data.draw(st.sampled_from(held), label="held")

    def has_held(self) -> bool:
        return any(self.held.values())

    def release(self, peer: bytes, msg: Msg) -> None:
        assert msg.id is not None
        del self.held[peer][msg.id]
        if not self.holding(peer, msg.queue) and not self.limits.get((peer, msg.queue)):
            self.limits.pop((peer, msg.queue), None)

    # ------------------------------------------------------------------ rules

    @rule(
        sender=st.sampled_from(SENDERS), queue=queues, ttl_list=st.lists(ttls, min_size=1, max_size=5)
    )
    def send_messages(self, sender: bytes, queue: str, ttl_list: list[int]) -> None:
        sends = []
        for ttl in ttl_list:
            content = b"m%d" % len(self.msgs)
            expires_at = self.now + ttl * NS_PER_SECOND if ttl else 0
            self.msgs[content] = Msg(content, queue, expires_at)
            sends.append(p.Send(queue, content, ttl))
        self.expected["received"] += len(sends)
        self.quiet_turn((sender, sends))

    @rule(peer=consumers, queue=queues, count=counts)
    def consume(self, peer: bytes, queue: str, count: int) -> None:
        messages = self.greet(peer, [p.Consume(queue, count)])
        self.set_limit(peer, queue, 0 if peer in self.closing else count)
        self.quiet_turn((peer, messages))

    @precondition(has_held)
    @rule(data=st.data())
    def ack_a_held_message(self, data: st.DataObject) -> None:
        peer, msg = self.pick_held(data)
        self.release(peer, msg)
        self.acked.add(msg.content)
        self.expected["acked"] += 1
        self.quiet_turn((peer, self.greet(peer, [p.Ack(msg.queue, msg.id)])))

    @precondition(has_held)
    @rule(data=st.data(), ttl=ttls)
    def requeue_a_held_message(self, data: st.DataObject, ttl: int) -> None:
        peer, msg = self.pick_held(data)
        self.release(peer, msg)
        msg.deliveries += 1
        msg.expires_at = self.now + ttl * NS_PER_SECOND if ttl else 0
        self.expected["requeued"] += 1
        self.quiet_turn((peer, self.greet(peer, [p.Requeue(msg.queue, msg.id, ttl)])))

    @precondition(has_held)
    @rule(data=st.data(), reason=st.sampled_from([None, "cannot parse", "expired"]))
    def dead_letter_a_held_message(self, data: st.DataObject, reason: str | None) -> None:
        peer, msg = self.pick_held(data)
        self.release(peer, msg)
        self.rejected[msg.content] = reason or "rejected"
        message = p.DeadLetter(msg.queue, msg.id, reason)
        self.quiet_turn((peer, self.greet(peer, [message])))

    @rule(
        peer=consumers,
        queue=queues,
        data=st.data(),
        verb=st.sampled_from([p.Ack, p.Requeue, p.DeadLetter]),
    )
    def refused_for_a_message_not_held(
        self, peer: bytes, queue: str, data: st.DataObject, verb: type
    ) -> None:
        if not self.settled:
            self.quiet_turn()
        known = sorted(self.by_id.values(), key=lambda m: m.content)
        message_id = data.draw(
            st.sampled_from([UNKNOWN_ID, *(m.id for m in known)]), label="message_id"
        )
        mine = self.held[peer].get(message_id)
        if mine is not None and mine.queue == queue:
            queue = next(q for q in QUEUES if q != queue)  # held, but on the other queue
        message = p.Requeue(queue, message_id, 5) if verb is p.Requeue else verb(queue, message_id)
        before = self.snapshot()
        self.expected["errors"] += 1
        out, refusals = self.turn((peer, self.greet(peer, [message])))
        assert [(who, e.code, e.message_id, e.queue) for who, e in refusals] == [
            (peer, p.ErrorCode.UNKNOWN_MESSAGE, message_id, queue)
        ]
        assert not any(isinstance(m, p.Dispatch) for ms in out.values() for m in ms)
        assert self.snapshot() == before, "a refused message changed the broker's state"

    @rule(peer=consumers)
    def consumer_disconnects(self, peer: bytes) -> None:
        messages = self.greet(peer, [p.Disconnect("done")])
        self.closing.add(peer)
        for queue in QUEUES:
            if (peer, queue) in self.limits:
                self.set_limit(peer, queue, 0)
        out = self.quiet_turn((peer, messages))
        assert any(isinstance(m, p.Kbai) for m in out.get(peer, []))

    @rule(peer=consumers)
    def consumer_says_kbai(self, peer: bytes) -> None:
        self.forget(peer)
        self.quiet_turn((peer, [p.Kbai()]))

    @rule(peer=consumers, queue=queues, count=counts)
    def consumer_says_kbai_and_consumes_again_in_one_frame(
        self, peer: bytes, queue: str, count: int
    ) -> None:
        self.forget(peer)
        messages = [p.Kbai(), *self.greet(peer, [p.Consume(queue, count)])]
        self.set_limit(peer, queue, count)
        self.quiet_turn((peer, messages))

    @rule(peer=consumers)
    def consumer_vanishes(self, peer: bytes) -> None:
        """As the shell does when a send fails: between turns; the next turn dispatches."""
        self.forget(peer)
        self.h.core.begin_turn()
        self.h.core.peer_gone(peer)
        self.settled = False

    @precondition(has_held)
    @rule()
    def every_consumer_acks_everything_in_one_turn(self) -> None:
        inputs = []
        for peer in CONSUMERS:
            msgs = sorted(self.held[peer].values(), key=lambda m: m.content)
            if not msgs:
                continue
            for msg in msgs:
                self.release(peer, msg)
                self.acked.add(msg.content)
            self.expected["acked"] += len(msgs)
            inputs.append((peer, self.greet(peer, [p.Ack(m.queue, m.id) for m in msgs])))
        self.quiet_turn(*inputs)

    @rule(seconds=st.integers(0, 40) | st.sampled_from([0.25, 0.999, 4.5]))
    def time_passes(self, seconds: float) -> None:
        self.h.advance(seconds)
        self.quiet_turn()

    # ------------------------------------------------------------------ invariants

    def snapshot(self) -> tuple:
        core = self.h.core
        return (
            {
                name: (
                    [(r.id, r.state, r.deliveries, r.expires_at) for r in q.ready],
                    q.stale,
                    q.in_flight,
                    len(q.dead),
                    [(w.peer.id, w.limit, sorted(w.held)) for w in q.windows],  # type: ignore[attr-defined]
                )
                for name, q in core.queues.items()
            },
            {k: v for k, v in core.counters.items() if k != "errors"},
        )

    @invariant()
    def every_message_is_in_exactly_one_place(self) -> None:
        core = self.h.core
        ready: list[bytes] = []
        in_flight: list[bytes] = []
        dead: list[bytes] = []
        for name, queue in core.queues.items():
            states = Counter(r.state for r in queue.ready)
            assert states[IN_FLIGHT] == 0, f"{name}: an in-flight record sits in ready"
            assert states[GONE] == queue.stale, f"{name}: stale != tombstones in ready"
            ready_records = [r for r in queue.ready if r.state == READY]
            assert queue.ready_count == len(ready_records)
            held = [r for w in queue.windows for r in w.held.values()]
            assert queue.in_flight == len(held), f"{name}: in_flight != records held"
            for record in held:
                assert record.state == IN_FLIGHT, f"{name}: held record not IN_FLIGHT"
            for record in ready_records + held:
                msg = self.msgs[record.content]
                assert msg.queue == name
                assert record.expires_at == msg.expires_at
                assert record.deliveries == msg.deliveries
                assert msg.id is None or record.id == msg.id
            ready += [r.content for r in ready_records]
            in_flight += [r.content for r in held]
            dead += [entry.content for entry in queue.dead]
            for entry in queue.dead:
                msg = self.msgs[entry.content]
                assert msg.queue == name
                assert msg.id is None or entry.id == msg.id
                if entry.content in self.rejected:
                    assert entry.reason == self.rejected[entry.content]
                    assert entry.deliveries == msg.deliveries
                else:
                    assert entry.reason == "expired"
                    assert 0 < msg.expires_at <= core.now, f"buried before its time: {msg}"
                    assert entry.deliveries == msg.deliveries - 1
        places = {"ready": ready, "in flight": in_flight, "dead": dead}
        for place, contents in places.items():
            twice = [c for c, n in Counter(contents).items() if n > 1]
            assert twice == [], f"duplicated in {place}: {twice}"
        places_sets = {place: set(contents) for place, contents in places.items()}
        places_sets["acked"] = self.acked
        seen: set[bytes] = set()
        for place, contents in places_sets.items():
            assert not seen & contents, f"in two places, one {place}: {sorted(seen & contents)}"
            seen |= contents
        lost = set(self.msgs) - seen
        assert not lost, f"lost: {sorted(lost)}"
        assert seen == set(self.msgs)
        assert set(self.rejected) <= set(dead)

    @invariant()
    def windows_match_the_model(self) -> None:
        core = self.h.core
        for name, queue in core.queues.items():
            for window in queue.windows:
                peer = window.peer
                assert core.peers.get(peer.id) is peer, "a window of a forgotten peer"  # type: ignore[attr-defined]
                assert peer.windows.get(name) is window  # type: ignore[attr-defined]
                assert window.queue is queue
        for peer_id in CONSUMERS:
            peer = core.peers.get(peer_id)
            windows = peer.windows if peer is not None else {}
            expected = {
                q for (c, q), limit in self.limits.items() if c == peer_id and limit
            } | {m.queue for m in self.held[peer_id].values()}
            assert set(windows) == expected, f"{peer_id!r}: windows {set(windows)} != {expected}"
            held = {mid: w.queue.name for w in windows.values() for mid in w.held}
            assert held == {mid: m.queue for mid, m in self.held[peer_id].items()}, (
                f"{peer_id!r} holds other dispatches than it was sent"
            )
            for name, window in windows.items():
                key = (peer_id, name)
                assert window in core.queues[name].windows
                assert window.limit == self.limits.get(key, 0)
                if len(window.held) <= window.limit:
                    self.overfull_ok.discard(key)
                else:
                    assert key in self.overfull_ok, f"{key} holds more than its limit"
            if peer is not None:
                assert peer.closing == (peer_id in self.closing)

    @invariant()
    def settled_queues_hold_no_due_or_dispatchable_work(self) -> None:
        if not self.settled:
            return
        core = self.h.core
        for name, queue in core.queues.items():
            ready = [r for r in queue.ready if r.state == READY]
            for record in ready:
                assert not record.expires_at or record.expires_at > core.now, (
                    f"{name}: {record.content!r} is due but still ready"
                )
            if ready:
                free = [w for w in queue.windows if len(w.held) < w.limit]
                assert free == [], f"{name}: ready messages while a window has room"

    @invariant()
    def counters_agree_with_the_model(self) -> None:
        counters = self.h.core.counters
        dead = sum(len(q.dead) for q in self.h.core.queues.values())
        expected = {
            "received": self.expected["received"],
            "dispatched": self.expected["dispatched"],
            "acked": self.expected["acked"],
            "requeued": self.expected["requeued"],
            "dead_lettered": dead,
            "expired": dead - len(self.rejected),
            "redelivered": self.expected["redelivered"],
            "errors": self.expected["errors"],
        }
        assert counters == expected


def test_no_message_is_lost_or_duplicated() -> None:
    run_state_machine_as_test(
        CoreMachine,
        settings=settings(max_examples=200, stateful_step_count=40, deadline=None),
    )
