"""What a handler raises to say how its message should end, other than by returning (ack)."""

from __future__ import annotations


class Retry(Exception):
    """Try this message again later: requeue it after `delay` seconds (default: the pool's
    exponential backoff), until the pool's --max-retries, then dead-letter it."""

    def __init__(self, reason: str = "retry requested", delay: float | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class Reject(Exception):
    """This message can never succeed: dead-letter it now with this reason."""
