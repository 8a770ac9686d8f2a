"""`phpmq web`: the console in a browser (docs/web.md), a process of its own that talks to
the broker as a client. Needs the `web` extra."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import click

from .environment import WEB_BIND_VARIABLE as BIND_VARIABLE
from .environment import WEB_USERS_VARIABLE as USERS_VARIABLE
from .shared import broker_option, fail, timeout_option

DEFAULT_BIND = "127.0.0.1:8080"
#: Connections and requests served at once; more are answered 503 by uvicorn.
MAX_CONCURRENT = 64


class HostPort(click.ParamType):
    """HOST:PORT, [IPv6]:PORT; the port 0-65535 (0: any free port)."""

    name = "host:port"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        host, _, port = str(value).rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or int(port) > 65535:
            self.fail(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8080)", param, ctx)
        return host, int(port)


@click.command()
@broker_option
@timeout_option
@click.option(
    "--bind",
    type=HostPort(),
    envvar=BIND_VARIABLE,
    default=DEFAULT_BIND,
    show_default=True,
    help=f"Where the console listens (env {BIND_VARIABLE}). Off loopback it needs --users and"
    " TLS, or --insecure.",
)
@click.option(
    "--users",
    "users_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=USERS_VARIABLE,
    help=f"TOML file of users, roles (admin, read) and password hashes (env {USERS_VARIABLE});"
    " with it every page needs a login.  [default: none: open on loopback]",
)
@click.option(
    "--certfile",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Serve HTTPS with this certificate (PEM; with --keyfile).  [default: none: HTTP]",
)
@click.option(
    "--keyfile",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The certificate's private key (PEM).  [default: none]",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Listen off loopback without TLS or without users all the same.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.5),
    default=2.0,
    show_default=True,
    help="Seconds between two stats requests to the broker (and live updates of the pages).",
)
@click.option(
    "--hash-password",
    is_flag=True,
    help="Read a password (asked twice on a terminal, else one line of stdin), print its hash"
    " for the users file, and exit.",
)
def web(
    address: str,
    timeout: float,
    bind: tuple[str, int],
    users_path: Path | None,
    certfile: Path | None,
    keyfile: Path | None,
    insecure: bool,
    interval: float,
    hash_password: bool,
) -> None:
    """A web console for the broker: queues with rates, peek, send, purge, delete, dead
    letters, events, schedules, peers; live in the browser (docs/web.md)."""
    _need_the_extra()
    if hash_password:
        _print_hash()
        return
    from ..web.console import ConsoleSettings
    from ..web.exposure import refusal_to_start
    from ..web.users import UsersFileError, load_users

    if (certfile is None) != (keyfile is None):
        raise click.UsageError("--certfile and --keyfile go together")
    try:
        users = load_users(users_path) if users_path is not None else {}
    except UsersFileError as exc:
        fail(str(exc))
    host, port = bind
    refusal = refusal_to_start(host, bool(users), certfile is not None, insecure)
    if refusal:
        fail(refusal)
    settings = ConsoleSettings(address, host, port, users, certfile, keyfile, interval, timeout)
    _serve(settings, _listening_socket(host, port))


def _need_the_extra() -> None:
    try:
        import argon2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        fail(f"phpmq web needs the web extra: pip install 'phpmq-zmq[web]' ({exc.name} is missing)")


def _print_hash() -> None:
    from ..web.users import hash_password

    if sys.stdin.isatty():
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        fail("an empty password")
    click.echo(hash_password(password))


def _listening_socket(host: str, port: int) -> socket.socket:
    """The console's socket, bound here so that a taken port is one line, not a traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        fail(f"cannot listen on {host}:{port}: {exc.strerror}")
    sock.listen(128)
    return sock


def _serve(settings: Any, sock: socket.socket) -> None:
    import uvicorn

    from ..web.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = uvicorn.Config(
        create_app(settings),
        ssl_certfile=settings.certfile,
        ssl_keyfile=settings.keyfile,
        log_level="warning",
        access_log=False,
        log_config=None,
        server_header=False,
        limit_concurrency=MAX_CONCURRENT,
    )
    host, port = sock.getsockname()[:2]
    scheme = "https" if settings.tls else "http"
    where = f"[{host}]" if ":" in host else host
    login = f"login for {len(settings.users)} user(s)" if settings.users else "no login"
    click.echo(
        f"phpmq web: {scheme}://{where}:{port}/ for the broker at {settings.broker} ({login})",
        err=True,
    )
    # uvicorn stops gracefully on SIGTERM and then raises it again: exit 0, as the broker.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    uvicorn.Server(config).run(sockets=[sock])
