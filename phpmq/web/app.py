"""The console as a Starlette application: settings, the routes of `pages` and `actions`,
the session cookie, the security headers every answer carries, and the watch that polls
the broker for as long as the application runs."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .access import Access
from .users import User
from .watch import Watch

SESSION_COOKIE = "phpmq_web"
SESSION_SECONDS = 12 * 3600
#: Messages shown once on the next page (after an action), kept per session at most.
MAX_FLASHES = 5
#: Sent with every answer: no script, style or frame from anywhere but the console itself
#: (so even content that escaped escaping could not run), no sniffing, no referrer abroad.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        b" object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


@dataclass(frozen=True)
class ConsoleSettings:
    broker: str
    host: str = "127.0.0.1"
    port: int = 8080
    users: dict[str, User] = field(default_factory=dict)
    certfile: Path | None = None
    keyfile: Path | None = None
    #: Seconds between two stats requests to the broker, and between two live updates.
    interval: float = 2.0
    #: Seconds the broker has to answer.
    timeout: float = 5.0

    @property
    def tls(self) -> bool:
        return self.certfile is not None


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every HTTP answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class Console:
    """What every route needs: the watch, the access rules, the templates."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.watch = Watch(settings.broker, settings.interval, settings.timeout)
        self.access = Access(settings.users)
        environment = jinja2.Environment(
            loader=jinja2.PackageLoader("phpmq.web", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        environment.globals["queue_url"] = queue_url
        environment.filters["figure"] = figure
        environment.filters["size"] = size
        self.templates = Jinja2Templates(env=environment)

    def render(
        self, request: Request, user: User, template: str, status: int = 200, **context: Any
    ) -> Response:
        common = {
            "user": user,
            "login_required": self.access.login_required,
            "csrf": self.access.csrf_token(request),
            "flashes": request.session.pop("flashes", []),
            "snapshot": self.watch.snapshot,
            "broker": self.watch.address,
            "refresh_ms": int(self.settings.interval * 1000),
            "page": template,
        }
        return self.templates.TemplateResponse(
            request, template, {**common, **context}, status_code=status
        )


def flash(request: Request, kind: str, text: str) -> None:
    """A line for the next page the session sees: kind "done" or "refused"."""
    flashes = [*request.session.get("flashes", []), [kind, text]]
    request.session["flashes"] = flashes[-MAX_FLASHES:]


def queue_url(name: str, page: str = "") -> str:
    """The URL of a queue's page (or of one of its confirmations): the name is a query
    value, since a queue name may hold `/`, `?` or `#`."""
    return f"/queue{'/' + page if page else ''}?{urlencode({'name': name})}"


def figure(value: object, digits: int = 1) -> str:
    """A number as the tables show it: `-` for unknown, thousands separated."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def size(value: int | None) -> str:
    """Bytes as B, KiB, MiB or GiB."""
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{amount:,.0f} {unit}" if unit == "B" else f"{amount:,.1f} {unit}"
        amount /= 1024
    return f"{amount:,.1f} GiB"


def create_app(settings: ConsoleSettings) -> Starlette:
    from .actions import Actions
    from .pages import Pages

    console = Console(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        polling = asyncio.create_task(console.watch.run())
        try:
            yield
        finally:
            polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await polling
            await console.watch.close()

    static = StaticFiles(packages=[("phpmq.web", "static")])
    app = Starlette(
        routes=[
            *Pages(console).routes(),
            *Actions(console).routes(),
            Mount("/static", app=static, name="static"),
        ],
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(
                SessionMiddleware,
                secret_key=secrets.token_urlsafe(32),
                session_cookie=SESSION_COOKIE,
                max_age=SESSION_SECONDS,
                same_site="strict",
                https_only=settings.tls,
            ),
        ],
        lifespan=lifespan,
    )
    app.state.console = console
    return app
