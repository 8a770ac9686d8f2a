"""The shared cluster file (docs/cluster.md "Several hosts"): a bad file is refused with one
line, and two nodes started from files that disagree refuse to link, log why, and refuse the
other's queues with 503 while their own keep working."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import phpmq.protocol as p
from harness import BrokerProcess, free_port, phpmq, raw_dealer, recv_messages
from phpmq.broker.shell.cluster_file import read_cluster_file
from phpmq.broker.shell.shards import shard_address


def write(path: Path, epoch: int, port_a: int, port_b: int) -> Path:
    path.write_text(
        f"epoch = {epoch}\n"
        f'[[nodes]]\nname = "a"\naddress = "tcp://127.0.0.1:{port_a}"\n'
        f'[[nodes]]\nname = "b"\naddress = "tcp://127.0.0.1:{port_b}"\n'
    )
    return path


def test_a_bad_cluster_file_is_refused_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[nodes]]\nname = "a"\naddress = "tcp://127.0.0.1:1"\nshards = 0\n')
    done = phpmq("broker", "--cluster-file", str(bad), "--node", "a")
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "1-256 shards" in done.stderr, done.stderr
    good = write(tmp_path / "good.toml", 3, 1, 2)
    done = phpmq("broker", "--cluster-file", str(good), "--node", "z")
    assert done.returncode == 1 and "node 'z' is not in the cluster file" in done.stderr
    mapping = read_cluster_file(str(good)).cluster_map(shard_address)
    assert mapping.epoch == 3 and [s.name for s in mapping.shards] == ["a/0", "b/0"]


def test_a_cluster_file_without_curve_needs_a_link_secret(tmp_path: Path) -> None:
    good = write(tmp_path / "good.toml", 1, free_port(), free_port())
    done = phpmq("broker", "--cluster-file", str(good), "--node", "a")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "needs CURVE (--curve-secret) or a link secret" in done.stderr


def test_nodes_whose_files_disagree_refuse_to_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHPMQ_LINK_SECRET", "shared-by-both-nodes")
    port_a, port_b = free_port(), free_port()
    file_a = write(tmp_path / "a.toml", 1, port_a, port_b)
    file_b = write(tmp_path / "b.toml", 2, port_a, port_b)
    address_a, address_b = f"tcp://127.0.0.1:{port_a}", f"tcp://127.0.0.1:{port_b}"
    mapping = read_cluster_file(str(file_a)).cluster_map(shard_address)
    names = (f"q{i}" for i in range(1000))
    mine = next(n for n in names if mapping.owner(n).name == "a/0")
    theirs = next(n for n in names if mapping.owner(n).name == "b/0")
    with (
        BrokerProcess(
            tmp_path / "a.log", "--cluster-file", str(file_a), "--node", "a", address=address_a
        ) as node_a,
        BrokerProcess(
            tmp_path / "b.log", "--cluster-file", str(file_b), "--node", "b", address=address_b
        ),
    ):
        with raw_dealer(address_a) as sock:
            sock.send(p.encode(p.Hello({"confirm": True})))
            recv_messages(sock)
            answers: dict[str, object] = {}
            deadline = time.monotonic() + 10
            while len(answers) < 2:
                assert time.monotonic() < deadline, (answers, node_a.log())
                sock.send(p.encode_all([p.Send(mine, b"x", tag=1), p.Send(theirs, b"y", tag=2)]))
                for message in recv_messages(sock):
                    if type(message) is p.Confirm:
                        answers[mine] = message
                    elif type(message) is p.Error:
                        answers[message.queue or ""] = message
            refused = answers[theirs]
            assert type(refused) is p.Error and refused.code == 503, refused
            assert "b/0" in refused.reason and "disagree" in refused.reason
            assert type(answers[mine]) is p.Confirm
        assert "disagree on the cluster" in node_a.log()
