"""A message the broker dispatched to us, and how it is settled.

A ReceivedMessage knows nothing of sockets: settling it encodes the 005/006 (or a reply) and
hands the bytes to `settle(frame, generation)`, which the driver provides (it buffers them and
flushes them with others); an ack, the hot path, hands only its queue and ID to
`ack(queue, message_id, generation)`, and the buffer encodes a run of them at once.
`generation` names the connection the message came on: a settle for an older one is dropped,
because the broker took those messages back when it lost us.
An AsyncReceivedMessage (AsyncClient's) is the same with `async def` settle methods (the
driver's `settle` and `ack` await nothing, so they are plain functions).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import msgspec

from ..protocol import (
    REQUEUE_UNSTARTED,
    DeadLetter,
    Dispatch,
    ErrorCode,
    Reply,
    Requeue,
    encode,
    encode_reply,
    queue_name_problem,
    sent_at,
)
from ..protocol import queue_packet as _encode_queue_packet
from .errors import InvalidArgument

_headers = msgspec.json.Decoder(dict[str, Any])

#: Where a settle frame goes: (frame, generation of the connection the message came on).
Settle = Callable[[bytes, int], object]
#: Where an ack goes: (queue, message ID, generation of the connection the message came on).
AckSettle = Callable[[str, bytes, int], object]


def content_bytes(content: bytes | str, what: str = "content") -> bytes:
    """Content (or a message key: `what`) as the wire carries it: text as UTF-8, a bytearray
    or memoryview copied, so that the codec gets bytes, compiled or not (docs/performance.md).

    Raises:
        TypeError: `content` is none of those.
    """
    if content.__class__ is bytes:
        return content  # type: ignore[return-value]
    if isinstance(content, str):
        return content.encode()
    if isinstance(content, bytes | bytearray | memoryview):
        return bytes(content)
    raise TypeError(f"{what} must be bytes or str, not {type(content).__name__}")


def as_bytes(value: bytes | str | None) -> bytes | None:
    """A message key as the wire carries it (None: none), as `content_bytes` makes content."""
    if value is None or value.__class__ is bytes:
        return value
    return content_bytes(value, "a message key")


@lru_cache(maxsize=4096)
def queue_packet(queue: str) -> bytes:
    """The queue's packet, built once per queue name (sends and acks carry it every time).

    Raises:
        InvalidArgument: the broker would refuse `queue` as a queue name.
    """
    problem = queue_name_problem(queue)
    if problem is not None:
        raise InvalidArgument(problem, queue)
    return _encode_queue_packet(queue)


class ReceivedMessage:
    """A dispatched message. Settle it exactly once: ack, requeue or dead_letter (or, not
    started at all, return_unstarted)."""

    __slots__ = (
        "_ack",
        "_dispatch",
        "_generation",
        "_headers",
        "_id",
        "_settle",
        "content",
        "queue",
    )

    def __init__(self, settle: Settle, ack: AckSettle, dispatch: Dispatch, generation: int) -> None:
        self._settle = settle
        self._ack = ack
        self._generation = generation
        #: What the broker sent: the fields few consumers read are read from it when asked.
        self._dispatch = dispatch
        self.queue = dispatch.queue
        self.content = dispatch.content
        #: The ID as the wire carried it: settling sends it back as it came.
        self._id = dispatch.message_id
        #: The HEADERS bytes as they came, then (once read) their decoded dict.
        self._headers: bytes | dict[str, Any] | None = dispatch.headers

    @property
    def ttl(self) -> int:
        """Remaining time to live in seconds (0: never expires)."""
        return self._dispatch.ttl or 0

    @property
    def delivery_count(self) -> int:
        """1 on the first delivery, more after redeliveries."""
        return self._dispatch.delivery_count or 1

    @property
    def event(self) -> str | None:
        """The event a published copy was published as (None: sent to the queue by name)."""
        return self._dispatch.event

    @property
    def reply_to(self) -> str | None:
        """A request's reply route ("" its requester, else a reply queue; None: no reply is
        asked)."""
        return self._dispatch.reply_to

    @property
    def correlation(self) -> str | None:
        """A request's correlation id; a reply found in a reply queue has this only."""
        return self._dispatch.correlation

    @property
    def message_key(self) -> bytes | None:
        """The producer's message key (`send(..., message_key=...)`), None without one."""
        return self._dispatch.message_key

    @property
    def id(self) -> str:
        """The broker's message ID (32 hex characters)."""
        return self._id.decode(errors="replace")

    @property
    def sent_at(self) -> float | None:
        """When the broker took the message in (wall-clock seconds, from its ID); None for
        an ID that carries no time (an older broker's)."""
        return sent_at(self._id)

    @property
    def headers(self) -> dict[str, Any]:
        """What the producer attached (`send(..., headers=...)`), decoded on first use (the
        same dict after); empty if nothing, or if what it attached is not a JSON object."""
        raw = self._headers
        if isinstance(raw, dict):
            return raw
        decoded: dict[str, Any] = {}
        if raw:
            # (msgspec's words for bad UTF-8 in a string and for nesting too deep to read)
            with contextlib.suppress(msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                decoded = _headers.decode(raw)
        self._headers = decoded
        return decoded

    @property
    def wants_reply(self) -> bool:
        """Whether this is a request: answer it with `reply` (which also settles it)."""
        return self.reply_to is not None

    def ack(self) -> None:
        self._ack(self.queue, self._id, self._generation)

    def reply(self, content: bytes | str = b"", error: str | None = None) -> None:
        """Answer this request and settle it (like `ack`): `content`, or with `error` (e.g.
        "ValueError: bad input") an error reply the requester raises as ReplyError."""
        self._settle(self._reply_frame(content, error), self._generation)

    def _reply_frame(self, content: bytes | str, error: str | None) -> bytes:
        body = content_bytes(content)
        if error is None:
            return encode_reply(body, queue_packet(self.queue), self._id)
        return encode(Reply(body, self.queue, self._id, None, int(ErrorCode.INTERNAL), error))

    def requeue(self, ttl: int = 0, delay: float = 0.0) -> None:
        """Back to the tail of the queue with a new TTL (0: never expires), after `delay`
        seconds out of it (a retry backoff)."""
        self._settle(self._requeue_frame(ttl, delay), self._generation)

    def dead_letter(self, reason: str | None = None) -> None:
        self._settle(self._dead_letter_frame(reason), self._generation)

    def return_unstarted(self) -> None:
        """Back to the head of the queue, for a message this consumer took but never
        started (a worker that stops with prefetched messages): its delivery count is not
        raised and its TTL is kept (docs/protocol.md §3.6). Hand back several last-first to
        keep their order."""
        self._settle(self.unstarted_frame(), self._generation)

    def unstarted_frame(self) -> bytes:
        """The 005 that hands this message back unstarted."""
        return encode(Requeue(self.queue, self._id, 0, None, REQUEUE_UNSTARTED))

    def _requeue_frame(self, ttl: int, delay: float) -> bytes:
        delay_ms = round(delay * 1000) or None
        return encode(Requeue(self.queue, self._id, ttl, delay_ms))

    def _dead_letter_frame(self, reason: str | None) -> bytes:
        return encode(DeadLetter(self.queue, self._id, reason))

    def __repr__(self) -> str:
        event = f" event={self.event}" if self.event is not None else ""
        return (
            f"<ReceivedMessage {self.queue}/{self.id} {len(self.content)} bytes"
            f" ttl={self.ttl} delivery={self.delivery_count}{event}>"
        )


class AsyncReceivedMessage(ReceivedMessage):
    """A message from `AsyncClient`: settle it exactly once with `await message.ack()`,
    `requeue(...)` or `dead_letter(...)`."""

    __slots__ = ()

    async def ack(self) -> None:  # type: ignore[override]
        self._ack(self.queue, self._id, self._generation)

    async def requeue(self, ttl: int = 0, delay: float = 0.0) -> None:  # type: ignore[override]
        """Back to the tail of the queue with a new TTL (0: never expires), after `delay`
        seconds out of it (a retry backoff)."""
        self._settle(self._requeue_frame(ttl, delay), self._generation)

    async def dead_letter(self, reason: str | None = None) -> None:  # type: ignore[override]
        self._settle(self._dead_letter_frame(reason), self._generation)

    async def return_unstarted(self) -> None:  # type: ignore[override]
        """Back to the head of the queue unstarted; see ReceivedMessage.return_unstarted."""
        self._settle(self.unstarted_frame(), self._generation)

    async def reply(  # type: ignore[override]
        self, content: bytes | str = b"", error: str | None = None
    ) -> None:
        """Answer this request and settle it; see ReceivedMessage.reply."""
        self._settle(self._reply_frame(content, error), self._generation)
