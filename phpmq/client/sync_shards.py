# auto-generated from aio_shards.py by tools/unasync.py; do not edit.
"""`Client`'s routing on a sharded broker (docs/client.md "Sharded brokers"): links to
the shards that own the queues it uses, made the first time one is needed, a receive that
reads every connection at once, moving subscriptions when the map changes, and closing them
all. A mixin of `Client` (sync.py); which shard owns what is decided in shards.py.
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any

from . import sync_backend as backend
from .errors import BrokerRefused, ClientError
from .message import ReceivedMessage

log = logging.getLogger("phpmq.client")


class SyncShards:
    """Routing for the blocking client. Every method is `Client`'s."""

    def _link_for(self, queue: str) -> Any:
        """The link to the owner of `queue`, made if need be (None: the home connection).
        The first call waits for the home HELLO answer, up to `confirm_timeout`."""
        shards = self._decided_routing()
        if shards is None or self.closed:
            return None
        if shards.moves_due:
            self._move_subscriptions()
        owner = shards.elsewhere(queue)
        if owner is None:
            return None
        return shards.links.get(owner.name) or self._new_link(owner)

    def _decided_routing(self) -> Any:
        """The routing in force once the home HELLO answer came (waited for up to
        `confirm_timeout`, the first time); None: everything stays at home."""
        if self._routing is not None and not self._routing.decided:
            self._await_limits()
            self._routing_waited_for()
        return self._routing

    def _window_at_owner(self, queue: str) -> int | None:
        """The window last asked for on `queue`, at the connection consuming it."""
        link = self._link_for(queue) if self._routing is not None else None
        return (link or self)._connection.window(queue)

    def _move_subscriptions(self) -> None:
        """A newer map moved some consumed queues: cancel each at its old owner and consume
        it at the new one."""
        for move in self._shards.take_moves():
            old = self._client_at(move.old)
            if old is not None:
                try:
                    inspect.unwrap(type(old).cancel)(old, move.queue)
                except ClientError as exc:
                    log.warning("moving %r from shard %s: %s", move.queue, move.old, exc)
            new = self._client_at(move.new.name) or self._new_link(move.new)
            inspect.unwrap(type(new).subscribe)(new, move.queue, **move.subscribe_options())

    # ------------------------------------------------------------------ receiving

    def _receive_merged(self, timeout: float | None) -> ReceivedMessage | None:
        """`receive` over the home connection and every link: the first message any of them
        has, waiting for news from any of them while none has one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._shards.moves_due:
                self._move_subscriptions()
            clients = self._shards.in_turn(self)
            for client in clients:
                message = client._take_received()
                if message is not None:
                    return message  # type: ignore[no-any-return]
            wait = None if deadline is None else deadline - time.monotonic()
            backend.news_from_any(self, clients, wait)
            if wait is not None and wait <= 0:
                return next((m for c in clients if (m := c._take_received())), None)

    # ------------------------------------------------------------------ closing

    def _close_links(self) -> BrokerRefused | None:
        """Close every link (each says goodbye); the first refusal they raise, if any."""
        refused: BrokerRefused | None = None
        for link in self._links():
            try:
                link.close()
            except BrokerRefused as exc:
                refused = refused or exc
        return refused

    def _every_shard(self) -> list[Any]:
        """This client and a link to every other shard of the map (just this client when
        the broker is not sharded)."""
        shards = self._decided_routing()
        if shards is None:
            return [self]
        return [self, *(shards.links.get(s.name) or self._new_link(s) for s in shards.others())]

