"""`phpmq schedule`: add, list and remove the jobs the broker runs itself (§6.7)."""

from __future__ import annotations

import contextlib
from datetime import datetime

import click

from .shared import MAX_WIRE_INTEGER, Duration, broker_option, timeout_option, with_client


@click.group()
def schedule() -> None:
    """Jobs the broker runs itself: a message into a queue (or an event published) every
    interval or on a cron expression. A durable broker keeps them across restarts."""


@schedule.command("add")
@broker_option
@timeout_option
@click.argument("name")
@click.argument("message")
@click.option(
    "--every",
    type=Duration(),
    help="Run every interval: 100ms at least, 30s, 5m, 2h.  [default: none]",
)
@click.option(
    "--cron", help="Run on a five-field cron expression, e.g. '*/5 * * * *'.  [default: none]"
)
@click.option(
    "--tz", default="UTC", show_default=True, help="IANA time zone the cron expression is read in."
)
@click.option("--queue", help="Send MESSAGE into this queue at each run.  [default: none]")
@click.option("--event", help="Publish MESSAGE as this event at each run.  [default: none]")
@click.option(
    "--nohaste", is_flag=True, help="First run after one interval, not at once (--every)."
)
@click.option(
    "--catch-up",
    type=click.Choice(["run-once", "skip"]),
    default="run-once",
    show_default=True,
    help="Runs missed while a durable broker was down: one run at start, or none.",
)
@click.option(
    "--ttl",
    type=click.IntRange(min=0, max=MAX_WIRE_INTEGER),
    default=0,
    show_default=True,
    help="Seconds each run's message lives; 0 never expires.",
)
def schedule_add(
    address: str,
    timeout: float,
    name: str,
    message: str,
    every: float | None,
    cron: str | None,
    tz: str,
    queue: str | None,
    event: str | None,
    nohaste: bool,
    catch_up: str,
    ttl: int,
) -> None:
    """Add the schedule NAME (or replace the one of that name): MESSAGE into --queue (or
    published as --event) --every interval or on --cron.

    \b
    phpmq schedule add report 'daily' --cron '0 7 * * 1-5' --tz Europe/Berlin --queue reports
    phpmq schedule add ping '{}' --every 30s --event health.ping --nohaste
    """
    if (every is None) == (cron is None):
        raise click.UsageError("give --every or --cron (one of them)")
    if (queue is None) == (event is None):
        raise click.UsageError("give --queue or --event (one of them)")
    reply = with_client(
        address,
        timeout,
        lambda client: client.schedule(
            name,
            queue,
            message,
            event=event,
            every=every,
            cron=cron,
            tz=tz,
            nohaste=nohaste,
            catch_up=catch_up,
            ttl=ttl,
        ),
    )
    verb = "replaced" if reply["replaced"] else "added"
    zone = tz if cron is not None else None
    click.echo(f"{verb} schedule {name}; next run {_when(reply['next_run'], zone)}")


@schedule.command("list")
@broker_option
@timeout_option
def schedule_list(address: str, timeout: float) -> None:
    """A table of the broker's schedules: target, when, next and last run, runs, refused."""
    from rich.console import Console
    from rich.table import Table

    schedules = with_client(address, timeout, lambda client: client.schedules())
    table = Table(title=f"schedules on {address}")
    for column in ("name", "target", "when", "next run", "last run"):
        table.add_column(column)
    table.add_column("runs", justify="right")
    table.add_column("refused", justify="right")
    for s in schedules:
        target = f"queue {s['queue']}" if s["queue"] is not None else f"event {s['event']}"
        table.add_row(
            s["name"],
            target,
            _schedule_when(s),
            _when(s["next_run"], s["tz"] if s["cron"] is not None else None),
            _when(s["last_run"], s["tz"] if s["cron"] is not None else None),
            str(s["runs"]),
            str(s["refused"]),
        )
    Console().print(table)


@schedule.command("remove")
@broker_option
@timeout_option
@click.argument("name")
def schedule_remove(address: str, timeout: float, name: str) -> None:
    """Remove the schedule NAME: it stops at once. Exits 1 if there is none."""
    from .shared import fail

    if not with_client(address, timeout, lambda client: client.unschedule(name)):
        fail(f"no schedule named {name!r}")
    click.echo(f"removed schedule {name}")


def _schedule_when(s: dict) -> str:
    flags = " nohaste" if s["nohaste"] else ""
    if s["cron"] is not None:
        return f"cron {s['cron']} ({s['tz']}){flags}"
    return f"every {_interval(s['every_ms'])}{flags}"


def _interval(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _when(wall: float | None, zone: str | None = None) -> str:
    """A wall-clock time to the second with its zone: in the IANA `zone` a cron expression
    is read in, else this machine's; '-' for none."""
    if wall is None:
        return "-"
    moment = datetime.fromtimestamp(wall).astimezone()
    if zone is not None:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        # A zone the broker knows and this machine does not: shown in this machine's.
        with contextlib.suppress(ZoneInfoNotFoundError):
            moment = moment.astimezone(ZoneInfo(zone))
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z")
