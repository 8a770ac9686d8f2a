"""The LAN harness (tests/lan.py) for real: namespaces joined by a bridge, a broker in one node,
a producer and a consumer in another, a partition and its healing; and the CI rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import lan
from lan import LanBroker, Node

PHPMQ = [sys.executable, "-m", "phpmq"]


# The LAN tests build network namespaces and run brokers in them: one LAN at a time.
pytestmark = pytest.mark.xdist_group("lan")


def _namespaces() -> set[str]:
    return {line.split()[0] for line in lan.ip("netns", "list").splitlines() if line.strip()}


def _root_links() -> str:
    """The root namespace's interfaces and addresses, which the harness must never change."""
    return lan.ip("-o", "addr", "show") + lan.ip("-o", "link", "show")


def _phpmq(node: Node, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return node.run([*PHPMQ, *args], input=stdin, capture_output=True, text=True, timeout=20)


def test_a_missing_capability_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.setattr(lan, "missing_capability", lambda: "no namespaces here")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run in CI: no namespaces here"):
        request.getfixturevalue("lan_capable")


def test_a_missing_capability_skips_outside_ci(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.setattr(lan, "missing_capability", lambda: "no namespaces here")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match=r"^no namespaces here$"):
        request.getfixturevalue("lan_capable")


def test_the_lan_is_made_and_removed_without_touching_the_root_namespace(
    lan_capable: None,
) -> None:
    before = _root_links()
    with lan.lan(3, prefix="plt") as net:
        names = {net.switch, *(node.name for node in net.nodes)}
        assert names <= _namespaces()
        assert [node.address for node in net.nodes] == [f"{net.subnet}.{i}" for i in (1, 2, 3)]
        shown = net.nodes[2].run(["ip", "-o", "addr", "show", "eth0"], capture_output=True)
        assert f"{net.nodes[2].address}/24" in shown.stdout.decode()
        assert _root_links() == before
    assert not names & _namespaces()
    assert _root_links() == before


def test_a_failure_inside_still_tears_down_processes_and_namespaces(lan_capable: None) -> None:
    with pytest.raises(RuntimeError, match="boom"), lan.lan(1, prefix="plt") as net:
        sleeper = net.nodes[0].popen(["sleep", "60"])
        names = {net.switch, net.nodes[0].name}
        raise RuntimeError("boom")
    assert sleeper.poll() is not None
    assert not names & _namespaces()


def test_leftovers_of_a_dead_run_are_removed_and_live_runs_kept(lan_capable: None) -> None:
    dead, live = "plt99999999-n1", "plt1-n1"  # no pid is that large; pid 1 always runs
    for name in (dead, live):
        lan.ip("netns", "add", name)
    try:
        with lan.lan(1, prefix="plt"):
            assert dead not in _namespaces()
            assert live in _namespaces()
    finally:
        for name in {dead, live} & _namespaces():
            lan.ip("netns", "del", name)


def test_messages_cross_the_lan_stop_at_a_partition_and_flow_after_it_heals(
    lan_capable: None, tmp_path: Path
) -> None:
    with lan.lan(2) as net:
        server, client = net.nodes
        broker = LanBroker(server, "--grace-seconds", "1", log_path=tmp_path / "broker.log")
        at = ("--broker", broker.address)
        consumer = client.popen(
            [*PHPMQ, "consume", "orders", "-n", "3", *at, "--idle-timeout", "10"],
            stdout=subprocess.PIPE,
            text=True,
        )
        sent = _phpmq(client, "send", "orders", "--lines", *at, stdin="one\ntwo\nthree\n")
        assert sent.returncode == 0, sent.stderr
        out, _ = consumer.communicate(timeout=15)
        assert (consumer.returncode, out.split()) == (0, ["one", "two", "three"])

        net.link_down(client)
        cut = _phpmq(client, "consume", "orders", *at, "--timeout", "1", "--idle-timeout", "2")
        assert (cut.returncode, cut.stdout) == (1, ""), cut.stderr  # linked: 0, "got 0 of 1"
        assert "no broker answered" in cut.stderr
        assert not broker.answers(client, timeout=1)
        assert broker.answers()  # the broker itself is fine: only the link is cut

        net.link_up(client)
        sent = _phpmq(client, "send", "orders", "healed", *at)
        assert sent.returncode == 0, sent.stderr
        got = _phpmq(client, "consume", "orders", *at, "--idle-timeout", "5")
        assert (got.returncode, got.stdout.split()) == (0, ["healed"]), got.stderr
        assert broker.stop() == 0, broker.log()


def test_a_broker_that_cannot_start_raises_with_its_log(lan_capable: None, tmp_path: Path) -> None:
    with lan.lan(1) as net, pytest.raises(lan.LanError, match="no such option '--no-such-flag'"):
        LanBroker(net.nodes[0], "--no-such-flag", log_path=tmp_path / "broker.log")
