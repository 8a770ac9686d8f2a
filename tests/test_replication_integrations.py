"""What runs on top of a replicated cluster keeps working through a failover (issue #30, item
7): the worker pool and a bridge, with real processes on loopback (three nodes, every shard on
all three, tests/replicated_cluster.py).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import zmq
from test_bridges import Bridge, bound
from test_pool import FAST, PoolProcess

from phpmq import Client, ClientError
from replicated_cluster import Producer, replicated_cluster

pytestmark = [pytest.mark.xdist_group("replication-b"), pytest.mark.timeout(240)]


class _Entry:
    """What PoolProcess needs of a broker: the address it is started with and a log."""

    def __init__(self, address: str, log: str) -> None:
        self.address = address
        self._log = log

    def log(self) -> str:
        return self._log


def test_a_worker_pool_handles_every_confirmed_message_through_a_failover(
    tmp_path: Path,
) -> None:
    """A pool of two workers consumes a queue of shard b/0 while node b, the home of b/0's
    leader, dies with kill -9: the pool's connections go to the new leader, which hands out
    again what the dead one had handed out and not seen acked; every message confirmed
    before or after the kill is handled (at least once; the duplicates are counted)."""
    with replicated_cluster(tmp_path) as cluster:
        leaders = cluster.wait_for_leaders(at_home=True)
        queue = cluster.queue_of("b/0")
        producer = Producer(cluster.address("a"))
        for i in range(60):
            assert producer.send(queue, f"before-{i}", time.monotonic() + 10)
        pool = PoolProcess(
            tmp_path,
            _Entry(cluster.address("a"), cluster.log("b")),  # type: ignore[arg-type]
            "slow",
            "-q", queue, "-p", "2", "--prefetch", "2", *FAST,
            env={"POOL_SLEEP": "0.05"},
        )  # fmt: skip
        try:
            pool.wait_for(lambda: len(pool.records("end")) >= 10, 60, "10 messages handled")
            cluster.kill_node(leaders["b/0"].node)
            killed_at = time.monotonic()
            for i in range(20):
                assert producer.send(queue, f"after-{i}", killed_at + 60)
            expected = set(producer.confirmed)

            def all_handled() -> bool:
                return expected <= {record["content"] for record in pool.records("end")}

            pool.wait_for(all_handled, 120, "every confirmed message handled")
            handled = Counter(record["content"] for record in pool.records("end"))
            print(
                f"{len(expected)} confirmed, all handled {time.monotonic() - killed_at:.1f} s"
                f" after the kill; {sum(handled.values()) - len(handled)} handled twice"
            )
            assert set(handled) <= expected  # nothing handled that was never sent
        finally:
            pool.stop()


def test_a_push_out_bridge_goes_on_pushing_after_its_shards_leader_dies(tmp_path: Path) -> None:
    """`phpmq bridge push-out` drains a queue of shard b/0 into a PULL socket; node b, the
    home of b/0's leader, dies with kill -9; what is sent after the failover is pushed too
    (push-out is at most once past the bridge: what was in flight at the kill may come twice
    or, in ZeroMQ's buffers, not at all, so only the later messages are counted)."""
    with replicated_cluster(tmp_path) as cluster, zmq.Context() as context:
        leaders = cluster.wait_for_leaders(at_home=True)
        queue = cluster.queue_of("b/0")
        pull, address = bound(context, zmq.PULL, linger=0)
        entry = _Entry(cluster.address("a"), "")
        bridge = Bridge(tmp_path / "bridge.log", entry, "push-out", queue, address)  # type: ignore[arg-type]
        try:
            producer = Producer(cluster.address("a"))
            for i in range(20):
                assert producer.send(queue, f"before-{i}", time.monotonic() + 10)
            got = set()
            while len(got) < 20:
                assert pull.poll(30_000), f"only {len(got)} of 20 pushed before the kill"
                got.add(pull.recv().decode())
            cluster.kill_node(leaders["b/0"].node)
            killed_at = time.monotonic()
            after = {f"after-{i}" for i in range(20)}
            for key in sorted(after):
                assert producer.send(queue, key, killed_at + 60)
            while not after <= got:
                assert pull.poll(60_000), (
                    f"missing after the failover: {sorted(after - got)}\n{bridge.log()[-3000:]}"
                )
                got.add(pull.recv().decode())
            print(f"pushed again {time.monotonic() - killed_at:.1f} s after the kill")
        finally:
            bridge.stop()
            pull.close()


def test_requests_are_answered_again_soon_after_their_shards_leader_dies(tmp_path: Path) -> None:
    """A worker pool answers requests on a queue of shard b/0 (docs/client.md "Requests and
    replies") through node a; node b, the home of b/0's leader, dies with kill -9. A request
    in flight then may time out or be lost (its caller asks again); the requests after the
    failover are answered, each with its own reply."""
    with replicated_cluster(tmp_path) as cluster:
        leaders = cluster.wait_for_leaders(at_home=True)
        queue = cluster.queue_of("b/0")
        pool = PoolProcess(
            tmp_path,
            _Entry(cluster.address("a"), cluster.log("b")),  # type: ignore[arg-type]
            "answer",
            "-q", queue, "-p", "2", *FAST,
        )  # fmt: skip
        try:
            with Client(cluster.address("a"), confirm_timeout=2) as client:
                for i in range(20):
                    assert (
                        client.request(queue, f"before-{i}", timeout=10) == f"BEFORE-{i}".encode()
                    )
                cluster.kill_node(leaders["b/0"].node)
                killed_at = time.monotonic()
                answered, failed = [], 0
                while len(answered) < 20 and time.monotonic() < killed_at + 60:
                    content = f"after-{len(answered)}"
                    try:
                        reply = client.request(queue, content, timeout=2)
                    except ClientError:  # timed out, lost, or refused between leaders
                        failed += 1
                        continue
                    assert reply == content.upper().encode()
                    answered.append(time.monotonic() - killed_at)
            assert len(answered) == 20, f"{len(answered)} answered in 60 s after the kill"
            print(
                f"the first request answered {answered[0]:.1f} s after the kill"
                f" ({failed} asked again); 20 answered within {answered[-1]:.1f} s"
            )
        finally:
            pool.stop()
