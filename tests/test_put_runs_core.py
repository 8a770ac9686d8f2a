"""Put runs end to end (docs/durability.md "Put runs"): random turns against a durable core
whose journal goes into a real store, across restarts after a kill -9.

The steps: sends to two queues (mostly plain, some with a TTL, a message key or headers,
some turns to both queues, interleaved), consumers taking windows and acking, returning
(to the tail, unstarted, with a delay), dead-lettering and cancelling what they hold or
leaving, batch leases taken, committed and released, purges, time passing (consumer leases,
delays and batch leases running out) and restarts. The test keeps an exact expectation of
every live message (ready, held by whom, leased by which lease, delayed), its delivery count,
its headers and key, and of the dead letters; it checks it against the core after every turn
and against the recovered core after every restart, where it can also drain the queues with
a big window (the contents and delivery counts a consumer sees), then restart again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import phpmq.protocol as p
from harness import OPS, StoredCore
from phpmq.broker.clock import FakeClock
from phpmq.broker.model import READY
from phpmq.protocol import admin_commands as cmd

PRODUCER, DRAIN = b"producer", b"drain"
CONSUMERS = (b"c1", b"c2")
QUEUES = ("q1", "q2")
LEASES = ("L1", "L2")
#: A TTL no example reaches: such a message is a row (put runs keep those that never expire).
TTL = 10_000_000
#: Time moves only in waits, by multiples of WAIT; the deadlines below (a consumer's lease,
#: a requeue's delay, a batch lease's default timeout) are never multiples of it, so the
#: model knows exactly which waits pass them.
WAIT, LONG_WAIT = 70, 3570
CONSUMER_LEASE, DELAY, BATCH_LEASE = 60, 30, 3600


@dataclass
class Message:
    queue: str
    headers: bytes
    key: bytes
    deliveries: int = 1
    #: "ready", "held" (by `holder`, a peer), "leased" (in lease `holder`), "delayed".
    state: str = "ready"
    holder: object = None
    #: When a held message's consumer lease, or a delay, runs out.
    due: float = 0.0
    message_id: bytes = b""


@dataclass
class Model:
    live: dict[bytes, Message] = field(default_factory=dict)
    dead: dict[str, Counter] = field(default_factory=lambda: {q: Counter() for q in QUEUES})
    #: Acked, committed or purged: never seen again.
    gone: set[bytes] = field(default_factory=set)
    #: (queue, lease name) -> when its timeout runs out.
    leases: dict[tuple[str, str], float] = field(default_factory=dict)
    #: (peer, queue) -> the window's limit.
    windows: dict[tuple[bytes, str], int] = field(default_factory=dict)
    hello: set[bytes] = field(default_factory=set)
    now: float = 0.0
    sent: int = 0

    def of(self, state: str, queue: str, holder: object = None) -> list[bytes]:
        return sorted(
            content
            for content, m in self.live.items()
            if m.state == state and m.queue == queue and (holder is None or m.holder == holder)
        )

    def back(self, content: bytes, counted: bool = True) -> None:
        m = self.live[content]
        m.state, m.holder, m.due = "ready", None, 0.0
        m.deliveries += counted

    def retire(self, content: bytes) -> None:
        del self.live[content]
        self.gone.add(content)

    def restarted(self) -> None:
        """What a restart makes of the state: held messages ready with one more delivery,
        those delayed by a requeue ready with the count they have (journal.py: the delay is
        not kept), leases kept with the default timeout from now, no peers."""
        for content, m in self.live.items():
            if m.state in ("held", "delayed"):
                self.back(content, counted=m.state == "held")
        for name in self.leases:
            self.leases[name] = self.now + BATCH_LEASE
        self.windows.clear()
        self.hello.clear()


class World:
    def __init__(self, path: Path, data: st.DataObject) -> None:
        self.clock = FakeClock()
        self.stored = StoredCore(path, clock=self.clock, max_deliveries=0, idle_peer_seconds=10**9)
        self.model = Model()
        self.data = data
        self.log: list[str] = []

    # ----------------------------------------------------------------- turns

    def turn(self, *inputs: tuple[bytes, list]) -> dict[bytes, list]:
        out = self.stored.core.turn(*inputs)
        self.stored.core.core.release_confirms()
        self.stored.commit()
        self.observe(out)
        return out

    def admin(self, command: str, **options: object) -> dict:
        out = self.stored.core.turn((OPS, [p.Admin({"command": command, **options})]))
        received = list(out.get(OPS, []))
        for to, frame in self.stored.core.core.release_confirms():
            if to == OPS:
                received.extend(p.decode_frame(frame)[0])
        self.stored.commit()
        self.observe(out)
        [reply] = received
        assert isinstance(reply, p.AdminReply), reply
        return reply.options

    def observe(self, out: dict[bytes, list]) -> None:
        """The dispatches of a turn, to the consumers: each must be of a ready message, with
        its delivery count."""
        model = self.model
        for peer in (*CONSUMERS, DRAIN):
            for message in out.get(peer, []):
                assert not isinstance(message, p.Error), (peer, message)
                if not isinstance(message, p.Dispatch):
                    continue
                assert message.content not in model.gone, f"{message.content!r} came back"
                m = model.live[message.content]
                assert (m.state, m.queue) == ("ready", message.queue), (message, m)
                assert message.delivery_count == m.deliveries, (message, m)
                m.state, m.holder, m.message_id = "held", peer, message.message_id
                m.due = model.now + CONSUMER_LEASE
                if peer != DRAIN:
                    held = len(model.of("held", m.queue, peer))
                    assert held <= model.windows.get((peer, m.queue), 0), (peer, m.queue)

    def hello(self, peer: bytes) -> list:
        if peer in self.model.hello:
            return []
        self.model.hello.add(peer)
        return [p.Hello({})]

    # ----------------------------------------------------------------- steps

    def step(self) -> None:
        kind = self.data.draw(
            st.sampled_from(
                ["send"] * 5
                + ["consume"] * 2
                + ["settle"] * 5
                + ["cancel", "leave", "lease", "lease", "commit", "release", "purge"]
                + ["wait", "restart", "restart"]
            ),
            label="step",
        )
        getattr(self, f"step_{kind}")()

    def draw_sends(self) -> list[p.Send]:
        batches = self.data.draw(
            st.lists(
                st.tuples(
                    st.sampled_from(QUEUES),
                    st.integers(1, 80),
                    st.sampled_from(["plain"] * 4 + ["ttl", "key", "headers"]),
                ),
                min_size=1,
                max_size=3,
            ),
            label="sends",
        )
        interleave = len(batches) > 1 and self.data.draw(st.booleans(), label="interleave")
        made: list[list[p.Send]] = []
        for queue, count, kind in batches:
            sends = []
            for n in range(count):
                self.model.sent += 1
                content = b"%s:%d" % (queue.encode(), self.model.sent)
                ttl = TTL if kind == "ttl" and n % 3 != 1 else 0
                headers = b'{"n":%d}' % self.model.sent if kind == "headers" else None
                key = b"k%d" % self.model.sent if kind == "key" else None
                sends.append(p.Send(queue, content, ttl, headers=headers, message_key=key))
                self.model.live[content] = Message(queue, headers or b"", key or b"")
            made.append(sends)
        if not interleave:
            return [send for sends in made for send in sends]
        mixed: list[p.Send] = []
        while any(made):
            for sends in made:
                if sends:
                    mixed.append(sends.pop(0))
        return mixed

    def step_send(self) -> None:
        sends = self.draw_sends()
        self.log.append(f"send {[(s.queue, s.content, s.ttl) for s in sends][:3]}... x{len(sends)}")
        self.turn((PRODUCER, sends))

    def step_consume(self) -> None:
        peer = self.data.draw(st.sampled_from(CONSUMERS), label="consumer")
        queue = self.data.draw(st.sampled_from(QUEUES), label="queue")
        window = self.data.draw(st.sampled_from([0, 1, 5, 40, 100, 1000]), label="window")
        self.log.append(f"consume {peer!r} {queue} {window}")
        self.model.windows[(peer, queue)] = window
        self.turn((peer, [*self.hello(peer), p.Consume(queue, window)]))

    def step_settle(self) -> None:
        model = self.model
        peer = self.data.draw(st.sampled_from(CONSUMERS), label="consumer")
        held = sorted(c for c, m in model.live.items() if m.state == "held" and m.holder == peer)
        if not held:
            return
        chosen = self.data.draw(
            st.lists(st.sampled_from(held), unique=True, min_size=1, max_size=len(held)),
            label="settled",
        )
        how = self.data.draw(
            st.lists(
                st.sampled_from(["ack"] * 4 + ["requeue", "unstarted", "delay", "dead"]),
                min_size=len(chosen),
                max_size=len(chosen),
            ),
            label="how",
        )
        messages: list[p.Message] = []
        for content, verb in zip(chosen, how, strict=True):
            m = model.live[content]
            if verb == "ack":
                messages.append(p.Ack(m.queue, m.message_id))
                model.retire(content)
            elif verb == "requeue":
                messages.append(p.Requeue(m.queue, m.message_id, 0))
                model.back(content)
            elif verb == "unstarted":
                messages.append(p.Requeue(m.queue, m.message_id, 0, flags=p.REQUEUE_UNSTARTED))
                model.back(content, counted=False)
            elif verb == "delay":
                messages.append(p.Requeue(m.queue, m.message_id, 0, delay_ms=DELAY * 1000))
                model.back(content)
                m.state, m.due = "delayed", model.now + DELAY
            else:
                messages.append(p.DeadLetter(m.queue, m.message_id, "test"))
                model.dead[m.queue][(content, m.deliveries)] += 1
                del model.live[content]
        self.log.append(f"settle {peer!r} {list(zip(chosen, how, strict=True))}")
        inputs = [(peer, messages)]
        if self.data.draw(st.integers(0, 3), label="with sends") == 0:
            inputs.append((PRODUCER, self.draw_sends()))
        self.turn(*inputs)

    def step_cancel(self) -> None:
        peer = self.data.draw(st.sampled_from(CONSUMERS), label="consumer")
        queue = self.data.draw(st.sampled_from(QUEUES), label="queue")
        self.log.append(f"cancel {peer!r} {queue}")
        for content in self.model.of("held", queue, peer):
            self.model.back(content)
        self.model.windows.pop((peer, queue), None)
        self.turn((peer, [*self.hello(peer), p.Cancel(queue)]))

    def step_leave(self) -> None:
        peer = self.data.draw(st.sampled_from(CONSUMERS), label="consumer")
        if peer not in self.model.hello:
            return
        self.log.append(f"leave {peer!r}")
        for queue in QUEUES:
            for content in self.model.of("held", queue, peer):
                self.model.back(content)
            self.model.windows.pop((peer, queue), None)
        self.model.hello.discard(peer)
        self.turn((peer, [p.Kbai()]))

    def step_lease(self) -> None:
        model = self.model
        queue = self.data.draw(st.sampled_from(QUEUES), label="queue")
        name = self.data.draw(st.sampled_from(LEASES), label="lease")
        most = self.data.draw(st.sampled_from([1, 7, 63, 64, 100, 500]), label="max_messages")
        max_bytes = self.data.draw(st.sampled_from([10**6, 10**6, 2_000]), label="max_bytes")
        self.log.append(f"lease {queue} {name} {most} {max_bytes}")
        if queue not in self.stored.core.core.queues:
            return
        answer = self.admin(
            cmd.LEASE, queue=queue, lease=name, max_messages=most, max_bytes=max_bytes
        )
        if (queue, name) in model.leases:
            model.leases[(queue, name)] = model.now + BATCH_LEASE
            assert not answer["created"]
            return
        lease = self.stored.core.core.queues[queue].leases.get(name)
        taken = [] if lease is None else [record.content for record in lease.records]
        assert answer["messages"] == len(taken)
        assert len(taken) <= most
        for content in taken:
            m = model.live[content]
            assert (m.state, m.queue) == ("ready", queue), (content, m)
            m.state, m.holder = "leased", name
        if taken:
            model.leases[(queue, name)] = model.now + BATCH_LEASE
        else:
            assert not model.of("ready", queue), "a lease of a queue with ready messages took none"

    def step_commit(self) -> None:
        queue = self.data.draw(st.sampled_from(QUEUES), label="queue")
        name = self.data.draw(st.sampled_from(LEASES), label="lease")
        self.log.append(f"commit {queue} {name}")
        taken = self.model.of("leased", queue, name)
        for content in taken:
            self.model.retire(content)
        self.model.leases.pop((queue, name), None)
        answer = self.admin(cmd.LEASE_COMMIT, queue=queue, lease=name)
        assert answer["acked"] == len(taken)

    def step_release(self) -> None:
        queue = self.data.draw(st.sampled_from(QUEUES), label="queue")
        name = self.data.draw(st.sampled_from(LEASES), label="lease")
        self.log.append(f"release {queue} {name}")
        taken = self.model.of("leased", queue, name)
        for content in taken:
            self.model.back(content)
        self.model.leases.pop((queue, name), None)
        answer = self.admin(cmd.LEASE_RELEASE, queue=queue, lease=name)
        assert answer["released"] == len(taken)

    def step_purge(self) -> None:
        queue = self.data.draw(st.sampled_from(QUEUES), label="queue")
        self.log.append(f"purge {queue}")
        if queue not in self.stored.core.core.queues:
            return
        ready = self.model.of("ready", queue)
        for content in ready:
            self.model.retire(content)
        answer = self.admin(cmd.QUEUE_PURGE, queue=queue)
        assert answer["purged"] == len(ready)

    def step_wait(self) -> None:
        model = self.model
        seconds = self.data.draw(st.sampled_from([WAIT, WAIT, LONG_WAIT]), label="wait")
        self.log.append(f"wait {seconds}")
        model.now += seconds
        for content, m in list(model.live.items()):
            if m.state in ("held", "delayed") and m.due < model.now:
                model.back(content, counted=m.state == "held")
        for (queue, name), due in list(model.leases.items()):
            if due < model.now:
                for content in model.of("leased", queue, name):
                    model.back(content)
                del model.leases[(queue, name)]
        self.clock.advance(seconds)
        self.turn()
        self.turn()

    def step_restart(self) -> None:
        self.log.append("restart")
        self.restart()
        if self.data.draw(st.booleans(), label="drain"):
            self.log.append("drain, restart")
            self.drain()
            self.restart()

    # ----------------------------------------------------------------- restarts

    def restart(self) -> None:
        self.stored.reopened()
        self.model.restarted()
        self.check()

    def drain(self) -> None:
        """What a consumer with a big window gets of each queue: its ready messages, with
        their delivery counts (observe checks each)."""
        model = self.model
        present = [q for q in QUEUES if q in self.stored.core.core.queues]
        self.turn((DRAIN, [p.Hello({}), *(p.Consume(q, 100_000) for q in present)]))
        for _ in range(3):
            self.turn()
        for queue in QUEUES:
            assert model.of("ready", queue) == [], f"not drained from {queue}"

    # ----------------------------------------------------------------- the check

    def check(self) -> None:
        """The core's state is the model's: every live message where the model has it,
        with its delivery count, headers and key; the dead letters; nothing gone back."""
        model = self.model
        queues = self.stored.core.core.queues
        seen: dict[bytes, tuple] = {}
        delayed: Counter = Counter()
        dead: dict[str, Counter] = {q: Counter() for q in QUEUES}
        for name, queue in queues.items():
            for record in queue.ready:
                if record.state == READY:
                    assert record.content not in seen, record.content
                    seen[record.content] = (name, "ready", None, record.deliveries)
            for window in queue.windows:
                for record in window.held.values():
                    assert record.content not in seen, record.content
                    seen[record.content] = (name, "held", window.peer.id, record.deliveries)
            for lease_name, lease in queue.leases.items():
                for record in lease.records:
                    assert record.content not in seen, record.content
                    seen[record.content] = (name, "leased", lease_name, record.deliveries)
            delayed[name] = queue.delayed
            for entry in queue.dead:
                dead[name][(entry.content, entry.deliveries)] += 1
            for content, *_ in dead[name]:
                assert content not in model.gone, f"{content!r} came back as a dead letter"
        for content in seen:
            assert content not in model.gone, f"{content!r} came back"
        expected = {
            content: (m.queue, m.state, m.holder, m.deliveries)
            for content, m in model.live.items()
            if m.state != "delayed"
        }
        if seen != expected:
            missing = {c: expected[c] for c in expected.keys() - seen.keys()}
            extra = {c: seen[c] for c in seen.keys() - expected.keys()}
            differ = {
                c: (seen[c], expected[c])
                for c in seen.keys() & expected.keys()
                if seen[c] != expected[c]
            }
            raise AssertionError(
                f"missing {sorted(missing.items())[:10]} ({len(missing)})"
                f" extra {sorted(extra.items())[:10]} ({len(extra)})"
                f" differ {sorted(differ.items())[:10]} ({len(differ)})"
            )
        want_delayed = Counter(m.queue for m in model.live.values() if m.state == "delayed")
        assert +delayed == +want_delayed, (delayed, want_delayed)
        assert {q: +c for q, c in dead.items()} == {q: +c for q, c in model.dead.items()}
        for queue in queues.values():
            for record in queue.ready:
                if record.state == READY:
                    m = model.live[record.content]
                    assert (record.headers, record.message_key) == (m.headers, m.key)
            for lease in queue.leases.values():
                for record in lease.records:
                    m = model.live[record.content]
                    assert (record.headers, record.message_key) == (m.headers, m.key)
        assert set(model.leases) == {
            (name, lease_name) for name, queue in queues.items() for lease_name in queue.leases
        }


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_put_runs_keep_every_message_across_restarts(data: st.DataObject) -> None:
    with TemporaryDirectory(prefix="put-runs-core-") as folder:
        world = World(Path(folder), data)
        try:
            for _ in range(data.draw(st.integers(1, 60), label="steps")):
                world.step()
                world.check()
            world.restart()
        finally:
            world.stored.store.close()
