# auto-generated from aio_requests.py by tools/unasync.py; do not edit.
"""`Client`'s requests and replies (docs/protocol.md §6.6, docs/client.md "Requests and
replies"). A mixin of `Client` (sync.py), kept apart so that neither module grows past
reading size; the protocol side is requests.py, and how a request's frame goes and its
requester waits is the backend's `InFlight` (sync_backend.py).
"""

from __future__ import annotations

import time
from typing import Any

from .batches import HeadersItem
from .errors import RequestTimeout
from .requests import Outcome, ReplyFormat, check_request, result
from .shards import to_owner


class SyncRequests:
    """Request/reply for the blocking client. Every method is `Client`'s, with its lock."""

    @property
    def replies_dropped(self) -> int:
        """Replies that came when no request awaited them (late, repeated, unknown)."""
        own = self._connection.requests.dropped
        return own + sum(link.replies_dropped for link in self._links())  # type: ignore[attr-defined]

    @to_owner
    def request(
        self,
        queue: str,
        content: bytes | str,
        timeout: float = 5.0,
        *,
        headers: HeadersItem = None,
        reply_format: ReplyFormat = "raw",
    ) -> Any:
        """Send `content` to `queue` as a request and return the reply that a worker sends:
        its bytes (`reply_format="raw"`), or decoded from JSON or msgpack (the request's
        headers then carry `reply_format`, so that a `phpmq workers` handler's return value
        is encoded that way). The request's TTL is `timeout` rounded up to whole seconds.
        An asyncio driver's requests may be awaited from many tasks at once.

        Raises:
            InvalidArgument: (at once) a bad queue name, timeout or reply format; content
                or headers over the broker's limit; headers as bytes that are not a JSON
                object.
            ReplyError: the handler failed: `.type_name`, `.text` (and `.code`, `.reason`).
            RequestTimeout: (also a TimeoutError) no reply within `timeout` seconds.
            RequestLost: the connection was replaced before the reply came.
            BrokerRefused: the broker refused the request (a full queue: 429...).
            Paused: sends to the queue were paused and no RESUME came in `send_timeout`.
            ClientError: the socket did not take it within `send_timeout` (no broker), or
                the reply is not in `reply_format`.
        """
        check_request(timeout, reply_format)
        deadline = time.monotonic() + timeout
        connection = self._connection
        if connection.limits_wanted(content):
            self._await_limits()
        self._wait_while_paused(queue)
        with self._lock:
            tag, correlation, frame = connection.request(
                queue, content, timeout, headers, reply_format
            )
            self._in_flight.expect(correlation)
            try:
                self._in_flight.send(frame, tag)
            except BaseException:
                self._end_request(correlation, tag)
                raise
        outcome = self._await_reply(correlation, tag, deadline)
        if outcome is None:
            raise RequestTimeout(f"no reply to the request to {queue!r} within {timeout:g}s")
        return result(outcome, reply_format)

    def _await_reply(self, correlation: str, tag: int, deadline: float) -> Outcome | None:
        """The request's outcome, once it came or `deadline` passed (None); the lock is let
        go between waits."""
        requests = self._connection.requests
        try:
            while True:
                with self._lock:
                    outcome = requests.outcome(correlation)
                    if outcome is not None:
                        return outcome
                    wait = deadline - time.monotonic()
                    if wait <= 0:
                        return None
                    self._flush_quietly()  # a requester that also consumes: its acks go
                    self._in_flight.within(correlation, wait)
        finally:
            self._end_request(correlation, tag)

    def _end_request(self, correlation: str, tag: int) -> None:
        """No longer awaited: a later reply is dropped, the tag's answer forgotten."""
        with self._lock:
            self._in_flight.forget(correlation)
            self._connection.requests.close(correlation, tag)
            self._connection.take_answers([tag])
