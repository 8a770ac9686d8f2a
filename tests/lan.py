"""A real LAN of network namespaces for multi-host tests (issue #18), built with iproute2.

    with lan(3) as net:
        broker = LanBroker(net.nodes[0], log_path=tmp_path / "broker.log")
        net.nodes[1].run([sys.executable, "-m", "phpmq", "send", "--broker", broker.address,
                          "q", "hello"], check=True)
        net.link_down(net.nodes[1])   # node 2 is partitioned away
        net.link_up(net.nodes[1])     # and healed

What `lan(n)` makes, all of it outside the root namespace (whose interfaces, routes and
firewall it never touches):

- a "switch" namespace `<tag>-sw` holding a Linux bridge `br0`;
- per node i (1..n) a namespace `<tag>-n<i>` with `lo` up and `eth0` at 10.213.<k>.<i>/24,
  the other end of that veth pair being port `p<i>` of the bridge. The veth is created in the
  switch namespace with its peer directly in the node's, so no name ever exists in the root
  namespace and interface names stay short (Linux allows 15 characters).

`<tag>` is the prefix (default "plan") followed by this process's pid, so parallel runs never
share a namespace name; `k` is derived from the pid as well (the LANs are isolated from each
other anyway, it only keeps addresses apart in logs). On exit, also after a failure or a
half-made LAN, the processes started with `popen` are stopped, anything else still running in
the namespaces is killed, and the namespaces are deleted (which deletes their interfaces). On
entry, namespaces of the same prefix left by a run whose process is gone are removed first.

`link_down(node)` takes the node's bridge port down, as a pulled cable: the node keeps its
address and its processes, packets between it and the rest are silently dropped (no reset, no
"unreachable"), until `link_up(node)`.

Needs root and iproute2; `missing_capability()` says what is missing (or None).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

DEFAULT_PREFIX = "plan"
SWITCH = "sw"
BRIDGE = "br0"
NODE_IFACE = "eth0"
_PREFIX_SHAPE = re.compile(r"[a-z][a-z0-9]{0,7}")


class LanError(RuntimeError):
    """An `ip` command failed while making or changing the LAN; the message has its stderr."""


def ip(*args: str) -> str:
    """Run `ip ARGS...`; its stdout, or LanError with its stderr."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LanError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


def in_ci() -> bool:
    """True in CI (`CI=true`), where a missing capability must fail the run."""
    return os.environ.get("CI") == "true"


def missing_capability() -> str | None:
    """Why a LAN cannot be made here (not root, no `ip`, no namespaces, no bridge or veth),
    or None. Tries it for real, in a namespace of its own that it deletes again."""
    if os.geteuid() != 0:
        return "the LAN harness needs root (network namespaces)"
    probe = f"{DEFAULT_PREFIX}{os.getpid()}-probe"
    try:
        ip("netns", "add", probe)
    except FileNotFoundError:
        return "the LAN harness needs iproute2's `ip` on the PATH"
    except LanError as error:
        return f"cannot create a network namespace: {error}"
    try:
        ip("-n", probe, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", probe, "link", "add", "p1", "type", "veth", "peer", "name", NODE_IFACE)
    except LanError as error:
        return f"cannot create a bridge or a veth pair in a namespace: {error}"
    finally:
        with suppress(LanError):
            ip("netns", "del", probe)
    return None


class Node:
    """One host of the LAN: its namespace `name`, `index` (1-based) and `address`."""

    def __init__(self, net: Lan, index: int, name: str, address: str) -> None:
        self.net = net
        self.index = index
        self.name = name
        self.address = address

    @property
    def port(self) -> str:
        """Its port on the switch's bridge (the other end of its eth0)."""
        return f"p{self.index}"

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` as run inside this node's namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        """Start `argv` in this node (Popen's keywords); stopped when the LAN is torn down."""
        process = subprocess.Popen(self.command(argv), **kw)
        self.net.processes.append(process)
        return process

    def run(self, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess:
        """Run `argv` in this node to the end (subprocess.run's keywords)."""
        return subprocess.run(self.command(argv), **kw)

    def __repr__(self) -> str:
        return f"<Node {self.index} {self.name} {self.address}>"


class Lan:
    """The LAN `lan()` yields: `nodes`, `switch` (the bridge's namespace), the cable cutter."""

    def __init__(self, tag: str, subnet: str) -> None:
        self.tag = tag
        self.subnet = subnet
        self.switch = f"{tag}-{SWITCH}"
        self.nodes: list[Node] = []
        self.processes: list[subprocess.Popen] = []
        self.namespaces: list[str] = []

    def link_down(self, node: Node) -> None:
        """Cut `node` off the switch (its bridge port down): a partition."""
        ip("-n", self.switch, "link", "set", node.port, "down")

    def link_up(self, node: Node) -> None:
        """Plug `node` back in."""
        ip("-n", self.switch, "link", "set", node.port, "up")

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _add_switch(self) -> None:
        self._add_namespace(self.switch)
        ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge", "stp_state", "0")
        ip("-n", self.switch, "link", "set", BRIDGE, "up")

    def _add_node(self, index: int) -> None:
        node = Node(self, index, f"{self.tag}-n{index}", f"{self.subnet}.{index}")
        self._add_namespace(node.name)
        sw = ("-n", self.switch)
        ip(*sw, "link", "add", node.port, "type", "veth", "peer", "name", NODE_IFACE)
        ip(*sw, "link", "set", NODE_IFACE, "netns", node.name)
        ip(*sw, "link", "set", node.port, "master", BRIDGE, "up")
        ip("-n", node.name, "addr", "add", f"{node.address}/24", "dev", NODE_IFACE)
        ip("-n", node.name, "link", "set", NODE_IFACE, "up")
        self.nodes.append(node)

    def teardown(self) -> list[str]:
        """Stop what runs in the LAN and delete its namespaces; what could not be undone."""
        problems = [problem for p in self.processes if (problem := _stop(p)) is not None]
        for name in reversed(self.namespaces):
            problems += _delete_namespace(name)
        self.namespaces.clear()
        return problems


def _stop(process: subprocess.Popen, grace: float = 3.0) -> str | None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                return f"pid {process.pid} survived SIGKILL"
    return None


def _delete_namespace(name: str) -> list[str]:
    """Kill what still runs in namespace `name` (all of it started through this harness),
    then delete it."""
    with suppress(LanError):
        for pid in ip("netns", "pids", name).split():
            with suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    try:
        ip("netns", "del", name)
    except LanError as error:
        return [str(error)]
    return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers(prefix: str) -> list[str]:
    """Delete the namespaces of `prefix` whose run (the pid in their name) is gone."""
    shape = re.compile(rf"{re.escape(prefix)}(\d+)-(?:{SWITCH}|n\d+|probe)")
    removed = []
    for line in ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        match = shape.fullmatch(name)
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            _delete_namespace(name)
            removed.append(name)
    return removed


def subnet_for(pid: int) -> str:
    """The /24 a run uses: 10.213.<k> with k from its pid (1..250)."""
    return f"10.213.{pid % 250 + 1}"


@contextmanager
def lan(nodes: int, prefix: str | None = None) -> Iterator[Lan]:
    """A switch and `nodes` namespaces joined to it; all of it removed on exit.

    Args:
        nodes: how many hosts (1..250).
        prefix: start of every namespace name (lowercase letter, then up to 7 lowercase
            letters or digits); the pid follows it. Default "plan".
    """
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    if not _PREFIX_SHAPE.fullmatch(prefix):
        raise ValueError(f"prefix {prefix!r}: a lowercase letter, then up to 7 [a-z0-9]")
    if not 1 <= nodes <= 250:
        raise ValueError(f"nodes={nodes}: 1 to 250")
    remove_leftovers(prefix)
    net = Lan(f"{prefix}{os.getpid()}", subnet_for(os.getpid()))
    try:
        net._add_switch()
        for index in range(1, nodes + 1):
            net._add_node(index)
        yield net
    finally:
        problems = net.teardown()
        if problems:
            print("lan teardown: " + "; ".join(problems), file=sys.stderr)


class LanBroker:
    """`python -m phpmq broker` inside a node, bound to the node's address on `port`, its
    output in `log_path`; returned once a `phpmq stats` run in the same node gets an answer
    (LanError with its log if it does not). Stopped with the LAN at the latest."""

    def __init__(
        self,
        node: Node,
        *flags: str,
        log_path: str | Path,
        port: int = 5555,
        start_timeout: float = 20.0,
    ) -> None:
        self.node = node
        self.address = f"tcp://{node.address}:{port}"
        self.log_path = Path(log_path)
        argv = [sys.executable, "-m", "phpmq", "broker", "--bind", self.address, *flags]
        with open(self.log_path, "wb") as log:
            self.process = node.popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self._wait_until_answering(start_timeout)

    def answers(self, node: Node | None = None, timeout: float = 1.0) -> bool:
        """Whether `phpmq stats`, run in `node` (default: the broker's), gets an answer."""
        argv = [sys.executable, "-m", "phpmq", "stats", "--broker", self.address]
        result = (node or self.node).run(
            [*argv, "--timeout", str(timeout)], capture_output=True, check=False
        )
        return result.returncode == 0

    def _wait_until_answering(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.answers(timeout=0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise LanError(f"the broker in {self.node.name} did not start:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM (it drains), SIGKILL after a while; its exit status."""
        _stop(self.process, grace=10.0)
        return self.process.returncode

    def kill(self) -> int:
        """SIGKILL, as a crash; its exit status."""
        self.process.kill()
        return self.process.wait(10)
