"""`phpmq stats`: a broker's queues, worker pools, bridges and counters, once or live."""

from __future__ import annotations

import time
from typing import Any

import click

from .shared import broker_option, timeout_option, with_client

#: Queue names up to this long are shown whole in the queue table.
MAX_NAME_WIDTH = 40


@click.command()
@broker_option
@timeout_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.option(
    "--watch",
    is_flag=True,
    help="Redraw the tables every --interval seconds until Ctrl-C (exit 130).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between redraws with --watch.",
)
def stats(address: str, timeout: float, as_json: bool, watch: bool, interval: float) -> None:
    """Show queues (ready, in flight, consumers, dead letters) and counters."""
    from .cluster_stats import cluster_stats

    if watch:
        with_client(address, timeout, lambda client: _watch(client, address, interval))
        return
    result = with_client(address, timeout, cluster_stats)
    if as_json:
        import msgspec

        click.echo(msgspec.json.encode(result).decode())
        return
    from rich.console import Console

    Console().print(_render(result, address))


def _watch(client: Any, address: str, interval: float) -> None:
    from rich.live import Live

    from .cluster_stats import cluster_stats

    with Live(_render(cluster_stats(client), address), auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            live.update(_render(cluster_stats(client), address), refresh=True)


def _render(result: dict[str, Any], address: str) -> Any:
    """The stats answer as rich renderables: queues, worker pools, bridges, counters."""
    from rich.console import Group
    from rich.table import Table

    table = Table(title=f"phpmq broker {address}")
    columns = ("ready", "in_flight", "consumers", "dead_letters", "refused", "paused_producers")
    # Queue names are never cut (a name is what people look for); the number columns give way.
    longest = max((len(name) for name in result["queues"]), default=5)
    table.add_column("queue", no_wrap=True, min_width=min(longest, MAX_NAME_WIDTH))
    shards = result.get("shards")
    if shards:
        table.add_column("shard")
    for column in ("ready", "in flight", "consumers", "dead letters", "refused", "paused"):
        table.add_column(column, justify="right")
    for name, q in result["queues"].items():
        owner = (q["shard"],) if shards else ()
        table.add_row(name, *owner, *(str(q.get(k, "")) for k in columns))
    parts: list[Any] = [table]
    if shards:
        parts.append(
            "shards: "
            + ", ".join(
                f"{name} at {s['address']} (no answer)"
                if "unreachable" in s
                else f"{name} at {s['address']} ({s['queues']} queues, {s['peers']} peers)"
                for name, s in shards.items()
            )
        )
    clients = _clients_table(result.get("clients", []))
    if clients is not None:
        parts.append(clients)
    if result.get("pools"):
        pools = Table(title="worker pools")
        for column in ("pool", "queue", "workers", "busy", "idle", "held"):
            pools.add_column(column, justify="left" if column in ("pool", "queue") else "right")
        for pool_name, pool in result["pools"].items():
            for queue_name, q in pool["queues"].items():
                idle = q["workers"] - q["busy"]
                pools.add_row(
                    pool_name,
                    queue_name,
                    str(q["workers"]),
                    str(q["busy"]),
                    str(idle),
                    str(q["held"]),
                )
        parts.append(pools)
    for bridge_name, report in result.get("bridges", {}).items():
        numbers = ", ".join(f"{k} {v}" for k, v in report["counters"].items())
        parts.append(f"bridge {bridge_name} ({report['kind']}): {numbers}")
    memory = result.get("memory")
    if memory:
        limit = memory["limit_bytes"]
        share = f" ({memory['held_bytes'] / limit:.0%})" if limit else ""
        alarm = " [memory alarm: sends refused]" if memory["alarm"] else ""
        parts.append(
            f"memory: {_mib(memory['held_bytes'])} held in messages of"
            f" {_mib(limit) if limit else 'no limit'}{share}{alarm};"
            f" {memory['paused_producers']} producers paused broker-wide"
        )
    storage = result.get("storage") or {}
    if "disk_free_bytes" in storage:
        parts.append(_disk_line(storage))
    counters = ", ".join(f"{k} {v}" for k, v in result["counters"].items())
    draining = " [draining]" if result.get("draining") else ""
    parts.append(
        f"peers {result['peers']}, up {result['uptime_seconds']:.0f}s{draining}; {counters}"
    )
    return Group(*parts)


def _disk_line(storage: dict[str, Any]) -> str:
    """The durable store's disk figures (docs/durability.md, "Disk space"), escaped: rich
    would read its brackets as markup."""
    from rich.markup import escape

    floor = storage["min_free_disk_bytes"]
    low = escape(" [disk low: sends refused]") if storage["disk_low"] else ""
    read_only = escape(" [read-only: sends refused]") if storage["read_only"] else ""
    unwritten = storage["unwritten_operations"]
    return (
        f"disk: {_mib(storage['disk_free_bytes'])} free of {_mib(storage['disk_total_bytes'])}"
        f" (floor {_mib(floor) if floor else 'none'}){low}{read_only}; WAL"
        f" {_mib(storage['wal_bytes'])} of {_mib(storage['wal_limit_bytes'])},"
        f" {storage['checkpoints']} checkpoints ({storage['checkpoint_errors']} failed),"
        f" {storage['write_errors']} write errors"
        + (f", {unwritten} operations not yet written" if unwritten else "")
    )


def _clients_table(clients: list[dict[str, Any]]) -> Any:
    """Peers that were refused, are paused or stalled (None if no peer is)."""
    from rich.table import Table

    worth = [c for c in clients if c["refused"] or c["paused_on"] or c["stalled"]]
    if not worth:
        return None
    table = Table(title="clients refused, paused or stalled")
    for column in ("peer", "transport", "held", "refused", "paused on", "stalled", "silent s"):
        table.add_column(column, justify="left" if column in ("peer", "paused on") else "right")
    for c in worth:
        table.add_row(
            c["name"] or c["id"],
            c["transport"],
            str(c["held"]),
            str(c["refused"]),
            ", ".join(c["paused_on"]),
            "yes" if c["stalled"] else "",
            f"{c['silent_seconds']:g}",
        )
    return table


def _mib(size: int) -> str:
    if size >= 1048576:
        return f"{size / 1048576:.1f} MiB"
    return f"{size / 1024:.1f} KiB" if size >= 1024 else f"{size} bytes"
