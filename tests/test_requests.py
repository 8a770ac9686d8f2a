"""Requests and replies end to end (docs/protocol.md §6.6): a real broker, a real worker pool
running `pool_tasks:answer`, and either client (`connect`, tests/driven.py) as the requester.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from driven import Connect
from test_pool import FAST, PoolProcess, start_pool

from harness import BrokerProcess, phpmq, raw_dealer, recv_messages, wait_for
from phpmq import protocol as p
from phpmq.client import (
    AsyncClient,
    BrokerRefused,
    Client,
    ReplyError,
    RequestLost,
    RequestTimeout,
)

__all__ = ["start_pool"]  # a fixture (tests/test_pool.py)


def answering(start_pool: Callable[..., PoolProcess], *args: str, **options: Any) -> PoolProcess:
    """A pool answering requests on `rpc`, once its workers consume it."""
    pool = start_pool("answer", "-q", "rpc", *FAST, *args, **options)
    # A request sent before the pool consumes could expire (its TTL) before any worker sees it.
    pool.wait_for(lambda: consumers(pool.broker, "rpc") > 0, 20, "the pool to consume rpc")
    return pool


def consumers(broker: BrokerProcess, queue: str) -> int:
    return int(broker.stats()["queues"].get(queue, {}).get("consumers", 0))


def dropped_by_broker(broker: BrokerProcess) -> int:
    return int(broker.stats()["counters"]["replies_dropped"])


def test_replies_carry_what_the_handler_returned(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess], connect: Connect
) -> None:
    answering(start_pool)
    with connect(broker.address) as client:
        assert client.request("rpc", "hello", timeout=20) == b"HELLO"
        answer = client.request("rpc", "json-1", reply_format="json")
        assert answer["echo"] == "json-1"
        assert client.request("rpc", "json-2", reply_format="msgpack")["echo"] == "json-2"
        assert client.replies_dropped == 0


def test_an_error_reply_carries_the_exceptions_type_and_text(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess], connect: Connect
) -> None:
    pool = answering(start_pool)
    with connect(broker.address) as client:
        with pytest.raises(ReplyError) as failed:
            client.request("rpc", "fail-7", timeout=20)
        error = failed.value
        assert (error.code, error.type_name, error.text) == (
            500,
            "ValueError",
            "cannot answer fail-7",
        )
        assert client.request("rpc", "next") == b"NEXT"  # the worker goes on
    assert [r["delivery"] for r in pool.records() if r["content"] == "fail-7"] == [1]  # no retry


def test_many_concurrent_requests_each_get_their_own_reply(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    answering(start_pool, "-p", "4", "--prefetch", "8")

    async def main() -> list[Any]:
        async with AsyncClient(broker.address) as client:
            contents = [f"m-{i}" for i in range(300)]
            replies = await asyncio.gather(*(client.request("rpc", c, 20) for c in contents))
            assert client.replies_dropped == 0
            return [(c, r) for c, r in zip(contents, replies, strict=True)]

    pairs = asyncio.run(main())
    assert all(reply == content.upper().encode() for content, reply in pairs)

    # Two blocking clients in two threads, interleaved on the same queue.
    def requester(name: str, out: list[bytes]) -> None:
        with Client(broker.address) as client:
            out.extend(client.request("rpc", f"{name}-{i}", 20) for i in range(50))

    outs: dict[str, list[bytes]] = {"a": [], "b": []}
    threads = [threading.Thread(target=requester, args=item) for item in outs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for name, out in outs.items():
        assert out == [f"{name.upper()}-{i}".encode() for i in range(50)]


def test_a_worker_killed_mid_request_still_gives_exactly_one_reply(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess], connect: Connect
) -> None:
    pool = answering(start_pool, env={"POOL_SLEEP": "1.0"})
    killed: list[int] = []

    def kill_the_first_worker() -> None:
        record = pool.wait_for(lambda: pool.records(), 20, "the request to start")[0]
        os.kill(record["pid"], signal.SIGKILL)
        killed.append(record["pid"])

    killer = threading.Thread(target=kill_the_first_worker)
    killer.start()
    with connect(broker.address) as client:
        assert client.request("rpc", "sleep-once", timeout=30) == b"SLEEP-ONCE"
        killer.join(30)
        time.sleep(0.3)
        client.flush()  # read whatever else came: no second reply
        assert client.replies_dropped == 0
    records = pool.records()
    assert [r["delivery"] for r in records] == [1, 2], pool.failure("deliveries")
    assert records[1]["pid"] not in killed
    assert dropped_by_broker(broker) == 0


def test_a_requester_that_left_costs_a_count_and_nothing_else(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess], connect: Connect
) -> None:
    pool = answering(start_pool, env={"POOL_SLEEP": "0.5"})
    with connect(broker.address) as gone, pytest.raises(RequestTimeout):
        gone.request("rpc", "sleep-left", timeout=0.1)
    pool.wait_for(lambda: dropped_by_broker(broker) == 1, 10, "the broker to drop the reply")
    with connect(broker.address) as client:
        assert client.request("rpc", "still") == b"STILL"
    assert dropped_by_broker(broker) == 1


def test_a_timed_out_requests_late_reply_is_dropped_by_the_client(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess], connect: Connect
) -> None:
    answering(start_pool, "-p", "2", env={"POOL_SLEEP": "0.5"})
    with connect(broker.address) as client:
        started = time.monotonic()
        with pytest.raises(RequestTimeout) as timed_out:
            client.request("rpc", "sleep-late", timeout=0.2)
        assert isinstance(timed_out.value, TimeoutError)
        assert time.monotonic() - started < 1.5
        deadline = time.monotonic() + 10
        while client.replies_dropped == 0 and time.monotonic() < deadline:
            client.flush()
            time.sleep(0.05)
        assert client.replies_dropped == 1
        assert client.request("rpc", "after") == b"AFTER"  # the late reply was not this one
    assert dropped_by_broker(broker) == 0  # the broker delivered it; the client dropped it


def test_a_request_no_worker_takes_times_out_and_expires(
    broker: BrokerProcess, connect: Connect
) -> None:
    client = connect(broker.address)
    with pytest.raises(RequestTimeout, match=r"within 0\.3s"):
        client.request("nobody", "x", timeout=0.3)
    wait_for(
        lambda: not broker.stats()["queues"].get("nobody", {}).get("ready", 0),
        "the request expired with its TTL",
        timeout=5,
    )


def test_a_lost_broker_fails_a_pending_request_instead_of_hanging(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address, heartbeat_ms=100, liveness=2) as client:
        assert client.admin("stats")  # greeted
        broker.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(RequestLost, match="no reply will come"):
                client.request("rpc", "x", timeout=20)
            assert time.monotonic() - started < 5
        finally:
            broker.signal(signal.SIGCONT)


def test_a_stock_consumer_consumes_a_request(broker: BrokerProcess) -> None:
    outcome: list[BaseException] = []

    def requester() -> None:
        with Client(broker.address) as client:
            try:
                client.request("rpc", "for-anyone", timeout=3)
            except RequestTimeout as exc:
                outcome.append(exc)

    thread = threading.Thread(target=requester)
    thread.start()
    with raw_dealer(broker.address) as consumer:
        consumer.send(p.encode(p.Consume("rpc", 1)))  # a stock peer: no HELLO, no extensions
        [dispatch] = recv_messages(consumer)
        assert isinstance(dispatch, p.Dispatch)
        assert (dispatch.queue, dispatch.content) == ("rpc", b"for-anyone")
        assert dispatch.reply_to is None and dispatch.correlation is None
        consumer.send(p.encode(p.Ack("rpc", dispatch.message_id)))
        thread.join(10)
    assert len(outcome) == 1  # no reply: the stock consumer knows nothing of them
    assert broker.stats()["queues"]["rpc"]["ready"] == 0


def test_phpmq_request_prints_the_reply_or_one_line(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    answering(start_pool)
    at = ("--broker", broker.address)
    done = phpmq("request", *at, "rpc", "hello")
    assert (done.returncode, done.stdout, done.stderr) == (0, "HELLO\n", "")
    done = phpmq("request", *at, "--format", "json", "rpc", "json-cli")
    assert done.returncode == 0 and '"echo":"json-cli"' in done.stdout
    done = phpmq("request", *at, "rpc", "-", stdin="from stdin")
    assert done.stdout == "FROM STDIN\n"
    failed = phpmq("request", *at, "rpc", "fail-cli")
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr == "phpmq: ValueError: cannot answer fail-cli\n"
    timed_out = phpmq("request", *at, "--timeout", "0.3", "nobody", "x")
    assert timed_out.returncode == 1
    assert timed_out.stderr == "phpmq: no reply from a worker of nobody within 0.3s\n"
    bad = phpmq("request", *at, "bad queue", "x")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_a_refused_request_raises_broker_refused(tmp_path: Any, connect: Connect) -> None:
    full = BrokerProcess(tmp_path / "full.log", "--max-queue-length", "1")
    try:
        with full.client() as producer:
            producer.send("rpc", b"fills it", confirm=True)
        with connect(full.address, send_timeout=1) as client:
            with pytest.raises(BrokerRefused) as refused:
                client.request("rpc", "one too many", timeout=5)
            assert refused.value.error.code == 429
            assert client.replies_dropped == 0
    finally:
        full.stop()


def test_closing_the_async_client_fails_its_pending_requests(broker: BrokerProcess) -> None:
    async def main() -> list[Any]:
        client = AsyncClient(broker.address)
        pending = [asyncio.ensure_future(client.request("nobody", f"{i}", 20)) for i in range(5)]
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await client.close()
        outcomes = await asyncio.gather(*pending, return_exceptions=True)
        assert time.monotonic() - started < 3
        return outcomes

    outcomes = asyncio.run(main())
    assert all(isinstance(outcome, RequestLost) for outcome in outcomes), outcomes
