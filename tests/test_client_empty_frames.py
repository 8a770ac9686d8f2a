"""No client call pattern sends an empty frame (issue 33, item 2).

A fresh client owes the broker its greeting; every call that needs the broker's HELLO answer
first sends the greeting alone. Concurrent calls on a new AsyncClient used to each find the
greeting still owed, and all but the first then sent an empty frame (`400 empty frame`, the
broker's `errors` counter up by one each). The asyncio tests make the race certain: the calls
are all waiting before the broker starts listening. The broker's `errors` counter must stay 0,
and the client must log no "empty frame".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from harness import BrokerProcess, free_port
from phpmq.client import AsyncClient, Client

CALLS = 64
#: Long enough for the calls to wait on a broker that is still starting.
SEND_TIMEOUT_S = 30.0


class LateBroker:
    """A broker address whose broker starts only when `start()` is called."""

    def __init__(self, log_path: Path) -> None:
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.log_path = log_path
        self.process: BrokerProcess | None = None

    def start(self) -> BrokerProcess:
        self.process = BrokerProcess(self.log_path, "--grace-seconds", "2", address=self.address)
        return self.process


def _assert_no_empty_frame(broker: BrokerProcess, caplog: pytest.LogCaptureFixture) -> None:
    assert broker.stats()["counters"]["errors"] == 0
    assert "empty frame" not in caplog.text
    assert "empty frame" not in broker.log()


@pytest.fixture
def late_broker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[LateBroker]:
    caplog.set_level(logging.WARNING, logger="phpmq.client")
    late = LateBroker(tmp_path / "broker.log")
    try:
        yield late
        assert late.process is not None, "the test never started the broker"
        _assert_no_empty_frame(late.process, caplog)
    finally:
        if late.process is not None:
            late.process.stop()


@pytest.fixture
def quiet_broker(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> Iterator[BrokerProcess]:
    """The broker, checked after the test: no refused frame, and no client told of one."""
    caplog.set_level(logging.WARNING, logger="phpmq.client")
    yield broker
    _assert_no_empty_frame(broker, caplog)


async def _when_broker_starts(late: LateBroker, calls: Awaitable[list]) -> list:
    """Let every call reach its wait for the broker, start the broker, and gather them."""
    gathered = asyncio.ensure_future(calls)
    await asyncio.sleep(0.2)
    assert not gathered.done()
    await asyncio.to_thread(late.start)
    return await gathered


async def _replying_worker(address: str, queue: str, replies: int) -> None:
    async with AsyncClient(address, name="worker") as worker:
        answered = 0
        async for message in worker.consume(queue, window=CALLS, timeout=10):
            await message.reply(b"ok " + message.content)
            answered += 1
            if answered == replies:
                return


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_async_gather_of_requests_on_a_fresh_client(late_broker: LateBroker) -> None:
    async def scenario() -> None:
        async with AsyncClient(late_broker.address, send_timeout=SEND_TIMEOUT_S) as client:
            requests = asyncio.gather(
                *(client.request("resize", f"img-{n}", timeout=20) for n in range(CALLS))
            )
            gathered = asyncio.ensure_future(requests)
            await asyncio.sleep(0.2)
            await asyncio.to_thread(late_broker.start)
            worker = asyncio.create_task(_replying_worker(late_broker.address, "resize", CALLS))
            replies = await gathered
            await worker
        assert replies == [b"ok img-%d" % n for n in range(CALLS)]

    _run(scenario)


def test_async_gather_of_confirmed_sends_on_a_fresh_client(late_broker: LateBroker) -> None:
    async def scenario() -> None:
        async with AsyncClient(late_broker.address, send_timeout=SEND_TIMEOUT_S) as client:
            sends = (client.send("orders", b"order %d" % n, confirm=True) for n in range(CALLS))
            ids = await _when_broker_starts(late_broker, asyncio.gather(*sends))
        assert len(set(ids)) == CALLS

    _run(scenario)
    assert late_broker.process is not None
    assert late_broker.process.stats()["queues"]["orders"]["ready"] == CALLS


def test_async_sends_admin_and_consume_at_once_on_a_fresh_client(
    late_broker: LateBroker,
) -> None:
    async def consume_all(client: AsyncClient) -> int:
        taken = 0
        async for message in client.consume("jobs", window=CALLS, timeout=20):
            await message.ack()
            taken += 1
            if taken == CALLS:
                break
        return taken

    async def scenario() -> None:
        async with AsyncClient(late_broker.address, send_timeout=SEND_TIMEOUT_S) as client:
            calls = asyncio.gather(
                consume_all(client),
                client.admin("stats"),
                *(client.send("jobs", b"job %d" % n) for n in range(CALLS)),
                *(client.send("jobs-confirmed", b"x", confirm=True) for _ in range(8)),
            )
            results = await _when_broker_starts(late_broker, calls)
        assert results[0] == CALLS

    _run(scenario)


def _reply_once(address: str, queue: str) -> None:
    with Client(address, name="worker") as worker:
        message = next(worker.consume(queue, window=1, timeout=10))
        message.reply(b"ok")


@pytest.mark.parametrize(
    "first_call", ["confirmed send", "confirmed send_many", "big request", "consume", "admin"]
)
def test_blocking_client_first_calls(quiet_broker: BrokerProcess, first_call: str) -> None:
    """The blocking client's calls that may send the greeting alone, each as a fresh
    client's first call (a request over 64 KiB waits for the broker's limits first)."""
    address = quiet_broker.address
    with Client(address) as client:
        if first_call == "confirmed send":
            assert client.send("orders", b"order", confirm=True)
        elif first_call == "confirmed send_many":
            assert all(client.send_many("orders", [b"a", b"b"], confirm=True))
        elif first_call == "big request":
            worker = threading.Thread(target=_reply_once, args=(address, "resize"))
            worker.start()
            assert client.request("resize", b"x" * 70_000, timeout=10) == b"ok"
            worker.join(10)
        elif first_call == "consume":
            with Client(address) as producer:
                producer.send("jobs", b"job")
            next(client.consume("jobs", window=4, timeout=5)).ack()
        elif first_call == "admin":
            assert "counters" in client.admin("stats")
