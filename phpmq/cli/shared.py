"""What the command groups share: the --broker and --timeout options, the one-line failure,
one client per command.

Errors print one line on stderr and exit 1 (click's own usage errors exit 2, Ctrl-C 130).
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from ..protocol import DEFAULT_ADDRESS
from ..protocol import admin_commands as cmd
from ..protocol.constants import INTEGER_LIMIT
from .environment import BROKER_VARIABLE

if TYPE_CHECKING:
    from ..client import Client

Result = TypeVar("Result")

DEFAULT_TIMEOUT_S = 5.0
#: The longest --timeout: ZeroMQ takes a socket's timeout in milliseconds, as a C int.
MAX_TIMEOUT_S = (2**31 - 1) // 1000
#: The largest integer a packet carries (a TTL in seconds, a delay in ms): 18 digits.
MAX_WIRE_INTEGER = INTEGER_LIMIT - 1
#: The exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


def checked_address(ctx: click.Context, param: click.Parameter, address: str) -> str:
    """A --broker value ZeroMQ cannot connect to is a usage error, caught before any work."""
    from ..client import ClientError, check_address

    try:
        check_address(address)
    except ClientError:
        raise click.BadParameter(f"not a ZeroMQ address: {address!r}") from None
    return address


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange without nan and inf, which it lets through (nan compares false with
    any bound) and no timer can wait."""

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        number: float = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


broker_option = click.option(
    "--broker",
    "address",
    envvar=BROKER_VARIABLE,
    default=DEFAULT_ADDRESS,
    show_default=True,
    callback=checked_address,
    help="Broker address (env PHPMQ_BROKER).",
)

timeout_option = click.option(
    "--timeout",
    type=FiniteFloatRange(min=0, min_open=True, max=MAX_TIMEOUT_S),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the broker to answer before giving up.",
)


class Seconds(float):
    """A duration in seconds that shows itself as it was written (`50ms`), so that a message
    naming the value quotes what was typed, not `0.05`."""

    text: str

    def __new__(cls, seconds: float, text: str) -> Seconds:
        duration = super().__new__(cls, seconds)
        duration.text = text
        return duration

    def __repr__(self) -> str:  # the client's refusals quote repr(value) themselves
        return self.text

    __str__ = __repr__


class Duration(click.ParamType):
    """A duration such as 500ms, 10s, 5m, 2h or 1.5 (seconds), as Seconds."""

    name = "duration"
    UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            return float(value)
        text = str(value).strip().lower()
        unit = next((u for u in ("ms", "s", "m", "h") if text.endswith(u)), "")
        try:
            seconds = float(text[: len(text) - len(unit)]) * self.UNITS.get(unit, 1.0)
        except ValueError:
            self.fail(f"{value!r} is not a duration such as 500ms, 10s, 5m or 2h", param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite duration", param, ctx)
        if seconds < 0:
            self.fail(f"{value!r} is negative", param, ctx)
        if seconds * 1000 > MAX_WIRE_INTEGER:
            self.fail(f"{value!r} is longer than {MAX_WIRE_INTEGER}ms", param, ctx)
        return Seconds(seconds, str(value).strip())


def usage_line(error: click.ClickException) -> str:
    """A usage error as the one line every failure is: `phpmq: what was wrong (where to
    look)`, naming the environment variable when that is where the bad value came from."""
    context = getattr(error, "ctx", None)
    parameter = getattr(error, "param", None)
    if isinstance(error, click.BadParameter) and context is not None and parameter is not None:
        source = context.get_parameter_source(parameter.name or "")
        if source is click.core.ParameterSource.ENVIRONMENT and parameter.envvar:
            error.param_hint = str(parameter.envvar)
    message = error.format_message().rstrip(".")
    message = message[:1].lower() + message[1:]
    if isinstance(error, click.UsageError) and context is not None:
        message += f" (see '{context.command_path} --help')"
    return f"phpmq: {message}"


def stop_status(signum: int | None) -> int:
    """The exit status of a command that stopped gracefully on `signum`: 130 after Ctrl-C
    (as the exit-code table says for every command), 0 after SIGTERM."""
    return EXIT_INTERRUPTED if signum == signal.SIGINT else 0


def fail(message: str) -> NoReturn:
    """Print `phpmq: MESSAGE` on stderr and exit 1."""
    click.echo(f"phpmq: {message}", err=True)
    sys.exit(1)


def with_client(
    address: str, timeout: float, action: Callable[[Client], Result], *, follow_leader: bool = True
) -> Result:
    """Run `action` with a client of the broker at `address`, once the broker has answered
    (so its HELLO, `client.broker_info`, is in); a ClientError fails the command, also one
    raised by the goodbye (a send the broker refused, told once it read them all).
    `follow_leader`: the client's (False: it stays at a follower replica)."""
    from ..client import Client, ClientError  # only commands that talk to a broker load it

    try:
        client = Client(
            address,
            name="phpmq-cli",
            send_timeout=timeout,
            close_timeout=timeout,
            follow_leader=follow_leader,
        )
    except ClientError as exc:  # e.g. an unusable PHPMQ_CURVE_SECRET file
        fail(str(exc))
    try:
        try:
            # A DEALER queues sends to an address nobody listens on: only an answer proves
            # there is a broker, so ask for one before anything else (the figures, no queue
            # listed; a client that stays at a follower replica asks that replica's own).
            here = {} if follow_leader else {"here": True}
            client.admin(cmd.STATS, timeout=timeout, limit=0, **here)
        except ClientError:
            client.close_timeout = 0  # no broker to say goodbye to, nor to warn about
            logging.getLogger("phpmq.client").disabled = True
            fail(f"no broker answered at {address} within {timeout:g}s{_why_silent(client)}")
        result = action(client)
        client.close()
        return result
    except ClientError as exc:
        fail(str(exc))
    finally:
        if not client.closed:
            with contextlib.suppress(ClientError):
                client.close()


def _why_silent(client: Client) -> str:
    """What a fresh connection's handshake says about a broker that did not answer."""
    from ..client.probe import handshake_problem

    hint = handshake_problem(client.address, client.curve, wait=min(client.send_timeout, 1.0))
    return f": {hint}" if hint else ""


def refusal_fails(call: Callable[[], Result]) -> Result:
    """What a typed client call returns; the broker's refusal fails the command with its
    reason."""
    from ..client import BrokerRefused

    try:
        return call()
    except BrokerRefused as exc:
        fail(exc.error.reason)


def stats(client: Client) -> dict[str, Any]:
    """The broker's `stats` with every queue (page by page); a refusal fails the command."""
    from ..client import BrokerRefused

    try:
        return client.stats(timeout=client.send_timeout)
    except BrokerRefused as exc:
        fail(exc.error.reason)
