"""`AsyncClient`'s requests and replies (docs/protocol.md §6.6, docs/client.md "Requests and
replies"). A mixin of `AsyncClient` (aio.py), kept apart so that neither module grows past
reading size; the protocol side is requests.py.

Each request waits on its own future, which the connection's `notify` resolves when that
request's outcome came: a reply wakes its one requester, not every task that waits, so many
requests may be in flight at once. Requests made in the same turn of the event loop leave in
one frame (`_Batch`): one socket send, one broker turn for all of them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .connection import TRUSTED_PACKET_BYTES
from .errors import ClientError, RequestTimeout
from .requests import ReplyFormat, check_request, encode_request, result
from .shards import to_owner_async
from .sync_requests import SMALL_CONTENT


class _Batch:
    """The requests of one turn of the event loop, sent as one frame by the first of them."""

    __slots__ = ("frames", "sent", "tags")

    def __init__(self, sent: asyncio.Future[None]) -> None:
        self.frames: list[bytes] = []
        self.tags: list[int] = []
        #: Done once the frame went out (or with the exception that kept it from going).
        self.sent = sent


class AsyncRequests:
    """Request/reply for the asyncio client. Every method is `AsyncClient`'s."""

    def _init_requests(self) -> None:
        """Called once by `AsyncClient.__init__`: outcomes wake their request's future."""
        self._reply_waiters: dict[str, asyncio.Future[None]] = {}
        self._request_batch: _Batch | None = None
        self._connection.requests.notify = self._outcome_came

    @property
    def replies_dropped(self) -> int:
        """Replies that came when no request awaited them (late, repeated, unknown)."""
        own = self._connection.requests.dropped
        return own + sum(link.replies_dropped for link in self._links())  # type: ignore[attr-defined]

    @to_owner_async
    async def request(
        self,
        queue: str,
        content: bytes | str,
        timeout: float = 5.0,
        *,
        headers: dict[str, Any] | None = None,
        reply_format: ReplyFormat = "raw",
    ) -> Any:
        """Send `content` to `queue` as a request and return the reply; as `Client.request`,
        with the same exceptions. Any number of tasks may await requests at once."""
        check_request(timeout, reply_format)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        connection = self._connection
        if not connection.knows_limits and len(content) > SMALL_CONTENT:
            await self._await_limits()
        await self._wait_while_paused(queue)
        limit = connection.broker_info.get("max_content_bytes", TRUSTED_PACKET_BYTES)
        tag = connection.next_tag()
        requests = connection.requests
        correlation = requests.open(tag)
        waiter = self._reply_waiters[correlation] = loop.create_future()
        time_up = loop.call_at(deadline, _wake, waiter)
        try:
            frame = encode_request(
                queue, content, timeout, headers, reply_format, tag, correlation, limit
            )
            await self._send_request(frame, tag)
            await waiter
        finally:
            time_up.cancel()
            self._reply_waiters.pop(correlation, None)
            outcome = requests.close(correlation, tag)
            connection.take_answers([tag])
        if outcome is None:
            raise RequestTimeout(f"no reply to the request to {queue!r} within {timeout:g}s")
        return result(outcome, reply_format)

    async def _send_request(self, frame: bytes, tag: int) -> None:
        """Hand the request's `frame` to the socket together with those of the other
        requests made in this turn of the loop: the first of them sends them all."""
        batch = self._request_batch
        if batch is not None:
            batch.frames.append(frame)
            batch.tags.append(tag)
            await asyncio.shield(batch.sent)
            return
        batch = self._request_batch = _Batch(asyncio.get_running_loop().create_future())
        batch.frames.append(frame)
        batch.tags.append(tag)
        try:
            await asyncio.sleep(0)  # the other requests of this turn join the batch
            self._request_batch = None
            await self._send_frame(b"".join(batch.frames), len(batch.tags), batch.tags)
        except BaseException as exc:
            if self._request_batch is batch:
                self._request_batch = None
            if len(batch.tags) > 1:  # the others are told; this one raises it itself
                batch.sent.set_exception(exc if isinstance(exc, Exception) else _not_sent())
            raise
        batch.sent.set_result(None)

    def _outcome_came(self, correlation: str) -> None:
        waiter = self._reply_waiters.get(correlation)
        if waiter is not None:
            _wake(waiter)


def _not_sent() -> ClientError:
    """What the requests of a batch raise when the one to send it was cancelled first."""
    return ClientError("request not sent: the request sending it with others was cancelled")


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
