"""An ADMIN's `ref` comes back in its ADMIN_REPLY, refusals included (docs/protocol.md §9),
and the client drops a reply with an earlier ref: an answer that arrives after its asker gave
up waiting is never taken for the answer to the next command (the web console once purged a
queue and read a late `stats` as the purge's answer)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import phpmq.protocol as p
from harness import BrokerProcess, CoreHarness
from phpmq import AsyncClient, Client, ClientError
from phpmq.broker.admin import ADMIN_PER_PEER_TURN
from phpmq.broker.clock import FakeClock
from phpmq.broker.config import BrokerConfig
from phpmq.broker.core import Core
from phpmq.broker.guard import Principal
from phpmq.broker.model import PeerProfile
from phpmq.broker.permissions import Permissions, Rights
from phpmq.client.connection import Connection

OPS = b"ops"


def replies(out: list[p.Message]) -> list[dict[str, Any]]:
    return [m.options for m in out if isinstance(m, p.AdminReply)]


def admin(ref: object, command: str = "stats", **options: object) -> p.Admin:
    return p.Admin({"command": command, **options, "ref": ref})


def test_every_kind_of_answer_carries_the_commands_ref() -> None:
    core = CoreHarness()
    core.send(b"producer", p.Send("jobs", b"x", 0))
    answers = replies(
        core.send(
            OPS,
            admin(1, "queue-peek", queue="jobs"),
            admin(2, "explode"),
            admin(3, "dlq-list", queue="nope"),
            admin(4, "stats"),
        )
    )
    assert [a["ref"] for a in answers] == [1, 2, 3, 4]
    assert "messages" in answers[0] or "entries" in answers[0], answers[0]
    assert answers[1]["error"]["code"] == 422 and answers[2]["error"]["code"] == 404
    assert answers[3]["queues"]["jobs"]["ready"] == 1


def test_one_stats_answer_built_once_a_turn_carries_each_askers_own_ref() -> None:
    core = CoreHarness()
    core.send(b"producer", p.Send("jobs", b"x", 0))
    out = core.send(OPS, admin(10), admin(11), p.Admin({"command": "stats"}))
    first, second, plain = replies(out)
    assert (first["ref"], second["ref"], "ref" in plain) == (10, 11, False)
    first.pop("ref"), second.pop("ref")
    assert first == second == plain


def test_refused_for_too_many_in_a_turn_the_answer_still_carries_the_ref() -> None:
    core = CoreHarness()
    answers = replies(core.send(OPS, *[admin(n) for n in range(ADMIN_PER_PEER_TURN + 2)]))
    assert [a["ref"] for a in answers] == list(range(ADMIN_PER_PEER_TURN + 2))
    assert {a["error"]["code"] for a in answers[ADMIN_PER_PEER_TURN:]} == {429}


@pytest.mark.parametrize("ref", [-1, 2**53, 1.5, "7", True, None])
def test_a_ref_that_is_not_one_is_refused_without_an_echo(ref: object) -> None:
    [answer] = replies(CoreHarness().send(OPS, admin(ref)))
    assert answer == {
        "error": {"code": 422, "reason": "'ref' must be an integer from 0 to 2**53 - 1"}
    }


def test_a_command_refused_for_want_of_the_admin_right_carries_its_ref() -> None:
    core = Core(BrokerConfig(), FakeClock())
    core.set_permissions(Permissions({"limited": Rights("limited", send=("jobs.*",))}))
    core.begin_turn()
    core.handle_frame(
        b"f",
        p.encode_all([p.Hello({}), admin(5, "queue-purge", queue="jobs.a")]),
        PeerProfile("router", ttl_form=True),
        Principal("limited", "10.0.0.1:1000", "router"),
    )
    frames = [frame for peer, frame in core.end_turn().frames if peer == b"f"]
    [answer] = replies([m for frame in frames for m in p.decode_frame(frame)[0]])
    assert answer["ref"] == 5 and answer["error"]["code"] == 403


def test_the_connection_drops_a_reply_to_an_earlier_command() -> None:
    connection = Connection()
    connection.start(now=0.0)
    first = p.decode_frame(connection.admin("stats", {}))[0][0]
    second = p.decode_frame(connection.admin("queue-purge", {"queue": "q"}))[0][0]
    assert isinstance(first, p.Admin) and isinstance(second, p.Admin)
    assert second.options["ref"] == first.options["ref"] + 1
    connection.receive(p.encode(p.AdminReply({"ref": first.options["ref"], "queues": {}})), 1.0)
    assert not connection.admin_replies and connection.late_admin_replies == 1
    connection.receive(p.encode(p.AdminReply({"ref": second.options["ref"], "purged": 3})), 1.1)
    assert connection.admin_replies.popleft().options == {"purged": 3}  # the ref is not shown
    connection.receive(p.encode(p.AdminReply({"purged": 4})), 1.2)  # a broker without refs
    assert connection.admin_replies.popleft().options == {"purged": 4}


def test_a_command_after_one_given_up_on_gets_its_own_answer_from_a_real_broker(
    broker: BrokerProcess,
) -> None:
    async def run() -> dict[str, Any]:
        client = AsyncClient(broker.address)
        try:
            await client.send_many("orders", [b"a", b"b", b"c"], confirm=True)
            with pytest.raises(ClientError, match="no answer"):
                await client.admin("stats", timeout=1e-9)  # its answer comes later
            return await client.admin("queue-purge", queue="orders")
        finally:
            await client.close()

    assert asyncio.run(run()) == {"queue": "orders", "purged": 3}
    with Client(broker.address) as client:
        with pytest.raises(ClientError, match="no answer"):
            client.admin("stats", timeout=1e-9)
        assert client.admin("queue-peek", queue="orders")["queue"] == "orders"


@pytest.mark.parametrize("driver", ["sync", "asyncio"])
def test_leases_and_key_holds_have_typed_methods_on_both_clients(
    broker: BrokerProcess, driver: str
) -> None:
    """What `phpmq queue leases/release` and `phpmq keys holds/release` call."""
    with broker.client() as client:
        client.send_many("events", [b"a", b"b", b"c"], confirm=True)
        leased = client.admin("lease", queue="events", lease="r/1", max_messages=2, max_bytes=1024)
        assert leased["messages"] == 2
        client.admin("key-hold", scope="query-1", queue="out")
        client.send("out", b"row", confirm=True, key="query-1/0/0/0")

    def check(leases: dict, released: int, holds: dict, keys_released: int) -> None:
        [lease] = leases["leases"]
        assert (lease["queue"], lease["lease"], lease["messages"]) == ("events", "r/1", 2)
        assert released == 2
        [hold] = holds["holds"]
        assert (hold["scope"], hold["held_keys"]) == ("query-1", 1)
        assert keys_released == 1

    if driver == "sync":
        with Client(broker.address) as client:
            check(
                client.leases("events"),
                client.release_lease("events", "r/1"),
                client.key_holds(),
                client.release_key_hold("query-1"),
            )
            assert client.release_lease("events", "r/1") == 0 and client.leases()["leases"] == []
        return

    async def run() -> None:
        client = AsyncClient(broker.address)
        try:
            check(
                await client.leases("events"),
                await client.release_lease("events", "r/1"),
                await client.key_holds(),
                await client.release_key_hold("query-1"),
            )
            assert await client.release_lease("events", "r/1") == 0
        finally:
            await client.close()

    asyncio.run(run())


def test_admin_commands_of_many_tasks_at_once_each_get_their_own_answer(
    broker: BrokerProcess,
) -> None:
    """The web console polls `stats` while a page asks `schedule-list` on the same client:
    each gets its own answer (a page once showed a KeyError for the stats it was given)."""

    async def run() -> list[tuple[str, dict[str, Any]]]:
        client = AsyncClient(broker.address)
        try:
            await client.send("orders", b"x", confirm=True)
            asked = ["stats", "schedule-list", "queue-peek"] * 5
            answers = await asyncio.gather(
                *(
                    client.admin(
                        command, timeout=10, **({"queue": "orders"} if "peek" in command else {})
                    )
                    for command in asked
                )
            )
            return list(zip(asked, answers, strict=True))
        finally:
            await client.close()

    for command, answer in asyncio.run(run()):
        expected = {"stats": "counters", "schedule-list": "schedules", "queue-peek": "entries"}
        assert expected[command] in answer, (command, sorted(answer))


def test_a_command_that_waited_its_whole_timeout_for_the_client_is_not_sent(
    broker: BrokerProcess,
) -> None:
    """A purge queued behind another command of the same client for longer than its timeout
    is refused without being sent: no one would be waiting for its answer, so the caller
    must be able to tell that it did not run."""

    def ready() -> int:
        return broker.stats()["queues"]["orders"]["ready"]

    with Client(broker.address) as client:
        client.send("orders", b"x", confirm=True)
        failures: list[BaseException] = []

        def purge() -> None:
            try:
                client.admin("queue-purge", timeout=0.3, queue="orders")
            except ClientError as exc:
                failures.append(exc)

        with client._lock:  # another thread's command holds the client
            waiting = threading.Thread(target=purge)
            waiting.start()
            time.sleep(2.0)  # far past the purge's timeout, however late its thread runs
        waiting.join(10)
        assert len(failures) == 1 and "was not sent" in str(failures[0])
    assert ready() == 1

    async def run() -> None:
        client = AsyncClient(broker.address)
        try:
            async with client._admin_lock:  # another task's command holds the client
                purge = asyncio.create_task(
                    client.admin("queue-purge", timeout=0.3, queue="orders")
                )
                await asyncio.sleep(2.0)
            with pytest.raises(ClientError, match="was not sent"):
                await purge
        finally:
            await client.close()

    asyncio.run(run())
    assert ready() == 1
