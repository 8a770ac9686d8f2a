"""Who may do what on the console: the session's user, the login, the roles, and the CSRF
token every action must carry.

The session is Starlette's signed cookie (its key is made at start, so a restart logs
everyone out); it holds the user's name and the CSRF token, never a role: the role is read
from the users file on each request. With no users configured (loopback, or --insecure)
everyone is NOBODY, an admin, and the CSRF token still guards every action.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from .throttle import LoginThrottle
from .users import NOBODY, User, verify

log = logging.getLogger("phpmq.web.access")

Page = Callable[[Request, User], Awaitable[Response]]
Action = Callable[[Request, FormData, User], Awaitable[Response]]
CSRF_FIELD = "csrf"


class Access:
    def __init__(self, users: dict[str, User]) -> None:
        self.users = users
        self.throttle = LoginThrottle()
        #: Actions refused for a missing or wrong CSRF token, or a read-only user.
        self.refused_csrf = 0
        self.refused_role = 0

    @property
    def login_required(self) -> bool:
        return bool(self.users)

    def user_of(self, request: Request) -> User | None:
        if not self.login_required:
            return NOBODY
        return self.users.get(request.session.get("user", ""))

    def csrf_token(self, request: Request) -> str:
        """The session's CSRF token, made on first use."""
        token = request.session.get(CSRF_FIELD)
        if not isinstance(token, str):
            token = request.session[CSRF_FIELD] = secrets.token_urlsafe(32)
        return token

    def csrf_ok(self, request: Request, form: FormData) -> bool:
        given = form.get(CSRF_FIELD)
        expected = request.session.get(CSRF_FIELD)
        return (
            isinstance(given, str)
            and isinstance(expected, str)
            and hmac.compare_digest(given.encode(), expected.encode())
        )

    def log_in(self, request: Request, name: str, password: str) -> str | None:
        """Start the session of `name`; None, or why not."""
        address = request.client.host if request.client else ""
        now = time.monotonic()
        if not self.throttle.allows(address, now):
            return "too many failed logins from here: wait a minute"
        user = verify(self.users, name, password)
        if user is None:
            self.throttle.failed(address, now)
            log.warning("failed login as %r from %s", name, address)
            return "wrong name or password"
        self.throttle.succeeded(address)
        request.session.clear()  # a new session: nothing carried over from before the login
        request.session["user"] = user.name
        log.info("%s logged in from %s", user.name, address)
        return None

    # ----------------------------------------------------------- route wrappers

    def page(self, handler: Page) -> Callable[[Request], Awaitable[Response]]:
        """A page for any logged-in user; others go to the login."""

        async def shown(request: Request) -> Response:
            user = self.user_of(request)
            if user is None:
                return RedirectResponse(f"/login?next={quote(_here(request))}", status_code=303)
            return await handler(request, user)

        return shown

    def admin_page(self, handler: Page) -> Callable[[Request], Awaitable[Response]]:
        """A page that leads to a change (a confirmation): admins only."""

        async def shown(request: Request, user: User) -> Response:
            if not user.may_change:
                self.refused_role += 1
                return _refused(user)
            return await handler(request, user)

        return self.page(shown)

    def action(self, handler: Action) -> Callable[[Request], Awaitable[Response]]:
        """A POST that changes something: a logged-in admin with the session's CSRF token."""

        async def done(request: Request) -> Response:
            user = self.user_of(request)
            if user is None:
                return PlainTextResponse("log in first", status_code=401)
            form = await request.form()
            if not self.csrf_ok(request, form):
                self.refused_csrf += 1
                log.warning("refused %s by %s: no valid CSRF token", request.url.path, user.name)
                return PlainTextResponse(
                    "refused: the form's CSRF token is missing or stale (reload the page)",
                    status_code=403,
                )
            if not user.may_change:
                self.refused_role += 1
                return _refused(user)
            return await handler(request, form, user)

        return done


def _refused(user: User) -> Response:
    log.warning("refused an action of %s: role %s", user.name, user.role)
    return PlainTextResponse(
        f"refused: {user.name} has the {user.role} role and may not change anything",
        status_code=403,
    )


def _here(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def safe_next(target: Any) -> str:
    """Where to go after the login: a path of this site only (never `//elsewhere`)."""
    if (
        isinstance(target, str)
        and target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
    ):
        return target
    return "/"
