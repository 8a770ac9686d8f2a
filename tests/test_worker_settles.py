"""How a worker's settles leave (workers/child.py): the acks and replies of the prefetched
jobs a worker ran back to back go out together, not a frame each; a settle held while the
next job runs long is still sent, by the client's heartbeat tick (without heartbeats none
is held)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import zmq
from test_pool import PoolProcess, start_pool

from harness import BrokerProcess
from phpmq import protocol as p
from phpmq.client import AsyncClient

__all__ = ["start_pool"]  # a fixture (tests/test_pool.py)

JOBS = 16


@pytest.fixture
def fake_broker() -> Iterator[tuple[zmq.Socket, str]]:
    """A bare ROUTER the pool connects to as if it were the broker."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.linger = 0
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield sock, f"tcp://127.0.0.1:{port}"
    finally:
        sock.close(linger=0)


def _until_consuming(sock: zmq.Socket, queue: str, timeout: float) -> bytes:
    """The routing id of the first peer that consumes `queue`, HELLOs answered meanwhile."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if not sock.poll(int(left * 1000)):
            break
        peer, frame = sock.recv_multipart()
        messages, _ = p.decode_frame(frame)
        if any(isinstance(m, p.Hello) for m in messages):
            sock.send_multipart([peer, p.encode(p.Hello({"max_content_bytes": 1 << 20}))])
        if any(isinstance(m, p.Consume) and m.queue == queue and m.count for m in messages):
            return peer
    raise AssertionError(f"no worker consumed {queue} within {timeout}s")


def _pool(tmp_path: Path, address: str, handler: str) -> PoolProcess:
    """One worker of `handler` on `rpc`, prefetch JOBS, at the bare ROUTER `address`."""
    broker = SimpleNamespace(address=address, log=lambda: "(a bare ROUTER: no log)")
    # Settles are held only with heartbeats; one every 10 s: the bare ROUTER answers none.
    return PoolProcess(
        tmp_path, broker, handler, "-q", "rpc", "-p", "1", "--prefetch", str(JOBS),  # type: ignore[arg-type]
        "--heartbeat-ms", "10000", "--summary-seconds", "0.5",
    )  # fmt: skip


def _request(number: int, delivery: int = 1) -> p.Dispatch:
    return p.Dispatch(
        "rpc", b"x", b"%032x" % number, 60, delivery, reply_to="", correlation=str(number)
    )


def _reply_frames(sock: zmq.Socket, worker: bytes, requests: list[p.Dispatch]) -> list[set]:
    """Dispatch `requests` in one frame; the IDs each frame of replies answered, in order."""
    sock.send_multipart([worker, p.encode_all(requests)])
    frames: list[set] = []
    replied = 0
    deadline = time.monotonic() + 20
    while replied < len(requests) and (left := deadline - time.monotonic()) > 0:
        if not sock.poll(int(left * 1000)):
            break
        _, frame = sock.recv_multipart()
        ids = {m.message_id for m in p.decode_frame(frame)[0] if isinstance(m, p.Reply)}
        if ids:
            frames.append(ids)
            replied += len(ids)
    assert set().union(*frames) == {r.message_id for r in requests}
    return frames


@pytest.mark.parametrize("handler", ["answer", "async_answer"])
def test_the_replies_of_jobs_run_back_to_back_share_frames(
    fake_broker: tuple[zmq.Socket, str], tmp_path: Path, handler: str
) -> None:
    sock, address = fake_broker
    pool = _pool(tmp_path, address, handler)
    try:
        worker = _until_consuming(sock, "rpc", 20)
        frames = _reply_frames(sock, worker, [_request(number) for number in range(JOBS)])
        # A frame each before; together here, split only where the machine paused the worker
        # for a millisecond between two jobs.
        assert len(frames) <= JOBS // 2, f"{JOBS} replies came in {len(frames)} frames"
    finally:
        _stop_answering_goodbyes(pool, sock)


def test_held_replies_go_before_a_redelivery_runs(
    fake_broker: tuple[zmq.Socket, str], tmp_path: Path
) -> None:
    """A redelivery may be the message that killed a worker: what the jobs before it settled
    is sent first, not lost with the worker."""
    sock, address = fake_broker
    pool = _pool(tmp_path, address, "answer")
    try:
        worker = _until_consuming(sock, "rpc", 20)
        firsts, again = [_request(number) for number in range(4)], _request(9, delivery=2)
        frames = _reply_frames(sock, worker, [*firsts, again])
        both = {firsts[-1].message_id, again.message_id}
        assert not [ids for ids in frames if both <= ids], frames
    finally:
        _stop_answering_goodbyes(pool, sock)


def _stop_answering_goodbyes(pool: PoolProcess, sock: zmq.Socket) -> None:
    """Stop the pool, its workers' goodbyes answered (KBAI) as a broker would, or each would
    wait out its close timeout; the socket is this thread's until the pool is gone."""
    stopped = threading.Event()

    def answer() -> None:
        while not stopped.is_set():
            if sock.poll(50):
                peer, frame = sock.recv_multipart()
                if any(isinstance(m, p.Disconnect | p.Kbai) for m in p.decode_frame(frame)[0]):
                    sock.send_multipart([peer, p.encode(p.Kbai())])

    answering = threading.Thread(target=answer)
    answering.start()
    try:
        pool.stop()
    finally:
        stopped.set()
        answering.join(5)


@pytest.mark.parametrize("heartbeat_ms", ["200", "0"])
def test_a_reply_is_not_held_behind_a_job_that_hangs(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess], heartbeat_ms: str
) -> None:
    """With heartbeats the client's tick sends the held reply; without, none is held."""
    pool = start_pool("answer", "-q", "rpc", "-p", "1", "--prefetch", "4",
                      "--heartbeat-ms", heartbeat_ms, "--summary-seconds", "0.5",
                      env={"POOL_SLEEP": "4"})  # fmt: skip
    pool.wait_for(lambda: broker.stats()["queues"].get("rpc", {}).get("consumers"), 20, "consume")

    async def main() -> float:
        async with AsyncClient(broker.address) as client:
            started = time.monotonic()
            # One frame: the broker dispatches both in one, and the worker runs `quick` first.
            quick = asyncio.ensure_future(client.request("rpc", "quick", 20))
            hangs = asyncio.ensure_future(client.request("rpc", "sleep", 20))
            assert await quick == b"QUICK"
            took = time.monotonic() - started
            hangs.cancel()
            return took

    took = asyncio.run(main())
    # The worker records `sleep` as it starts it, after it sent `quick`'s reply: under load
    # that can come after the reply did.
    records = pool.wait_for(lambda: (r := pool.records())[1:] and r, 3, "the second job's start")
    os.killpg(pool.pid, signal.SIGKILL)  # not to wait for the job to end
    assert [r["content"] for r in records[:2]] == ["quick", "sleep"], pool.failure("order")
    assert took < 2, f"the reply waited {took:.1f}s behind a job that hangs for 4s"
