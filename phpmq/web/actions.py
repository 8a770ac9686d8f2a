"""What the console changes (POST, admins only, each with the session's CSRF token): send,
publish, replay dead letters, add a schedule, and the destructive ones, which a page of
their own asks about first (GET: the question; POST: done). Each ADMIN command carries the
user's name to the broker's audit log (`Watch.act`); sends and publishes, which the broker
does not audit, are logged here (`phpmq.web.audit`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from phpmq import BrokerRefused, ClientError, InvalidArgument

from ..broker.routing import Bindings
from ..client.schedules import schedule_options
from ..protocol import admin_commands as cmd
from .console import Console, flash, queue_url
from .users import User

audit = logging.getLogger("phpmq.web.audit")


class Refused(Exception):
    """An action that cannot be done, said in its message."""


@dataclass(frozen=True)
class Danger:
    """A destructive action: the page that asks, and the command it then runs."""

    path: str
    title: str
    #: What will be lost, shown on the question's page ({name} is the queue or schedule).
    warning: str
    button: str
    command: str
    #: Where to go afterwards ({name}-free: a list page) or None for the queue's page.
    back: str | None
    #: What the answer says, for the next page.
    done: Callable[[str, dict[str, Any]], str]


DANGERS = (
    Danger(
        "/queue/purge",
        "Purge queue {name}",
        "Every ready message of {name} is deleted. Messages in flight, delayed ones and dead"
        " letters stay, and so do the queue and its consumers.",
        "Purge",
        cmd.QUEUE_PURGE,
        None,
        lambda name, answer: f"purged {answer['purged']} messages from {name}",
    ),
    Danger(
        "/queue/delete",
        "Delete queue {name}",
        "The queue goes at once with its ready, in flight and delayed messages, its dead"
        " letters and its bindings; its consumers are told.",
        "Delete",
        cmd.QUEUE_DELETE,
        "/queues",
        lambda name, answer: f"deleted queue {name} ({answer.get('purged', 0)} ready messages)",
    ),
    Danger(
        "/queue/dlq-purge",
        "Purge the dead letters of {name}",
        "Every dead letter of {name} is deleted; its ready messages stay.",
        "Purge dead letters",
        cmd.DLQ_PURGE,
        None,
        lambda name, answer: f"purged {answer['purged']} dead letters from {name}",
    ),
    Danger(
        "/schedules/remove",
        "Remove schedule {name}",
        "The schedule {name} stops at once and is forgotten.",
        "Remove",
        cmd.SCHEDULE_REMOVE,
        "/schedules",
        lambda name, answer: f"removed schedule {name}",
    ),
)


class Actions:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.watch = console.watch

    def routes(self) -> list[Route]:
        access = self.console.access
        routes = [
            Route("/queue/send", access.action(self.send), methods=["POST"]),
            Route("/queue/dlq-replay", access.action(self.replay), methods=["POST"]),
            Route("/events/publish", access.action(self.publish), methods=["POST"]),
            Route("/schedules/add", access.action(self.add_schedule), methods=["POST"]),
        ]
        for danger in DANGERS:
            routes += [
                Route(danger.path, access.admin_page(self._asker(danger)), methods=["GET"]),
                Route(danger.path, access.action(self._doer(danger)), methods=["POST"]),
            ]
        return routes

    def _asker(self, danger: Danger) -> Callable[[Request, User], Awaitable[Response]]:
        async def ask(request: Request, user: User) -> Response:
            name = request.query_params.get("name", "")
            stats = self.watch.snapshot.stats or {"queues": {}}
            return self.console.render(
                request,
                user,
                "confirm.html",
                danger=danger,
                name=name,
                figures=stats["queues"].get(name),
                back=_back(danger, name),
            )

        return ask

    def _doer(self, danger: Danger) -> Callable[[Request, FormData, User], Awaitable[Response]]:
        async def do(request: Request, form: FormData, user: User) -> Response:
            name = str(form.get("name", ""))
            back = _back(danger, name)
            if danger.command == cmd.SCHEDULE_REMOVE:
                action = self._remove_schedule(user, name)
            else:
                action = self.watch.act(user, danger.command, queue=name)
            return await self._done(request, back, action, lambda a: danger.done(name, a))

        return do

    async def _remove_schedule(self, user: User, name: str) -> dict[str, Any]:
        if not await self.watch.act_everywhere(user, cmd.SCHEDULE_REMOVE, name=name):
            raise Refused(f"no schedule named {name!r}")
        return {}

    async def _done(
        self,
        request: Request,
        back: str,
        action: Awaitable[Any],
        told: Callable[[Any], str],
    ) -> Response:
        """Run `action`; flash what it did, or why it was refused; go `back`."""
        try:
            answer = await action
        except BrokerRefused as exc:
            flash(request, "refused", f"refused ({exc.error.code}): {exc.error.reason}")
        except (ClientError, Refused) as exc:  # InvalidArgument too: a bad name or value
            flash(request, "refused", str(exc))
        else:
            flash(request, "done", told(answer))
        return RedirectResponse(back, status_code=303)

    async def send(self, request: Request, form: FormData, user: User) -> Response:
        name = str(form.get("name", ""))
        content = str(form.get("content", "")).encode()
        ttl = _integer(form.get("ttl"))
        audit.info("send to %r by %s (%d bytes)", name, user.name, len(content))
        sent = self.watch.client.send(name, content, ttl, confirm=True)
        return await self._done(request, queue_url(name), sent, lambda i: f"sent {i} to {name}")

    async def replay(self, request: Request, form: FormData, user: User) -> Response:
        name = str(form.get("name", ""))
        one = form.get("id")
        options: dict[str, Any] = {"ids": [str(one)]} if one else {}
        replayed = self.watch.act(user, cmd.DLQ_REPLAY, queue=name, **options)
        return await self._done(
            request, queue_url(name), replayed, lambda a: f"replayed {a['replayed']} into {name}"
        )

    async def publish(self, request: Request, form: FormData, user: User) -> Response:
        event = str(form.get("event", ""))
        content = str(form.get("content", "")).encode()

        async def publish() -> str:
            bound = await self._bindings()
            audit.info("publish %r by %s (%d bytes)", event, user.name, len(content))
            copies = await self.watch.client.publish(event, content)
            reached = sorted(bound.match(event)) if copies else []
            return f"published {event}: {copies} queue(s) got a copy" + (
                f": {', '.join(reached)}" if reached else ""
            )

        return await self._done(request, "/events", publish(), str)

    async def _bindings(self) -> Bindings:
        """Every queue's bindings as the broker routes by them (the ones `stats` cut short
        asked for in full)."""
        bindings = Bindings()
        stats = self.watch.snapshot.stats or {"queues": {}}
        for name, figures in stats["queues"].items():
            patterns = figures["bindings"]
            if figures["binding_count"] > len(patterns):
                with_all = await self.watch.client.admin(cmd.QUEUE_BINDINGS, queue=name)
                patterns = with_all["bindings"]
            for pattern in patterns:
                bindings.bind(name, pattern)
        return bindings

    async def add_schedule(self, request: Request, form: FormData, user: User) -> Response:
        async def add() -> dict[str, Any]:
            options = schedule_options(**_schedule_fields(form))
            return await self.watch.act(user, cmd.SCHEDULE_ADD, **options)

        name = str(form.get("name", ""))
        return await self._done(
            request,
            "/schedules",
            add(),
            lambda a: f"{'replaced' if a['replaced'] else 'added'} schedule {name}",
        )


def _back(danger: Danger, name: str) -> str:
    return danger.back or queue_url(name)


def _integer(value: Any) -> int:
    try:
        return max(0, int(str(value or 0)))
    except ValueError:
        return 0


def _schedule_fields(form: FormData) -> dict[str, Any]:
    """schedule_options' arguments from the schedule form (InvalidArgument for bad ones)."""
    target = str(form.get("target", "")).strip()
    is_event = form.get("kind") == "event"
    every = str(form.get("every", "")).strip()
    cron = str(form.get("cron", "")).strip()
    headers = str(form.get("headers", "")).strip()
    return {
        "name": str(form.get("name", "")).strip(),
        "queue": None if is_event else target,
        "content": str(form.get("content", "")),
        "event": target if is_event else None,
        "every": _seconds(every) if every else None,
        "cron": cron or None,
        "tz": str(form.get("tz", "") or "UTC").strip(),
        "nohaste": form.get("nohaste") == "on",
        "catch_up": str(form.get("catch_up", "run-once")),
        "ttl": _integer(form.get("ttl")),
        "headers": _json_object(headers) if headers else None,
    }


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidArgument("headers must be a JSON object", text)
    return value


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidArgument("every must be a number of seconds", text) from None
