"""`AsyncClient`'s sends of many messages to one queue: sync_batches.py's methods as
coroutines, with the same arguments, results and exceptions. A mixin of `AsyncClient`
(aio.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .batches import BATCH_MESSAGES
from .confirms import ConfirmedSends
from .errors import ClientError, InvalidArgument, PartialSend, Paused
from .shards import to_owner_async


class AsyncBatchSends:
    """`send_many` for the asyncio client."""

    @to_owner_async
    async def send_many(
        self,
        queue: str,
        contents: Iterable[bytes | str],
        ttl: int = 0,
        *,
        confirm: bool = False,
        keys: Iterable[str] | None = None,
        max_unconfirmed: int = 5_000,
        on_confirm: Callable[[int, str], None] | None = None,
    ) -> int | list[str]:
        """Send many messages to one queue, packed several to a frame: the count, or with
        `confirm=True` the IDs in order. As `Client.send_many`, with the same exceptions."""
        if self._connection.refusals.sends:
            self._tell_refused_sends()
        if confirm and not self._connection.knows_limits:
            await self._await_limits()
        batch_messages = max(1, min(BATCH_MESSAGES, max_unconfirmed)) if confirm else BATCH_MESSAGES
        batches = self._connection.send_batches(
            queue, contents, ttl, keys, confirm=confirm, batch_messages=batch_messages
        )
        if confirm:
            sends = ConfirmedSends(max_unconfirmed, on_confirm)
            return await self._send_confirmed(queue, batches, sends)
        sent = 0
        try:
            for frame, count, _ in batches:
                await self._wait_while_paused(queue)
                await self._send_frame(frame, count)
                sent += count
        except InvalidArgument:
            raise
        except Paused as exc:
            raise self._partly_sent(exc, sent) from None
        except ClientError as exc:
            raise PartialSend(str(exc), sent) from None
        return sent

    async def _send_confirmed(
        self, queue: str, batches: Iterable[tuple[bytes, int, list[int]]], sends: ConfirmedSends
    ) -> list[str]:
        try:
            for frame, count, tags in batches:
                first = sends.read(count)
                oldest = sends.to_wait_for(count)
                if oldest:
                    sends.record(await self._await_answers(oldest, self.confirm_timeout))
                if sends.to_resend:
                    await self._resend(queue, sends)
                if sends.stopped:
                    break
                await self._wait_while_paused(queue)
                await self._send_frame(frame, count, tags)
                sends.sent(first, tags, frame)
            while True:
                outstanding = sends.outstanding_tags()
                sends.record(await self._await_answers(outstanding, self.confirm_timeout))
                if not sends.to_resend or sends.stopped:
                    break
                await self._resend(queue, sends)
        except BaseException as exc:
            if isinstance(exc, Paused):  # what went out before the pause is answered by now
                outstanding = sends.outstanding_tags()
                sends.record(await self._await_answers(outstanding, self.confirm_timeout))
            self._connection.take_answers(sends.outstanding_tags())
            if not isinstance(exc, ClientError) or isinstance(exc, InvalidArgument):
                raise
            raise sends.interrupted(exc) from None
        return sends.result(self.confirm_timeout, self._unanswered_why())

    async def _resend(self, queue: str, sends: ConfirmedSends) -> None:
        """Send the flow refusals of a confirmed send_many again, once the pause is over."""
        await self._wait_while_paused(queue)
        frame, count, tags = sends.resends()
        await self._send_frame(frame, count, tags)
        sends.resent(frame)
