"""`phpmq stats`: a broker's queues, worker pools, bridges and counters."""

from __future__ import annotations

import click

from .shared import admin, broker_option, with_client


@click.command()
@broker_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def stats(address: str, as_json: bool) -> None:
    """Show queues (ready, in flight, consumers, dead letters) and counters."""
    result = with_client(address, lambda c: admin(c, "stats"))
    if as_json:
        import msgspec

        click.echo(msgspec.json.encode(result).decode())
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"phpmq broker {address}")
    for column in ("queue", "ready", "in flight", "consumers", "dead letters"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for name, q in result["queues"].items():
        table.add_row(
            name, *(str(q[k]) for k in ("ready", "in_flight", "consumers", "dead_letters"))
        )
    console = Console()
    console.print(table)
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
        console.print(pools)
    for bridge_name, report in result.get("bridges", {}).items():
        numbers = ", ".join(f"{k} {v}" for k, v in report["counters"].items())
        console.print(f"bridge {bridge_name} ({report['kind']}): {numbers}")
    counters = ", ".join(f"{k} {v}" for k, v in result["counters"].items())
    console.print(f"peers {result['peers']}, up {result['uptime_seconds']:.0f}s; {counters}")
