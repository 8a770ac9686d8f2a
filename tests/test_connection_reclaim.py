"""A key (or host) whose scripts connect per task over ZeroMQ and close without KBAI (docs/
protocol.md §12.4): the broker cannot see those peers go, and each counted against the key's
quota of connections for idle_peer_seconds (300 s), so that more than about 3 such connections
a second had every client of the key refused with 429. At the quota, a new connection now
takes the place of one that has been silent for reclaim_silent_seconds (15; 1 here) without
heartbeats and holds nothing."""

from __future__ import annotations

import time
from pathlib import Path

import zmq

import phpmq.protocol as p
from harness import curve_broker, generate_keys, recv_messages
from phpmq.client import Curve, curve_keys


def hello_and_vanish(address: str, keys: Curve) -> p.Message:
    """What a bare HELLO (no heartbeats) is answered with; the socket then closes without a
    goodbye, as a one-shot script's does."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    keys.apply(sock)
    sock.connect(address)
    try:
        sock.send(p.encode(p.Hello({})))
        [answer] = recv_messages(sock)
        return answer
    finally:
        sock.close(linger=0)


def test_a_key_s_vanished_one_shot_peers_make_room_for_its_new_ones(tmp_path: Path) -> None:
    # (Loopback peers without a key count against no quota: the test needs keys.)
    keys = generate_keys(tmp_path / "keys", ["broker", "script", "ops"], ["script", "ops"])
    script = curve_keys(keys / "script.key_secret", keys / "broker.key")
    config = tmp_path / "broker.toml"
    config.write_text("quota_connections = 3\nreclaim_silent_seconds = 1\n")
    broker = curve_broker(tmp_path, keys, "--config", str(config), as_key="ops")
    with broker:
        for _ in range(3):
            assert isinstance(hello_and_vanish(broker.address, script), p.Hello)
        refused = hello_and_vanish(broker.address, script)  # the quota is full of fresh peers
        assert isinstance(refused, p.Error) and refused.code == 429
        time.sleep(1.2)
        for _ in range(3):
            assert isinstance(hello_and_vanish(broker.address, script), p.Hello)
        assert broker.stats()["counters"]["connections_reclaimed"] == 3
        assert "key 'script' at its quota of connections" in broker.log()
