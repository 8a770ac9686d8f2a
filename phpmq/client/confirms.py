"""What a confirmed send_many or publish_many keeps track of, sans-IO (docs/protocol.md §6.3).

The sends are pipelined: up to `max_unconfirmed` are out before the driver waits for the
oldest answers, so the broker's group commit confirms whole batches. This class says which
answers to wait for, files each answer under its message, and builds the outcome; the driver
does the sending and the waiting.

Flow control (docs/protocol.md §6.4): a send refused because the broker had paused its queue
(a FlowRefusal: it went out before the PAUSE arrived) is not a refusal yet. The frames of
outstanding sends are kept (at most `max_unconfirmed` messages' worth), so such a send is
sent again, same bytes and tag, once the pause is over; it then lands after the messages
sent since.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ..protocol import Error, Publish, Send, decode_frame, encode
from .errors import Paused, Unconfirmed
from .refusals import FlowRefusal

#: The messages a confirmed batch is made of: 001 (send_many) and 108 (publish_many).
_SENDS = (Send, Publish)
#: (tag, message index, the frame that carried it)
_Sent = tuple[int, int, bytes]


class ConfirmedSends:
    """One confirmed send_many or publish_many: message i is `ids[i]` once confirmed (a
    publish's: its first copy's ID, and `counts[i]` the queues that got a copy)."""

    def __init__(
        self,
        max_unconfirmed: int,
        on_confirm: Callable[[int, str], None] | None = None,
        count_of: Callable[[int], int] | None = None,
    ) -> None:
        self.max_unconfirmed = max_unconfirmed
        self.on_confirm = on_confirm
        #: For publishes: how many queues the confirm of a tag said got a copy.
        self._count_of = count_of
        #: (publishes) message index -> queues that got a copy, as confirmed.
        self.counts: list[int] = []
        #: The broker's ID per message read so far (None: not confirmed, yet or at all).
        self.ids: list[str | None] = []
        #: Message index -> the ERROR that refused it.
        self.refused: dict[int, Error] = {}
        #: Sends whose answer did not come in time (or whose connection was lost).
        self.unanswered = 0
        #: (tag, message index, frame) sent and not answered yet, oldest first.
        self._outstanding: deque[_Sent] = deque()
        #: Flow refusals to send again once the pause is over, with their ERRORs.
        self._resend: list[tuple[_Sent, Error]] = []
        #: Messages sent again after a flow refusal.
        self.sent_again = 0

    def read(self, count: int) -> int:
        """`count` more messages were read for a batch; the index of the first."""
        first = len(self.ids)
        self.ids.extend([None] * count)
        if self._count_of is not None:
            self.counts.extend([0] * count)
        return first

    def to_wait_for(self, count: int) -> list[int]:
        """The tags of the oldest sends to wait for before `count` more may go out."""
        outstanding = self._outstanding
        over = len(outstanding) + count - self.max_unconfirmed
        return [outstanding[i][0] for i in range(min(max(over, 0), len(outstanding)))]

    def outstanding_tags(self) -> list[int]:
        return [sent[0] for sent in self._outstanding]

    @property
    def stopped(self) -> bool:
        """A refusal or a silence was seen: nothing more should be sent."""
        return bool(self.refused) or self.unanswered > 0

    def sent(self, first: int, tags: list[int], frame: bytes = b"") -> None:
        """The batch of messages `first`, `first + 1`, ... went out with `tags` in `frame`
        (kept while they are outstanding, to send a flow refusal again)."""
        indexes = range(first, first + len(tags))
        self._outstanding.extend(
            (tag, index, frame) for tag, index in zip(tags, indexes, strict=True)
        )

    def record(self, answers: list[str | Error | FlowRefusal | None]) -> None:
        """The answers to the oldest outstanding sends, in order (None: none came)."""
        outstanding = self._outstanding
        for answer in answers:
            sent = outstanding.popleft()
            index = sent[1]
            if type(answer) is FlowRefusal:
                self._resend.append((sent, answer.error))
            elif isinstance(answer, Error):
                self.refused[index] = answer
            elif answer is None:
                self.unanswered += 1
            else:
                self.ids[index] = answer
                if self._count_of is not None:
                    self.counts[index] = self._count_of(sent[0])
                if self.on_confirm is not None:
                    self.on_confirm(index, answer)

    @property
    def to_resend(self) -> int:
        """Flow refusals waiting to be sent again."""
        return len(self._resend)

    def resends(self) -> tuple[bytes, int, list[int]]:
        """The flow-refused sends as one frame to send again (same bytes, same tags), oldest
        first: (frame, count, tags). Call `resent` once it went out."""
        wanted = {sent[0] for sent, _ in self._resend}
        parts: dict[int, bytes] = {}
        for frame in dict.fromkeys(sent[2] for sent, _ in self._resend):
            messages, _ = decode_frame(frame, len(frame))  # no content is longer than its frame
            for message in messages:
                if type(message) in _SENDS and message.tag in wanted:
                    parts[message.tag] = encode(message)
        tags = [sent[0] for sent, _ in self._resend]
        return b"".join(parts[tag] for tag in tags), len(tags), tags

    def resent(self, frame: bytes) -> None:
        """The flow refusals went out again in `frame`: they are outstanding again."""
        self._outstanding.extend((tag, index, frame) for (tag, index, _), _ in self._resend)
        self.sent_again += len(self._resend)
        self._resend.clear()

    def paused_queues(self) -> list[str | None]:
        """The queues whose pauses the flow refusals wait out (a publish's names the bound
        queue that was full; None: the broker-wide pause)."""
        return list(dict.fromkeys(error.queue for _, error in self._resend))

    def give_up_resends(self) -> None:
        """The pause outlasted the wait: the flow refusals count as refused."""
        for (_, index, _), error in self._resend:
            self.refused[index] = error
        self._resend.clear()

    def confirmed(self) -> int:
        return sum(message_id is not None for message_id in self.ids)

    def interrupted(self, why: object) -> Unconfirmed:
        """What to raise when sending or waiting failed with `why` (a Paused: a pause outlasted
        the wait; it is raised again with the IDs and refusals)."""
        self.give_up_resends()
        if isinstance(why, Paused):
            return Paused(
                why.error,
                why.waited,
                ids=self.ids,
                errors=self.refused,
                detail=f"; {self.confirmed()} of {len(self.ids)} messages confirmed",
            )
        return Unconfirmed(
            f"{why}; {self.confirmed()} of {len(self.ids)} messages confirmed",
            self.ids,
            self.refused,
        )

    def result(self, timeout: float, why: str = "") -> list[str]:
        """The IDs, once every message read was sent and answered (`why`: what the driver
        knows of the sends without one).

        Raises:
            Unconfirmed: some were refused, not answered within `timeout`, or not sent.
        """
        self.give_up_resends()  # none left once the driver is done; refused if any were
        if not self.stopped:
            return self.ids  # type: ignore[return-value]
        confirmed = self.confirmed()
        refused = self.refused
        first = refused[min(refused)] if refused else None
        raise Unconfirmed(
            f"{confirmed} of {len(self.ids)} messages confirmed, {len(refused)} refused"
            + (f" (first: {first.code} {first.reason})" if first else "")
            + f", {self.unanswered} without an answer within {timeout:g}s,"
            f" {len(self.ids) - confirmed - len(refused) - self.unanswered} not sent{why}",
            self.ids,
            refused,
        )
