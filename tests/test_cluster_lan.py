"""A sharded broker on a LAN of namespaces (issue #18): a client on another node reads the
cluster map from the HELLO answer and sends to and consumes from each queue's owner across
the LAN; a shard killed with -9 inside its node comes back with its confirmed messages."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

import lan
from lan import LanBroker
from phpmq.broker.shell.shards import started_pids

#: Run inside the client node: send one confirmed message to each queue at its owner (from
#: the map in the HELLO answer), print {queue: owner name}.
SEND = """
import json, sys
from phpmq.client import Client
address, queues = sys.argv[1], sys.argv[2:]
with Client(address) as probe:
    probe.admin("stats")
    mapping = probe.cluster_map
owners = {}
for queue in queues:
    shard = mapping.owner(queue)
    with Client(shard.address) as client:
        client.send(queue, queue.encode(), confirm=True)
    owners[queue] = shard.name
print(json.dumps(owners))
"""

#: Run inside the client node: take one message of each queue from its owner, print them.
TAKE = """
import json, sys
from phpmq.client import Client
address, queues = sys.argv[1], sys.argv[2:]
with Client(address) as probe:
    probe.admin("stats")
    mapping = probe.cluster_map
got = {}
for queue in queues:
    with Client(mapping.owner(queue).address) as client:
        message = next(client.consume(queue, window=1, timeout=10))
        got[queue] = message.content.decode()
        message.ack()
print(json.dumps(got))
"""

QUEUES = [f"orders-{i}" for i in range(8)]


# The LAN tests build network namespaces and run brokers in them: one LAN at a time.
pytestmark = pytest.mark.xdist_group("lan")


def _python(node: lan.Node, script: str, *args: str) -> dict:
    done = node.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_clients_across_the_lan_use_the_map_and_a_killed_shard_comes_back(
    lan_capable: None, tmp_path: Path
) -> None:
    with lan.lan(2, prefix="pcl") as net:
        server, client = net.nodes
        broker = LanBroker(
            server,
            "--shards",
            "2",
            "--data-dir",
            str(tmp_path / "data"),
            log_path=tmp_path / "broker.log",
        )
        try:
            owners = _python(client, SEND, broker.address, *QUEUES)
            assert set(owners.values()) == {"local/0", "local/1"}
            victim = started_pids(broker.log())["local/1"]
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 20
            while started_pids(broker.log())["local/1"] == victim:
                assert time.monotonic() < deadline, broker.log()
                time.sleep(0.1)
            got = _python(client, TAKE, broker.address, *QUEUES)
            assert got == {queue: queue for queue in QUEUES}
        finally:
            assert broker.stop() == 0, broker.log()
