"""The answers to tagged sends as a client keeps them, sans-IO (docs/protocol.md §6.3).

A send that asks for an answer carries a tag; once it went out the tag is awaited, and the
broker's CONFIRM (an ID) or ERROR (one may answer a run of tags) is kept until the driver
takes it. A tag whose transport was replaced before its answer came is answered LOST.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..protocol import Error
from .refusals import FlowRefusal

#: The answer recorded for a tag whose transport was replaced before the answer came.
LOST = None

Answer = str | Error | FlowRefusal | None


class Answers:
    __slots__ = ("_awaited", "_on_refused", "by_tag")

    def __init__(self, on_refused: Callable[[int, Error], None] | None = None) -> None:
        #: Told each awaited tag an ERROR answers (a request's refusal, requests.py).
        self._on_refused = on_refused
        #: Tags sent and not yet answered.
        self._awaited: set[int] = set()
        #: The answers come (an ID, the refusing ERROR, a FlowRefusal, or LOST), by tag.
        self.by_tag: dict[int, Answer] = {}

    @property
    def awaiting(self) -> bool:
        """Whether a tag sent on this transport still waits for its answer."""
        return any(tag not in self.by_tag for tag in self._awaited)

    def expect(self, tags: Iterable[int]) -> None:
        """These tags went out: their answers are to be kept."""
        self._awaited.update(tags)

    def give_up(self) -> None:
        """The transport was replaced: every awaited tag is answered LOST."""
        for tag in self._awaited:
            self.by_tag[tag] = LOST

    def lose(self, tags: Iterable[int]) -> None:
        """These awaited tags will get no answer (the broker read nothing of their frame):
        answered LOST now, not after the wait."""
        for tag in tags:
            if tag in self._awaited:
                self.by_tag.setdefault(tag, LOST)

    def confirmed(self, tag: int, message_id: bytes) -> bool:
        """A CONFIRM came for `tag`; False if no one awaits it."""
        if tag not in self._awaited:
            return False
        self.by_tag[tag] = message_id.decode(errors="replace")
        return True

    def refused(self, error: Error) -> bool:
        """An ERROR came; True if it answers awaited tags (then it is raised to the sender,
        not logged)."""
        awaited = self._awaited
        if error.tag not in awaited:
            return False
        answers = self.by_tag
        for tag in range(error.tag, error.tag + (error.count or 1)):  # type: ignore[operator]
            if tag in awaited:
                answers[tag] = error
                if self._on_refused is not None:
                    self._on_refused(tag, error)
        return True

    def take(self, tags: list[int]) -> list[Answer]:
        """The answers to `tags`, in order (LOST: none came), no longer awaited."""
        self._awaited.difference_update(tags)
        answers = self.by_tag
        return [answers.pop(tag, LOST) for tag in tags]

    def count(self, tags: list[int], start: int = 0) -> int:
        """How many of `tags` from the first are answered (counting on from `start`)."""
        answers = self.by_tag
        index = start
        while index < len(tags) and tags[index] in answers:
            index += 1
        return index
