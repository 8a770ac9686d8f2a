"""The LAN harness (tests/lan.py) for real: namespaces joined by a bridge, a broker in one node,
a producer and a consumer in another, a partition and its healing; and the CI rule."""

from __future__ import annotations

import subprocess
import sys

import pytest

import lan
from lan import Node

PHPMQ = [sys.executable, "-m", "phpmq"]


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
