"""`phpmq cluster`: a cluster's replicas (docs/cluster.md "Replicated queues"): what each
says of itself, moving a shard's leadership to another node, and its members (nodes joining
and leaving: the cluster file changed, docs/cluster.md "Membership")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .replicas import quiet_clients, replication_of, shard_rows, staying_client
from .shared import broker_option, fail, timeout_option, with_client

if TYPE_CHECKING:
    from ..broker.shell.cluster_file import ClusterFile
    from ..client import Client
    from ..protocol.cluster import ClusterMap, Shard

#: How often `move` looks whether the target leads yet, and asks the leader again.
POLL_S = 0.2
ASK_AGAIN_S = 2.0
#: The table's width when it goes to a file or a pipe (rich would cut it to 80 columns).
UNBOUNDED_WIDTH = 1_000
#: The table's columns: (row key, heading).
COLUMNS = (
    ("shard", "shard"),
    ("endpoint", "replica"),
    ("node", "node"),
    ("role", "role"),
    ("term", "term"),
    ("commit_index", "commit"),
    ("applied_index", "applied"),
    ("lag", "lag"),
    ("connected", "peers"),
)


@click.group()
def cluster() -> None:
    """A cluster's replicas: their state, and which one leads each shard."""


@cluster.command()
@broker_option
@timeout_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def status(address: str, timeout: float, as_json: bool) -> None:
    """Every replica of every shard of the cluster the broker belongs to, as each says of
    itself: role, Raft term, commit and applied index, lag behind the leader, connections.
    A replica that does not answer within --timeout shows as unreachable."""
    from .replicas import rows

    with quiet_clients():
        mapping = _cluster_map(address, timeout)
        table = rows(mapping, replication_of(mapping.shards, timeout))
    if as_json:
        import msgspec

        click.echo(msgspec.json.encode({"epoch": mapping.epoch, "replicas": table}).decode())
        return
    _print(table, f"cluster of {address}, map epoch {mapping.epoch}")


def _cluster_map(address: str, timeout: float) -> ClusterMap:
    """The map of the broker's HELLO answer (asked where it is: a follower replica has it
    too); a broker that is no part of a cluster fails the command."""
    mapping = with_client(address, timeout, lambda client: client.cluster_map, follow_leader=False)
    if mapping is None:
        fail(f"the broker at {address} is not part of a cluster (its HELLO answer has no map)")
    return mapping


def _print(table: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a file or a pipe: every row whole, however wide
        console.width = UNBOUNDED_WIDTH
    shown = Table(title=title)
    for key, heading in COLUMNS:
        numeric = key in ("term", "commit_index", "applied_index", "lag")
        shown.add_column(heading, justify="right" if numeric else "left")
    for row in table:
        shown.add_row(*("-" if row[key] is None else str(row[key]) for key, _ in COLUMNS))
    console.print(shown)


@cluster.command()
@broker_option
@timeout_option
@click.argument("shard_name", metavar="SHARD")
@click.option("--to", "node", required=True, help="The node whose replica is to lead SHARD.")
def move(address: str, timeout: float, shard_name: str, node: str) -> None:
    """Move the leadership of the replicated SHARD to its replica on node --to, and keep it
    there (no hand-back to the shard's home replica until that replica stops leading). Waits
    up to --timeout for the replica to lead."""
    with quiet_clients():
        _move(address, timeout, shard_name, node)


def _move(address: str, timeout: float, shard_name: str, node: str) -> None:
    shard = _replicated_shard(_cluster_map(address, timeout), shard_name)
    table = shard_rows(shard, replication_of([shard], timeout))
    target = next((row for row in table if row["node"] == node), None)
    if target is None:
        nodes = ", ".join(sorted(str(row["node"]) for row in table))
        fail(f"shard {shard.name} has no replica on node {node!r} (its nodes: {nodes})")
    leader = next((row for row in table if row["role"] == "leader"), None)
    if leader is None:
        fail(f"shard {shard.name} has no leader now (an election?): try again")
    if leader is not target:
        _ask_leader(leader["endpoint"], node, timeout)
    _wait_until_leading(shard.name, node, target["endpoint"], timeout)


def _replicated_shard(mapping: ClusterMap, name: str) -> Shard:
    shard = next((shard for shard in mapping.shards if shard.name == name), None)
    if shard is None:
        names = ", ".join(shard.name for shard in mapping.shards)
        fail(f"the cluster has no shard {name!r} (its shards: {names})")
    if len(shard.replicas) < 2:
        fail(f"shard {name} is not replicated: it has no other replica to lead it")
    return shard


def _ask_leader(endpoint: str, node: str, timeout: float) -> None:
    """The leader hands over, or its refusal fails the command."""
    from ..client import BrokerRefused, ClientError

    try:
        with staying_client(endpoint, timeout) as client:
            client.move_leadership(node, timeout)
    except BrokerRefused as exc:
        fail(exc.error.reason)
    except ClientError as exc:
        fail(f"the leader at {endpoint} did not answer: {exc}")


def _wait_until_leading(shard: str, node: str, endpoint: str, timeout: float) -> None:
    """Until the target says it leads, then tells it to keep leading; the leader is asked
    again now and then through the target (pysyncobj may have dropped the hand-over)."""
    from ..client import BrokerRefused, ClientError

    deadline = time.monotonic() + timeout
    ask_again_at = time.monotonic() + ASK_AGAIN_S
    why = ""
    with staying_client(endpoint, timeout) as client:
        while (left := deadline - time.monotonic()) > 0:
            try:
                if _leads(client, node, left):
                    click.echo(f"shard {shard} is led by node {node} ({endpoint})")
                    return
                if time.monotonic() >= ask_again_at:
                    ask_again_at = time.monotonic() + ASK_AGAIN_S
                    client.move_leadership(node, left)
            except BrokerRefused as exc:
                why = f": {exc.error.reason}"
            except ClientError as exc:
                why = f": {exc}"
            time.sleep(POLL_S)
    fail(f"shard {shard}'s leadership did not reach node {node} within {timeout:g}s{why}")


def _leads(client: Client, node: str, timeout: float) -> bool:
    """Whether the replica leads; if so it is told to keep leading."""
    figures = client.replication(timeout) or {}
    return figures.get("role") == "leader" and client.move_leadership(node, timeout)["leads"]


FILE_OPTION = click.option(
    "--file",
    "path",
    required=True,
    type=click.Path(dir_okay=False),
    envvar="PHPMQ_CLUSTER_FILE",
    help="The cluster file to change (env PHPMQ_CLUSTER_FILE). Every node needs the new one.",
)


@cluster.command()
@FILE_OPTION
@click.argument("node")
@click.option("--address", required=True, help="Where the new node listens: tcp://HOST:PORT.")
def join(path: str, node: str, address: str) -> None:
    """Add NODE to a running replicated cluster: the file gets it (with no shards of its own:
    it holds replicas of the others') and a new epoch. Shows which replicas move; then copy
    the file to every node, start NODE, and send SIGHUP to every other node's broker."""
    before = _read(path)
    _check_address(address)
    after = _changed(lambda: before.with_node_joined(node, address))
    _write(path, after)
    _show_moves(before, after, f"node {node} joins: epoch {before.epoch} -> {after.epoch}")
    click.echo(
        f"next: copy {path} to every node; start node {node} (phpmq broker --cluster-file"
        f" {path} --node {node} --data-dir DIR); send SIGHUP to every other node's broker"
        " (kill -HUP PID); phpmq cluster status shows its replicas catch up."
    )


@cluster.command()
@FILE_OPTION
@click.argument("node")
def leave(path: str, node: str) -> None:
    """Take NODE out of a running replicated cluster: the file marks it `left = true` (its
    shards stay, held by the other nodes) and gets a new epoch. Shows which replicas move;
    then copy the file to every node and send SIGHUP to every node's broker, NODE's too:
    NODE's broker hands its replicas over and exits once its groups have removed it."""
    before = _read(path)
    after = _changed(lambda: before.with_node_left(node))
    _write(path, after)
    _show_moves(before, after, f"node {node} leaves: epoch {before.epoch} -> {after.epoch}")
    click.echo(
        f"next: copy {path} to every node and send SIGHUP to every node's broker (node {node}'s"
        " too: it stops once its replicas are handed over); phpmq cluster status shows the"
        " others catch up."
    )


def _read(path: str) -> ClusterFile:
    from ..broker.shell.cluster_file import read_cluster_file

    try:
        return read_cluster_file(path)
    except ValueError as exc:
        fail(str(exc))


def _changed(change: Callable[[], ClusterFile]) -> ClusterFile:
    from ..broker.shell.cluster_file import cluster_problem

    try:
        after = change()
    except ValueError as exc:
        fail(str(exc))
    problem = cluster_problem(after)
    if problem is not None:
        fail(problem)
    return after


def _check_address(address: str) -> None:
    from ..broker.shell.shard_addresses import shard_address

    try:
        shard_address(address, 0)
    except ValueError:
        fail(f"--address needs tcp://HOST:PORT, not {address!r}")


def _write(path: str, cluster_file: ClusterFile) -> None:
    """The new file in place of the old at once (written beside it, then renamed)."""
    import os

    temporary = f"{path}.new"
    try:
        with open(temporary, "w") as out:
            out.write(cluster_file.to_toml())
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        fail(f"cannot write {path}: {exc}")


def _show_moves(before: ClusterFile, after: ClusterFile, title: str) -> None:
    """Each shard's nodes before and after: what moves."""
    from rich.console import Console
    from rich.table import Table

    from ..broker.shell.shard_addresses import shard_address

    old, new = before.replica_sets(shard_address), after.replica_sets(shard_address)
    console = Console()
    if not console.is_terminal:
        console.width = UNBOUNDED_WIDTH
    shown = Table(title=title)
    for heading in ("shard", "nodes before", "nodes after", "change"):
        shown.add_column(heading)
    for shard, replicas in new.items():
        was = [replica.node for replica in old[shard]]
        now = [replica.node for replica in replicas]
        added = [node for node in now if node not in was]
        removed = [node for node in was if node not in now]
        change = " ".join([*(f"+{node}" for node in added), *(f"-{node}" for node in removed)])
        shown.add_row(shard, " ".join(was), " ".join(now), change or "-")
    console.print(shown)
