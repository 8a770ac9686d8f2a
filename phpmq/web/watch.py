"""The console's side of the broker: one `AsyncClient` (and, on a sharded broker, one per
other shard of its map) that asks for `stats` every `interval` seconds, and what the pages
read from the answers: the queue table with its rates, the peers, the rate history for the
graphs. Pages never ask for stats themselves, so viewers add nothing to the broker's load.

Actions go through `act`, which names the console's user in the ADMIN options (`by`): the
broker's audit log prints the options with who ran the command (docs/security.md "Audit").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from phpmq import AsyncClient, BrokerRefused, ClientError

from ..monitor import Monitor, merged_stats, rate
from ..protocol import admin_commands as cmd
from .tables import QueueLine, queue_lines
from .users import User

log = logging.getLogger("phpmq.web")

#: Samples kept per queue (and for the whole broker) for the rate graphs.
HISTORY_SAMPLES = 90
#: Queues with a rate history at most; more are counted in `graphs_refused`.
MAX_GRAPHED_QUEUES = 2000
#: The HELLO name the console's connections give (stats lists it among the peers).
CLIENT_NAME = "phpmq-web"

Sample = tuple[float | None, float | None]


@dataclass(frozen=True)
class Snapshot:
    """The last `stats` answer and what was made of it."""

    stats: dict[str, Any] | None = None
    queues: list[QueueLine] = field(default_factory=list)
    #: Messages per second into and out of all queues (None: no earlier answer).
    in_rate: float | None = None
    out_rate: float | None = None
    #: When the answer came (wall-clock seconds).
    taken_at: float | None = None
    #: Why the last poll got no answer (None: it did).
    problem: str | None = None


class Watch:
    def __init__(self, address: str, interval: float, timeout: float) -> None:
        self.address = address
        self.interval = interval
        self.timeout = timeout
        self._home: AsyncClient | None = None
        self.snapshot = Snapshot()
        self.history: OrderedDict[str, deque[Sample]] = OrderedDict()
        self.broker_history: deque[Sample] = deque(maxlen=HISTORY_SAMPLES)
        #: Queues left without a graph to stay within MAX_GRAPHED_QUEUES.
        self.graphs_refused = 0
        self.polls = 0
        self.failed_polls = 0
        self._monitor = Monitor()
        self._counters: tuple[float, dict[str, int]] | None = None
        self._shards: dict[str, AsyncClient] = {}

    def _client(self, address: str) -> AsyncClient:
        return AsyncClient(
            address,
            name=CLIENT_NAME,
            role="console",
            send_timeout=self.timeout,
            close_timeout=min(self.timeout, 2.0),
        )

    @property
    def client(self) -> AsyncClient:
        """The client of the broker at `address`, made on first use: on the loop that serves
        (an AsyncClient belongs to the loop it was made on)."""
        if self._home is None:
            self._home = self._client(self.address)
        return self._home

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await self.poll()
            await asyncio.sleep(self.interval)

    async def poll(self) -> None:
        try:
            stats = await self._stats()
        except ClientError as exc:
            self.failed_polls += 1
            self.snapshot = Snapshot(
                self.snapshot.stats,
                self.snapshot.queues,
                taken_at=self.snapshot.taken_at,
                problem=str(exc),
            )
            return
        self.polls += 1
        now = time.monotonic()
        view = self._monitor.update(stats, now)
        in_rate, out_rate = self._broker_rates(stats["counters"], now)
        self.snapshot = Snapshot(
            stats, queue_lines(stats, view.queues, time.time()), in_rate, out_rate, time.time()
        )
        self.broker_history.append((in_rate, out_rate))
        self._remember(self.snapshot.queues)

    def _broker_rates(self, counters: dict[str, int], now: float) -> Sample:
        previous, self._counters = self._counters, (now, counters)
        if previous is None or now <= previous[0]:
            return None, None
        interval = now - previous[0]
        return (
            rate(counters["received"], previous[1].get("received"), interval),
            rate(counters["dispatched"], previous[1].get("dispatched"), interval),
        )

    def _remember(self, lines: list[QueueLine]) -> None:
        """Each queue's rates onto its history; queues gone from stats are forgotten."""
        present = {line.name for line in lines}
        for name in [name for name in self.history if name not in present]:
            del self.history[name]
        for line in lines:
            samples = self.history.get(line.name)
            if samples is None:
                if len(self.history) >= MAX_GRAPHED_QUEUES:
                    self.graphs_refused += 1
                    continue
                samples = self.history[line.name] = deque(maxlen=HISTORY_SAMPLES)
            samples.append((line.in_rate, line.out_rate))

    async def _stats(self) -> dict[str, Any]:
        """The broker's stats; a sharded broker's merged over every shard of its map."""
        home = await self.client.admin(cmd.STATS, timeout=self.timeout)
        mapping = self.client.cluster_map
        if mapping is None or len(mapping.shards) < 2:
            return home
        mine = self.client.broker_info.get("shard")
        answers = {mine: home}
        unreachable = {}
        for shard in mapping.shards:
            if shard.name == mine:
                continue
            try:
                answers[shard.name] = await self._shard(shard.name, shard.address).admin(
                    cmd.STATS, timeout=self.timeout
                )
            except ClientError as exc:
                unreachable[shard.name] = str(exc)
        addresses = {shard.name: shard.address for shard in mapping.shards}
        return merged_stats(answers, addresses, unreachable)

    def _shard(self, name: str, address: str) -> AsyncClient:
        client = self._shards.get(name)
        if client is None or client.address != address:
            client = self._shards[name] = self._client(address)
        return client

    def every_shard(self) -> list[AsyncClient]:
        """The console's client and its client of every other shard (for schedules, which
        live on the shard that owns their queue, or any shard for an event)."""
        return [self.client, *self._shards.values()]

    async def act(self, user: User, command: str, **options: Any) -> dict[str, Any]:
        """An ADMIN command run for `user`, whose name the broker's audit line shows
        (`by`); a command about one queue goes to the shard that owns it."""
        return await self.client.admin(command, timeout=self.timeout, by=user.name, **options)

    async def act_everywhere(self, user: User, command: str, **options: Any) -> int:
        """An ADMIN command on every shard; how many did it (a 404 is not done)."""
        done = 0
        for client in self.every_shard():
            try:
                await client.admin(command, timeout=self.timeout, by=user.name, **options)
            except BrokerRefused as exc:
                if exc.error.code != 404:
                    raise
            else:
                done += 1
        return done

    async def close(self) -> None:
        if self._home is None:
            return
        for client in self.every_shard():
            with contextlib.suppress(ClientError):
                await client.close()
