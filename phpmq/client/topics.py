"""Events as a client keeps them, sans-IO (docs/protocol.md §6.5): what a publish encodes and
how many queues its CONFIRM says it reached, the options each subscription's consume carries
(binding patterns, delete when unused) so that every greeting repeats them, cancels awaiting
the broker's answer, and queues the broker deleted under a subscription, until the caller is
told.

Rules of the conversation:

* a subscription's 002 carries its patterns (PATTERNS) and its unused time (UNUSED_MS) every
  time it is sent, also by the greeting of a new transport: binding is additive, so sending
  them again changes nothing on a broker that kept the queue, and re-creates a live queue the
  broker deleted when the old transport's window closed;
* a cancel stops the subscription at once (no later greeting consumes the queue) and drops the
  queue's deliveries received but not handed out; the broker answers CANCEL `cancelled` with
  how many messages it took back, and the deliveries that arrive before that answer are ones
  it took back too, so they are dropped as well;
* an unasked CANCEL (`queue deleted`) ends the subscription the same way and is kept, by queue,
  for the driver to raise (QueueDeleted) at the next receive.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Iterable

from ..protocol import Cancel, Consume, Publish, encode, event_name_problem
from ..protocol.rules import PATTERN_SEPARATOR, pattern_problem
from .batches import HeadersItem, check_key, checked_headers, too_large
from .errors import InvalidArgument
from .message import ReceivedMessage, content_bytes

#: A live feed's queue: this prefix and 16 random hex digits (docs/protocol.md §6.5).
LIVE_PREFIX = "live."
#: The reason of the broker's answer to a client's CANCEL, and of its unasked one.
CANCELLED = "cancelled"
QUEUE_DELETED = "queue deleted"


def live_queue_name() -> str:
    """A fresh name for a live feed's temporary queue."""
    return LIVE_PREFIX + secrets.token_hex(8)


def checked_patterns(patterns: Iterable[str]) -> list[str]:
    """`patterns` as a list, each checked: InvalidArgument (422) for one the broker would
    refuse (docs/protocol.md §6.5), before anything is sent."""
    if isinstance(patterns, str):
        patterns = [patterns]  # one pattern, not its characters
    checked = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise InvalidArgument("a binding pattern must be a string", repr(pattern))
        problem = pattern_problem(pattern)
        if problem is not None:
            raise InvalidArgument(problem, pattern)
        checked.append(pattern)
    return checked


def check_event(event: str) -> None:
    """InvalidArgument (422) for an event name the broker would refuse."""
    problem = event_name_problem(event) if isinstance(event, str) else "not a string"
    if problem is not None:
        raise InvalidArgument(problem, str(event))


def unused_ms(seconds: float | None) -> int | None:
    """`delete_when_unused` in seconds as the 002's UNUSED_MS (None: keep the queue)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise InvalidArgument("delete_when_unused must be seconds >= 0 or None", repr(seconds))
    return round(seconds * 1000)


def encode_publish(
    event: str,
    content: bytes | str,
    ttl: int,
    headers: HeadersItem,
    tag: int | None,
    key: str | None,
    limit: int,
    message_key: bytes | None = None,
) -> bytes:
    """One 108, checked as a 001 is (the event name instead of the queue name).

    Raises:
        InvalidArgument: a bad event name or key (422), content over `limit` (413).
    """
    check_event(event)
    if key is not None:
        check_key(key)
    body = content_bytes(content)
    if len(body) > limit:
        raise too_large(event, len(body), limit)
    encoded = checked_headers(headers, event, limit) if headers else None
    return encode(
        Publish(event, body, ttl, tag=tag, key=key, headers=encoded, message_key=message_key)
    )


def rebind_options(
    replace: Iterable[str] | None,
    remove: Iterable[str],
    remove_mask: Iterable[str],
    add: Iterable[str],
) -> dict[str, list[str]]:
    """The lists of a `queue-rebind` command, each checked (InvalidArgument)."""
    options = {
        "remove": checked_patterns(remove),
        "remove_mask": checked_patterns(remove_mask),
        "add": checked_patterns(add),
    }
    if replace is not None:
        options["replace"] = checked_patterns(replace)
    return options


def no_patterns() -> InvalidArgument:
    """What a live feed without a pattern raises: it would never get a message."""
    return InvalidArgument("a live feed needs at least one pattern", "")


class Topics:
    """Per-queue consume options, publish counts, cancels and deletions of one connection."""

    __slots__ = ("_cancelling", "_counts", "_options", "cancelled", "deleted")

    def __init__(self) -> None:
        #: Queue -> (PATTERNS text or None, UNUSED_MS or None) its consumes carry.
        self._options: dict[str, tuple[str | None, int | None]] = {}
        #: Publish tag -> how many queues its CONFIRM said got a copy.
        self._counts: dict[int, int] = {}
        #: Queues whose CANCEL was sent and not answered yet.
        self._cancelling: set[str] = set()
        #: Answered cancels not taken yet: queue -> messages the broker took back.
        self.cancelled: dict[str, int] = {}
        #: Queues the broker deleted under a subscription, not told to the caller yet.
        self.deleted: dict[str, Cancel] = {}

    # ------------------------------------------------------------------ consuming

    def set_options(self, queue: str, patterns: Iterable[str], unused: int | None) -> None:
        """What `queue`'s consumes carry from now on (checked: InvalidArgument)."""
        checked = checked_patterns(patterns)
        text = PATTERN_SEPARATOR.join(checked) if checked else None
        if text is None and unused is None:
            self._options.pop(queue, None)
        else:
            self._options[queue] = (text, unused)
        self.deleted.pop(queue, None)  # subscribed anew: an old deletion is no news
        self.cancelled.pop(queue, None)

    def consume(self, queue: str, window: int) -> Consume:
        """The 002 for `queue` with its options (none when stopping: window 0)."""
        options = self._options.get(queue) if window > 0 else None
        if options is None:
            return Consume(queue, window)
        patterns, unused = options
        return Consume(queue, window, patterns=patterns, unused_ms=unused)

    def forget(self, queue: str) -> None:
        self._options.pop(queue, None)

    # ------------------------------------------------------------------ publishing

    def confirmed(self, tag: int, count: int | None) -> None:
        """A CONFIRM of an awaited tag; `count` is set for a publish (None: a send, or a
        publish confirmed from its idempotency key, which copied nothing again)."""
        if count is not None:
            self._counts[tag] = count

    def take_count(self, tag: int) -> int:
        """How many queues the publish tagged `tag` reached (0: none, or a repeated key)."""
        return self._counts.pop(tag, 0)

    # ------------------------------------------------------------------ cancelling

    def cancel(self, queue: str, received: deque[ReceivedMessage]) -> bytes:
        """The 109 for `queue`; its undelivered messages are dropped and its answer awaited."""
        self._options.pop(queue, None)
        self.cancelled.pop(queue, None)
        self._cancelling.add(queue)
        drop_queue(received, queue)
        return encode(Cancel(queue))

    def on_cancel(
        self, message: Cancel, received: deque[ReceivedMessage], subscribed: bool
    ) -> bool:
        """A CANCEL from the broker: the answer to ours, or a deletion. True if it ended a
        subscription the caller is to be told of (kept in `deleted`)."""
        queue = message.queue
        drop_queue(received, queue)  # the broker took them back, or they are gone
        if queue in self._cancelling:
            self._cancelling.discard(queue)
            self.cancelled[queue] = message.count or 0
            return False
        if message.reason == CANCELLED or not subscribed:
            return False  # a late answer, or a queue we stopped consuming
        self._options.pop(queue, None)
        self.deleted[queue] = message
        return True

    def take_cancelled(self, queue: str) -> int | None:
        """Messages given back by the answered cancel of `queue` (None: not answered yet)."""
        return self.cancelled.pop(queue, None)

    def restart(self) -> None:
        """A new transport: the broker took back everything the old one held, so awaited
        cancels are done, having given back nothing more."""
        for queue in self._cancelling:
            self.cancelled[queue] = 0
        self._cancelling.clear()


def drop_queue(received: deque[ReceivedMessage], queue: str) -> None:
    """Remove `queue`'s messages from `received`, in place (drivers hold the deque)."""
    if any(message.queue == queue for message in received):
        kept = [message for message in received if message.queue != queue]
        received.clear()
        received.extend(kept)


def deleted_reason(message: Cancel) -> str:
    """What the caller reads when the broker deleted a queue it consumed."""
    held = f"; {message.count} messages held there are gone" if message.count else ""
    return f"queue {message.queue!r} was deleted{held}"
