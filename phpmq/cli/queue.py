"""`phpmq queue`: list queues, peek at, purge or delete one."""

from __future__ import annotations

import click

from .shared import admin, broker_option, timeout_option, with_client

yes_option = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")


@click.group()
def queue() -> None:
    """List queues; peek at, purge or delete one."""


@queue.command("list")
@broker_option
@timeout_option
def queue_list(address: str, timeout: float) -> None:
    """A table of the broker's queues (ready, in flight, delayed, consumers, dead letters)."""
    from rich.console import Console
    from rich.table import Table

    result = with_client(address, timeout, lambda c: admin(c, "stats"))
    table = Table(title=f"queues on {address}")
    columns = ("ready", "in_flight", "delayed", "consumers", "dead_letters")
    table.add_column("queue")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right")
    for name, q in result["queues"].items():
        table.add_row(name, *(str(q[column]) for column in columns))
    Console().print(table)


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

    result = with_client(
        address, timeout, lambda c: admin(c, "queue-peek", queue=name, limit=count)
    )
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
    result = with_client(address, timeout, lambda c: admin(c, "queue-purge", queue=name))
    click.echo(f"purged {result['purged']} messages from {name}")


@queue.command("delete")
@broker_option
@timeout_option
@click.argument("name", metavar="QUEUE")
@yes_option
def queue_delete(address: str, timeout: float, name: str, yes: bool) -> None:
    """Remove QUEUE with its ready messages and dead letters.

    Refused while a consumer is attached or a message is in flight: stop the consumers first.
    """
    if not yes:
        click.confirm(f"Delete queue {name} on {address}, messages and dead letters?", abort=True)
    result = with_client(address, timeout, lambda c: admin(c, "queue-delete", queue=name))
    click.echo(
        f"deleted queue {name} ({result['purged']} messages, {result['dead_letters']} dead letters)"
    )
