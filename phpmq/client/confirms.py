"""What a confirmed send_many keeps track of, sans-IO (docs/protocol.md §6.3).

The sends are pipelined: up to `max_unconfirmed` are out before the driver waits for the
oldest answers, so the broker's group commit confirms whole batches. This class says which
answers to wait for, files each answer under its message, and builds the outcome; the driver
does the sending and the waiting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ..protocol import Error
from .errors import Unconfirmed


class ConfirmedSends:
    """One confirmed send_many: message i is `ids[i]` once confirmed."""

    def __init__(
        self, max_unconfirmed: int, on_confirm: Callable[[int, str], None] | None = None
    ) -> None:
        self.max_unconfirmed = max_unconfirmed
        self.on_confirm = on_confirm
        #: The broker's ID per message read so far (None: not confirmed, yet or at all).
        self.ids: list[str | None] = []
        #: Message index -> the ERROR that refused it.
        self.refused: dict[int, Error] = {}
        #: Sends whose answer did not come in time (or whose connection was lost).
        self.unanswered = 0
        #: (tag, message index) sent and not answered yet, oldest first.
        self._outstanding: deque[tuple[int, int]] = deque()

    def read(self, count: int) -> int:
        """`count` more messages were read for a batch; the index of the first."""
        first = len(self.ids)
        self.ids.extend([None] * count)
        return first

    def to_wait_for(self, count: int) -> list[int]:
        """The tags of the oldest sends to wait for before `count` more may go out."""
        outstanding = self._outstanding
        over = len(outstanding) + count - self.max_unconfirmed
        return [outstanding[i][0] for i in range(min(max(over, 0), len(outstanding)))]

    def outstanding_tags(self) -> list[int]:
        return [tag for tag, _ in self._outstanding]

    @property
    def stopped(self) -> bool:
        """A refusal or a silence was seen: nothing more should be sent."""
        return bool(self.refused) or self.unanswered > 0

    def sent(self, first: int, tags: list[int]) -> None:
        """The batch of messages `first`, `first + 1`, ... went out with `tags`."""
        self._outstanding.extend(zip(tags, range(first, first + len(tags)), strict=True))

    def record(self, answers: list[str | Error | None]) -> None:
        """The answers to the oldest outstanding sends, in order (None: none came)."""
        outstanding = self._outstanding
        for answer in answers:
            _, index = outstanding.popleft()
            if isinstance(answer, Error):
                self.refused[index] = answer
            elif answer is None:
                self.unanswered += 1
            else:
                self.ids[index] = answer
                if self.on_confirm is not None:
                    self.on_confirm(index, answer)

    def confirmed(self) -> int:
        return sum(message_id is not None for message_id in self.ids)

    def interrupted(self, why: object) -> Unconfirmed:
        """What to raise when sending or waiting failed with `why`."""
        return Unconfirmed(
            f"{why}; {self.confirmed()} of {len(self.ids)} messages confirmed",
            self.ids,
            self.refused,
        )

    def result(self, timeout: float) -> list[str]:
        """The IDs, once every message read was sent and answered.

        Raises:
            Unconfirmed: some were refused, not answered within `timeout`, or not sent.
        """
        if not self.stopped:
            return self.ids  # type: ignore[return-value]
        confirmed = self.confirmed()
        refused = self.refused
        first = refused[min(refused)] if refused else None
        raise Unconfirmed(
            f"{confirmed} of {len(self.ids)} messages confirmed, {len(refused)} refused"
            + (f" (first: {first.code} {first.reason})" if first else "")
            + f", {self.unanswered} without an answer within {timeout:g}s,"
            f" {len(self.ids) - confirmed - len(refused) - self.unanswered} not sent",
            self.ids,
            refused,
        )
