"""The console as a Starlette application: the routes of `pages` and `actions`, the session
cookie, the security headers every answer carries, and the watch that polls the broker for as
long as the application runs."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .actions import Actions
from .console import Console, ConsoleSettings
from .pages import Pages

SESSION_COOKIE = "phpmq_web"
SESSION_SECONDS = 12 * 3600
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


def create_app(settings: ConsoleSettings) -> Starlette:
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
