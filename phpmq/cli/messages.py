"""`phpmq send` and `phpmq consume`: move messages between the shell and a queue."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .shared import MAX_WIRE_INTEGER, Duration, broker_option, fail, timeout_option, with_client

if TYPE_CHECKING:
    from ..client import Client, Unconfirmed


@click.command()
@broker_option
@timeout_option
@click.argument("queue")
@click.argument("message", required=False)
@click.option(
    "--ttl",
    type=click.IntRange(min=0, max=MAX_WIRE_INTEGER),
    default=0,
    show_default=True,
    help="Seconds to live; 0 never expires.",
)
@click.option(
    "--lines",
    is_flag=True,
    show_default=True,
    help="Read stdin; send each line as one message.",
)
@click.option(
    "--confirm/--no-confirm",
    default=True,
    show_default=True,
    help="Wait for the broker's confirm (on disk with --data-dir) and print each message ID;"
    " --no-confirm sends and forgets.",
)
@click.option(
    "--key",
    help="Idempotency key: sent again within the broker's window, the message is not queued"
    " twice. With --lines, KEY-1, KEY-2, ... per line.  [default: none]",
)
@click.option(
    "--delay",
    type=Duration(),
    help="Keep the message invisible to consumers this long (500ms, 10s, 5m, 2h): a delayed"
    " job.  [default: none]",
)
def send(
    address: str,
    timeout: float,
    queue: str,
    message: str | None,
    ttl: int,
    lines: bool,
    confirm: bool,
    key: str | None,
    delay: float | None,
) -> None:
    """Send MESSAGE to QUEUE. With MESSAGE '-' or absent, read it from stdin.

    Exits 1 with the broker's code and reason when it refuses a message.
    """
    if lines:
        contents = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    elif message is None or message == "-":
        contents = [sys.stdin.buffer.read()]
    else:
        contents = [message.encode()]
    keys = None
    if key is not None:
        keys = [f"{key}-{n}" for n in range(1, len(contents) + 1)] if lines else [key]

    def run(client: Client) -> int | list[str]:
        # Content over the broker's limit is refused by the client at once (413).
        if delay:
            client.confirm_timeout = timeout
            return _send_delayed(client, queue, contents, ttl, keys, confirm, delay)
        if not confirm:
            return client.send_many(queue, contents, ttl, keys=keys)
        from ..client import Unconfirmed

        client.confirm_timeout = timeout
        try:
            return client.send_many(queue, contents, ttl, confirm=True, keys=keys)
        except Unconfirmed as exc:
            _fail_unconfirmed(exc, address, queue)

    result = with_client(address, timeout, run)
    plural = "s" if len(contents) != 1 else ""
    if isinstance(result, int):
        click.echo(f"sent {result} message{plural} to {queue} (not confirmed)", err=True)
        return
    for message_id in result:
        click.echo(message_id)
    click.echo(f"sent {len(result)} message{plural} to {queue}, confirmed", err=True)


def _send_delayed(
    client: Client,
    queue: str,
    contents: list[bytes],
    ttl: int,
    keys: list[str] | None,
    confirm: bool,
    delay: float,
) -> int | list[str]:
    """Delayed sends, one at a time (a batch carries no delay)."""
    ids = []
    for index, content in enumerate(contents):
        key = keys[index] if keys else None
        ids.append(client.send(queue, content, ttl, confirm=confirm, key=key, delay=delay))
    return [i for i in ids if i is not None] if confirm else len(ids)


def _fail_unconfirmed(exc: Unconfirmed, address: str, queue: str) -> None:
    confirmed = sum(message_id is not None for message_id in exc.ids)
    done = f" ({confirmed} of {len(exc.ids)} confirmed)" if len(exc.ids) > 1 else ""
    if exc.errors:
        index, error = min(exc.errors.items())
        which = f"message {index + 1}" if len(exc.ids) > 1 else "the message"
        fail(f"broker refused {which} to {queue}: {error.code} {error.reason}{done}")
    fail(f"no confirm from the broker at {address} for messages to {queue}{done}")


@click.command()
@broker_option
@timeout_option
@click.argument("queue")
@click.option(
    "--count",
    "-n",
    type=click.IntRange(min=1, max=MAX_WIRE_INTEGER),
    default=1,
    show_default=True,
    help="Stop after this many messages.",
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    show_default=True,
    help="Run until Ctrl-C (exit 130), whatever --count and --idle-timeout say.",
)
@click.option(
    "--window",
    type=click.IntRange(min=1, max=MAX_WIRE_INTEGER),
    help="Unacked messages at a time.  [default: --count, 100 with --follow]",
)
@click.option(
    "--ack/--no-ack",
    default=True,
    show_default=True,
    help="--no-ack leaves messages unacked: they return to the queue on exit.",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0),
    help="Stop after this many seconds without a message.  [default: wait forever]",
)
@click.option(
    "--json", "as_json", is_flag=True, show_default=True, help="One JSON object per message."
)
def consume(
    address: str,
    timeout: float,
    queue: str,
    count: int,
    follow: bool,
    window: int | None,
    ack: bool,
    idle_timeout: float | None,
    as_json: bool,
) -> None:
    """Print messages from QUEUE, one per line (content as text).

    A subscription the broker refuses (a bad queue name, a limit) exits 1 with its reason.
    """
    import msgspec

    from ..client import BrokerRefused

    def run(client: Client) -> int:
        received = 0
        limit = None if follow else count
        stream = client.consume(
            queue, window or (100 if follow else count), None if follow else idle_timeout
        )
        try:
            for message in stream:
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
                if limit is not None and received >= limit:
                    break
        except BrokerRefused as exc:
            fail(f"broker refused consuming {queue}: {exc.error.code} {exc.error.reason}")
        return received

    received = with_client(address, timeout, run)
    if received < count:
        click.echo(f"got {received} of {count} messages before the idle timeout", err=True)
