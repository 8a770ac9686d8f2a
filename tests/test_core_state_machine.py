"""A stateful (hypothesis) test of the pure broker core, one core turn per step, on a fake clock:
extension consumers say HELLO (some agree on heartbeats), a stock one never does; they consume
with or without their own lease, ack, requeue (some with a delay), dead-letter, disconnect, say
KBAI, vanish and fall silent; producers send with TTLs and headers; an operator replays or
purges dead letters; time passes (TTL expiry, leases, delays, dead and idle peers); the broker
may start draining. Each example draws its limits: max deliveries, queue length and overflow
policy, leases.

The invariant, checked after every step: every message ever accepted is in exactly one place -
ready in its queue, in flight in one consumer window, delayed, in a dead-letter store (rejected
by a consumer, expired, past max-deliveries or dropped by overflow), acked, or purged. Nothing
is lost and nothing is duplicated.

Besides: the queues' counters match their structures; a window is never dispatched past its
limit (it may hold more only after its limit was lowered); every held record is IN_FLIGHT; each
peer holds exactly the dispatches the model saw it get; delivery counts are exact and never go
down; an expired message is never dispatched; and the core's counters agree with the model.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import phpmq.protocol as p
from harness import CoreHarness, dispatches
from phpmq.broker.config import QueueSettings
from phpmq.broker.model import GONE, IN_FLIGHT, NS_PER_SECOND, READY

NS_PER_MS = 1_000_000
#: Consumers that speak the extensions (HELLO first), and one stock PHPMQ consumer that never
#: does: it gets no ERRORs, delivery counts or headers, and its only sign of life is its acks.
EXTENSION_CONSUMERS = (b"c0", b"c1", b"c2")
STOCK = b"s0"
CONSUMERS = (*EXTENSION_CONSUMERS, STOCK)
PRODUCER = b"producer"
ADMIN = b"operator"
SENDERS = (PRODUCER, *CONSUMERS)
QUEUES = ("q0", "q1")
TTLS = (0, 1, 5, 30)
LIVENESS = 3  # the broker's default, used when a HELLO does not say
#: Examples per run; a soak: STATE_MACHINE_EXAMPLES=5000 pytest tests/test_core_state_machine.py
EXAMPLES = int(os.environ.get("STATE_MACHINE_EXAMPLES", "400"))
#: An ID the broker never hands out (its IDs are random); acking it is always refused.
UNKNOWN_ID = b"f" * 32

consumers = st.sampled_from(CONSUMERS)
extension_consumers = st.sampled_from(EXTENSION_CONSUMERS)
queues = st.sampled_from(QUEUES)
ttls = st.sampled_from(TTLS)
counts = st.integers(0, 5)
window_leases = st.sampled_from([None, None, 0, 2_000, 20_000])


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
    #: While held under a lease: monotonic ns when it goes back.
    lease_until: int = 0
    #: While requeued with a delay: monotonic ns when it is back in its queue.
    delayed_until: int = 0
    #: The producer's HEADERS packet, passed on in every dispatch.
    headers: bytes | None = None


@dataclass
class PeerModel:
    """A consumer the core knows (it has spoken an extension type)."""

    heartbeat_ns: int
    last_seen: int
    hello: bool = True
    closing: bool = False

    @property
    def expiry_ns(self) -> int:
        return self.heartbeat_ns * LIVENESS


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.msgs: dict[bytes, Msg] = {}
        self.sent = 0
        self.by_id: dict[str, Msg] = {}
        self.known: dict[bytes, PeerModel] = {}
        #: Known peers the core gave up on without a goodbye: they come back as extension
        #: peers (that have not said HELLO) when they speak again.
        self.departed: set[bytes] = set()
        self.held: dict[bytes, dict[str, Msg]] = {peer: {} for peer in CONSUMERS}
        self.limits: dict[tuple[bytes, str], int] = {}
        self.window_lease_ms: dict[tuple[bytes, str], int] = {}
        #: Windows whose limit was lowered below what they held at the time.
        self.overfull_ok: set[tuple[bytes, str]] = set()
        self.acked: set[bytes] = set()
        #: Dead letters an operator purged: gone for good, on purpose.
        self.purged: set[bytes] = set()
        #: Buried for a reason the model predicts (a consumer's, or max-deliveries), with the
        #: deliveries its dead-letter entry must count.
        self.buried: dict[bytes, tuple[str, int]] = {}
        self.last_delivery: dict[str, int] = {}
        self.expected = Counter[str]()
        self.draining = False
        self.turns = 0
        #: Messages that timers (leases, dead peers) return in the coming turn, and those they
        #: returned in the last: timers run after the turn's TTL sweep, so one of these may
        #: stay READY past its TTL until the next turn's sweep (docs/protocol.md, "turn").
        self.timer_returns: set[bytes] = set()
        self.returned_late: set[bytes] = set()
        #: False between a peer_gone() and the next turn, which does the dispatch it asks for.
        self.settled = True

    @initialize(
        max_deliveries=st.sampled_from([0, 2, 5]),
        lease_ms=st.sampled_from([0, 5_000, 60_000]),
        max_in_flight_ms=st.sampled_from([0, 0, 15_000]),
        max_queue_length=st.sampled_from([0, 0, 4, 10]),
        overflow=st.sampled_from(["reject", "drop-oldest"]),
        q1_max_deliveries=st.sampled_from([None, 1, 3]),
        q1_max_length=st.sampled_from([None, None, 0, 3]),
        q1_overflow=st.sampled_from([None, "reject", "drop-oldest"]),
        idle_peer_seconds=st.sampled_from([60.0, 300.0]),
        heartbeats_ms=st.tuples(
            *[st.sampled_from([0, 0, 1_000, 4_000])] * len(EXTENSION_CONSUMERS)
        ),
    )
    def start_broker(
        self,
        max_deliveries: int,
        lease_ms: int,
        max_in_flight_ms: int,
        max_queue_length: int,
        overflow: str,
        q1_max_deliveries: int | None,
        q1_max_length: int | None,
        q1_overflow: str | None,
        idle_peer_seconds: float,
        heartbeats_ms: tuple[int, ...],
    ) -> None:
        q1 = QueueSettings(
            max_deliveries=q1_max_deliveries, max_length=q1_max_length, overflow=q1_overflow
        )
        self.h = CoreHarness(
            max_deliveries=max_deliveries,
            lease_ms=lease_ms,
            max_in_flight_ms=max_in_flight_ms,
            max_queue_length=max_queue_length,
            overflow=overflow,
            idle_peer_seconds=idle_peer_seconds,
            queues={"q1": q1},
        )
        self.lease_ms, self.max_in_flight_ms = lease_ms, max_in_flight_ms
        self.idle_ns = int(idle_peer_seconds * NS_PER_SECOND)
        self.max_deliveries = {"q0": max_deliveries, "q1": _pick(q1_max_deliveries, max_deliveries)}
        self.max_length = {"q0": max_queue_length, "q1": _pick(q1_max_length, max_queue_length)}
        self.overflow = {"q0": overflow, "q1": q1_overflow or overflow}
        self.heartbeat_ms = dict(zip(EXTENSION_CONSUMERS, heartbeats_ms, strict=True))

    # ------------------------------------------------------------------ driving the core

    @property
    def now(self) -> int:
        return self.h.clock.monotonic_ns()

    def greet(self, peer: bytes, messages: list[p.Message]) -> list[p.Message]:
        """A consumer the core does not know says HELLO first, so it is told of refusals."""
        if peer == STOCK or peer in self.known:
            return messages
        return [self.hello(peer), *messages]

    def hello(self, peer: bytes) -> p.Hello:
        """The peer's HELLO, with the heartbeats it asks for; it (re)sets its terms."""
        heartbeat_ms = self.heartbeat_ms[peer]
        model = self.known.get(peer)
        if model is None:
            model = self.known[peer] = PeerModel(0, self.now)
        model.heartbeat_ns, model.last_seen, model.hello = heartbeat_ms * NS_PER_MS, self.now, True
        options = {"name": peer.decode(), "heartbeat_ms": heartbeat_ms} if heartbeat_ms else {}
        return p.Hello(options)

    def turn(
        self, *inputs: tuple[bytes, list[p.Message]]
    ) -> tuple[dict[bytes, list], list[tuple[bytes, p.Error]]]:
        """One core turn; every dispatch in the output (to whichever peer) is checked and
        recorded. Returns the output and the ERRORs in it."""
        for peer, _ in inputs:
            if peer in self.departed:
                self.departed.discard(peer)
                if peer not in self.known:
                    self.known[peer] = PeerModel(0, self.now, hello=False)
        out = self.h.turn(*inputs)
        self.turns += 1
        self.settled = True
        self.returned_late, self.timer_returns = self.timer_returns, set()
        for peer, _ in inputs:
            if peer in self.known:
                self.known[peer].last_seen = self.now
        self.notice_idle_peers_forgotten()
        refusals = []
        for peer, messages in out.items():
            for message in messages:
                if isinstance(message, p.Dispatch):
                    self.on_dispatch(peer, message)
                elif isinstance(message, p.Error):
                    refusals.append((peer, message))
                elif isinstance(message, p.Heartbeat):
                    assert peer in self.known, f"heartbeat to a forgotten peer {peer!r}"
                    assert self.known[peer].heartbeat_ns, "heartbeat to a peer without"
        return out, refusals

    def quiet_turn(self, *inputs: tuple[bytes, list[p.Message]]) -> dict[bytes, list]:
        """A turn in which the core must refuse nothing."""
        out, refusals = self.turn(*inputs)
        assert refusals == [], f"unexpected refusals: {refusals}"
        return out

    def settle(self) -> None:
        """One empty turn if the core has work pending from outside a turn (a vanished peer)
        or left over from its timers (a returned message past its TTL)."""
        if not self.settled or self.returned_late:
            self.quiet_turn()

    def notice_idle_peers_forgotten(self) -> None:
        """An extension peer without heartbeats, windows or messages may be forgotten once it
        has been quiet for idle_peer_seconds (the exact turn depends on timer slack)."""
        for peer in [c for c in self.known if c not in self.h.core.peers]:
            model = self.known[peer]
            assert not model.heartbeat_ns, f"{peer!r} forgotten before its expiry"
            assert not self.windows_of(peer), f"{peer!r} forgotten with open windows"
            assert self.now - model.last_seen >= self.idle_ns, f"{peer!r} forgotten too soon"
            self.forget(peer)

    def on_dispatch(self, peer: bytes, dispatch: p.Dispatch) -> None:
        msg = self.msgs.get(dispatch.content)
        assert msg is not None, f"dispatched content never sent: {dispatch.content!r}"
        assert not self.draining, "dispatch while draining"
        assert dispatch.queue == msg.queue
        assert msg.content not in self.acked, f"acked message dispatched again: {msg}"
        assert msg.content not in self.buried, f"buried message dispatched: {msg}"
        assert not msg.delayed_until, f"delayed message dispatched: {msg}"
        assert msg.content not in self.purged, f"purged message dispatched: {msg}"
        stock = peer == STOCK
        assert dispatch.headers == (None if stock else msg.headers)
        core_peer = self.h.core.peers.get(peer)
        assert core_peer is None or not core_peer.stalled, f"dispatch to stalled {peer!r}"
        holders = [c for c in CONSUMERS if dispatch.message_id in self.held[c]]
        assert holders == [], f"{msg} dispatched to {peer!r} while {holders} hold it"
        if msg.id is None:
            assert dispatch.message_id not in self.by_id, "two messages share an ID"
            msg.id = dispatch.message_id
            self.by_id[msg.id] = msg
        assert dispatch.message_id == msg.id, "a message changed its ID"
        if stock:
            assert dispatch.delivery_count is None
        else:
            assert dispatch.delivery_count is not None
            assert dispatch.delivery_count >= self.last_delivery.get(msg.id, 0)
            assert dispatch.delivery_count == msg.deliveries
            self.last_delivery[msg.id] = dispatch.delivery_count
        now = self.now
        assert not msg.expires_at or now < msg.expires_at, f"expired message dispatched: {msg}"
        left = math.ceil((msg.expires_at - now) / NS_PER_SECOND) if msg.expires_at else 0
        assert dispatch.ttl == (max(1, left) if msg.expires_at else 0)
        assert stock or (peer in self.known and not self.known[peer].closing)
        self.held[peer][msg.id] = msg
        assert self.holding(peer, msg.queue) <= self.limits.get((peer, msg.queue), 0), (
            "window overfilled"
        )
        lease_ns = self.lease_ns(peer, msg.queue)
        msg.lease_until = now + lease_ns if lease_ns else 0
        self.expected["dispatched"] += 1

    def lease_ns(self, peer: bytes, queue: str) -> int:
        lease_ms = self.window_lease_ms.get((peer, queue))
        if lease_ms is None:
            lease_ms = 0 if self.heartbeats(peer) else self.lease_ms
        cap = self.max_in_flight_ms
        if cap and (not lease_ms or lease_ms > cap):
            lease_ms = cap
        return lease_ms * NS_PER_MS

    def heartbeats(self, peer: bytes) -> bool:
        return peer in self.known and bool(self.known[peer].heartbeat_ns)

    def closing(self, peer: bytes) -> bool:
        return peer in self.known and self.known[peer].closing

    def holding(self, peer: bytes, queue: str) -> int:
        return sum(1 for m in self.held[peer].values() if m.queue == queue)

    def windows_of(self, peer: bytes) -> set[str]:
        return {q for (c, q), limit in self.limits.items() if c == peer and limit} | {
            m.queue for m in self.held[peer].values()
        }

    def tidy(self, peer: bytes, queue: str) -> None:
        """A window with limit 0 that holds nothing is closed (and forgets its lease)."""
        key = (peer, queue)
        if not self.limits.get(key) and not self.holding(peer, queue):
            self.limits.pop(key, None)
            self.window_lease_ms.pop(key, None)
            self.overfull_ok.discard(key)

    def set_limit(self, peer: bytes, queue: str, limit: int, lease_ms: int | None = None) -> None:
        key = (peer, queue)
        if limit == 0 and queue not in self.windows_of(peer):
            return  # no window to stop, and none is opened to be told so
        self.limits[key] = limit
        if lease_ms is not None:
            self.window_lease_ms[key] = lease_ms
        if self.holding(peer, queue) > limit:
            self.overfull_ok.add(key)
        self.tidy(peer, queue)

    def take(self, peer: bytes, msg: Msg) -> None:
        """The peer no longer holds the message."""
        assert msg.id is not None
        del self.held[peer][msg.id]
        self.tidy(peer, msg.queue)

    def give_back(self, msg: Msg) -> None:
        """A message returns to its queue: one more delivery; past max-deliveries, buried."""
        msg.deliveries += 1
        limit = self.max_deliveries[msg.queue]
        if limit and msg.deliveries > limit:
            self.buried[msg.content] = ("max-deliveries", msg.deliveries - 1)
            self.expected["max_deliveries"] += 1

    def forget(self, peer: bytes, goodbye: bool = False) -> None:
        """KBAI, a vanished, dead or idle peer: what it held goes back, one delivery later.
        A known peer that left without a goodbye is remembered as an extension peer."""
        if goodbye:
            self.departed.discard(peer)
        elif peer in self.known:
            self.departed.add(peer)
        for msg in self.held[peer].values():
            self.give_back(msg)
            self.expected["returned"] += 1
        self.held[peer].clear()
        for key in [k for k in self.limits if k[0] == peer]:
            del self.limits[key]
        for key in [k for k in self.window_lease_ms if k[0] == peer]:
            del self.window_lease_ms[key]
        self.overfull_ok -= {k for k in self.overfull_ok if k[0] == peer}
        self.known.pop(peer, None)

    def pick_held(self, data: st.DataObject) -> tuple[bytes, Msg]:
        held = sorted(
            ((peer, msg) for peer in CONSUMERS for msg in self.held[peer].values()),
            key=lambda pair: pair[1].content,
        )
        return data.draw(st.sampled_from(held), label="held")

    def has_held(self) -> bool:
        return any(self.held.values())

    # ------------------------------------------------------------------ rules

    @rule(
        sender=st.sampled_from(SENDERS),
        queue=queues,
        ttl_list=st.lists(ttls, min_size=1, max_size=5),
        with_headers=st.booleans(),
    )
    def send_messages(
        self, sender: bytes, queue: str, ttl_list: list[int], with_headers: bool
    ) -> None:
        core_queue = self.h.core.queues.get(queue)
        ready = core_queue.ready_count if core_queue is not None else 0
        max_length, overflow = self.max_length[queue], self.overflow[queue]
        sends, refused = [], 0
        for ttl in ttl_list:
            content = b"m%d" % self.sent
            headers = b'{"n": %d}' % self.sent if with_headers else None
            self.sent += 1
            sends.append(p.Send(queue, content, ttl, headers=headers))
            if self.draining:
                refused += 1
                continue
            if max_length and ready >= max_length:
                self.expected["overflowed"] += 1
                if overflow == "reject":
                    refused += 1
                    continue
                self.expected["dropped"] += 1
            else:
                ready += 1
            expires_at = self.now + ttl * NS_PER_SECOND if ttl else 0
            self.msgs[content] = Msg(content, queue, expires_at, headers=headers)
            self.expected["received"] += 1
        self.expected["errors"] += refused
        code = p.ErrorCode.SHUTTING_DOWN if self.draining else p.ErrorCode.LIMIT_REACHED
        _, refusals = self.turn((sender, sends))
        told = refused if sender in self.known else 0  # only extension peers get ERRORs
        # Refusals in a row leave as one ERROR with a count.
        assert all((e.code, e.queue) == (code, queue) for _, e in refusals)
        assert sum(e.count or 1 for _, e in refusals) == told
        assert len(refusals) <= 1

    @rule(peer=consumers, queue=queues, count=counts, lease_ms=window_leases)
    def consume(self, peer: bytes, queue: str, count: int, lease_ms: int | None) -> None:
        lease_ms = None if peer == STOCK else lease_ms  # an extension packet
        messages = self.greet(peer, [p.Consume(queue, count, lease_ms)])
        self.set_limit(peer, queue, 0 if self.closing(peer) else count, lease_ms)
        self.quiet_turn((peer, messages))

    @precondition(lambda self: any(limit for (c, _), limit in self.limits.items() if c != STOCK))
    @rule(data=st.data(), lease_ms=st.sampled_from([0, 1_000, 2_000, 20_000]))
    def consumer_changes_its_lease(self, data: st.DataObject, lease_ms: int) -> None:
        """A 002 that keeps the window's size but gives later dispatches a new lease."""
        windows = sorted((k, limit) for k, limit in self.limits.items() if limit and k[0] != STOCK)
        (peer, queue), limit = data.draw(st.sampled_from(windows), label="window")
        self.set_limit(peer, queue, limit, lease_ms)
        self.quiet_turn((peer, [p.Consume(queue, limit, lease_ms)]))

    @precondition(has_held)
    @rule(data=st.data())
    def ack_a_held_message(self, data: st.DataObject) -> None:
        peer, msg = self.pick_held(data)
        self.take(peer, msg)
        self.acked.add(msg.content)
        self.expected["acked"] += 1
        self.quiet_turn((peer, [p.Ack(msg.queue, msg.id)]))

    @precondition(has_held)
    @rule(data=st.data(), ttl=ttls, delay_ms=st.sampled_from([None, None, 0, 1_500, 10_000]))
    def requeue_a_held_message(self, data: st.DataObject, ttl: int, delay_ms: int | None) -> None:
        peer, msg = self.pick_held(data)
        delay_ms = None if peer == STOCK else delay_ms  # an extension packet
        self.take(peer, msg)
        msg.expires_at = self.now + ttl * NS_PER_SECOND if ttl else 0
        self.give_back(msg)
        if delay_ms and msg.content not in self.buried:
            msg.delayed_until = self.now + delay_ms * NS_PER_MS
        self.expected["requeued"] += 1
        self.quiet_turn((peer, [p.Requeue(msg.queue, msg.id, ttl, delay_ms)]))

    @precondition(has_held)
    @rule(data=st.data(), reason=st.sampled_from([None, "cannot parse", "expired"]))
    def dead_letter_a_held_message(self, data: st.DataObject, reason: str | None) -> None:
        peer, msg = self.pick_held(data)
        self.take(peer, msg)
        self.buried[msg.content] = (reason or "rejected", msg.deliveries)
        self.quiet_turn((peer, [p.DeadLetter(msg.queue, msg.id, reason)]))

    @rule(
        peer=consumers,
        queue=queues,
        data=st.data(),
        verb=st.sampled_from([p.Ack, p.Requeue, p.DeadLetter]),
    )
    def refused_for_a_message_not_held(
        self, peer: bytes, queue: str, data: st.DataObject, verb: type
    ) -> None:
        self.settle()
        known = sorted(self.by_id.values(), key=lambda m: m.content)
        message_id = data.draw(
            st.sampled_from([UNKNOWN_ID, *(m.id for m in known)]), label="message_id"
        )
        mine = self.held[peer].get(message_id)
        if mine is not None and mine.queue == queue:
            queue = next(q for q in QUEUES if q != queue)  # held, but on the other queue
        message = p.Requeue(queue, message_id, 5) if verb is p.Requeue else verb(queue, message_id)
        core_peer = self.h.core.peers.get(peer)
        # A stalled peer that speaks again, even with a refused settle, gets work again.
        stalled = core_peer is not None and core_peer.stalled
        before = self.snapshot()
        self.expected["errors"] += 1
        # A peer given up on settles late without a new HELLO: it gets ERRORs all the same.
        messages = [message] if peer in self.departed else self.greet(peer, [message])
        out, refusals = self.turn((peer, messages))
        told = [] if peer == STOCK else [(peer, p.ErrorCode.UNKNOWN_MESSAGE, message_id, queue)]
        assert [(who, e.code, e.message_id, e.queue) for who, e in refusals] == told
        if not stalled:
            assert not any(dispatches(replies) for replies in out.values())
            assert self.snapshot() == before, "a refused message changed the broker's state"

    @rule(peer=extension_consumers, hello=st.booleans())
    def consumer_heartbeats_or_says_hello_again(self, peer: bytes, hello: bool) -> None:
        """Traffic that keeps a peer alive. A HEARTBEAT from a peer that never said HELLO is
        answered with DISCONNECT; a HELLO (the reference client's answer to it) restarts the
        peer's terms."""
        if hello:
            out = self.quiet_turn((peer, [self.hello(peer)]))
            assert [type(m) for m in out[peer] if not isinstance(m, p.Dispatch)] == [p.Hello]
            return
        if peer not in self.known:  # opts in to extensions without a HELLO
            self.known[peer] = PeerModel(0, self.now, hello=False)
        out = self.quiet_turn((peer, [p.Heartbeat()]))
        told_to_go = [m for m in out.get(peer, []) if isinstance(m, p.Disconnect)]
        assert len(told_to_go) == (0 if self.known[peer].hello else 1)

    @rule(peer=extension_consumers)
    def consumer_disconnects(self, peer: bytes) -> None:
        messages = self.greet(peer, [p.Disconnect("done")])
        self.known[peer].closing = True
        for queue in self.windows_of(peer):
            self.set_limit(peer, queue, 0)
        out = self.quiet_turn((peer, messages))
        assert any(isinstance(m, p.Kbai) for m in out.get(peer, []))

    @rule(peer=consumers, vanishes=st.booleans())
    def consumer_says_kbai_or_vanishes(self, peer: bytes, vanishes: bool) -> None:
        """KBAI in a turn; or, as the shell reports a failed send, peer_gone() between turns
        (the next turn dispatches what came back). KBAI is an extension: the stock
        consumer only vanishes."""
        vanishes = vanishes or peer == STOCK
        self.forget(peer, goodbye=not vanishes)
        if vanishes:
            self.h.core.begin_turn()
            self.h.core.peer_gone(peer)
            self.settled = False
        else:
            self.quiet_turn((peer, [p.Kbai()]))

    @rule(peer=extension_consumers, queue=queues, count=counts)
    def consumer_says_kbai_and_consumes_again_in_one_frame(
        self, peer: bytes, queue: str, count: int
    ) -> None:
        self.forget(peer, goodbye=True)
        messages = [p.Kbai(), *self.greet(peer, [p.Consume(queue, count)])]
        self.set_limit(peer, queue, count)
        self.quiet_turn((peer, messages))

    @precondition(has_held)
    @rule()
    def every_consumer_acks_everything_in_one_turn(self) -> None:
        inputs = []
        for peer in CONSUMERS:
            msgs = sorted(self.held[peer].values(), key=lambda m: m.content)
            if not msgs:
                continue
            for msg in msgs:
                self.take(peer, msg)
                self.acked.add(msg.content)
            self.expected["acked"] += len(msgs)
            inputs.append((peer, [p.Ack(m.queue, m.id) for m in msgs]))
        self.quiet_turn(*inputs)

    @rule(seconds=st.integers(0, 40) | st.sampled_from([0.25, 0.5, 2.75]))
    def time_passes(self, seconds: float) -> None:
        """TTLs run out, leases run out, delays end, heartbeating peers that kept quiet die."""
        self.h.advance(seconds)
        now = self.now
        events = [
            (model.last_seen + model.expiry_ns, 0, peer, None)
            for peer, model in self.known.items()
            if model.heartbeat_ns and model.last_seen + model.expiry_ns <= now
        ]
        dying = {peer for _, _, peer, _ in events}
        for peer in CONSUMERS:
            for msg in self.held[peer].values():
                if msg.lease_until and msg.lease_until <= now:
                    events.append((msg.lease_until, 1, peer, msg))
                    # A lease and its holder's death in one turn: the core may act on either
                    # first (its peer timer can be armed earlier than the deadline).
                    self.expected["lease_expired_max"] += 1
                    self.expected["lease_expired_min"] += peer not in dying
        for msg in self.msgs.values():
            if msg.delayed_until and msg.delayed_until <= now:
                msg.delayed_until = 0
                self.timer_returns.add(msg.content)
        for _, _, peer, msg in sorted(events, key=lambda e: (e[0], e[1])):
            if msg is None:
                self.expected["peers_expired"] += 1
                self.timer_returns |= {m.content for m in self.held[peer].values()}
                self.forget(peer)
            elif msg.id in self.held[peer]:
                self.timer_returns.add(msg.content)
                self.take(peer, msg)
                self.give_back(msg)
                self.expected["returned"] += 1
        self.quiet_turn()

    @rule(queue=queues, data=st.data(), purge=st.booleans())
    def operator_replays_or_purges_dead_letters(
        self, queue: str, data: st.DataObject, purge: bool
    ) -> None:
        """ADMIN dlq-replay (all, or some IDs: back at the tail, same ID, no TTL, delivery
        count as the entry says + 1) or dlq-purge."""
        core_queue = self.h.core.queues.get(queue)
        entries = list(core_queue.dead) if core_queue is not None else []
        options: dict = {"command": "dlq-purge" if purge else "dlq-replay", "queue": queue}
        chosen = entries
        if not purge and entries:
            ids = [e.id for e in sorted(entries, key=lambda e: e.content)]  # IDs are random
            wanted = data.draw(st.none() | st.lists(st.sampled_from(ids), unique=True), "ids")
            if wanted is not None:
                options["ids"] = [i.decode() for i in wanted]  # JSON carries them as text
                chosen = [e for e in entries if e.id in wanted]
        for entry in chosen:
            msg = self.msgs[entry.content]
            if self.buried.pop(msg.content, None) is None:  # expired or overflow
                self.expected[f"undead {entry.reason}"] += 1
            self.expected["undead"] += 1
            if purge:
                self.purged.add(msg.content)
                continue
            assert msg.id in (None, entry.id)
            msg.id = entry.id
            self.by_id[msg.id] = msg
            msg.deliveries, msg.expires_at = entry.deliveries + 1, 0
        out = self.quiet_turn((ADMIN, [p.Admin(options)]))
        [reply] = [m for m in out[ADMIN] if isinstance(m, p.AdminReply)]
        if core_queue is None:
            self.expected["errors"] += 1
            assert "error" in reply.options
        else:
            verb = "purged" if purge else "replayed"
            assert reply.options == {"queue": queue, verb: len(chosen)}

    @precondition(lambda self: self.turns >= 35 and not self.draining)
    @rule()
    def broker_starts_draining(self) -> None:
        self.settle()
        self.draining = True
        self.h.core.start_drain()
        out = self.quiet_turn()
        for peer in CONSUMERS:
            told = [m for m in out.get(peer, []) if isinstance(m, p.Disconnect)]
            assert len(told) == (peer in self.known)

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
            {k: v for k, v in core.counters.as_dict().items() if k != "errors"},
        )

    @invariant()
    def every_message_is_in_exactly_one_place(self) -> None:
        core = self.h.core
        ready: list[bytes] = []
        in_flight: list[bytes] = []
        dead: list[bytes] = []
        dead_reasons = Counter[str]()
        delayed = {c for c, m in self.msgs.items() if m.delayed_until}
        for name, queue in core.queues.items():
            in_queue = sum(1 for c in delayed if self.msgs[c].queue == name)
            assert queue.delayed == in_queue, f"{name}: delayed count {queue.delayed}"
            states = Counter(r.state for r in queue.ready)
            assert states[IN_FLIGHT] == 0, f"{name}: an in-flight record sits in ready"
            assert states[GONE] == queue.stale, f"{name}: stale != tombstones in ready"
            ready_records = [r for r in queue.ready if r.state == READY]
            assert queue.ready_count == len(ready_records)
            held = [r for w in queue.windows for r in w.held.values()]
            assert queue.in_flight == len(held), f"{name}: in_flight != records held"
            for record in held:
                assert record.state == IN_FLIGHT, f"{name}: held record not IN_FLIGHT"
                lease_until = self.msgs[record.content].lease_until
                assert not lease_until or record.lease_until == lease_until
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
                if entry.content in self.buried:
                    assert (entry.reason, entry.deliveries) == self.buried[entry.content]
                    continue
                dead_reasons[entry.reason] += 1
                assert entry.reason in ("expired", "overflow"), entry
                assert entry.deliveries == msg.deliveries - 1
                if entry.reason == "expired":
                    assert 0 < msg.expires_at <= core.now, f"buried before its time: {msg}"
        places = {"ready": ready, "in flight": in_flight, "dead": dead}
        for place, contents in places.items():
            twice = [c for c, n in Counter(contents).items() if n > 1]
            assert twice == [], f"duplicated in {place}: {twice}"
        places_sets = {place: set(contents) for place, contents in places.items()}
        places_sets["acked"] = self.acked
        places_sets["delayed (model)"] = delayed
        places_sets["purged"] = self.purged
        seen: set[bytes] = set()
        for place, contents in places_sets.items():
            assert not seen & contents, f"in two places, one {place}: {sorted(seen & contents)}"
            seen |= contents
        assert seen == set(self.msgs), f"lost: {sorted(set(self.msgs) - seen)}"
        assert set(self.buried) <= places_sets["dead"]
        # Replayed or purged dead letters left the store but not the counts.
        expected = self.expected
        assert dead_reasons["overflow"] + expected["undead overflow"] == expected["dropped"]
        assert core.counters.expired == dead_reasons["expired"] + expected["undead expired"]

    @invariant()
    def windows_and_peers_match_the_model(self) -> None:
        core = self.h.core
        for name, queue in core.queues.items():
            for window in queue.windows:
                peer = window.peer
                assert core.peers.get(peer.id) is peer, "a window of a forgotten peer"  # type: ignore[attr-defined]
                assert peer.windows.get(name) is window  # type: ignore[attr-defined]
                assert window.queue is queue
        assert {c for c in EXTENSION_CONSUMERS if c in core.peers} == set(self.known)
        for peer_id in CONSUMERS:
            peer = core.peers.get(peer_id)
            windows = peer.windows if peer is not None else {}
            expected = self.windows_of(peer_id)
            assert set(windows) == expected, f"{peer_id!r}: windows {set(windows)} != {expected}"
            held = {mid: w.queue.name for w in windows.values() for mid in w.held}
            assert held == {mid: m.queue for mid, m in self.held[peer_id].items()}, (
                f"{peer_id!r} holds other dispatches than it was sent"
            )
            for name, window in windows.items():
                key = (peer_id, name)
                assert window in core.queues[name].windows
                assert window.limit == self.limits.get(key, 0)
                assert window.lease_ms == self.window_lease_ms.get(key)
                if len(window.held) <= window.limit:
                    self.overfull_ok.discard(key)
                else:
                    assert key in self.overfull_ok, f"{key} holds more than its limit"
            if peer is not None:
                assert peer.closing == self.closing(peer_id)
                assert peer.extensions == (peer_id != STOCK)

    @invariant()
    def settled_queues_hold_no_due_or_dispatchable_work(self) -> None:
        if not self.settled:
            return
        core = self.h.core
        for name, queue in core.queues.items():
            ready = [r for r in queue.ready if r.state == READY]
            for record in ready:
                due = record.expires_at and record.expires_at <= core.now
                assert not due or record.content in self.returned_late, (
                    f"{name}: {record.content!r} is due but still ready"
                )
            if ready and not self.draining:
                # A stalled peer (a lease ran out while it said nothing) gets no new work.
                free = [w for w in queue.windows if len(w.held) < w.limit and not w.peer.stalled]
                assert free == [], f"{name}: ready messages while a window has room"

    @invariant()
    def counters_agree_with_the_model(self) -> None:
        counters = self.h.core.counters
        expected = self.expected
        dead = sum(len(q.dead) for q in self.h.core.queues.values())
        for name in (
            "received",
            "dispatched",
            "acked",
            "requeued",
            "peers_expired",
            "max_deliveries",
            "overflowed",
            "errors",
        ):
            assert getattr(counters, name) == expected[name], name
        assert counters.dead_lettered == dead + expected["undead"]
        assert counters.redelivered + counters.lease_expired == expected["returned"]
        low, high = expected["lease_expired_min"], expected["lease_expired_max"]
        assert low <= counters.lease_expired <= high


def _pick(override: int | None, default: int) -> int:
    return default if override is None else override


def test_no_message_is_lost_or_duplicated() -> None:
    run_state_machine_as_test(
        CoreMachine,
        settings=settings(max_examples=EXAMPLES, stateful_step_count=50, deadline=None),
    )


# ------------------------------------------------------------------ found by the machine


def test_a_peer_declared_dead_is_not_sent_the_heartbeat_it_was_owed() -> None:
    """Bug found by the machine (fixed in d4a4574): a heartbeating peer declared dead in a
    turn's timers was still sent, in that same turn, the HEARTBEAT it was owed, after the
    broker had forgotten it (and the heartbeat timer was re-armed for the dead peer)."""
    core = CoreHarness()
    core.send(b"c0", p.Hello({"heartbeat_ms": 1000}))
    core.advance(3)  # silent for interval x liveness (3 x 1 s); a heartbeat is owed too
    out = core.turn()
    assert b"c0" not in core.core.peers
    assert out == {}


def test_a_replayed_dead_letter_keeps_its_headers() -> None:
    """Bug found by the machine (fixed in 6965d1a): dlq-replay rebuilt each record from its
    dead-letter entry, which had no headers field, so a replayed message reached consumers
    without the HEADERS packet its producer sent (a worker pool's per-message timeout, say)."""
    core = CoreHarness()
    core.send(PRODUCER, p.Send("jobs", b"a", 0, headers=b'{"timeout": 5}'))
    [first] = dispatches(core.send(b"c0", p.Hello({}), p.Consume("jobs", 1)))
    assert first.headers == b'{"timeout": 5}'
    core.send(b"c0", p.DeadLetter("jobs", first.message_id))
    out = core.turn((ADMIN, p.Admin({"command": "dlq-replay", "queue": "jobs"})))
    [again] = dispatches(out[b"c0"])
    assert (again.message_id, again.delivery_count) == (first.message_id, 2)
    assert again.headers == b'{"timeout": 5}'  # was None
