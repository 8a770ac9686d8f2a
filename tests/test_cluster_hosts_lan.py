"""Several hosts from one cluster file, on a LAN of namespaces (issue #18 part 4): nodes a and
b each run a broker from the same file; a stock-protocol peer on a third node talks to a only
and uses the queues of both; b cut off makes only b's queues fail, with 503 naming b/0, and
once the link is back they work again."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import lan
from lan import LanBroker

# The LAN tests build network namespaces and run brokers in them: one LAN at a time.
pytestmark = pytest.mark.xdist_group("lan")

#: Run in the client node: a raw DEALER (HELLO with confirms, no map) at node a sends one
#: message to each queue, consumes them all and acks; prints what it got, and each queue's
#: answer to one more send ("ok" or the ERROR's code and reason).
PEER = """
import json, sys, time
import zmq
import phpmq.protocol as p
address, queues = sys.argv[1], sys.argv[2:]
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.linger = 0
sock.connect(address)
def read(seconds):
    if not sock.poll(int(seconds * 1000)):
        return []
    return p.decode_frame(sock.recv())[0]
sock.send(p.encode(p.Hello({"confirm": True})))
read(5)
if queues[0] == "--probe":
    queues = queues[1:]
    answers = {}
    for tag, queue in enumerate(queues, 1):
        sock.send(p.encode(p.Send(queue, b"probe", tag=tag)))
    deadline = time.monotonic() + 8
    while len(answers) < len(queues) and time.monotonic() < deadline:
        for m in read(1):
            if type(m) is p.Confirm:
                answers[queues[m.tag - 1]] = "ok"
            elif type(m) is p.Error:
                answers[m.queue] = f"{m.code} {m.reason}"
    print(json.dumps(answers))
    raise SystemExit(0)
sock.send(p.encode_all([p.Send(q, q.encode(), tag=i) for i, q in enumerate(queues, 1)]))
sock.send(p.encode_all([p.Consume(q, 10) for q in queues]))
got, confirmed = {}, 0
deadline = time.monotonic() + 20
while (len(got) < len(queues) or confirmed < len(queues)) and time.monotonic() < deadline:
    for m in read(1):
        if type(m) is p.Dispatch:
            got[m.queue] = m.content.decode()
            sock.send(p.encode(p.Ack(m.queue, m.message_id)))
        elif type(m) is p.Confirm:
            confirmed += 1
print(json.dumps({"got": got, "confirmed": confirmed}))
"""

QUEUES = [f"jobs-{i}" for i in range(8)]


def _peer(node: lan.Node, *args: str) -> dict:
    done = node.run([sys.executable, "-c", PEER, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_two_hosts_from_one_file_and_one_cut_off(lan_capable: None, tmp_path: Path) -> None:
    with lan.lan(3, prefix="pch") as net:
        node_a, node_b, client = net.nodes
        cluster = tmp_path / "cluster.toml"
        cluster.write_text(
            "epoch = 1\n"
            f'[[nodes]]\nname = "a"\naddress = "tcp://{node_a.address}:5555"\nshards = 1\n'
            f'[[nodes]]\nname = "b"\naddress = "tcp://{node_b.address}:5555"\nshards = 1\n'
        )
        secret = tmp_path / "link.toml"  # without CURVE, links prove themselves with it
        secret.write_text('link_secret = "the-same-on-every-node"\n')
        flags = ("--cluster-file", str(cluster), "--config", str(secret))
        broker_a = LanBroker(node_a, *flags, "--node", "a", log_path=tmp_path / "a.log")
        broker_b = LanBroker(node_b, *flags, "--node", "b", log_path=tmp_path / "b.log")
        try:
            result = _peer(client, broker_a.address, *QUEUES)
            assert result == {"got": {q: q for q in QUEUES}, "confirmed": len(QUEUES)}, (
                broker_a.log() + broker_b.log()
            )
            net.link_down(node_b)
            try:
                answers = _wait_for_refusal(client, broker_a.address)
            finally:
                net.link_up(node_b)
            refused = {q: a for q, a in answers.items() if a != "ok"}
            assert refused and len(refused) < len(QUEUES), answers
            assert all(a.startswith("503 ") and "shard b/0" in a for a in refused.values())
            healed: dict[str, str] = {}
            deadline = time.monotonic() + 30  # the link's reconnect back-off, under load too
            while time.monotonic() < deadline:
                healed = _peer(client, broker_a.address, "--probe", *QUEUES)
                if all(a == "ok" for a in healed.values()) and len(healed) == len(QUEUES):
                    break
                time.sleep(0.5)
            assert set(healed.values()) == {"ok"}, healed
        finally:
            assert broker_a.stop() == 0, broker_a.log()
            assert broker_b.stop() == 0, broker_b.log()


def _wait_for_refusal(client: lan.Node, address: str) -> dict[str, str]:
    answers: dict[str, str] = {}
    for _ in range(10):
        answers = _peer(client, address, "--probe", *QUEUES)
        if any(a.startswith("503") for a in answers.values()):
            return answers
    return answers
