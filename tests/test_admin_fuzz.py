"""Bad admin options get a clear error, never a crash (the project's rule: bad input gets a
clear error to its sender and never crashes the broker or harms another client).

Every ADMIN command the broker knows (protocol/admin_commands.py and the core's own table, so
a new command is fuzzed as soon as it exists), an unknown one and commands that are no string
at all. Each starts from options it runs with (GOOD), so that one bad option reaches the
check, or the code, behind the others; the option names fuzzed are those the command looks
up when it runs (found by running it), with values of every type a client can send (and,
handed to the core decoded, those only a transport could: NaN, bytes). The core has
something for each command to act on first.

No exception may leave the core's turn, nor the turns after it (a schedule that runs, a lease
that times out), nor the store's commit of what it journaled, nor a restart from that store;
the asker gets exactly one ADMIN_REPLY, a result or an error with a code and a reason. A peer
without the admin right is refused (403) whatever it asks.
"""

from __future__ import annotations

import os
import random
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import phpmq.protocol as p
from harness import (
    BrokerProcess,
    CoreHarness,
    StoredCore,
    abandon,
    dispatches,
    raw_dealer,
    recv_messages,
)
from phpmq.broker import guard
from phpmq.broker.guard import Principal
from phpmq.broker.model import PeerProfile
from phpmq.broker.permissions import Permissions, Rights
from phpmq.broker.schedule_spec import ScheduleSpec, decode_spec
from phpmq.broker.shell.durable import DurableStore
from phpmq.protocol import admin_commands as cmd

OPS = b"ops"
PRODUCER = b"producer"
CONSUMER = b"consumer"
BURIER = b"burier"
PROFILE = PeerProfile("router", ttl_form=True)
#: A peer with a key that has no right at all.
NOBODY = Principal("nobody", "10.0.0.9:1000", "router")
NO_RIGHTS = Permissions({"nobody": Rights("nobody")})
#: Examples per command of the main property (the other two run half as many); a soak:
#: ADMIN_FUZZ_EXAMPLES=2000 pytest tests/test_admin_fuzz.py
EXAMPLES = int(os.environ.get("ADMIN_FUZZ_EXAMPLES", "8"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="ADMIN_FUZZ_EXAMPLES" not in os.environ,  # a soak explores afresh each time
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def known_commands() -> list[str]:
    """Every command the protocol names and every one the core runs."""
    return sorted({*cmd.ALL, *CoreHarness().core.admin._commands})


COMMANDS = known_commands()
#: Commands fuzzed besides the known ones: an unknown name, and ones that are no string.
MISSING = object()
ODD_COMMANDS = ("no-such-command", "", " stats", None, 7, ["stats"], MISSING)
ALL_COMMANDS = [*COMMANDS, *ODD_COMMANDS]
each_command = pytest.mark.parametrize(
    "command", ALL_COMMANDS, ids=["missing" if c is MISSING else repr(c) for c in ALL_COMMANDS]
)


class RealId:
    """Stands for the ID of one of the messages the stage holds (known once it exists)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"RealId({self.index})"


PAGE = {"offset": 0, "limit": 10, "max_bytes": 10_000}
SMALL = {"max_bytes": 1_000}
#: Options each command runs with on the stage (a command not here starts from none).
GOOD: dict[str, list[dict[str, Any]]] = {
    cmd.STATS: [PAGE],
    cmd.REPORT: [{"counters": {"sent": 1}, "kind": "bridge"}],
    cmd.DLQ_LIST: [{"queue": "jobs", "end": 5, **PAGE}],
    cmd.DLQ_REPLAY: [{"queue": "jobs", "ids": [RealId(1)]}, {"queue": "jobs"}],
    cmd.DLQ_PURGE: [{"queue": "jobs"}],
    cmd.QUEUE_PEEK: [{"queue": "orders", "end": 5, **PAGE}],
    cmd.QUEUE_PURGE: [{"queue": "orders"}],
    cmd.QUEUE_DELETE: [{"queue": "orders"}],
    cmd.QUEUE_BIND: [{"queue": "orders", "patterns": ["order.new"]}],
    cmd.QUEUE_UNBIND: [{"queue": "orders", "patterns": ["order.*"]}],
    cmd.QUEUE_REBIND: [
        {
            "queue": "orders",
            "replace": ["order.*", "x.y"],
            "remove": ["x.y"],
            "remove_mask": ["order.#"],
            "add": ["order.paid"],
        }
    ],
    cmd.QUEUE_BINDINGS: [{"queue": "orders"}],
    cmd.SCHEDULE_ADD: [
        {
            "name": "new-job",
            "queue": "orders",
            "every_ms": 1_000,
            "content": "x",
            "nohaste": True,
            "catch_up": "skip",
            "ttl": 5,
            "headers": {"timeout": 5},
        },
        {
            "name": "tick",
            "event": "order.new",
            "cron": "*/5 * * * *",
            "tz": "Europe/Berlin",
            "content_base64": "eA==",
        },
    ],
    cmd.SCHEDULE_REMOVE: [{"name": "tick"}],
    cmd.SCHEDULE_LIST: [PAGE],
    cmd.LEASE: [
        {
            "queue": "orders",
            "lease": "spark/2",
            "max_messages": 2,
            "max_bytes": 10_000,
            "timeout_ms": 60_000,
        }
    ],
    cmd.LEASE_READ: [{"queue": "orders", "lease": "spark/1", **PAGE}],
    cmd.LEASE_COMMIT: [{"queue": "orders", "lease": "spark/1"}],
    cmd.LEASE_RELEASE: [{"queue": "orders", "lease": "spark/1"}],
    cmd.LEASES: [{"queue": "orders", **PAGE}],
    cmd.KEY_HOLD: [{"scope": "writer2", "queue": "orders"}],
    cmd.KEY_COMMIT: [{"scope": "writer", "event": "order.new", "batch": 1}],
    cmd.KEY_HOLDS: [PAGE],
    cmd.KEY_RELEASE: [{"scope": "writer"}],
    cmd.REPLICA_LEAD: [{"node": "n1"}],
}
#: Good values of each option name (some naming what the stage holds), mixed into the
#: fuzzed ones.
PLAUSIBLE: dict[str, tuple[Any, ...]] = {
    "queue": ("orders", "jobs", "missing", "fresh.q"),
    "ids": ([RealId(0)], [RealId(1), RealId(2)], [RealId(3), "f" * 32], []),
    "offset": (0, 1, 3),
    "end": (1, 5),
    "limit": (0, 1, 2, 10),
    "max_bytes": (1, 100, 10_000),
    "patterns": (["order.*"], ["#"], ["order.new", "a.b"]),
    "replace": (["order.*"], ["order.#", "x"], []),
    "remove": (["order.*"], ["nope"]),
    "remove_mask": (["order.*"], ["#"]),
    "add": (["order.paid"], ["*.new"]),
    "name": ("tick", "nightly", "new-job"),
    "event": ("order.new", "order.paid"),
    "content": ("x", ""),
    "content_base64": ("eA==", ""),
    "every_ms": (100, 60_000),
    "cron": ("*/5 * * * *", "0 3 * * *"),
    "tz": ("Europe/Berlin", "UTC"),
    "nohaste": (True, False),
    "catch_up": ("run-once", "skip"),
    "ttl": (0, 5, 60),
    "headers": ({"timeout": 5}, {}),
    "lease": ("spark/1", "spark/2"),
    "max_messages": (1, 3),
    "timeout_ms": (1_000, 60_000),
    "scope": ("writer", "other"),
    "batch": (0, 1, 2),
    "node": ("n1",),
    "counters": ({"sent": 1}, {}),
    "kind": ("bridge",),
    cmd.REF: (0, 1, 2**53 - 1),
}
OPTION_NAMES = tuple(PLAUSIBLE)
#: Values at the edges: wrong types, huge and negative numbers, odd strings.
EDGES = (
    None, True, 0, -1, 0.5, 1e308, 2**63, 10**18, 10**400, -(2**63) - 1,
    "", "\x00", "x" * 300, "x" * 70_000, "America", "../etc", "a/b", "é", "*/0 * * * *",
    [], [None], [1], ["x" * 300], {}, {"a": None},
)  # fmt: skip
scalars = st.one_of(
    st.sampled_from(EDGES),
    st.sampled_from((2**31, 2**32, 2**53, 2**63 - 1, 2**64, -(2**200), -0.0, "\U0001f600", " ")),
    st.none() | st.booleans(),
    st.integers() | st.floats(),
    st.text(max_size=12),
    st.builds(RealId, st.integers(0, 9)),
)


def nested(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return leaves | st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
        ),
        max_leaves=6,
    )


values = nested(scalars)
#: What only a peer decoded by something other than the codec could hold.
raw_values = nested(
    scalars | st.sampled_from([float("nan"), float("inf"), -float("inf")]) | st.binary(max_size=6)
)


class Reads(dict[str, Any]):
    """Options that note the names looked up in them."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def good_options(command: object) -> list[dict[str, Any]]:
    return GOOD.get(command, []) if isinstance(command, str) else []


@cache
def _names_read(command: str) -> tuple[str, ...]:
    """The option names `command` looks up when it runs with its good options."""
    read: set[str] = set()
    for good in good_options(command) or [{}]:
        stage = Stage()
        options = Reads({"command": command, **stage.real(good)})
        the_reply(stage.ask(options, raw=True))
        read |= options.read | set(good)
    return tuple(sorted(read - {"command"}))


def names_of(command: object) -> tuple[str, ...]:
    """The names to fuzz for `command`: those it reads, or (an unknown command, which reads
    only `ref`) every name any command reads."""
    names = _names_read(command) if isinstance(command, str) else ()
    return names if set(names) - {cmd.REF} else OPTION_NAMES


@st.composite
def admin_options(draw: st.DrawFn, command: object, raw: bool = False) -> dict[str, Any]:
    """One ADMIN's options: mostly the command's good ones, a few of the names it reads
    fuzzed, made plausible, or left out, sometimes any name with any value."""
    fuzzed = raw_values if raw else values
    options: dict[str, Any] = {} if command is MISSING else {"command": command}
    goods = good_options(command)
    if goods and draw(st.integers(0, 4)):
        options.update(draw(st.sampled_from(goods)))
    for name in draw(st.lists(st.sampled_from(names_of(command)), max_size=4, unique=True)):
        how = draw(st.sampled_from(("fuzzed", "fuzzed", "plausible", "left out")))
        if how == "fuzzed":
            options[name] = draw(fuzzed)
        elif how == "plausible":
            options[name] = draw(st.sampled_from(PLAUSIBLE.get(name, (None,))))
        else:
            options.pop(name, None)
    if not draw(st.integers(0, 4)):
        options[draw(st.sampled_from(OPTION_NAMES) | st.text(max_size=8))] = draw(fuzzed)
    return options


class Stage:
    """A core with something for every command to act on: queues with ready messages, one
    in flight, a dead letter, a binding, a batch lease, a key hold and two schedules. A
    durable one journals into a real store (`store_at`)."""

    def __init__(self, store_at: Path | None = None) -> None:
        config = {"dedup_window_seconds": 60}
        self.stored = None if store_at is None else StoredCore(store_at, **config)
        self.harness = CoreHarness(**config) if self.stored is None else self.stored.core
        self._send(PRODUCER, *[p.Send("orders", b"o%d" % n, 0) for n in range(6)])
        self._send(PRODUCER, p.Send("jobs", b"j", 30), p.Send("jobs", b"k", 0))
        [held] = dispatches(self._send(CONSUMER, p.Consume("orders", 1)))
        [doomed] = dispatches(self._send(BURIER, p.Consume("jobs", 1)))
        self._send(BURIER, p.DeadLetter("jobs", doomed.message_id, "fuzzed"))
        for command, options in (
            (cmd.QUEUE_BIND, {"queue": "orders", "patterns": ["order.*"]}),
            (cmd.LEASE, {"queue": "orders", "lease": "spark/1", "max_messages": 2, **SMALL}),
            (cmd.KEY_HOLD, {"scope": "writer", "queue": "orders"}),
            (cmd.SCHEDULE_ADD, {"name": "tick", "queue": "orders", "every_ms": 60_000}),
            (cmd.SCHEDULE_ADD, {"name": "nightly", "event": "order.new", "cron": "0 3 * * *"}),
        ):
            answer = self._admin(command, options)
            assert "error" not in answer, (command, answer)
        peeked = self._admin(cmd.QUEUE_PEEK, {"queue": "orders"})["entries"]
        self.ids = [held.message_id.decode(), doomed.message_id.decode()]
        self.ids += [entry["id"] for entry in peeked]

    def _send(self, peer: bytes, *messages: p.Message) -> list:
        return (self.stored or self.harness).send(peer, *messages)

    def _admin(self, command: str, options: dict[str, Any]) -> dict:
        return (self.stored or self.harness).admin(command, **options)

    def real(self, value: Any) -> Any:
        return with_ids(value, self.ids)

    def ask(
        self, options: dict[str, Any], principal: Principal | None = None, raw: bool = False
    ) -> list:
        """What OPS receives for an ADMIN with these options: over the wire (encoded and
        decoded as a client's), or `raw`, handed to the core as it is."""
        core = self.harness.core
        core.begin_turn()
        if raw:
            core.handle_messages(OPS, [p.Admin(options)], None, PROFILE, None, principal)
        else:
            core.handle_frame(OPS, p.encode(p.Admin(options)), PROFILE, principal)
        frames = [*core.end_turn().frames, *core.release_confirms()]
        self.commit()
        return [message for to, frame in frames if to == OPS for message in decoded(frame)]

    def go_on(self) -> None:
        """Turns after the command: time passes (a schedule runs, a lease times out, a
        message expires), consumers take what is there; all of it stored."""
        harness = self.harness
        for seconds in (1, 61, 3_601, 86_401):
            harness.advance(seconds)
            harness.turn((CONSUMER, p.Consume("orders", 5)), (BURIER, p.Consume("jobs", 5)))
            harness.core.release_confirms()
            self.commit()

    def commit(self) -> None:
        if self.stored is not None:
            self.stored.commit()

    def recovered(self) -> None:
        """The store opened again after a kill, everything in it recovered as the server
        does (broker/shell/server.py `_recover`), and turns run."""
        assert self.stored is not None
        abandon(self.stored.store)
        store = DurableStore(self.stored.path)
        try:
            messages, dead = store.load()
            purged_seqs = store.load_purged_seqs()
            keys, holds = store.load_keys(), store.load_holds()
            bindings, unused = store.load_bindings()
            schedules = store.load_schedules()
            store.read_done()
            harness = CoreHarness(durable=True, **self.stored.config)
            core = harness.core
            core.restore(messages, dead, purged_seqs)
            core.restore_keys(keys, holds)
            core.restore_bindings(bindings, unused)
            core.restore_schedules(schedules)
            store.commit(core.journal.take())
            for seconds in (1, 3_601):
                harness.advance(seconds)
                harness.turn((CONSUMER, p.Consume("orders", 5)))
                store.commit(core.journal.take())
        finally:
            store.close()


def with_ids(value: Any, ids: list[str]) -> Any:
    """`value` with each RealId replaced by the ID it stands for."""
    if isinstance(value, RealId):
        return ids[value.index % len(ids)]
    if isinstance(value, list):
        return [with_ids(item, ids) for item in value]
    if isinstance(value, dict):
        return {key: with_ids(item, ids) for key, item in value.items()}
    return value


def decoded(frame: bytes) -> list:
    messages, error = p.decode_frame(frame)
    assert error is None, f"the core sent an undecodable frame: {error}"
    return messages


def the_reply(received: list) -> dict[str, Any]:
    """The one ADMIN_REPLY, checked: a result, or an error with an int code and a reason."""
    [reply] = received
    assert isinstance(reply, p.AdminReply), reply
    answer = reply.options
    assert isinstance(answer, dict)
    if "error" in answer:
        error = answer["error"]
        assert set(error) == {"code", "reason"}, answer
        assert type(error["code"]) is int and isinstance(error["reason"], str), answer
        assert error["reason"], answer
    return answer


# --------------------------------------------------------------------------- the properties


@pytest.mark.parametrize("command", COMMANDS)
def test_each_option_a_command_reads_at_each_edge_value(command: str) -> None:
    """One option at a time, from the command's good options: each edge value, and left
    out (what the fuzzing below may take long to hit, every time)."""
    for good in good_options(command) or [{}]:
        if command in CoreHarness().core.admin._commands:
            stage = Stage()
            answer = the_reply(stage.ask(stage.real({"command": command, **good})))
            assert "error" not in answer, (good, answer)
        for name in set(names_of(command)) - {cmd.REF}:
            for value in (*EDGES, MISSING):
                stage = Stage()
                options = stage.real({"command": command, **good, name: value})
                if value is MISSING:
                    del options[name]
                if "error" not in the_reply(stage.ask(options)):
                    stage.go_on()  # (an error changed nothing)


@each_command
@FUZZ
@given(data=st.data())
def test_any_admin_options_get_one_answer_and_crash_nothing(
    tmp_path_factory: pytest.TempPathFactory, command: object, data: st.DataObject
) -> None:
    """Over the wire, as a client sends them; one example in four on a real store."""
    options = data.draw(admin_options(command), "options")
    durable = not data.draw(st.integers(0, 3), "durable")
    store = tmp_path_factory.mktemp("store") / "store.db" if durable else None
    stage = Stage(store)
    the_reply(stage.ask(stage.real(options)))
    stage.go_on()
    if store is not None:
        stage.recovered()


@each_command
@settings(FUZZ, max_examples=max(1, EXAMPLES // 2))
@given(data=st.data())
def test_admin_options_decoded_by_a_transport_crash_nothing(
    command: object, data: st.DataObject
) -> None:
    """Values no JSON holds (NaN, infinities, bytes), handed to the core as they are."""
    options = data.draw(admin_options(command, raw=True), "options")
    stage = Stage()
    the_reply(stage.ask(stage.real(options), raw=True))
    stage.go_on()


@each_command
@settings(FUZZ, max_examples=max(1, EXAMPLES // 2))
@given(data=st.data())
def test_a_peer_without_the_admin_right_is_refused_whatever_it_asks(
    command: object, data: st.DataObject
) -> None:
    options = data.draw(admin_options(command), "options")
    stage = Stage()
    stage.harness.core.set_permissions(NO_RIGHTS)
    answer = the_reply(stage.ask(stage.real(options), NOBODY))
    if isinstance(command, str) and command not in guard.OPEN_COMMANDS:
        assert answer["error"]["code"] == 403, answer
    stage.go_on()


# --------------------------------------------------------------------------- what crashed


#: Commands that stopped the broker, and what they are told now: a schedule's interval or TTL
#: past a float's range (at its next run, or its message's expiry), a time zone that is a
#: folder or too long a file name, a batch past SQLite's integers (at the store's commit).
CRASHED = [
    ({"command": cmd.SCHEDULE_ADD, "every_ms": 10**400}, "'every_ms' must be an integer"),
    ({"command": cmd.SCHEDULE_ADD, "every_ms": 10**18}, "at most 18 digits"),
    ({"command": cmd.SCHEDULE_ADD, "every_ms": 1_000, "ttl": 10**400}, "'ttl' must be"),
    ({"command": cmd.SCHEDULE_ADD, "cron": "* * * * *", "tz": "America"}, "unknown time zone"),
    ({"command": cmd.SCHEDULE_ADD, "cron": "* * * * *", "tz": "x" * 300}, "unknown time zone"),
    ({"command": cmd.KEY_COMMIT, "batch": 2**63}, "'batch' must be an integer"),
    ({"command": cmd.KEY_COMMIT, "batch": 10**18}, "at most 18 digits"),
]


def crashed(options: dict[str, Any]) -> dict[str, Any]:
    """One of CRASHED's commands, with the options it needs besides."""
    return {"name": "big", "scope": "writer", "queue": "orders", **options}


@pytest.mark.parametrize(("options", "reason"), CRASHED)
def test_what_once_crashed_the_broker_is_refused(
    tmp_path: Path, options: dict[str, Any], reason: str
) -> None:
    stage = Stage(tmp_path / "store.db")
    answer = the_reply(stage.ask(crashed(options)))
    assert answer["error"]["code"] == 422 and reason in answer["error"]["reason"], answer
    stage.go_on()
    stage.recovered()


@pytest.mark.parametrize("command", [cmd.QUEUE_PEEK, cmd.DLQ_LIST])
@pytest.mark.parametrize("name", ["offset", "end", "limit"])
def test_a_browse_past_any_queue_s_length_is_told_the_bound(command: str, name: str) -> None:
    """Not a crash: a 422 that said "Indices for islice() must be None or an integer"."""
    answer = the_reply(Stage().ask({"command": command, "queue": "orders", name: 2**63}))
    assert answer["error"] == {
        "code": 422,
        "reason": f"{name!r} must be a non-negative integer of at most 18 digits",
    }


@pytest.mark.parametrize(
    "options",
    [
        {"command": cmd.SCHEDULE_ADD, "name": "far", "every_ms": 10**18 - 1, "ttl": 10**18 - 1},
        {"command": cmd.KEY_COMMIT, "scope": "writer", "batch": 10**18 - 1},
    ],
)
def test_the_largest_numbers_taken_are_stored_and_read_back(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    stage = Stage(tmp_path / "store.db")
    answer = the_reply(stage.ask({**options, "queue": "orders"}))
    assert "error" not in answer, answer
    stage.go_on()
    stage.recovered()


def test_a_schedule_an_older_broker_stored_past_the_bounds_is_held_under_them() -> None:
    """An older broker took any interval or TTL (the store's JSON holds 64 bits): read back,
    they are held under 18 digits, so its runs' 003s stay decodable."""
    huge = 2**64 - 1
    stored = msgspec.json.encode(ScheduleSpec(name="old", queue="q", every_ms=huge, ttl=huge))
    spec = decode_spec(stored)
    assert (spec.every_ms, spec.ttl) == (10**18 - 1, 10**18 - 1)
    assert decode_spec(msgspec.json.encode(ScheduleSpec(name="c", queue="q", cron="* * * * *")))


# --------------------------------------------------------------------------- a real broker

#: Commands sent to the real broker.
REAL_COMMANDS = 100


def fuzzed_options(rng: random.Random, ids: list[str]) -> dict[str, Any]:
    """Seeded options for the real broker, drawn much as the properties draw them."""
    command = rng.choice([*COMMANDS, *ODD_COMMANDS])
    options: dict[str, Any] = {} if command is MISSING else {"command": command}
    goods = good_options(command)
    if goods and rng.random() < 0.8:
        options.update(rng.choice(goods))
    names = names_of(command)
    for name in rng.sample(names, min(len(names), rng.randint(1, 3))):
        options[name] = rng.choice([*EDGES, *PLAUSIBLE.get(name, ())])
    return with_ids(options, ids)


def test_a_real_broker_answers_fuzzed_admin_commands_and_stays_up(tmp_path: Path) -> None:
    """Durable, so that what the commands change is stored (and read back at a restart);
    the shell's commands and `stats` sections are there too."""
    rng = random.Random(20_240_611)
    data = tmp_path / "data"
    with BrokerProcess(tmp_path / "broker.log", data_dir=data) as broker:
        with broker.client() as client:
            client.send_many("orders", [b"a", b"b", b"c", b"d"], confirm=True)
            client.send_many("jobs", [b"j"], confirm=True)
            client.admin(cmd.QUEUE_BIND, queue="orders", patterns=["order.*"])
            client.admin(cmd.KEY_HOLD, scope="writer", queue="orders")
            client.admin(cmd.LEASE, queue="orders", lease="spark/1", max_messages=1, **SMALL)
            client.admin(cmd.SCHEDULE_ADD, name="tick", queue="jobs", every_ms=60_000)
            peeked = client.admin(cmd.QUEUE_PEEK, queue="orders")["entries"]
        ids = [entry["id"] for entry in peeked]
        asked = [crashed(options) for options, _ in CRASHED]
        asked += [fuzzed_options(rng, ids) for _ in range(REAL_COMMANDS)]
        with raw_dealer(broker.address) as sock:
            for options in asked:
                sock.send(p.encode(p.Admin(options)))
                [reply] = recv_messages(sock, timeout=5.0)  # an answer, not a hang
                assert isinstance(reply, p.AdminReply), (options, reply)
                assert broker.process.poll() is None, options
        with broker.client() as client:
            storage = client.admin(cmd.STATS)["storage"]  # it answers, and stored everything
            assert (storage["write_errors"], storage["unwritten_operations"]) == (0, 0), storage
    with (
        BrokerProcess(tmp_path / "again.log", data_dir=data) as broker,
        broker.client() as client,
    ):
        assert "queues" in client.admin(cmd.STATS)  # and starts again from what it stored
