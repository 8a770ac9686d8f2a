"""Requests awaiting replies, as a client keeps them, sans-IO (docs/protocol.md §6.6).

A request is a tagged 001 with REPLY_TO "" (reply to this peer) and a CORRELATION taken from
a per-connection counter. Its outcome is one of: the broker's 112 REPLY with that correlation,
the ERROR that refused the request (it carries the request's tag), or LOST when the transport
was replaced first (the broker dropped the route back: no reply can come). A reply whose
correlation no one awaits (the requester timed out, or it is a second one) is dropped and
counted. The drivers wait for the outcome; `notify`, when set, is told each correlation whose
outcome came, so that an asyncio driver wakes just that request's waiter.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from ..protocol import Error, Reply, encode_send
from .batches import HeadersItem, checked_headers, headers_dict, too_large
from .errors import BrokerRefused, ClientError, InvalidArgument, ReplyError, RequestLost
from .message import content_bytes, queue_packet

ReplyFormat = Literal["raw", "json", "msgpack"]
REPLY_FORMATS: tuple[str, ...] = ("raw", "json", "msgpack")
#: Content up to this size goes without first waiting for the broker's limits.
SMALL_REQUEST_BYTES = 64 * 1024


class Lost:
    """The outcome of a request whose transport was replaced before its reply came."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


Outcome = Reply | Error | Lost
#: Timed-out requests whose tags are remembered, to drop a refusal that comes after.
MAX_GIVEN_UP = 1024


class Requests:
    """The requests one connection has in flight, by correlation."""

    __slots__ = ("_correlations", "_closed", "_outcomes", "_tags", "dropped", "notify")

    def __init__(self) -> None:
        self._correlations = itertools.count(1)
        #: Correlation -> its outcome, None while it is awaited.
        self._outcomes: dict[str, Outcome | None] = {}
        #: The tag each request was sent with -> its correlation (to match a refusal).
        self._tags: dict[int, str] = {}
        #: Tags of the latest requests done without a refusal (timed out, answered, lost): a
        #: refusal of one that comes after is dropped, its requester told already.
        self._closed: dict[int, None] = {}
        #: Replies (and refusals) no request awaited: late (after a timeout), repeated, or
        #: unknown.
        self.dropped = 0
        #: Told each correlation whose outcome came (None: no one is told).
        self.notify: Callable[[str], object] | None = None

    def __len__(self) -> int:
        return len(self._outcomes)

    def open(self, tag: int) -> str:
        """A new request, sent with `tag`: its correlation, awaited from now on."""
        correlation = str(next(self._correlations))
        self._outcomes[correlation] = None
        self._tags[tag] = correlation
        return correlation

    def outcome(self, correlation: str) -> Outcome | None:
        """The request's outcome, or None while none came."""
        return self._outcomes.get(correlation)

    def close(self, correlation: str, tag: int) -> Outcome | None:
        """The requester is done waiting (answered or not): a reply or refusal after this is
        dropped. (A refusal can follow the reply: a replicated shard's leader that dispatched
        the request and died before its confirm; the shard the client talks to then answers
        the request's tag with 503, and the requester has its reply.)"""
        self._tags.pop(tag, None)
        outcome = self._outcomes.pop(correlation, None)
        if type(outcome) is not Error:
            closed = self._closed
            if len(closed) >= MAX_GIVEN_UP:
                del closed[next(iter(closed))]
            closed[tag] = None
        return outcome

    def late_refusal(self, error: Error) -> bool:
        """Whether `error` refuses a request that has its outcome already (a reply, or lost
        with its transport) or whose requester gave up on it: then it is dropped, the
        requester told already. (A request still waiting takes it as its outcome.)"""
        tag = error.tag
        if tag is None:
            return False
        correlation = self._tags.get(tag)
        if correlation is not None:
            if self._outcomes.get(correlation) is None:
                self._set(correlation, error)
            else:
                self.dropped += 1
            return True
        if tag not in self._closed:
            return False
        del self._closed[tag]
        self.dropped += 1
        return True

    def replied(self, reply: Reply) -> None:
        """A 112 REPLY came: the outcome of the request it names, else dropped."""
        correlation = reply.correlation
        if correlation is None or self._outcomes.get(correlation, reply) is not None:
            self.dropped += 1  # unknown, timed out, or already answered
            return
        self._set(correlation, reply)

    def refused(self, tag: int, error: Error) -> None:
        """An ERROR answered `tag`: if a request went with it, that is its outcome."""
        correlation = self._tags.get(tag)
        if correlation is not None and self._outcomes.get(correlation, error) is None:
            self._set(correlation, error)

    def give_up(self, why: str) -> None:
        """The transport was replaced: every awaited request is LOST."""
        lost = Lost(why)
        for correlation, outcome in list(self._outcomes.items()):
            if outcome is None:
                self._set(correlation, lost)

    def _set(self, correlation: str, outcome: Outcome) -> None:
        self._outcomes[correlation] = outcome
        if self.notify is not None:
            self.notify(correlation)


def check_request(timeout: float, reply_format: str) -> None:
    """Raise InvalidArgument for a timeout or reply format `request` cannot use."""
    if not timeout > 0 or math.isinf(timeout):
        raise InvalidArgument("the request timeout must be a number of seconds > 0", str(timeout))
    if reply_format not in REPLY_FORMATS:
        raise InvalidArgument(
            f"the reply format must be one of {', '.join(REPLY_FORMATS)}", reply_format
        )


def encode_request(
    queue: str,
    content: bytes | str,
    timeout: float,
    headers: HeadersItem,
    reply_format: str,
    tag: int,
    correlation: str,
    limit: int,
) -> bytes:
    """The 001 of a request: TTL the timeout rounded up, so an untaken one expires; its
    headers say `reply_format` unless raw.

    Raises:
        InvalidArgument: a bad queue name, content or headers over `limit`, headers as
            bytes that are not a JSON object.
    """
    packet = queue_packet(queue)
    body = content_bytes(content)
    if len(body) > limit:
        raise too_large(queue, len(body), limit)
    if reply_format != "raw":  # (raw: a JSON object's bytes go as they are, as in a send)
        headers = {**headers_dict(headers), "reply_format": reply_format}
    encoded = checked_headers(headers, queue, limit) if headers else None
    ttl = math.ceil(timeout)
    return encode_send(packet, body, ttl, tag, None, encoded, reply_to="", correlation=correlation)


def result(outcome: Outcome, reply_format: str) -> Any:
    """What `request` returns for `outcome`: the reply's content, decoded per `reply_format`
    (an empty reply is None for json and msgpack).

    Raises:
        ReplyError: an error reply.
        RequestLost: the connection was replaced before the reply came.
        BrokerRefused: the broker refused the request.
        ClientError: the reply is not in the format asked for.
    """
    if isinstance(outcome, Lost):
        raise RequestLost(f"no reply will come: {outcome.why}")
    if isinstance(outcome, Error):
        raise BrokerRefused(outcome)
    if outcome.code is not None or outcome.reason is not None:
        raise ReplyError(outcome.code or 500, outcome.reason or "")
    content = outcome.content
    if reply_format == "raw":
        return content
    if not content:
        return None
    try:
        if reply_format == "json":
            return msgspec.json.decode(content)
        return msgspec.msgpack.decode(content)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        # (msgspec reports bad UTF-8 in a JSON string and deep nesting with these two)
        raise ClientError(f"the reply is not {reply_format}: {exc}") from None
