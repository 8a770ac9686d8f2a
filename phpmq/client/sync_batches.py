# auto-generated from aio_batches.py by tools/unasync.py; do not edit.
"""`Client`'s sends of many messages to one queue and publishes of many as one event:
packed several to a frame (batches.py), and with confirms pipelined, `max_unconfirmed` out
before it waits, sending again what the broker refused while it paused a queue (confirms.py
keeps the count). A mixin of `Client` (sync.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .batches import HeadersItem, MessageKeyItem, messages_per_frame, partly_sent
from .confirms import ConfirmedSends
from .errors import ClientError, InvalidArgument, Paused
from .shards import to_owner


class SyncBatchSends:
    """`send_many` and `publish_many` for the blocking client. Every method is `Client`'s,
    with its lock."""

    @to_owner
    def send_many(
        self,
        queue: str,
        contents: Iterable[bytes | str],
        ttl: int = 0,
        *,
        confirm: bool = False,
        keys: Iterable[str] | None = None,
        headers: Iterable[HeadersItem] | None = None,
        message_keys: Iterable[MessageKeyItem] | None = None,
        max_unconfirmed: int = 5_000,
        on_confirm: Callable[[int, str], None] | None = None,
    ) -> int | list[str]:
        """Send many messages to one queue, packed several to a frame. Returns the count, or
        with `confirm=True` the list of message IDs in order. `keys` (one per message) make
        the sends idempotent, as in `send`; `headers` (one dict, its JSON object already
        encoded as bytes and sent as given, or None per message) and `message_keys` (one
        bytes, text or None per message) go with each message as `send`'s do. Without
        `headers` and `message_keys` nothing is done per message beyond encoding it.

        With `confirm=True` the sends are pipelined: up to `max_unconfirmed` are out before
        the client waits for answers, so the broker's group commit confirms whole batches;
        `on_confirm(index, message_id)` is called as confirms come in (in order).

        Raises:
            PartialSend: a frame was not taken; its `sent` says how many went before it.
            Unconfirmed: (confirm) some were refused or not answered; its `ids` and `errors`
                say which, for the messages read from `contents` so far. Once a refusal
                or a silence is seen nothing more is sent; sends already out (up to
                `max_unconfirmed`) are still answered and reported.
            ValueError: `keys`, `headers` or `message_keys` has fewer entries than
                `contents`; or (also a ClientError) the queue name or a key breaks the
                protocol's rules, or content or headers are over the broker's size limit.
            Paused: the broker paused sends to the queue and no RESUME came within
                `send_timeout`; also a PartialSend (`sent`) and, confirmed, an Unconfirmed
                (`ids`, `errors`), as above.
        """
        self._before_sends(confirm)
        batches = self._connection.send_batches(
            queue, contents, ttl, keys, confirm=confirm, headers=headers,
            message_keys=message_keys, batch_messages=messages_per_frame(confirm, max_unconfirmed),
        )  # fmt: skip
        if confirm:
            sends = ConfirmedSends(max_unconfirmed, on_confirm)
            return self._send_confirmed(queue, batches, sends)
        return self._send_unconfirmed(queue, batches)

    def publish_many(
        self,
        event: str,
        contents: Iterable[bytes | str],
        ttl: int = 0,
        *,
        confirm: bool = True,
        keys: Iterable[str] | None = None,
        headers: Iterable[HeadersItem] | None = None,
        message_keys: Iterable[MessageKeyItem] | None = None,
        max_unconfirmed: int = 5_000,
    ) -> int | list[int]:
        """Publish many messages as `event`, packed several to a frame, pipelined as a
        confirmed `send_many` is. Returns, with `confirm` (the default), how many queues got
        a copy of each message, in order (0: none is bound, or a repeated key); without, the
        count sent. `keys`, `headers` and `message_keys` are per message, as in `send_many`.

        Raises:
            InvalidArgument: (at once, nothing sent) a bad event name; (when reached) a bad
                key, content or headers over the broker's limit.
            Unconfirmed: (confirm) some were refused (429 naming a full bound queue: that
                message reached no queue) or not answered: `ids` (each message's first copy,
                or None) and `errors` by index; nothing more is sent after a refusal.
            PartialSend: (no confirm) a frame was not taken; `sent` went before it.
            Paused: sends were paused and no RESUME came within `send_timeout`.
        """
        self._before_sends(confirm)
        connection = self._connection
        batches = connection.publish_batches(
            event, contents, ttl, keys, confirm=confirm, headers=headers,
            message_keys=message_keys, batch_messages=messages_per_frame(confirm, max_unconfirmed),
        )  # fmt: skip
        if not confirm:
            return self._send_unconfirmed(None, batches)
        sends = ConfirmedSends(max_unconfirmed, count_of=connection.publish_count)
        self._send_confirmed(None, batches, sends)
        return sends.counts

    def _send_unconfirmed(
        self, queue: str | None, batches: Iterable[tuple[bytes, int, list[int]]]
    ) -> int:
        sent = 0
        try:
            for frame, count, _ in batches:
                self._wait_while_paused(queue)
                self._send_frame(frame, count)
                sent += count
        except InvalidArgument:
            raise
        except ClientError as exc:
            raise partly_sent(exc, sent) from None
        return sent

    def _send_confirmed(
        self,
        queue: str | None,
        batches: Iterable[tuple[bytes, int, list[int]]],
        sends: ConfirmedSends,
    ) -> list[str]:
        try:
            for frame, count, tags in batches:
                first = sends.read(count)
                oldest = sends.to_wait_for(count)
                if oldest:
                    sends.record(self._await_answers(oldest, self.confirm_timeout))
                if sends.to_resend:
                    self._resend(sends)
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
                self._resend(sends)
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

    def _resend(self, sends: ConfirmedSends) -> None:
        """Send the flow refusals of a confirmed batch again, once the pauses that refused
        them are over."""
        for queue in sends.paused_queues():
            self._wait_while_paused(queue)
        frame, count, tags = sends.resends()
        self._send_frame(frame, count, tags)
        sends.resent(frame)
