"""The broker's PAUSEs and RESUMEs as a client keeps them, sans-IO (docs/protocol.md §6.4).

A PAUSE in force says to wait before sending to its queue (or, without a queue, to any). The
refusals of confirmed sends for a full queue or memory (429, 503) that a PAUSE covers are flow
refusals: sent before the PAUSE reached the client, to be sent again once it is over. Which
ones they are is decided when the whole frame is read, since the PAUSE, its ERROR and even the
RESUME may come in the same frame.
"""

from __future__ import annotations

from ..protocol import Error, Pause
from .refusals import FLOW_CODES, FlowRefusal


class Pauses:
    __slots__ = ("_errors", "_in_force", "_in_frame")

    def __init__(self) -> None:
        #: The PAUSEs in force, by queue (None: the broker-wide one).
        self._in_force: dict[str | None, Pause] = {}
        #: While a frame is read: its PAUSEs, and its ERRORs that may be flow refusals.
        self._in_frame: dict[str | None, Pause] = {}
        self._errors: list[Error] = []

    def paused(self, queue: str | None) -> Pause | None:
        """The PAUSE that says to wait before sending to `queue`: its own, else the
        broker-wide one (None: sends may go)."""
        in_force = self._in_force
        if not in_force:
            return None
        return in_force.get(queue) or in_force.get(None)

    @property
    def in_force(self) -> dict[str | None, Pause]:
        return dict(self._in_force)

    def clear(self) -> None:
        """A new transport or a rejoin: the broker asks again."""
        self._in_force.clear()

    def pause(self, message: Pause) -> bool:
        """A PAUSE came; True if it is a new one (not a repeat for the same queue)."""
        self._in_frame[message.queue] = message
        known = message.queue in self._in_force
        self._in_force[message.queue] = message
        return not known

    def resume(self, queue: str | None) -> bool:
        """A RESUME came; True if it lifted a pause in force."""
        return self._in_force.pop(queue, None) is not None

    def refused(self, error: Error) -> None:
        """An ERROR answering confirmed sends: a flow refusal if a PAUSE covers it."""
        if error.code in FLOW_CODES:
            self._errors.append(error)

    def end_frame(self, answers: dict) -> None:
        """The frame is read: the answers to tags that were refused while a PAUSE covered
        their queue become FlowRefusals (a limit no pause covers, such as `max_queues` or a
        draining broker, stays a refusal)."""
        if self._errors:
            seen = self._in_frame
            for error in self._errors:
                queue = error.queue
                pause = seen.get(queue) or seen.get(None) or self.paused(queue)
                if pause is None:
                    continue
                refusal = FlowRefusal(error, pause)
                for tag in range(error.tag, error.tag + (error.count or 1)):  # type: ignore[operator]
                    if answers.get(tag) is error:
                        answers[tag] = refusal
            self._errors.clear()
        if self._in_frame:
            self._in_frame.clear()
