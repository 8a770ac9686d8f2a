"""What forwarding costs (docs/cluster.md "Forwarding"): the same stock-protocol producer and
consumer (raw DEALERs, no HELLO) work on queues that shard local/1 owns, once connected to
local/1 itself (direct) and once to local/0 (every message, dispatch and ack forwarded over
the link). Printed: msgs/s and the CPU both shards spend per message, and the ratio of the
two costs (target ≤ 1.3, issue #32). Also each shard's part: local/0's, nothing when direct,
is what forwarding adds, and steadier than the ratio, whose owner's part swings ±15% between
runs on a shared machine. Nothing is asserted.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import msgspec
import zmq

from ..protocol import Ack, Consume, Dispatch, Hello, Send, decode_frame, encode, encode_all
from ..protocol.cluster import ClusterMap
from ..testing import BrokerProcess, free_ports
from .shard_cpu import cpu_seconds, shard_pids

BATCH = 256
MAX_LEAD = 5_000
WINDOW = 500


def _dealer(address: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 1000
    sock.connect(address)
    return sock


def _producer(address: str, queues: list[str], seconds: float, consumed: Any) -> None:
    sock = _dealer(address)
    frames = [encode_all([Send(queue, b"x" * 100)] * BATCH) for queue in queues]
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        while sent - consumed.value > MAX_LEAD and time.monotonic() < end:
            time.sleep(0.0002)
        sock.send(frames[(sent // BATCH) % len(frames)])
        sent += BATCH
    sock.close()


def _consumer(address: str, queues: list[str], seconds: float, consumed: Any, out: Any) -> None:
    sock = _dealer(address)
    sock.send(encode_all([Consume(queue, WINDOW) for queue in queues]))
    received = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not sock.poll(100):
            continue
        messages, _ = decode_frame(sock.recv())
        acks = [Ack(m.queue, m.message_id) for m in messages if type(m) is Dispatch]
        if acks:
            sock.send(encode_all(acks))
            received += len(acks)
            consumed.value = received
    sock.close()
    out.put(received)


def _owner_map(address: str) -> ClusterMap:
    sock = _dealer(address)
    sock.send(encode(Hello({})))
    if not sock.poll(10_000):
        raise RuntimeError(f"no HELLO answer from {address}")
    [answer], _ = decode_frame(sock.recv())
    sock.close()
    return msgspec.convert(answer.options["cluster"], ClusterMap)  # type: ignore[union-attr]


def _run(broker: BrokerProcess, at: str, queues: list[str], seconds: float) -> dict[str, Any]:
    pids = shard_pids(broker, 2)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    consumed = ctx.Value("q", 0, lock=False)
    processes = [
        ctx.Process(target=_consumer, args=(at, queues, seconds, consumed, out)),
        ctx.Process(target=_producer, args=(at, queues, seconds, consumed)),
    ]
    before = [cpu_seconds(pid) for pid in pids]
    started = time.monotonic()
    for process in processes:
        process.start()
    received = out.get(timeout=seconds + 60)
    elapsed = time.monotonic() - started
    cpu = [cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
    for process in processes:
        process.join(30)
    per_message = [1e6 * c / received if received else 0.0 for c in cpu]
    return {
        "received": received,
        "msgs_per_s": received / elapsed,
        "us_per_message": sum(per_message),
        "us_per_message_by_shard": per_message,
    }


def run_forwarding(seconds: float, queue_count: int = 8) -> dict[str, Any]:
    """Direct, then forwarded, on one 2-shard broker; their figures."""
    address = free_ports(2)
    with BrokerProcess("--log-level", "INFO", "--shards", "2", address=address) as broker:
        mapping = _owner_map(address)
        owner = mapping.shards[1]
        names = (f"fwd-{index}" for index in range(10_000))
        queues = [n for n in names if mapping.owner(n).name == owner.name][: 2 * queue_count]
        entry = mapping.shards[0].address
        direct = _run(broker, owner.address, queues[:queue_count], seconds)
        forwarded = _run(broker, entry, queues[queue_count:], seconds)
    ratio = forwarded["us_per_message"] / direct["us_per_message"] if direct["received"] else 0.0
    return {"direct": direct, "forwarded": forwarded, "cost_ratio": ratio}
