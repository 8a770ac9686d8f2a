"""Refusals that answer no awaited tag, kept until the caller can be told.

A send that asked for no answer returns before the broker has read it, so its refusal (a full
queue, a draining broker) arrives later: it is kept here and raised by the driver at the next
call or flush, never only logged. A subscription refused for something that may pass (429: the
queue has its maximum of consumers; 503: its shard cannot be reached now, as while a replicated
shard elects its leader, or the broker's memory is full) is asked for again with backoff; one
refused for a reason that retrying cannot change (422) is dropped and raised by the next
receive.

The broker names the type of the message an ERROR refuses (docs/protocol.md §6.1, packet 19),
which is how a refused send is told from a refused subscription.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..protocol import Error, ErrorCode, Pause

#: Send refusals kept for the caller; past this the oldest are dropped (and counted).
MAX_KEPT_REFUSALS = 1000
#: A subscription refused with one of these is asked for again after RESUBSCRIBE_FIRST_S,
#: doubling up to the max.
PASSING_CODES = frozenset((ErrorCode.LIMIT_REACHED, ErrorCode.SHUTTING_DOWN))
RESUBSCRIBE_FIRST_S = 0.1
RESUBSCRIBE_MAX_S = 5.0
#: The codes of a flow refusal (a full queue, the broker's memory at its limit): a confirmed
#: send refused with one of them while a PAUSE covers its queue is sent again after the RESUME.
FLOW_CODES = frozenset((ErrorCode.LIMIT_REACHED, ErrorCode.OVERLOADED))


@dataclass(frozen=True, slots=True)
class FlowRefusal:
    """The answer to a confirmed send refused by flow control (docs/protocol.md §6.4): it went
    out before the broker's PAUSE reached the client, so it is to be sent again once the
    pause is over, not reported. `error` is the ERROR that refused it, `pause` the PAUSE."""

    error: Error
    pause: Pause


class Refusals:
    __slots__ = ("_delays", "_due", "dropped", "sends", "subscriptions")

    def __init__(self) -> None:
        #: Refused sends that asked for no answer, oldest first.
        self.sends: deque[Error] = deque(maxlen=MAX_KEPT_REFUSALS)
        #: Send refusals dropped because too many were kept unread.
        self.dropped = 0
        #: Subscriptions refused for good, by queue.
        self.subscriptions: dict[str, Error] = {}
        #: Subscriptions refused for a limit: when to ask again, and the delay used.
        self._due: dict[str, float] = {}
        self._delays: dict[str, float] = {}

    def send_refused(self, error: Error) -> None:
        """One refusal per message: an ERROR may refuse several of a frame (its count)."""
        sends = self.sends
        for _ in range(error.count or 1):
            if len(sends) == sends.maxlen:
                self.dropped += 1
            sends.append(error)

    def take_sends(self) -> list[Error]:
        """The send refusals not yet told, oldest first; they are told now."""
        refused = list(self.sends)
        self.sends.clear()
        return refused

    def subscription_refused(self, queue: str, error: Error, now: float) -> bool:
        """Note a refused subscription; True if it is to be asked for again (429, 503)."""
        if error.code in PASSING_CODES:
            delay = min(self._delays.get(queue, RESUBSCRIBE_FIRST_S / 2) * 2, RESUBSCRIBE_MAX_S)
            self._delays[queue] = delay
            self._due[queue] = now + delay
            return True
        self.subscriptions[queue] = error
        self.forget(queue, keep_refusal=True)
        return False

    def forget(self, queue: str, keep_refusal: bool = False) -> None:
        """The caller subscribed anew (or stopped): earlier refusals no longer apply."""
        self._due.pop(queue, None)
        self._delays.pop(queue, None)
        if not keep_refusal:
            self.subscriptions.pop(queue, None)

    def due(self, now: float) -> list[str]:
        """Queues whose refused subscription is to be asked for again now."""
        queues = [queue for queue, at in self._due.items() if at <= now]
        for queue in queues:
            del self._due[queue]
        return queues

    def next_due(self) -> float | None:
        return min(self._due.values(), default=None)
