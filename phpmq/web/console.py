"""What every route of the console needs: its settings, the watch, the access rules, the
templates and their filters, and the one-line notices an action leaves for the next page."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from .access import Access
from .users import User
from .watch import Watch

#: Messages shown once on the next page (after an action), kept per session at most.
MAX_FLASHES = 5


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
