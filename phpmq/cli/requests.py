"""`phpmq request`: send a request to a queue and print the reply a worker sends back."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from .shared import MAX_TIMEOUT_S, FiniteFloatRange, broker_option, fail, with_client

if TYPE_CHECKING:
    from ..client import Client


@click.command()
@broker_option
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0, min_open=True, max=MAX_TIMEOUT_S),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the reply (and for the broker to answer at all). The request"
    " expires unread after this, rounded up to whole seconds.",
)
@click.argument("queue")
@click.argument("message", required=False)
@click.option(
    "--format",
    "reply_format",
    type=click.Choice(["raw", "json"]),
    default="raw",
    show_default=True,
    help="raw: print the reply's bytes as they came. json: ask the worker for JSON (the"
    ' request\'s headers say {"reply_format": "json"}) and print it as one line of JSON.',
)
def request(
    address: str, timeout: float, queue: str, message: str | None, reply_format: str
) -> None:
    """Send MESSAGE to QUEUE as a request and print the reply on stdout. With MESSAGE '-' or
    absent, read it from stdin.

    A worker (`phpmq workers mod:fn`) answers with its handler's return value. Exits 1 with
    one line on stderr when the handler raised (`phpmq: TypeName: message`), when no reply
    came within --timeout, or when the broker refused the request.
    """
    from_stdin = message is None or message == "-"
    content = sys.stdin.buffer.read() if from_stdin else str(message).encode()

    def run(client: Client) -> Any:
        from ..client import BrokerRefused, ReplyError, RequestTimeout

        try:
            return client.request(queue, content, timeout, reply_format=reply_format)  # type: ignore[arg-type]
        except ReplyError as exc:
            fail(exc.reason if exc.type_name else f"error reply {exc.code}: {exc.reason}")
        except RequestTimeout:
            fail(f"no reply from a worker of {queue} within {timeout:g}s")
        except BrokerRefused as exc:
            fail(f"broker refused the request to {queue}: {exc.error.code} {exc.error.reason}")

    reply = with_client(address, timeout, run)
    if reply_format == "json":
        import msgspec

        click.echo(msgspec.json.encode(reply).decode())
        return
    out = sys.stdout.buffer
    out.write(reply)
    if not reply.endswith(b"\n"):
        out.write(b"\n")
    out.flush()
