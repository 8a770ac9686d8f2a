"""Bad data-plane values get a clear error, never a crash (the project's rule: bad input gets a
clear error to its sender and never crashes the broker or harms another client).

A few peers (some after a HELLO with fuzzed options) send a durable core sequences of valid
protocol messages, encoded as a client encodes them, whose integers take the extremes the wire
allows (0, 1, the largest 18-digit number; there are no negative integers on the wire) and
whose strings and bytes are empty, long, non-ASCII or no valid name. Time passes a lot in
between (TTLs, delays, leases, unused queues and heartbeats all come due), every turn's
journal is committed to a real store, and the broker restarts from that store (at the end,
sometimes in the middle). No exception may escape any of it, and the restarted broker answers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import phpmq.protocol as p
from harness import CoreHarness, abandon, dispatches
from phpmq.broker.clock import FakeClock
from phpmq.broker.shell.durable import DurableStore
from phpmq.protocol.cluster import ClusterMap, Shard, encode_map
from phpmq.protocol.constants import MAX_INTEGER_DIGITS, MessageType, PacketType
from phpmq.protocol.writer import message_header, packet

#: Examples of the main property, per mode; a soak (seeded afresh each time):
#: PACKET_FUZZ_EXAMPLES=2000 pytest tests/test_packet_fuzz.py
EXAMPLES = int(os.environ.get("PACKET_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="PACKET_FUZZ_EXAMPLES" not in os.environ,  # a soak explores afresh each time
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)

#: Small, so that contents at and past the limit stay cheap.
MAX_CONTENT = 4_096
LINK_SECRET = "link-s3cret"
CONFIG: dict[str, Any] = {
    "dedup_window_seconds": 60,
    "max_content_bytes": MAX_CONTENT,
    "link_secret": LINK_SECRET,
}
PEERS = (b"alice", b"bob", b"carol")
#: A shard of a cluster of two: it owns "jobs" and "rq"; its link from the other shard.
MAP = ClusterMap(1, (Shard("t/0", "tcp://127.0.0.1:1"), Shard("t/1", "tcp://127.0.0.1:2")))
SHARD = {"cluster": encode_map(MAP).decode(), "shard": "t/0"}
LINK = b"\x00link"
#: Queues of a story of their own (the shard owns them too).
STORY_QUEUES = tuple(q for q in (f"s{n}" for n in range(100)) if MAP.owner(q).name == "t/0")[:30]
LINK_HELLO = p.Hello({"role": "link", "name": "t/1", "link_secret": LINK_SECRET})
OPS = b"ops"
#: The largest integer a packet carries (the decoder refuses 19 digits with a 400).
MAX_INT = 10**MAX_INTEGER_DIGITS - 1

#: The extremes as often as everything else (19 digits: the decoder refuses them, 400).
integers = st.sampled_from((0, 1, MAX_INT - 1, MAX_INT, MAX_INT + 1)) | st.sampled_from(
    (2, 5, 999, 1_000, 60_000, 3_600_000, 2**31, 2**32, 2**53, 2**63 // 10**6, 10**12, 10**15)
)
maybe_integers = st.none() | integers
LONG = "x" * (MAX_CONTENT - 1)
names = st.sampled_from(("jobs", "rq")) | st.sampled_from(
    ("jobs", "orders", "rq", "", " ", "a b", "é€\U0001f600", "\x00", "..", "#", "order.*",
     "a/b", "x" * 300, LONG, "x" * (MAX_CONTENT + 1))
)  # fmt: skip
texts = st.sampled_from(("", "c1", "é", "\x00", LONG, "x" * 70_000)) | st.text(max_size=8)
maybe_texts = st.none() | texts
contents = st.sampled_from(
    (b"", b"x", "é".encode(), b"\xff\xfe", b"x" * (MAX_CONTENT - 1), b"x" * MAX_CONTENT,
     b"x" * (MAX_CONTENT + 1))
) | st.binary(max_size=8)  # fmt: skip
#: Producer headers (the broker keeps them as they are, but reads some): JSON objects, and
#: bytes that are no JSON object at all, in every way a JSON decoder can say so.
headers = st.none() | st.sampled_from(
    (b"", b"{}", b'{"timeout":5}', b'{"timeout":0}', b'{"timeout":1e308}',
     b'{"timeout":99999999999999999999999}', b'{"timeout":-1}', b'{"timeout":"x"}')
) | st.sampled_from(
    (b"not json", b"[1]", b"\xff", b'{"a":"\xff"}', b'{"a":"\\ud800"}', b"{" * 2_000,
     b'{"a":' + b"[" * 2_000 + b"]" * 2_000 + b"}", b"x" * MAX_CONTENT)
)  # fmt: skip
events = st.sampled_from(("order.new", "order.paid", "", "a..b", "é.x", "#", "x" * 300))
patterns = st.none() | st.sampled_from(
    ("order.*", "#", "order.new order.paid", "", "a  b", " ", "*.#.*", "é", "x" * 70_000)
)
reply_tos = st.none() | st.sampled_from(("", "rq", "rq", "missing", "é", "x" * 300))


class Held:
    """Stands for the ID of one of the messages peers were dispatched (known once sent)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"Held({self.index})"


message_ids = st.builds(Held, st.integers(0, 20)) | st.sampled_from(
    (b"", b"f" * 32, b"\xff", b"x" * 100)
)

sends = st.builds(
    p.Send,
    queue=names,
    content=contents,
    ttl=maybe_integers,
    tag=maybe_integers,
    key=maybe_texts,
    headers=headers,
    reply_to=reply_tos,
    correlation=maybe_texts,
    delay_ms=maybe_integers,
    message_key=st.none() | contents,
)
publishes = st.builds(
    p.Publish,
    event=events,
    content=contents,
    ttl=maybe_integers,
    tag=maybe_integers,
    key=maybe_texts,
    headers=headers,
    message_key=st.none() | contents,
)
consumes = st.builds(
    p.Consume,
    queue=names,
    count=integers,
    lease_ms=maybe_integers,
    patterns=patterns,
    unused_ms=maybe_integers,
)
acks = st.builds(p.Ack, queue=names, message_id=message_ids)
requeues = st.builds(
    p.Requeue,
    queue=names,
    message_id=message_ids,
    ttl=integers,
    delay_ms=maybe_integers,
    flags=st.none() | st.sampled_from((0, 1, 2, 3, MAX_INT)),
)
dead_letters = st.builds(p.DeadLetter, queue=names, message_id=message_ids, reason=maybe_texts)
replies = st.builds(
    p.Reply,
    content=contents,
    queue=st.none() | names,
    message_id=st.none() | message_ids,
    correlation=maybe_texts,
    code=maybe_integers,
    reason=maybe_texts,
    headers=headers,
)
#: 113 from a shard link: a peer of another shard's messages, with its principal as the
#: entry shard encoded it (packet 28), or anything else.
principals = st.none() | st.sampled_from(
    (b'[null,"10.0.0.1:1000","router",false]', b'["k","a","router",true]', b"", b"[]",
     b"null", b'["\xff","a","router",false]', b'[null,"\\ud800","router",false]',
     b"[" * 3_000, b'[1e400,"a","b",true]', b"\xff")
)  # fmt: skip
cancels = st.builds(p.Cancel, queue=names, reason=maybe_texts, count=maybe_integers)
others = st.sampled_from(
    (p.Heartbeat(), p.Disconnect(), p.Disconnect("bye"), p.Kbai(), p.Resume(), p.Resume("jobs"))
)
messages = st.one_of(
    sends, sends, publishes, consumes, consumes, acks, requeues, dead_letters, replies, cancels,
    others,
)  # fmt: skip

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from((0, 1, -1, 1_000, 2**31, 2**53, 2**63 - 1, -(2**63), 2**64 - 1)),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from((0.5, -0.0, 1e308, -1e308, 5e-324)),
    st.text(max_size=8),
    st.sampled_from(("", "x" * 300, "é\U0001f600")),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=5,
)
#: Each HELLO option: plausible values, and any JSON value.
HELLO_OPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "heartbeat_ms": st.sampled_from((0, 1, 100, 1_000, 60_000, MAX_INT)) | json_values,
    "liveness": st.sampled_from((0, 1, 3, 100, MAX_INT)) | json_values,
    "confirm": st.booleans() | json_values,
    "name": st.sampled_from(("w/1", "", "x" * 300, "é")) | json_values,
    "role": st.sampled_from(("worker", "link", "producer", "")) | json_values,
    "link_role": st.sampled_from(("link", "follower")) | json_values,
    "link_secret": st.sampled_from((LINK_SECRET, "wrong", "")) | json_values,
    "admin_secret": st.sampled_from(("wrong", "")) | json_values,
}
#: HELLO options as JSON only a hand-made encoder writes (numbers past 64 bits, a lone
#: surrogate, deep nesting).
RAW_HELLOS = (
    b'{"heartbeat_ms":1e400}',
    b'{"heartbeat_ms":123456789012345678901234567890,"liveness":3}',
    b'{"heartbeat_ms":1000,"liveness":1e400}',
    b'{"heartbeat_ms":1000,"liveness":-123456789012345678901234567890}',
    b'{"heartbeat_ms":1000,"liveness":123456789012345678901234567890}',
    b'{"name":"\\ud800","role":"\\udfff"}',
    b'{"role":"link","link_secret":"\\ud800"}',
    b'{"admin_secret":"\\ud800"}',
    b'{"x":' + b"[" * 5_000 + b"]" * 5_000 + b"}",
)


@st.composite
def hellos(draw: st.DrawFn) -> bytes:
    """A HELLO frame: encoded from fuzzed options, or (seldom) one of RAW_HELLOS."""
    if not draw(st.integers(0, 7)):
        raw = draw(st.sampled_from(RAW_HELLOS))
        return message_header(MessageType.HELLO, 1) + packet(PacketType.OPTIONS, raw)
    options: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(sorted(HELLO_OPTIONS)), max_size=5, unique=True)):
        options[name] = draw(HELLO_OPTIONS[name])
    if not draw(st.integers(0, 3)):
        options[draw(st.text(max_size=6))] = draw(json_values)
    return p.encode(p.Hello(options))


#: Time passing between turns, in seconds: a millisecond to a century.
SECONDS = (0.001, 1, 30, 61, 3_601, 86_401, 31_536_000, 100 * 31_536_000)


@st.composite
def forwards(draw: st.DrawFn) -> p.Forward:
    """A 113 whose content (a frame of its peer's messages, encoded when sent) is fuzzed."""
    return p.Forward(
        draw(st.sampled_from((b"\x00p1", b"\x00p2", b"", b"x" * 256, b"\xff"))),
        Inner(draw(st.lists(messages, max_size=3))),  # type: ignore[arg-type]
        draw(st.none() | st.sampled_from((0, 1, 2, 4, 7, 8, 15, MAX_INT))),
        draw(principals),
    )


#: A story's fields: a plain value, and the fuzzed ones.
STORY_FIELDS: dict[str, tuple[Any, st.SearchStrategy[Any]]] = {
    "content": (b"job", contents),
    "ttl": (None, maybe_integers),
    "tag": (None, maybe_integers),
    "key": (None, maybe_texts),
    "headers": (None, headers),
    "delay_ms": (None, st.none() | st.sampled_from((0, 1))),
    "message_key": (None, st.none() | contents),
    "count": (1, st.sampled_from((1, 5))),
    "lease_ms": (None, maybe_integers),
    "patterns": (None, patterns),
    "unused_ms": (None, maybe_integers),
    "requeue_ttl": (0, integers),
    "requeue_delay_ms": (None, maybe_integers),
    "flags": (None, st.none() | st.sampled_from((0, 1, MAX_INT))),
    "reason": (None, maybe_texts),
    "reply": (b"answer", contents),
    "correlation": ("c1", texts),
    "code": (500, maybe_integers),
}

#: The fields of each frame of a story: those of one of them are fuzzed.
STAGES = (
    ("content", "ttl", "tag", "key", "headers", "delay_ms", "message_key", "correlation"),
    ("count", "lease_ms", "patterns", "unused_ms"),
    ("requeue_ttl", "requeue_delay_ms", "flags", "reason", "reply", "code"),
)


@st.composite
def stories(draw: st.DrawFn) -> list[tuple]:
    """Frames that hang together, so that fuzzed values reach what happens late: a send (a
    request, sometimes) to a queue one peer consumes (sometimes after a restart), and that
    peer's settle of it (an ack, a requeue, a dead letter, a reply) or its goodbye. Fields of
    one of the frames are fuzzed, the others plain (one bad field is enough to refuse a
    message before it goes further)."""
    stage = draw(st.sampled_from(STAGES))
    fuzzed = {name for name in stage if draw(st.booleans())}
    v = {
        name: draw(fuzz) if name in fuzzed else plain
        for name, (plain, fuzz) in STORY_FIELDS.items()
    }
    producer, consumer = draw(st.permutations(PEERS))[:2]
    queue = draw(st.sampled_from(STORY_QUEUES))
    request = draw(st.booleans())
    correlation = v["correlation"] if request else None
    reply_to = draw(st.sampled_from(("", "rq", "rq.replies"))) if request else None
    send = p.Send(
        queue, v["content"], v["ttl"], v["tag"], v["key"], v["headers"], reply_to, correlation,
        v["delay_ms"], v["message_key"],
    )  # fmt: skip
    consume = p.Consume(queue, v["count"], v["lease_ms"], v["patterns"], v["unused_ms"])
    reply_headers = draw(headers)  # (what a reply's headers are matters only when it arrives)
    replies = (
        p.Reply(v["reply"], queue, Held(0), correlation, v["code"], v["reason"], reply_headers),
        p.Reply(v["reply"], queue, Held(0), correlation, None, None, reply_headers),
    )
    settles = (
        p.Ack(queue, Held(0)),
        p.Kbai(),
        p.Disconnect(),
        p.Requeue(queue, Held(0), v["requeue_ttl"], v["requeue_delay_ms"], v["flags"]),
        p.DeadLetter(queue, Held(0), v["reason"]),
    )
    # A request is mostly answered.
    settle = draw(st.sampled_from(replies if request and draw(st.booleans()) else settles))
    hello = [] if draw(st.integers(0, 3)) else [p.Hello({"confirm": True})]
    out = [("frame", producer, [*hello, send])]
    if not draw(st.integers(0, 3)):
        out.append(("restart",))  # what was sent comes back from the store
    out.append(("frame", consumer, [consume]))
    if draw(st.booleans()):
        out.append(("wait", draw(st.sampled_from(SECONDS))))
    out.append(("frame", consumer, [settle]))
    if request:
        out.append(("frame", producer, [p.Consume("rq.replies", 5)]))
    return out


@st.composite
def steps(draw: st.DrawFn, shard: bool = False) -> list[tuple]:
    """What happens: frames from peers (several messages each), time passing, restarts; a
    shard's link forwards other peers' frames."""
    out: list[tuple] = [("hello", peer, draw(hellos())) for peer in PEERS if draw(st.booleans())]
    kinds = ("frame", "frame", "frame", "story", "story", "wait", "restart")
    for _ in range(draw(st.integers(1, 12))):
        what = draw(st.sampled_from(kinds + (("forward", "forward", "forward") if shard else ())))
        if what == "story":
            out += draw(stories())
        elif what == "forward":
            sender = LINK if draw(st.integers(0, 7)) else draw(st.sampled_from(PEERS))
            out.append(("frame", sender, draw(st.lists(forwards(), min_size=1, max_size=2))))
        elif what == "frame":
            peer = draw(st.sampled_from(PEERS))
            if not draw(st.integers(0, 9)):
                out.append(("hello", peer, draw(hellos())))
            else:
                out.append(("frame", peer, draw(st.lists(messages, min_size=1, max_size=4))))
        elif what == "wait":
            out.append(("wait", draw(st.sampled_from(SECONDS))))
        else:
            out.append(("restart",))
    return out


class Inner:
    """Stands for a FORWARD's content: these messages, encoded once their IDs are known."""

    def __init__(self, messages: list[Any]) -> None:
        self.messages = messages

    def __repr__(self) -> str:
        return f"Inner({self.messages!r})"


class Broker:
    """A durable core whose every turn is committed to a real store, and restarted from it
    as the server does (broker/shell/server.py `_recover`); a `shard` of a cluster of two,
    its link (which says HELLO with the link secret at each start) carrying FORWARDs."""

    def __init__(self, path: Path, shard: bool = False) -> None:
        self.path = path
        self.config = {**CONFIG, **SHARD} if shard else CONFIG
        self.clock = FakeClock()
        self.harness = CoreHarness(durable=True, clock=self.clock, **self.config)
        self.store = DurableStore(path)
        self.held: list[bytes] = []
        self._link_hello()

    def _link_hello(self) -> None:
        if "shard" in self.config:
            self.turn((LINK, p.encode(LINK_HELLO)))

    def real(self, message: Any) -> Any:
        """`message` with a Held replaced by the ID it stands for, an Inner encoded."""
        fields = {}
        for name in message.__struct_fields__:
            value = getattr(message, name)
            if isinstance(value, Held):
                value = self.held[value.index % len(self.held)] if self.held else b"f" * 32
            elif isinstance(value, Inner):
                value = b"".join(self.frame(inner) or b"" for inner in value.messages)
            fields[name] = value
        return type(message)(**fields)

    def frame(self, *messages: Any) -> bytes | None:
        """The frame a client's encoder makes of them (None: it refuses to encode them)."""
        try:
            return p.encode_all([self.real(message) for message in messages])
        except p.LocalProtocolError:
            return None

    def turn(self, *frames: tuple[bytes, bytes]) -> list:
        """One loop turn with these frames, its journal committed; what peers received."""
        core = self.harness.core
        core.begin_turn()
        for peer, data in frames:
            core.handle_frame(peer, data)
        turn = core.end_turn()
        received = []
        for _, frame in [*turn.frames, *core.release_confirms()]:
            decoded, error = p.decode_frame(frame)
            assert error is None, f"the core sent an undecodable frame: {error}"
            received += decoded
        self.store.commit(core.journal.take())
        for dispatch in dispatches(received):
            self.held = [dispatch.message_id, *self.held][:21]
        return received

    def wait(self, seconds: float) -> None:
        """Time passes; the turns that follow run everything due (a turn runs at most
        DUE_PER_TURN entries: a few turns)."""
        self.clock.advance(seconds)
        for _ in range(3):
            self.turn()

    def restart(self) -> None:
        """A kill -9 and a start from the store: a new core (its monotonic clock starts
        again; the wall clock goes on) recovers everything the store holds."""
        abandon(self.store)
        self.store = store = DurableStore(self.path)
        self.clock = FakeClock(wall=self.clock.wall())
        self.harness = CoreHarness(durable=True, clock=self.clock, **self.config)
        core = self.harness.core
        messages, dead = store.load()
        purged_seqs = store.load_purged_seqs()
        keys, holds = store.load_keys(), store.load_holds()
        bindings, unused = store.load_bindings()
        schedules = store.load_schedules()
        store.read_done()
        core.restore(messages, dead, purged_seqs)
        core.restore_keys(keys, holds)
        core.restore_bindings(bindings, unused)
        core.restore_schedules(schedules)
        store.commit(core.journal.take())
        self.held = []
        self._link_hello()

    def answers(self) -> dict:
        """It answers a `stats` admin (after a turn that runs what is due)."""
        self.wait(1)
        [reply] = self.turn((OPS, p.encode(p.Admin({"command": "stats"}))))
        assert isinstance(reply, p.AdminReply), reply
        assert "error" not in reply.options, reply.options
        return reply.options

    def close(self) -> None:
        abandon(self.store)


def run(path: Path, script: list[tuple], shard: bool = False) -> None:
    broker = Broker(path, shard)
    try:
        for step in script:
            if step[0] == "hello":
                broker.turn((step[1], step[2]))
            elif step[0] == "frame":
                data = broker.frame(*step[2])
                if data is not None:
                    broker.turn((step[1], data))
            elif step[0] == "wait":
                broker.wait(step[1])
            else:
                broker.restart()
        broker.wait(100 * 31_536_000)  # everything due comes due
        broker.restart()
        broker.answers()
    finally:
        broker.close()


# --------------------------------------------------------------------------- the property


@pytest.mark.parametrize("shard", [False, True], ids=["broker", "shard"])
@FUZZ
@given(data=st.data())
def test_any_valid_messages_at_any_edge_crash_nothing(
    tmp_path_factory: pytest.TempPathFactory, shard: bool, data: st.DataObject
) -> None:
    """A broker, and a shard of a cluster whose link forwards fuzzed frames."""
    script = data.draw(steps(shard), "script")
    run(tmp_path_factory.mktemp("store") / "store.db", script, shard)


# --------------------------------------------------------------------------- what crashed


def request_replied(broker: Broker, reply_headers: bytes) -> list:
    """A request whose replies go to the queue "rq.replies", answered by its worker with an
    error reply with these headers; what the requester then receives from that queue."""
    broker.turn(
        (b"alice", p.encode(p.Send("jobs", b"x", 0, reply_to="rq.replies", correlation="c")))
    )
    [request] = dispatches(broker.turn((b"bob", p.encode(p.Consume("jobs", 1)))))
    reply = p.Reply(b"failed", "jobs", request.message_id, "c", 500, "ValueError: x", reply_headers)
    assert broker.turn((b"bob", p.encode(reply))) == []
    return broker.turn((b"alice", p.encode(p.Consume("rq.replies", 1))))


#: A worker's error-reply headers (17) that stopped the broker when it put the reply into a
#: reply queue: msgspec's own exceptions for invalid UTF-8 in a JSON string and for deep
#: nesting are no DecodeError (broker/replies.py `_reply_headers`).
CRASHING_REPLY_HEADERS = [
    b'{"a":"\xff"}',
    b'{"a":' + b"[" * 2_000 + b"]" * 2_000 + b"}",
]


@pytest.mark.parametrize("reply_headers", CRASHING_REPLY_HEADERS, ids=["utf8", "nested"])
def test_an_error_reply_s_headers_no_json_object_are_replaced(
    tmp_path: Path, reply_headers: bytes
) -> None:
    """As headers that are no JSON object always were: the reply queue's message says only
    that it is an error reply."""
    broker = Broker(tmp_path / "store.db")
    try:
        [delivered] = request_replied(broker, reply_headers)
        assert isinstance(delivered, p.Dispatch), delivered
        assert delivered.correlation == "c"
        assert delivered.headers == b'{"error":{"code":500,"reason":"ValueError: x"}}'
        broker.wait(100 * 31_536_000)
        broker.restart()
        broker.answers()
    finally:
        broker.close()


#: A PRINCIPAL packet (28) of a link's FORWARD with invalid UTF-8 in a JSON string: it
#: stopped the shard (broker/guard.py `forwarded_principal`); now it is a principal that
#: cannot be read, as one that is no JSON: the peer's send is refused (403), not taken.
@pytest.mark.parametrize("principal", [b'["\xff","a","router",false]', b"not json"])
def test_a_forwarded_principal_that_is_no_utf8_is_refused(tmp_path: Path, principal: bytes) -> None:
    broker = Broker(tmp_path / "store.db", shard=True)
    try:
        send = p.encode(p.Send("jobs", b"x", 0, tag=1))
        forward = p.Forward(b"\x00p1", send, p.FORWARD_EXTENSIONS, principal)
        [back] = broker.turn((LINK, p.encode(forward)))
        assert isinstance(back, p.Forward), back
        [refusal] = p.decode_frame(back.content)[0]
        assert isinstance(refusal, p.Error) and (refusal.code, refusal.tag) == (403, 1), refusal
        broker.restart()
        broker.answers()
    finally:
        broker.close()


@pytest.mark.parametrize("ttl", [MAX_INT, MAX_INT - 1])
@pytest.mark.parametrize("delay_ms", [None, MAX_INT])
def test_the_longest_ttl_stays_18_digits_after_a_restart(
    tmp_path: Path, ttl: int, delay_ms: int | None
) -> None:
    """A deadline read back from the store's wall-clock seconds (a float) came back up to a
    minute later: the 003 said TTL 1000000000000000000, 19 digits, which no decoder reads
    (the consumer lost the frame and what else it held). Now it is held to the longest."""
    broker = Broker(tmp_path / "store.db")
    try:
        broker.turn((b"alice", p.encode(p.Send("jobs", b"x", ttl, delay_ms=delay_ms))))
        broker.restart()
        broker.clock.advance(delay_ms / 1_000 if delay_ms else 0)
        [dispatch] = dispatches(broker.turn((b"bob", p.encode(p.Consume("jobs", 1)))))
        assert 0 < dispatch.ttl <= MAX_INT  # type: ignore[operator]  # (a float: not exact)
        broker.restart()
        broker.answers()
    finally:
        broker.close()
