"""`phpmq keys`: CURVE key pairs for the broker and its clients (docs/security.md), and the
holds that keep a writer's idempotency keys (docs/pipeline.md, "Retries do not duplicate")."""

from __future__ import annotations

from pathlib import Path

import click

from .shared import broker_option, fail, refusal_fails, timeout_option, with_client


@click.group()
def keys() -> None:
    """CURVE keys: `phpmq keys generate NAME` writes NAME.key (public: give it to the other
    side) and NAME.key_secret (keep it), in the format pyzmq's zmq.auth uses. Key holds:
    `phpmq keys holds` lists what keeps idempotency keys past the dedup window (a Spark sink
    query's), `phpmq keys release SCOPE` drops one an abandoned query left."""


@keys.command("holds")
@broker_option
@timeout_option
def holds(address: str, timeout: float) -> None:
    """List key holds: scope (a Spark sink query's id), the last batch it committed, the
    keys it holds and of which batches, whose key made it, and when."""
    import datetime

    from rich.console import Console
    from rich.table import Table

    result = with_client(address, timeout, lambda c: refusal_fails(lambda: c.key_holds(timeout)))
    table = Table(title=f"key holds on {address}")
    for column in ("scope", "committed", "held keys", "batches", "owner", "made"):
        table.add_column(column, justify="right" if column == "held keys" else "left")
    for hold in result["holds"]:
        batches = "-".join(str(batch) for batch in dict.fromkeys(hold["batches"]))
        made = datetime.datetime.fromtimestamp(hold["created"]).isoformat(timespec="seconds")
        committed = "none" if hold["committed"] is None else str(hold["committed"])
        row = (hold["scope"], committed, str(hold["held_keys"]), batches, hold["owner"], made)
        table.add_row(*row)
    Console(width=200).print(table)
    click.echo(f"{len(result['holds'])} key holds, {result['held_keys']} held keys", err=True)


@keys.command("release")
@broker_option
@timeout_option
@click.argument("scope")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def release(address: str, timeout: float, scope: str, yes: bool) -> None:
    """Drop the key hold SCOPE (a query abandoned for good): its keys get the dedup window
    from now, then go. A query that runs again later may then queue its last batch twice."""
    if not yes:
        click.confirm(f"Release key hold {scope} on {address}?", abort=True)
    released = with_client(
        address, timeout, lambda c: refusal_fails(lambda: c.release_key_hold(scope, timeout))
    )
    click.echo(f"released key hold {scope!r}: {released} key(s) get the window")


@keys.command()
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    default=".",
    show_default=True,
    help="Where to write the two files.",
)
@click.option("--force", is_flag=True, help="Replace files that exist.")
def generate(name: str, directory: str, force: bool) -> None:
    """Write NAME.key and NAME.key_secret; the key's name in --curve-clients and in the
    permissions file is NAME."""
    from zmq.auth import create_certificates

    from ..broker.shell.keyring import KEY_NAME, read_key_pair

    if KEY_NAME.match(name) is None:
        fail(f"a key name is 1-100 letters, digits, '.', '_', '@' or '-': {name!r}")
    folder = Path(directory)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    if not force and (public.exists() or secret.exists()):
        fail(f"{public} or {secret} exists already (--force replaces them)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        create_certificates(folder, name)
        secret.chmod(0o600)
        pair = read_key_pair(secret)
    except OSError as exc:
        fail(f"cannot write the keys in {folder}: {exc}")
    click.echo(f"wrote {public} (public: {pair.public.decode()}) and {secret} (keep it secret)")
