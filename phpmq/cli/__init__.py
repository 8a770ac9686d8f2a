"""`phpmq`: run a broker, move messages from the shell, inspect queues, benchmark.

A thin shell over the public API, one module per command group; each command imports what it
needs when it runs, so `phpmq send` loads the client and not the broker or Spark. Every
command that talks to a broker takes --broker (or PHPMQ_BROKER) and --timeout. Errors print
one line on stderr (`phpmq: ...`, usage errors too) and exit non-zero: 1 for a refused or
failed request, 2 for bad usage, 130 when stopped by Ctrl-C (quietly: no traceback; the
broker and the worker pool after their graceful stop). docs/cli.md lists every command.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from click.exceptions import NoSuchCommand

from .. import __version__
from .environment import warn_unknown_variables


def _exit_if_stale(exc: RuntimeError) -> None:
    """A work tree's compiled modules older than its sources (protocol/compiled.py) as one
    line and status 1; known by name, as importing its module would run the check again."""
    if type(exc).__name__ != "StaleCompiledModule":
        return
    click.echo(f"phpmq: {exc}", err=True)
    sys.exit(1)


try:
    from .shared import EXIT_INTERRUPTED, usage_line  # the first import of the codec
except RuntimeError as exc:
    _exit_if_stale(exc)
    raise

__all__ = ["main"]

#: Each command: the module of this package that defines it, and its name there. A command's
#: module is imported only when the command runs (or help lists it): `phpmq broker`, which
#: tests and supervisors start hundreds of times, loads no bridge, web or Spark code.
COMMANDS = {
    "broker": ("broker", "broker"),
    "send": ("messages", "send"),
    "consume": ("messages", "consume"),
    "request": ("requests", "request"),
    "publish": ("events", "publish"),
    "subscribe": ("events", "subscribe"),
    "bind": ("events", "bind"),
    "unbind": ("events", "unbind"),
    "rebind": ("events", "rebind"),
    "stats": ("stats", "stats"),
    "top": ("top", "top"),
    "dlq": ("dlq", "dlq"),
    "queue": ("queue", "queue"),
    "cluster": ("cluster", "cluster"),
    "schedule": ("schedule", "schedule"),
    "bridge": ("bridge", "bridge"),
    "workers": ("workers", "workers"),
    "bench": ("bench", "bench"),
    "pipeline": ("pipeline", "pipeline"),
    "keys": ("keys", "keys"),
    "web": ("web", "web"),
}

#: What click raises for a group called without a command (click 8.2 and later).
NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


class InterruptibleGroup(click.Group):
    """The commands of COMMANDS, each imported when first asked for. Ctrl-C ends any command
    with status 130 and no traceback (click's own handling prints "Aborted!" and exits 1,
    which a script cannot tell from a failure), and a usage error is one line, `phpmq: ...`,
    exit 2 (click's own is three: Usage, Try, Error)."""

    def main(self, *args: Any, **options: Any) -> Any:
        options["standalone_mode"] = False
        try:
            status = super().main(*args, **options)
        except NO_ARGS_IS_HELP as exc:  # `phpmq` or a group alone: its help, as click shows it
            exc.show()
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(usage_line(exc), err=True)
            sys.exit(exc.exit_code)
        except click.Abort:  # a declined confirmation (Ctrl-C at a prompt exits in invoke)
            click.echo("phpmq: aborted", err=True)
            sys.exit(1)
        except RuntimeError as exc:  # (the broker's check, when a command imports it)
            _exit_if_stale(exc)
            raise
        sys.exit(status if isinstance(status, int) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        # the builtin, which `python -X importtime` reports (importlib.import_module is not)
        module = __import__(f"{__name__}.{where[0]}", fromlist=[where[1]])
        command: click.Command = getattr(module, where[1])
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except NoSuchCommand as exc:  # click suggests from the commands it holds: none yet
            raise NoSuchCommand(exc.command_name, possibilities=list(COMMANDS), ctx=ctx) from None

    def invoke(self, ctx: click.Context) -> Any:
        warn_unknown_variables(os.environ)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            ctx.exit(EXIT_INTERRUPTED)
        except click.Abort as exc:
            if isinstance(exc.__context__, KeyboardInterrupt):  # Ctrl-C at a click prompt
                ctx.exit(EXIT_INTERRUPTED)
            raise


@click.group(cls=InterruptibleGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="phpmq", message="%(prog)s %(version)s")
def main() -> None:
    """phpmq-zmq: a PHPMQ message broker on ZeroMQ.

    Start a broker with `phpmq broker`, then `phpmq send QUEUE MESSAGE` and
    `phpmq consume QUEUE`; events with `phpmq bind QUEUE PATTERN`, `phpmq publish EVENT
    MESSAGE` and `phpmq subscribe PATTERN`; jobs the broker runs itself with `phpmq schedule
    add`. The wire protocol is documented in docs/protocol.md.
    """
