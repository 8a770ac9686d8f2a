"""`phpmq publish`, `bind`, `unbind`, `rebind` and `subscribe`: events from the shell
(docs/protocol.md §6.5, docs/cli.md "Events")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import click

from .shared import MAX_WIRE_INTEGER, broker_option, fail, timeout_option, with_client

if TYPE_CHECKING:
    from ..client import Client


def _checked(patterns: Iterable[str]) -> list[str]:
    """The patterns, or a one-line failure for one the broker would refuse."""
    from ..client import InvalidArgument
    from ..client.topics import checked_patterns

    try:
        return checked_patterns(patterns)
    except InvalidArgument as exc:
        fail(str(exc))


def _refused(action: str, exc: Exception) -> None:
    from ..client import BrokerRefused

    if isinstance(exc, BrokerRefused):
        fail(f"broker refused {action}: {exc.error.code} {exc.error.reason}")
    fail(str(exc))


@click.command()
@broker_option
@timeout_option
@click.argument("event")
@click.argument("message", required=False)
@click.option(
    "--ttl",
    type=click.IntRange(min=0, max=MAX_WIRE_INTEGER),
    default=0,
    show_default=True,
    help="Seconds each copy lives; 0 never expires.",
)
@click.option(
    "--key",
    help="Idempotency key: published again within the broker's window, nothing is copied"
    " twice.  [default: none]",
)
def publish(
    address: str, timeout: float, event: str, message: str | None, ttl: int, key: str | None
) -> None:
    """Publish MESSAGE as EVENT to every queue bound to it.

    EVENT is dot-separated (order.paid); each queue bound to a matching pattern gets one
    copy. With MESSAGE '-' or absent, read it from stdin.

    Prints how many queues got a copy (0: none is bound). Exits 1 with the broker's code and
    reason when it refuses the publish (a full bound queue refuses it for all).
    """
    import sys

    from ..client import ClientError

    content = sys.stdin.buffer.read() if message in (None, "-") else message.encode()

    def run(client: Client) -> int:
        client.confirm_timeout = timeout
        try:
            return client.publish(event, content, ttl, key=key) or 0
        except ClientError as exc:
            _refused(f"publishing {event}", exc)
            raise

    count = with_client(address, timeout, run)
    click.echo(f"published {event} to {count} queue{'' if count == 1 else 's'}")


@click.command()
@broker_option
@timeout_option
@click.argument("queue")
@click.argument("patterns", metavar="PATTERN...", nargs=-1, required=True)
def bind(address: str, timeout: float, queue: str, patterns: tuple[str, ...]) -> None:
    """Bind QUEUE to event PATTERNs (the queue is made if missing).

    In a pattern `*` matches one dot-separated segment and `#` zero or more: order.*,
    user.*.created, audit.#. Prints the queue's bindings after."""
    checked = _checked(patterns)
    bound = with_client(address, timeout, lambda c: _admin(c, "bind", c.bind, queue, *checked))
    _print_bindings(queue, bound)


@click.command()
@broker_option
@timeout_option
@click.argument("queue")
@click.argument("patterns", metavar="[PATTERN]...", nargs=-1)
@click.option(
    "--remove-mask",
    "masks",
    multiple=True,
    help="Also remove every binding this mask matches (order.* removes order.paid and"
    " order.*); repeatable.  [default: none]",
)
def unbind(
    address: str, timeout: float, queue: str, patterns: tuple[str, ...], masks: tuple[str, ...]
) -> None:
    """Remove PATTERNs (as written) from QUEUE's bindings.

    Prints the queue's bindings after; exits 1 if the queue does not exist."""
    if not patterns and not masks:
        raise click.UsageError("name at least one PATTERN or --remove-mask")
    remove, mask = _checked(patterns), _checked(masks)

    def run(client: Client) -> list[str]:
        # queue-unbind first: it refuses an unknown queue (404), where queue-rebind makes it.
        bound = _admin(client, "unbind", client.unbind, queue, *remove)
        if mask:
            bound = _admin(client, "unbind", client.rebind, queue, remove_mask=mask)
        return bound

    _print_bindings(queue, with_client(address, timeout, run))


@click.command()
@broker_option
@timeout_option
@click.argument("queue")
@click.option(
    "--replace",
    multiple=True,
    help="The bindings become these patterns (first); repeatable.  [default: keep them]",
)
@click.option("--no-bindings", is_flag=True, help="Start from no bindings (with --add).")
@click.option("--remove", multiple=True, help="Remove this pattern.  [default: none]")
@click.option(
    "--remove-mask", "masks", multiple=True, help="Remove what this mask matches.  [default: none]"
)
@click.option("--add", multiple=True, help="Add this pattern (last).  [default: none]")
def rebind(
    address: str,
    timeout: float,
    queue: str,
    replace: tuple[str, ...],
    no_bindings: bool,
    remove: tuple[str, ...],
    masks: tuple[str, ...],
    add: tuple[str, ...],
) -> None:
    """Change QUEUE's bindings in one step.

    Applied in this order: --replace (or --no-bindings), --remove, --remove-mask, --add;
    each is repeatable. Prints the queue's bindings after."""
    replacing = _checked(replace) if replace or no_bindings else None
    options = {"remove": _checked(remove), "remove_mask": _checked(masks), "add": _checked(add)}
    bound = with_client(
        address, timeout, lambda c: _admin(c, "rebind", c.rebind, queue, replacing, **options)
    )
    _print_bindings(queue, bound)


def _admin(
    client: Client,
    what: str,
    method: Callable[..., list[str]],
    queue: str,
    *args: object,
    **options: object,
) -> list[str]:
    from ..client import ClientError

    try:
        return method(queue, *args, **options)
    except ClientError as exc:
        _refused(f"to {what} {queue}", exc)
        raise


def _print_bindings(queue: str, bindings: list[str]) -> None:
    click.echo(" ".join(bindings) if bindings else "(no bindings)")
    click.echo(f"{queue}: {len(bindings)} binding{'' if len(bindings) == 1 else 's'}", err=True)


@click.command()
@broker_option
@timeout_option
@click.argument("patterns", metavar="PATTERN...", nargs=-1, required=True)
@click.option(
    "--count",
    "-n",
    type=click.IntRange(min=1),
    help="Stop after this many events.  [default: until Ctrl-C]",
)
@click.option(
    "--for",
    "seconds",
    type=click.FloatRange(min=0, min_open=True),
    help="Stop after this many seconds.  [default: until Ctrl-C]",
)
@click.option(
    "--json", "as_json", is_flag=True, show_default=True, help="One JSON object per event."
)
def subscribe(
    address: str,
    timeout: float,
    patterns: tuple[str, ...],
    count: int | None,
    seconds: float | None,
    as_json: bool,
) -> None:
    """Print events matching PATTERNs as they are published.

    One line per event, its name and content, until Ctrl-C, --count or --for.

    A live feed: a temporary queue bound to the patterns, deleted by the broker when this
    command ends. Events published before it started are not shown.
    """
    checked = _checked(patterns)

    def run(client: Client) -> int:
        from ..client import ClientError

        try:
            return _feed(client, checked, count, seconds, as_json)
        except ClientError as exc:
            _refused("the subscription", exc)
            raise

    shown = with_client(address, timeout, run)
    click.echo(f"{shown} event{'' if shown == 1 else 's'}", err=True)


def _feed(
    client: Client, patterns: list[str], count: int | None, seconds: float | None, as_json: bool
) -> int:
    import msgspec

    feed = client.subscribe_events(*patterns, window=100)
    deadline = None if seconds is None else time.monotonic() + seconds
    shown = 0
    while count is None or shown < count:
        wait = None if deadline is None else deadline - time.monotonic()
        if wait is not None and wait <= 0:
            break
        message = client.receive(wait if wait is None else min(wait, 1.0))
        if message is None or message.queue != feed:
            continue
        text = message.content.decode(errors="replace")
        if as_json:
            line = {"event": message.event, "id": message.id, "content": text}
            click.echo(msgspec.json.encode(line).decode())
        else:
            click.echo(f"{message.event}  {text}")
        message.ack()
        shown += 1
    return shown
