"""What the command groups share: the --broker option, the one-line failure, one client per
command.

Errors print one line on stderr and exit 1 (click's own usage errors exit 2).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from ..protocol import DEFAULT_ADDRESS

if TYPE_CHECKING:
    from ..client import Client

Result = TypeVar("Result")

broker_option = click.option(
    "--broker",
    "address",
    envvar="PHPMQ_BROKER",
    default=DEFAULT_ADDRESS,
    show_default=True,
    help="Broker address (env PHPMQ_BROKER).",
)


def fail(message: str) -> NoReturn:
    """Print `phpmq: MESSAGE` on stderr and exit 1."""
    click.echo(f"phpmq: {message}", err=True)
    sys.exit(1)


def with_client(address: str, action: Callable[[Client], Result], timeout: float = 5.0) -> Result:
    """Run `action` with a client of the broker at `address`; a ClientError fails the command."""
    from ..client import Client, ClientError  # only commands that talk to a broker load it

    client = Client(address, name="phpmq-cli", send_timeout=timeout, close_timeout=timeout)
    try:
        return action(client)
    except ClientError as exc:
        fail(str(exc))
    finally:
        client.close()


def admin(client: Client, command: str, **options: Any) -> dict[str, Any]:
    """An ADMIN command; the broker's refusal fails the command with its reason."""
    from ..client import BrokerRefused

    try:
        return client.admin(command, **options)
    except BrokerRefused as exc:
        fail(exc.error.reason)
