# auto-generated from aio_topics.py by tools/unasync.py; do not edit.
"""`Client`'s events and queue lifecycle (docs/protocol.md §6.5, docs/client.md
"Events"): publish, bindings, live feeds, cancel, delete and purge. A mixin of `Client`
(sync.py); the protocol side is topics.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ..protocol import admin_commands as cmd
from .batches import HeadersItem
from .errors import ClientError
from .message import queue_packet
from .refusals import FlowRefusal
from .shards import to_owner
from .topics import checked_patterns, live_queue_name, no_patterns, rebind_options


class SyncTopics:
    """Events for the blocking client. Every method is `Client`'s, with its lock."""

    def publish(
        self,
        event: str,
        content: bytes | str,
        ttl: int = 0,
        key: str | None = None,
        headers: HeadersItem = None,
        *,
        confirm: bool = True,
        message_key: bytes | str | None = None,
    ) -> int | None:
        """Publish `content` as `event`: the broker puts one copy into every queue bound to
        a pattern that matches it. With `confirm` (the default) wait for the broker's answer
        and return how many queues got a copy (0: none is bound; also for a repeated `key`,
        which copies nothing again); without, return None at once. `ttl`, `key`,
        `headers` and `message_key` work as in `send`.

        Raises:
            InvalidArgument: (at once, nothing sent) a bad event name or key, content or
                headers over the broker's limit, headers as bytes that are not a JSON object.
            BrokerRefused: the broker refused it (`.error.code`: 422, 429 naming the full
                queue: then no queue got a copy, 503, 507); unconfirmed: at the next call.
            Unconfirmed: (confirm) no answer within `confirm_timeout`.
            Paused: sends were paused and no RESUME came within `send_timeout`.
        """
        connection = self._connection
        if confirm or connection.refusals.sends:
            self._before_sends(confirm)
        tag = connection.next_tag() if confirm else None
        frame = connection.publish(event, content, ttl, headers, tag, key, message_key)
        paused_on: str | None = None
        while True:
            self._wait_while_paused(paused_on)
            self._send_frame(frame, 1, () if tag is None else (tag,))
            if tag is None:
                return None
            [answer] = self._await_answers([tag], self.confirm_timeout)
            if type(answer) is not FlowRefusal:
                self._one_answer(answer)
                return connection.publish_count(tag)
            paused_on = answer.error.queue  # a bound queue filled: wait for its RESUME

    def subscribe_events(self, *patterns: str, window: int = 100) -> str:
        """A live feed: a temporary queue (`live.` + 16 hex digits) bound to `patterns`,
        consumed with `window`, deleted by the broker once this client stops consuming it
        (cancel, close, or the client is lost; after a reconnect it is made again, empty).
        Returns its name; read it with `receive` or `consume(name, window)`."""
        if not patterns:
            raise no_patterns()
        shards = self._decided_routing()  # type: ignore[attr-defined]
        queue = live_queue_name() if shards is None else shards.home_name(live_queue_name)
        self.subscribe(queue, window, bind=patterns, delete_when_unused=0)
        return queue

    @to_owner
    def cancel(self, queue: str, timeout: float = 5.0) -> int:
        """Stop consuming `queue` and wait for the broker's answer: the number of messages
        this client held there, now back at the head of the queue. Acks buffered before go
        first; deliveries of `queue` received and not handed out are dropped (the broker
        takes them back); the subscription is not renewed after a reconnect.

        Raises:
            InvalidArgument: a bad queue name.
            ClientError: no answer within `timeout` seconds.
        """
        connection = self._connection
        self._forget_subscription(queue)
        with self._lock:
            frame = connection.cancel(queue)
            self._send_frame(connection.take_settles() + frame)
            deadline = time.monotonic() + timeout
            while (count := connection.topics.take_cancelled(queue)) is None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise ClientError(
                        f"no answer to cancelling {queue!r} from the broker at {self.address}"
                        f" within {timeout:g}s"
                    )
                self._news_within(wait)
        return count

    # ------------------------------------------------------------------ bindings (admin)

    @to_owner
    def bind(self, queue: str, *patterns: str) -> list[str]:
        """Bind `queue` (made if it does not exist) to `patterns`; its bindings after.
        BrokerRefused (422) past the broker's binding limits: then nothing is bound."""
        queue_packet(queue)
        reply = self.admin(cmd.QUEUE_BIND, queue=queue, patterns=checked_patterns(patterns))
        return list(reply["bindings"])

    @to_owner
    def unbind(self, queue: str, *patterns: str) -> list[str]:
        """Remove `patterns` (as written) from `queue`'s bindings; its bindings after.
        BrokerRefused (404) for a queue that does not exist."""
        queue_packet(queue)
        reply = self.admin(cmd.QUEUE_UNBIND, queue=queue, patterns=checked_patterns(patterns))
        return list(reply["bindings"])

    @to_owner
    def rebind(
        self,
        queue: str,
        replace: Iterable[str] | None = None,
        remove: Iterable[str] = (),
        remove_mask: Iterable[str] = (),
        add: Iterable[str] = (),
    ) -> list[str]:
        """Change `queue`'s bindings in one step, in this order: `replace` (the bindings
        become this list), `remove` (as written), `remove_mask` (every binding the mask
        matches: `order.*` removes `order.paid` and `order.*`), `add`. Its bindings after."""
        queue_packet(queue)
        options = rebind_options(replace, remove, remove_mask, add)
        reply = self.admin(cmd.QUEUE_REBIND, queue=queue, **options)
        return list(reply["bindings"])

    @to_owner
    def bindings(self, queue: str) -> list[str]:
        """`queue`'s binding patterns, in the order bound (BrokerRefused 404: no queue)."""
        queue_packet(queue)
        reply = self.admin(cmd.QUEUE_BINDINGS, queue=queue)
        return list(reply["bindings"])

    @to_owner
    def delete_queue(self, queue: str) -> dict[str, Any]:
        """Delete `queue` at once with everything in it and its bindings; its consumers are
        told (QueueDeleted). Returns what was deleted: counts of `purged`, `in_flight`,
        `delayed`, `dead_letters`, `consumers`, `bindings`. This client's own subscription
        to it ends quietly. BrokerRefused (404) for a queue that does not exist."""
        queue_packet(queue)
        self._forget_subscription(queue)
        with self._lock:
            self._connection.subscribe(queue, 0)  # ours ends here, not told as news
        return self.admin(cmd.QUEUE_DELETE, queue=queue)

    @to_owner
    def purge(self, queue: str) -> int:
        """Delete `queue`'s ready messages (in flight ones and dead letters stay); how many."""
        queue_packet(queue)
        reply = self.admin(cmd.QUEUE_PURGE, queue=queue)
        return int(reply["purged"])
