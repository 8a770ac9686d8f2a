"""What the client raises. Every error is a ClientError, so one `except` catches them all."""

from __future__ import annotations

from ..protocol import Error, ErrorCode


class ClientError(Exception):
    """Raised when the client cannot do what was asked (send timed out, broker refused...)."""


class NotTaken(ClientError):
    """Raised when the socket did not take a frame within `send_timeout`: nothing of it
    reached the broker (none running there, not reachable, or not keeping up). A client
    with somewhere else to go (another endpoint given, another replica) goes there next."""


class PartialSend(ClientError):
    """Raised by send_many when some frames were handed to the socket and then one was not:
    `sent` messages (the first ones) went out, the rest did not."""

    def __init__(self, message: str, sent: int) -> None:
        super().__init__(message)
        self.sent = sent


class BrokerRefused(ClientError):
    """Raised when the broker refuses a request: an ADMIN command, a send (confirmed: at once;
    fire-and-forget: at the next call or flush), a subscription. `error` is the broker's
    ERROR (`.code`, `.reason`, `.queue`); `refusals` all the ones told at once, `error` first.
    """

    def __init__(self, error: Error, refusals: list[Error] | None = None) -> None:
        more = len(refusals) - 1 if refusals else 0
        also = f" (and {more} more refusals)" if more else ""
        queue = f" ({error.queue})" if error.queue else ""
        super().__init__(f"broker refused: {error.code} {error.reason}{queue}{also}")
        self.error = error
        self.refusals = refusals or [error]


class JoinRefused(BrokerRefused):
    """Raised by every call once the broker refused this client's HELLO in a row as often as
    the client asks (`phpmq.client.greeting.JOIN_ATTEMPTS`, with a growing back-off): it is
    not let in, and asks no more (a new client asks again). `error` is the last refusal:
    its code (413: a HELLO over the broker's limit; 403: a right missing) and reason."""

    def __init__(self, error: Error, why: str) -> None:
        ClientError.__init__(self, f"{why}; not asking again")
        self.error = error
        self.refusals = [error]


class Unconfirmed(ClientError):
    """Raised when sends asked for confirms did not all get one. `ids[i]` is the broker's ID
    for message i, or None; `errors` maps the index of each refused message to the broker's
    ERROR. The other Nones got no answer (connection lost, timeout) or were never sent: they
    may or may not be queued, so send them again, with their keys to be safe."""

    def __init__(self, message: str, ids: list[str | None], errors: dict[int, Error]) -> None:
        super().__init__(message)
        self.ids = ids
        self.errors = errors


class InvalidArgument(ClientError, ValueError):
    """Raised at once, before anything is sent, for a queue name or idempotency key that
    breaks the protocol's rules (`phpmq.protocol.rules`), or content over the broker's size
    limit: the broker would refuse it with `code` (422, 413). A ValueError too, since it is
    the caller's mistake."""

    def __init__(self, problem: str, value: str, code: ErrorCode = ErrorCode.INVALID_VALUE) -> None:
        self.code = code
        super().__init__(f"refused before sending: {int(code)} {problem}: {value!r}")


class CurveKeyError(ClientError, ValueError):
    """Raised at once for CURVE keys that cannot be used: a missing or malformed key file,
    or only one of PHPMQ_CURVE_SECRET and PHPMQ_CURVE_SERVER set (docs/security.md)."""


class Paused(BrokerRefused, PartialSend, Unconfirmed):
    """Raised when the broker paused sends to a queue (or to all: its memory is at its limit)
    and no RESUME came within the client's `send_timeout` (docs/protocol.md §6.4).

    A `BrokerRefused` whose `error` carries the PAUSE's code (429: the queue is nearly full;
    503: the broker's memory) and reason; `waited` is how long the client waited. It is also
    a `PartialSend` and an `Unconfirmed`, so that a `send_many` caller keeps its counts:
    `sent` messages went out before the pause (fire-and-forget), and `ids` / `errors` are
    the confirmed IDs and refusals so far (confirmed), as those exceptions have them.
    """

    def __init__(
        self,
        error: Error,
        waited: float,
        *,
        sent: int = 0,
        ids: list[str | None] | None = None,
        errors: dict[int, Error] | None = None,
        detail: str = "",
    ) -> None:
        scope = f"to queue {error.queue!r}" if error.queue else "to every queue"
        ClientError.__init__(
            self,
            f"the broker paused sends {scope} and sent no RESUME within {waited:.1f}s"
            f" (send_timeout): {error.code} {error.reason}{detail}",
        )
        self.error = error
        self.refusals = [error]
        self.waited = waited
        self.sent = sent
        self.ids = ids if ids is not None else []
        self.errors = errors or {}


class QueueDeleted(BrokerRefused):
    """Raised by the next `receive` (and so ends a `consume` loop) after the broker deleted a
    queue the client consumed (`queue-delete`, docs/protocol.md §6.5). The subscription is
    over: it is not renewed after a reconnect, and the queue's deliveries not yet handed out
    are dropped. `queue` names it, `count` is how many messages the client held there (gone
    with it: settling them is refused with 404). `error.code` is 404."""

    def __init__(self, error: Error, count: int) -> None:
        ClientError.__init__(self, f"{error.code} {error.reason}")
        self.error = error
        self.refusals = [error]
        self.queue = error.queue or ""
        self.count = count


class ReplyError(ClientError):
    """Raised by `request` when the worker answered with an error reply: its handler raised
    (docs/protocol.md §6.6). `code` and `reason` are the reply's (the reference workers send
    500 and "TypeName: message"); `type_name` and `text` are the reason split at the first
    ": " (`type_name` is "" when the reason has no such prefix)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"error reply: {code} {reason}")
        self.code = code
        self.reason = reason
        head, sep, tail = reason.partition(": ")
        plain = not sep or not head.replace(".", "").replace("_", "").isalnum()
        self.type_name = "" if plain else head
        self.text = reason if plain else tail


class RequestTimeout(ClientError, TimeoutError):
    """Raised by `request` when no reply came within its timeout. The request may still be
    handled (it expires unread after the timeout, rounded up to whole seconds); a reply that
    comes later is dropped and counted in `replies_dropped`."""


class RequestLost(ClientError):
    """Raised by `request` when the connection was replaced (the broker was lost, restarted,
    or the client closed) before the reply came: the broker dropped the route back, so no
    reply will come. The request may or may not have been handled."""
