# auto-generated from aio_batches.py by tools/unasync.py; do not edit.
"""`Client`'s sends of many messages to one queue: packed several to a frame
(batches.py), and with confirms pipelined, `max_unconfirmed` out before it waits, sending again
what the broker refused while it paused the queue (confirms.py keeps the count). A mixin of
`Client` (sync.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .batches import BATCH_MESSAGES
from .confirms import ConfirmedSends
from .errors import ClientError, InvalidArgument, PartialSend, Paused
from .shards import to_owner


class SyncBatchSends:
    """`send_many` for the blocking client. Every method is `Client`'s, with its lock."""

    @to_owner
    def send_many(
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
        """Send many messages to one queue, packed several to a frame. Returns the count, or
        with `confirm=True` the list of message IDs in order. `keys` (one per message) make
        the sends idempotent, as in `send`.

        With `confirm=True` the sends are pipelined: up to `max_unconfirmed` are out before
        the client waits for answers, so the broker's group commit confirms whole batches;
        `on_confirm(index, message_id)` is called as confirms come in (in order).

        Raises:
            PartialSend: a frame was not taken; its `sent` says how many went before it.
            Unconfirmed: (confirm) some were refused or not answered; its `ids` and `errors`
                say which, for the messages read from `contents` so far. Once a refusal
                or a silence is seen nothing more is sent; sends already out (up to
                `max_unconfirmed`) are still answered and reported.
            ValueError: `keys` has fewer entries than `contents`; or (also a ClientError)
                the queue name or a key breaks the protocol's rules.
            Paused: the broker paused sends to the queue and no RESUME came within
                `send_timeout`; also a PartialSend (`sent`) and, confirmed, an Unconfirmed
                (`ids`, `errors`), as above.
        """
        if self._connection.refusals.sends:
            self._tell_refused_sends()
        if confirm and not self._connection.knows_limits:
            self._await_limits()
        batch_messages = max(1, min(BATCH_MESSAGES, max_unconfirmed)) if confirm else BATCH_MESSAGES
        batches = self._connection.send_batches(
            queue, contents, ttl, keys, confirm=confirm, batch_messages=batch_messages
        )
        if confirm:
            sends = ConfirmedSends(max_unconfirmed, on_confirm)
            return self._send_confirmed(queue, batches, sends)
        sent = 0
        try:
            for frame, count, _ in batches:
                self._wait_while_paused(queue)
                self._send_frame(frame, count)
                sent += count
        except InvalidArgument:
            raise
        except Paused as exc:
            raise self._partly_sent(exc, sent) from None
        except ClientError as exc:
            raise PartialSend(str(exc), sent) from None
        return sent

    def _send_confirmed(
        self, queue: str, batches: Iterable[tuple[bytes, int, list[int]]], sends: ConfirmedSends
    ) -> list[str]:
        try:
            for frame, count, tags in batches:
                first = sends.read(count)
                oldest = sends.to_wait_for(count)
                if oldest:
                    sends.record(self._await_answers(oldest, self.confirm_timeout))
                if sends.to_resend:
                    self._resend(queue, sends)
                if sends.stopped:
                    break
                self._wait_while_paused(queue)
                self._send_frame(frame, count, tags)
                sends.sent(first, tags, frame)
            while True:
                outstanding = sends.outstanding_tags()
                sends.record(self._await_answers(outstanding, self.confirm_timeout))
                if not sends.to_resend or sends.stopped:
                    break
                self._resend(queue, sends)
        except BaseException as exc:
            if isinstance(exc, Paused):  # what went out before the pause is answered by now
                outstanding = sends.outstanding_tags()
                sends.record(self._await_answers(outstanding, self.confirm_timeout))
            with self._lock:
                self._connection.take_answers(sends.outstanding_tags())
            if not isinstance(exc, ClientError) or isinstance(exc, InvalidArgument):
                raise
            raise sends.interrupted(exc) from None
        return sends.result(self.confirm_timeout, self._unanswered_why())

    def _resend(self, queue: str, sends: ConfirmedSends) -> None:
        """Send the flow refusals of a confirmed send_many again, once the pause is over."""
        self._wait_while_paused(queue)
        frame, count, tags = sends.resends()
        self._send_frame(frame, count, tags)
        sends.resent(frame)
