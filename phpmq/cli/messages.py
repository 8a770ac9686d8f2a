"""`phpmq send` and `phpmq consume`: move messages between the shell and a queue."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .shared import broker_option, with_client

if TYPE_CHECKING:
    from ..client import Client


@click.command()
@broker_option
@click.argument("queue")
@click.argument("message", required=False)
@click.option(
    "--ttl",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seconds to live; 0 never expires.",
)
@click.option("--lines", is_flag=True, help="Read stdin; send each line as one message.")
@click.option(
    "--confirm",
    is_flag=True,
    help="Wait for the broker's confirm (on disk with --data-dir) and print each message ID.",
)
@click.option(
    "--key",
    help="Idempotency key: sent again within the broker's window, the message is not queued"
    " twice. With --lines, KEY-1, KEY-2, ... per line.",
)
def send(
    address: str,
    queue: str,
    message: str | None,
    ttl: int,
    lines: bool,
    confirm: bool,
    key: str | None,
) -> None:
    """Send MESSAGE to QUEUE. With MESSAGE '-' or absent, read it from stdin."""
    if lines:
        contents = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    elif message is None or message == "-":
        contents = [sys.stdin.buffer.read()]
    else:
        contents = [message.encode()]
    keys = None
    if key is not None:
        keys = [f"{key}-{n}" for n in range(1, len(contents) + 1)] if lines else [key]
    if not confirm:
        sent = with_client(address, lambda c: c.send_many(queue, contents, ttl, keys=keys))
        click.echo(f"sent {sent} message{'s' if sent != 1 else ''} to {queue}", err=True)
        return
    ids = with_client(address, lambda c: c.send_many(queue, contents, ttl, confirm=True, keys=keys))
    for message_id in ids:
        click.echo(message_id)
    click.echo(f"{len(ids)} confirmed in {queue}", err=True)


@click.command()
@broker_option
@click.argument("queue")
@click.option(
    "--count",
    "-n",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Stop after this many messages.",
)
@click.option("--window", type=click.IntRange(min=1), help="Unacked messages at a time.")
@click.option(
    "--ack/--no-ack",
    default=True,
    show_default=True,
    help="--no-ack leaves messages unacked: they return to the queue on exit.",
)
@click.option("--timeout", type=float, help="Stop after this many seconds without a message.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
def consume(
    address: str,
    queue: str,
    count: int,
    window: int | None,
    ack: bool,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Print messages from QUEUE, one per line (content as text)."""
    import msgspec

    def run(client: Client) -> int:
        received = 0
        for message in client.consume(queue, window or count, timeout):
            if as_json:
                out = msgspec.json.encode(
                    {
                        "queue": message.queue,
                        "id": message.id,
                        "ttl": message.ttl,
                        "delivery_count": message.delivery_count,
                        "content": message.content.decode(errors="replace"),
                    }
                ).decode()
            else:
                out = message.content.decode(errors="replace")
            click.echo(out)
            if ack:
                message.ack()
            received += 1
            if received >= count:
                break
        return received

    received = with_client(address, run)
    if received < count:
        click.echo(f"got {received} of {count} messages before the timeout", err=True)
