"""Either client driven the blocking way, so one test can run against both.

`DrivenClient` puts `AsyncClient` behind `Client`'s blocking interface: each coroutine runs to
completion on an event loop owned by the test thread (its background tasks run while the test
waits in a call, which is when a blocking client works too). The `connect` fixture (registered
in conftest.py) is parametrized over both clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from phpmq.client import AsyncClient, BrokerRefused, Client, ReceivedMessage


class DrivenMessage:
    """A received message of either client, settled the blocking way."""

    def __init__(self, message: ReceivedMessage, driver: DrivenClient) -> None:
        self.message = message
        self._driver = driver

    def __getattr__(self, name: str) -> Any:
        return getattr(self.message, name)

    def ack(self) -> None:
        self._driver.result(self.message.ack())

    def requeue(self, ttl: int = 0, delay: float = 0.0) -> None:
        self._driver.result(self.message.requeue(ttl, delay))

    def dead_letter(self, reason: str | None = None) -> None:
        self._driver.result(self.message.dead_letter(reason))

    def return_unstarted(self) -> None:
        self._driver.result(self.message.return_unstarted())


class DrivenClient:
    """Either client behind `Client`'s blocking interface: a method's coroutine is run on
    `loop`, an async iterator is iterated there, and messages settle through DrivenMessage."""

    def __init__(
        self, client: Client | AsyncClient, loop: asyncio.AbstractEventLoop | None
    ) -> None:
        self.client = client
        self.loop = loop

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)
        if not callable(attribute):
            return attribute
        return lambda *args, **options: self.result(attribute(*args, **options))

    def result(self, value: Any) -> Any:
        if inspect.iscoroutine(value):
            assert self.loop is not None
            value = self.loop.run_until_complete(value)
        if inspect.isasyncgen(value) or inspect.isgenerator(value):
            return self._iterate(value)
        if isinstance(value, ReceivedMessage):
            return DrivenMessage(value, self)
        return value

    def _iterate(self, messages: Any) -> Iterator[Any]:
        while True:
            try:
                if self.loop is not None and inspect.isasyncgen(messages):
                    item = self.loop.run_until_complete(anext(messages))
                else:
                    item = next(messages)
            except (StopIteration, StopAsyncIteration):
                return
            yield self.result(item)

    def __enter__(self) -> DrivenClient:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is None:
            self.close()
            return
        # As the clients do: an error on the way out is not hidden behind a refusal.
        with contextlib.suppress(BrokerRefused):
            self.close()


Connect = Callable[..., DrivenClient]


@pytest.fixture(params=["sync", "async"])
def connect(request: pytest.FixtureRequest) -> Iterator[Connect]:
    """`connect(address=None, **options)`: a client of the kind under test, closed at the end
    (no address: the one PHPMQ_BROKER names, else the default)."""
    made: list[DrivenClient] = []
    loop = asyncio.new_event_loop() if request.param == "async" else None

    def connect(address: str | None = None, **options: Any) -> DrivenClient:
        kind = Client if loop is None else AsyncClient
        driven = DrivenClient(kind(address, **options), loop)
        made.append(driven)
        return driven

    try:
        yield connect
    finally:
        for driven in made:
            driven.close()
        if loop is not None:
            loop.close()
