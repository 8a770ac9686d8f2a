"""What happens to a client's connection, in two forms.

The typed events are what `Connection.receive` returns for the frames that need a driver's
attention (everything but dispatches, confirms and admin replies, which it queues). The
strings are what a driver passes to the application's `on_event(event, detail)` callback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..protocol import Cancel, Error, Pause

#: Events passed to `on_event(event, detail)`.
BROKER_LOST = "broker-lost"  # silent for interval x liveness; reconnecting
RECONNECTED = "reconnected"  # new socket, HELLO and consumes sent again
REJOINED = "rejoined"  # the broker did not know us (it restarted); HELLO sent again
BROKER_LEAVING = "broker-leaving"  # the broker said DISCONNECT (shutting down)
QUEUE_DELETED = "queue-deleted"  # the broker deleted a queue the client consumed
JOIN_REFUSED = "join-refused"  # the broker refused HELLO; asked again after a back-off


@dataclass(frozen=True, slots=True)
class BrokerGreeted:
    """The broker answered HELLO; the heartbeat terms it agreed to are now in force."""

    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BrokerError:
    """An ERROR that answers no awaited send (it is also kept in `Connection.errors`)."""

    error: Error


@dataclass(frozen=True, slots=True)
class Rejoined:
    """The broker said it does not know us: the greeting goes out again, and the messages
    held from before are given up (the broker took them back)."""

    reason: str


@dataclass(frozen=True, slots=True)
class BrokerLeaving:
    """The broker said DISCONNECT for another reason: it is shutting down."""

    reason: str


@dataclass(frozen=True, slots=True)
class SendsPaused:
    """The broker asked the client to stop sending to `pause.queue` (None: to any queue) until
    a RESUME (docs/protocol.md §6.4); sends to it wait. Only a change is reported: a PAUSE
    already in force is not repeated."""

    pause: Pause


@dataclass(frozen=True, slots=True)
class SendsResumed:
    """The pause on `queue` (None: the broker-wide one) is over."""

    queue: str | None


@dataclass(frozen=True, slots=True)
class GoodbyeAnswered:
    """KBAI: the broker read everything sent before the goodbye."""


@dataclass(frozen=True, slots=True)
class SubscriptionEnded:
    """An unasked CANCEL: the broker deleted `cancel.queue`, which the client consumed; the
    subscription is dropped and the caller told at its next receive (QueueDeleted)."""

    cancel: Cancel


@dataclass(frozen=True, slots=True)
class HelloRefused:
    """The broker refused this client's HELLO (`error`, its `count`th refusal in a row); the
    greeting goes again in `retry_in` seconds, or never (None: the client gave up)."""

    error: Error
    count: int
    retry_in: float | None


@dataclass(frozen=True, slots=True)
class UndecodableFrame:
    """A frame from the broker that did not decode (the messages before the bad one count)."""

    reason: str


Event = (
    BrokerGreeted
    | BrokerError
    | Rejoined
    | BrokerLeaving
    | SendsPaused
    | SendsResumed
    | GoodbyeAnswered
    | SubscriptionEnded
    | HelloRefused
    | UndecodableFrame
)
NO_EVENTS: tuple[Event, ...] = ()
