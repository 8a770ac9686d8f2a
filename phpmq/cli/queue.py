"""`phpmq queue`: list queues, peek at, purge or delete one, list and release batch leases."""

from __future__ import annotations

import click

from .shared import broker_option, fail, refusal_fails, timeout_option, with_client

yes_option = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")


@click.group()
def queue() -> None:
    """List queues; peek at, purge or delete one; list or release batch leases."""


@queue.command("list")
@broker_option
@timeout_option
def queue_list(address: str, timeout: float) -> None:
    """A table of the broker's queues (ready, in flight, leased, delayed, consumers, dead
    letters, the event patterns each is bound to)."""
    from rich.console import Console
    from rich.table import Table

    from .cluster_stats import cluster_stats

    result = with_client(address, timeout, cluster_stats)
    sharded = "shards" in result
    table = Table(
        title=f"queues on {address}" + (f" ({len(result['shards'])} shards)" if sharded else "")
    )
    columns = ("ready", "in_flight", "leased", "delayed", "consumers", "dead_letters")
    table.add_column("queue")
    if sharded:
        table.add_column("shard")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right", no_wrap=column == "leased")
    table.add_column("bindings")
    for name, q in result["queues"].items():
        owner = (q["shard"],) if sharded else ()
        figures = (_leased(q) if column == "leased" else str(q[column]) for column in columns)
        table.add_row(name, *owner, *figures, _bindings(q))
    Console().print(table)


def _leased(q: dict) -> str:
    """Messages held in batch leases, and in how many (a broker without leases: 0)."""
    leased, leases = q.get("leased", 0), q.get("leases", 0)
    return f"{leased} ({leases} lease{'' if leases == 1 else 's'})" if leases else "0"


def _bindings(q: dict) -> str:
    """A queue's patterns as stats shows them (the first 20), and how many more."""
    shown = q.get("bindings") or []
    more = q.get("binding_count", len(shown)) - len(shown)
    return " ".join(shown) + (f" (+{more} more)" if more > 0 else "")


@queue.command("peek")
@broker_option
@timeout_option
@click.argument("name", metavar="QUEUE")
@click.option(
    "--count",
    "-n",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Show at most this many.",
)
def queue_peek(address: str, timeout: float, name: str, count: int) -> None:
    """Show QUEUE's first ready messages without taking them (no delivery is counted)."""
    import base64

    result = with_client(address, timeout, lambda c: refusal_fails(lambda: c.peek(name, count)))
    for entry in result["entries"]:
        content = base64.b64decode(entry["content"]).decode(errors="replace")
        preview = content if len(content) <= 60 else content[:57] + "..."
        click.echo(f"{entry['id']}  ttl={entry['ttl']} deliveries={entry['deliveries']}  {preview}")
    cut = " (cut to fit one reply)" if result["truncated"] else ""
    click.echo(f"{len(result['entries'])} of {result['ready']} ready in {name}{cut}", err=True)


@queue.command("purge")
@broker_option
@timeout_option
@click.argument("name", metavar="QUEUE")
@yes_option
def queue_purge(address: str, timeout: float, name: str, yes: bool) -> None:
    """Delete QUEUE's ready messages (those in flight and dead letters stay)."""
    if not yes:
        click.confirm(f"Delete every ready message of {name} on {address}?", abort=True)
    purged = with_client(address, timeout, lambda c: refusal_fails(lambda: c.purge(name)))
    click.echo(f"purged {purged} messages from {name}")


@queue.command("delete")
@broker_option
@timeout_option
@click.argument("name", metavar="QUEUE")
@yes_option
def queue_delete(address: str, timeout: float, name: str, yes: bool) -> None:
    """Remove QUEUE at once with everything in it and its bindings.

    Its ready, in flight and delayed messages and its dead letters are deleted; its consumers
    are told (their subscription ends). Prints what was deleted.
    """
    if not yes:
        click.confirm(
            f"Delete queue {name} on {address}, its messages, dead letters and bindings?",
            abort=True,
        )
    result = with_client(address, timeout, lambda c: refusal_fails(lambda: c.delete_queue(name)))
    click.echo(f"deleted queue {name}: {_deleted(result)}")


@queue.command("leases")
@broker_option
@timeout_option
@click.argument("name", metavar="[QUEUE]", required=False)
def queue_leases(address: str, timeout: float, name: str | None) -> None:
    """List batch leases (a Spark source's micro-batches, docs/pipeline.md): queue, lease
    name, messages, bytes, seconds since last touched and the timeout after which its messages
    go back to the queue. Without QUEUE: every lease of the shard asked."""
    from rich.console import Console
    from rich.table import Table

    result = with_client(
        address, timeout, lambda c: refusal_fails(lambda: c.leases(name or None, timeout))
    )
    table = Table(title=f"batch leases on {address}")
    for column in ("queue", "lease", "messages", "bytes", "idle s", "timeout s"):
        table.add_column(column, justify="left" if column in ("queue", "lease") else "right")
    for lease in result["leases"]:
        table.add_row(
            lease["queue"],
            lease["lease"],
            str(lease["messages"]),
            str(lease["bytes"]),
            f"{lease['idle_seconds']:.0f}",
            f"{lease['timeout_ms'] / 1000:.0f}",
        )
    Console().print(table)
    click.echo(f"{len(result['leases'])} leases", err=True)


@queue.command("release")
@broker_option
@timeout_option
@click.argument("name", metavar="QUEUE")
@click.argument("lease", metavar="LEASE")
@yes_option
def queue_release(address: str, timeout: float, name: str, lease: str, yes: bool) -> None:
    """Put the messages of QUEUE's batch lease LEASE back at the head of the queue now (one
    more delivery each), as its timeout would: for a lease a stopped query left behind. A
    query still reading it fails (the lease is gone)."""
    if not yes:
        click.confirm(f"Release lease {lease} of {name} on {address}?", abort=True)
    released = with_client(
        address, timeout, lambda c: refusal_fails(lambda: c.release_lease(name, lease, timeout))
    )
    if not released:
        fail(f"no lease {lease!r} on queue {name!r} (committed, released or timed out)")
    click.echo(f"released {released} messages of lease {lease} back to {name}")


def _deleted(result: dict) -> str:
    """What a queue-delete reply counts, in words (a field the broker left out is skipped)."""
    parts = (
        ("purged", "ready messages"),
        ("in_flight", "in flight"),
        ("delayed", "delayed"),
        ("dead_letters", "dead letters"),
        ("bindings", "bindings"),
        ("consumers", "consumers told"),
    )
    return ", ".join(f"{result[key]} {label}" for key, label in parts if key in result)
