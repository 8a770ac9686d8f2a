"""`phpmq top`: a full-screen live view of a broker's queues and peers (docs/cli.md).

The terminal part only: asking the broker, reading keys, drawing. What the rows hold and how
they sort is phpmq.monitor's.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from .shared import broker_option, fail, timeout_option, with_client

if TYPE_CHECKING:
    from ..client import Client
    from ..monitor import Monitor, Sort, View

KEYS_HELP = "s/r: sort queues by the next column / reverse   p/o: the same for peers   q: quit"


@click.command()
@broker_option
@timeout_option
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes.",
)
def top(address: str, timeout: float, interval: float) -> None:
    """A live view of queues (rates in and out, ready, in flight, consumers) and peers;
    keys sort it, q quits."""
    if not sys.stdin.isatty():
        fail("phpmq top needs a terminal (its keys are read from stdin)")
    with_client(address, timeout, lambda client: _run(client, address, interval))


def _run(client: Client, address: str, interval: float) -> None:
    from rich.live import Live

    from ..monitor import Monitor
    from .cluster_stats import cluster_stats

    monitor = Monitor()
    with _keys() as read_key, Live(screen=True, auto_refresh=False) as live:
        due = 0.0
        while True:
            if time.monotonic() >= due:
                stats = cluster_stats(client)
                monitor.update(stats, time.monotonic())
                due = time.monotonic() + interval
                live.update(_render(monitor, monitor.view(), stats, address), refresh=True)
            key = read_key(max(0.0, due - time.monotonic()))
            if key is None:
                continue
            if not monitor.press(key):
                return
            live.update(_render(monitor, monitor.view(), stats, address), refresh=True)


@contextmanager
def _keys() -> Iterator[Callable[[float], str | None]]:
    """Single keys from the terminal without Enter (cbreak: Ctrl-C still interrupts); the
    terminal's settings come back on the way out."""
    import termios  # POSIX only: loaded when top runs, so `phpmq` itself loads anywhere
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)

    def read_key(wait: float) -> str | None:
        readable, _, _ = select.select([fd], [], [], wait)
        return os.read(fd, 1).decode(errors="replace") if readable else None

    tty.setcbreak(fd)
    try:
        yield read_key
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _render(monitor: Monitor, view: View, stats: dict[str, Any], address: str) -> Any:
    from rich.console import Group
    from rich.table import Table

    from ..monitor import PEER_COLUMNS, QUEUE_COLUMNS

    queues = Table(title=f"queues ({len(view.queues)})", expand=True)
    _columns(queues, QUEUE_COLUMNS, monitor.queue_sort)
    for row in view.queues:
        queues.add_row(*(_cell(getattr(row, attribute)) for _, attribute in QUEUE_COLUMNS))
    peers = Table(title=f"peers ({stats['peers']}; listed: {len(view.peers)})", expand=True)
    _columns(peers, PEER_COLUMNS, monitor.peer_sort)
    for row in view.peers:
        peers.add_row(*(_cell(getattr(row, attribute)) for _, attribute in PEER_COLUMNS))
    memory = stats["memory"]
    header = (
        f"[b]phpmq top[/b] {address}  up {stats['uptime_seconds']:.0f}s  peers {stats['peers']}"
        f"  held {memory['held_bytes'] / 1048576:.1f} MiB"
        + ("  [red]memory alarm[/red]" if memory["alarm"] else "")
        + ("  [yellow]draining[/yellow]" if stats.get("draining") else "")
    )
    return Group(header, queues, peers, f"[dim]{KEYS_HELP}[/dim]")


def _columns(table: Any, columns: tuple[tuple[str, str], ...], sort: Sort) -> None:
    for index, (title, _) in enumerate(columns):
        marker = (" ▼" if sort.descending else " ▲") if index == sort.column else ""
        table.add_column(title + marker, justify="left" if index == 0 else "right", no_wrap=True)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)
