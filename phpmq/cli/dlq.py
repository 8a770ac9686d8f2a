"""`phpmq dlq`: a queue's dead letters, listed, replayed or purged."""

from __future__ import annotations

import click

from .shared import broker_option, refusal_fails, timeout_option, with_client


@click.group()
def dlq() -> None:
    """Inspect, replay and purge a queue's dead letters."""


@dlq.command("list")
@broker_option
@timeout_option
@click.argument("queue")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="List at most this many.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON (content in base64).")
def dlq_list(address: str, timeout: float, queue: str, limit: int, as_json: bool) -> None:
    """List QUEUE's dead letters, oldest first."""
    result = with_client(
        address, timeout, lambda c: refusal_fails(lambda: c.dead_letters(queue, limit))
    )
    if as_json:
        import msgspec

        click.echo(msgspec.json.encode(result).decode())
        return
    import base64

    for entry in result["entries"]:
        content = base64.b64decode(entry["content"]).decode(errors="replace")
        preview = content if len(content) <= 60 else content[:57] + "..."
        click.echo(
            f"{entry['id']}  {entry['reason']:<15} deliveries={entry['deliveries']}  {preview}"
        )
    click.echo(f"{result['total']} dead letters in {queue} ({result['dropped']} dropped)", err=True)


@dlq.command("replay")
@broker_option
@timeout_option
@click.argument("queue")
@click.option(
    "--id", "ids", multiple=True, help="Replay only these IDs (repeatable).  [default: all]"
)
def dlq_replay(address: str, timeout: float, queue: str, ids: tuple[str, ...]) -> None:
    """Put QUEUE's dead letters back at the tail of QUEUE (same IDs, no TTL)."""
    replayed = with_client(
        address, timeout, lambda c: refusal_fails(lambda: c.replay_dead_letters(queue, ids))
    )
    click.echo(f"replayed {replayed} dead letters into {queue}")


@dlq.command("purge")
@broker_option
@timeout_option
@click.argument("queue")
def dlq_purge(address: str, timeout: float, queue: str) -> None:
    """Delete all of QUEUE's dead letters."""
    purged = with_client(
        address, timeout, lambda c: refusal_fails(lambda: c.purge_dead_letters(queue))
    )
    click.echo(f"purged {purged} dead letters from {queue}")
