"""`AsyncClient`'s requests and replies (docs/protocol.md §6.6, docs/client.md "Requests and
replies"). A mixin of `AsyncClient` (aio.py), kept apart so that neither module grows past
reading size; the protocol side is requests.py.

Each request waits on its own future, which the connection's `notify` resolves when that
request's outcome came: a reply wakes its one requester, not every task that waits, so many
requests may be in flight at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .connection import TRUSTED_PACKET_BYTES
from .errors import RequestTimeout
from .requests import ReplyFormat, check_request, encode_request, result
from .sync_requests import SMALL_CONTENT


class AsyncRequests:
    """Request/reply for the asyncio client. Every method is `AsyncClient`'s."""

    def _init_requests(self) -> None:
        """Called once by `AsyncClient.__init__`: outcomes wake their request's future."""
        self._reply_waiters: dict[str, asyncio.Future[None]] = {}
        self._connection.requests.notify = self._outcome_came

    @property
    def replies_dropped(self) -> int:
        """Replies that came when no request awaited them (late, repeated, unknown)."""
        return self._connection.requests.dropped

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
        try:
            frame = encode_request(
                queue, content, timeout, headers, reply_format, tag, correlation, limit
            )
            async with asyncio.timeout_at(deadline):
                await self._send_frame(frame, 1, (tag,))
                await waiter
        except TimeoutError:
            if requests.outcome(correlation) is None:
                raise RequestTimeout(
                    f"no reply to the request to {queue!r} within {timeout:g}s"
                ) from None
        finally:
            self._reply_waiters.pop(correlation, None)
            outcome = requests.close(correlation, tag)
            connection.take_answers([tag])
        return result(outcome, reply_format)  # type: ignore[arg-type]

    def _outcome_came(self, correlation: str) -> None:
        waiter = self._reply_waiters.get(correlation)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
