"""The console's pages (GET): overview, queues, a queue, events, schedules, peers, and the
login. Figures come from the watch's last `stats` answer; a queue's page also peeks at its
messages and lists its dead letters (two ADMIN commands, answered by its owning shard).
Every page re-reads its live parts (`data-live`) every few seconds (static/console.js)."""

from __future__ import annotations

import base64
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from phpmq import ClientError

from ..protocol import ErrorCode
from ..protocol import admin_commands as cmd
from .access import safe_next
from .console import Console, flash
from .content import shown
from .tables import QUEUE_TABLE_COLUMNS, overview_figures, rate_graph, table_order
from .users import User
from .watch import HISTORY_SAMPLES

#: Messages a queue's page peeks at, and dead letters it lists, per page.
PEEK_LIMIT = 20
DEAD_LETTER_LIMIT = 20
#: Bindings `stats` lists per queue; past that the queue's page asks for them all.
LISTED_BINDINGS = 20


class Pages:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.watch = console.watch

    def routes(self) -> list[Route]:
        page = self.console.access.page
        return [
            Route("/", page(self.overview)),
            Route("/queues", page(self.queues)),
            Route("/queue", page(self.queue)),
            Route("/events", page(self.events)),
            Route("/schedules", page(self.schedules)),
            Route("/peers", page(self.peers)),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self.logout, methods=["POST"]),
        ]

    async def overview(self, request: Request, user: User) -> Response:
        stats = self.watch.snapshot.stats
        return self.console.render(
            request,
            user,
            "overview.html",
            figures=overview_figures(stats) if stats else None,
            graph=rate_graph(self.watch.broker_history, HISTORY_SAMPLES),
            code_names=_code_names(),
            watch=self.watch,
            access=self.console.access,
        )

    async def queues(self, request: Request, user: User) -> Response:
        query = request.query_params
        column = query.get("sort", "name")
        descending = query.get("desc") == "1"
        name_filter = query.get("filter", "")
        lines = table_order(self.watch.snapshot.queues, column, descending, name_filter)
        return self.console.render(
            request,
            user,
            "queues.html",
            lines=lines,
            columns=QUEUE_TABLE_COLUMNS,
            sort=column,
            descending=descending,
            name_filter=name_filter,
            sharded="shards" in (self.watch.snapshot.stats or {}),
        )

    async def queue(self, request: Request, user: User) -> Response:
        name = request.query_params.get("name", "")
        stats = self.watch.snapshot.stats or {"queues": {}, "pools": {}}
        figures = stats["queues"].get(name)
        offset = _offset(request.query_params.get("offset"))
        problems: list[str] = []
        peek = await self._asked(user, problems, cmd.QUEUE_PEEK, queue=name, limit=PEEK_LIMIT,
                                 offset=offset)  # fmt: skip
        dead = await self._asked(user, problems, cmd.DLQ_LIST, queue=name, limit=DEAD_LETTER_LIMIT)
        bindings = figures["bindings"] if figures else []
        if figures and figures["binding_count"] > len(bindings):
            listed = await self._asked(user, problems, cmd.QUEUE_BINDINGS, queue=name)
            bindings = listed["bindings"] if listed else bindings
        return self.console.render(
            request,
            user,
            "queue.html",
            status=200 if figures or peek else 404,
            name=name,
            figures=figures,
            bindings=bindings,
            pools=_pools_of(stats.get("pools", {}), name),
            graph=rate_graph(self.watch.history.get(name, ()), HISTORY_SAMPLES),
            peek=_with_content(peek),
            offset=offset,
            dead=_with_content(dead),
            problems=problems,
        )

    async def _asked(
        self, user: User, problems: list[str], command: str, **options: Any
    ) -> dict[str, Any] | None:
        """An ADMIN command's answer, or None with the reason in `problems`."""
        try:
            return await self.watch.act(user, command, **options)
        except ClientError as exc:
            problems.append(f"{command}: {exc}")
            return None

    async def events(self, request: Request, user: User) -> Response:
        stats = self.watch.snapshot.stats or {"queues": {}}
        by_pattern: dict[str, list[str]] = {}
        more = {}
        for name, figures in stats["queues"].items():
            for pattern in figures["bindings"]:
                by_pattern.setdefault(pattern, []).append(name)
            if figures["binding_count"] > len(figures["bindings"]):
                more[name] = figures["binding_count"] - len(figures["bindings"])
        return self.console.render(
            request,
            user,
            "events.html",
            by_pattern=dict(sorted(by_pattern.items())),
            more=more,
            counters=stats.get("counters", {}),
        )

    async def schedules(self, request: Request, user: User) -> Response:
        listed: list[dict[str, Any]] = []
        problems: list[str] = []
        for client in self.watch.every_shard():
            try:
                listed += (await client.admin(cmd.SCHEDULE_LIST, timeout=self.watch.timeout))[
                    "schedules"
                ]
            except ClientError as exc:
                problems.append(f"schedule-list at {client.address}: {exc}")
        listed.sort(key=lambda schedule: str(schedule["name"]))
        return self.console.render(
            request, user, "schedules.html", schedules=listed, problems=problems
        )

    async def peers(self, request: Request, user: User) -> Response:
        stats = self.watch.snapshot.stats or {}
        clients = sorted(stats.get("clients", []), key=lambda c: c["name"] or c["id"])
        return self.console.render(
            request,
            user,
            "peers.html",
            clients=clients,
            peer_count=stats.get("peers", 0),
            pools=stats.get("pools", {}),
            bridges=stats.get("bridges", {}),
        )

    async def login(self, request: Request) -> Response:
        access = self.console.access
        target = safe_next(request.query_params.get("next"))
        if not access.login_required:
            return RedirectResponse(target, status_code=303)
        problem = None
        if request.method == "POST":
            form = await request.form()
            if not access.csrf_ok(request, form):
                problem = "the form was stale: try again"
            else:
                problem = access.log_in(
                    request, str(form.get("name", "")), str(form.get("password", ""))
                )
            if problem is None:
                return RedirectResponse(target, status_code=303)
        return self.console.templates.TemplateResponse(
            request,
            "login.html",
            {"csrf": access.csrf_token(request), "problem": problem, "next": target},
            status_code=200 if problem is None else 401,
        )

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if self.console.access.csrf_ok(request, form):
            request.session.clear()
            flash(request, "done", "logged out")
        return RedirectResponse("/login", status_code=303)


def _offset(text: str | None) -> int:
    try:
        return max(0, int(text or 0))
    except ValueError:
        return 0


def _with_content(answer: dict[str, Any] | None) -> dict[str, Any] | None:
    """A queue-peek or dlq-list answer with each entry's content made safe to show."""
    if answer is None:
        return None
    entries = [
        {**entry, "shown": shown(base64.b64decode(entry["content"]))} for entry in answer["entries"]
    ]
    return {**answer, "entries": entries}


def _pools_of(pools: dict[str, Any], queue: str) -> dict[str, Any]:
    """The worker pools that consume `queue`, with their workers, busy ones and held."""
    return {name: pool["queues"][queue] for name, pool in pools.items() if queue in pool["queues"]}


def _code_names() -> dict[str, str]:
    return {str(int(code)): code.name.lower().replace("_", " ") for code in ErrorCode}
