"""`phpmq keys`: CURVE key pairs for the broker and its clients (docs/security.md)."""

from __future__ import annotations

from pathlib import Path

import click

from .shared import fail


@click.group()
def keys() -> None:
    """CURVE keys: `phpmq keys generate NAME` writes NAME.key (public: give it to the other
    side) and NAME.key_secret (keep it), in the format pyzmq's zmq.auth uses."""


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
