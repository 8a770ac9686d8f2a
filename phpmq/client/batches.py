"""Many 001s packed into frames, for `send_many`: the fewer frames, the fewer syscalls and
broker turns, the higher the rate (the pipe benchmark sends frames of 512 messages)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import msgspec

from ..protocol import (
    MAX_KEY_BYTES,
    MIN_CONTROL_PACKET_BYTES,
    ErrorCode,
    Send,
    encode,
    encode_keyed_publish,
    encode_keyed_send,
    encode_publish,
    encode_send,
    key_problem,
    ttl_packet,
)
from .errors import ClientError, InvalidArgument, PartialSend, Paused
from .message import as_bytes, content_bytes

_headers = msgspec.json.Encoder()
_headers_decoder = msgspec.json.Decoder()

#: Messages packed into one frame by send_many, and the frame size that closes a batch early.
BATCH_MESSAGES = 512
BATCH_BYTES = 256 * 1024
#: Keys this short are valid whatever their characters (UTF-8: at most 4 bytes each).
_SURELY_SHORT_KEY = MAX_KEY_BYTES // 4

#: (frame, how many messages it holds, the tags it carries)
Batch = tuple[bytes, int, list[int]]


def messages_per_frame(confirm: bool, max_unconfirmed: int) -> int:
    """How many messages send_many and publish_many pack into one frame: confirmed, no more
    than may be out unconfirmed."""
    return max(1, min(BATCH_MESSAGES, max_unconfirmed)) if confirm else BATCH_MESSAGES


def partly_sent(stopped_by: ClientError, sent: int) -> PartialSend:
    """What a fire-and-forget send_many raises when `stopped_by` kept a frame from going
    after `sent` messages went: a Paused still (with `sent`), else a PartialSend."""
    if isinstance(stopped_by, Paused):
        detail = f"; {sent} messages sent before it"
        return Paused(stopped_by.error, stopped_by.waited, sent=sent, detail=detail)
    return PartialSend(str(stopped_by), sent)


def check_key(key: str) -> None:
    """Raise InvalidArgument (422) for an idempotency key the broker would refuse."""
    if not key or len(key) > _SURELY_SHORT_KEY:
        problem = key_problem(key)
        if problem is not None:
            raise InvalidArgument(problem, key)


def check_lengths(contents: Iterable[object], **per_message: Iterable[object] | None) -> None:
    """Raise ValueError, before anything is sent, when one of `per_message` (keys, headers,
    message keys: one per message) is shorter than `contents`, both sized."""
    if not isinstance(contents, Sized):
        return
    for name, items in per_message.items():
        if isinstance(items, Sized) and len(items) < len(contents):
            raise ValueError(f"{len(items)} {name.replace('_', ' ')} for {len(contents)} messages")


def too_large(queue: str, size: int, limit: int, part: str = "content") -> InvalidArgument:
    """What to raise for a packet over the broker's limit (413, as the broker would answer)."""
    return InvalidArgument(
        f"{part} of {size} bytes is over the broker's limit of {limit}", queue, ErrorCode.TOO_LARGE
    )


#: Per-message headers (a JSON object, or its compact JSON encoding as bytes; None for none)
#: and message keys of a batch (or of one send).
HeadersItem = dict[str, Any] | bytes | bytearray | memoryview | None
MessageKeyItem = bytes | str | None


def encode_full_send(
    queue: str,
    body: bytes,
    ttl: int,
    headers: bytes | None,
    tag: int | None,
    key: str | None,
    delay_ms: int,
    message_key: bytes | str | None,
) -> bytes:
    """A 001 with the packets the fast `encode_send` has no place for: headers (their JSON,
    `checked_headers`), a delay, a message key (already checked by the caller, as for the
    fast form)."""
    return encode(
        Send(
            queue,
            body,
            ttl,
            tag,
            key,
            headers or None,
            delay_ms=delay_ms or None,
            message_key=as_bytes(message_key),
        )
    )


#: Encodes one 001 or 108 from its target's packet: encode_keyed_send or encode_keyed_publish
#: (the one form).
Encoder = Callable[..., bytes]


def send_batches(
    queue: str,
    packet: bytes,
    contents: Iterable[bytes | str],
    ttl: int | None,
    keys: Iterable[str] | None,
    tags: Iterator[int] | None,
    batch_messages: int,
    max_content_bytes: int,
    headers: Iterable[HeadersItem] | None = None,
    message_keys: Iterable[MessageKeyItem] | None = None,
    publish: bool = False,
) -> Iterator[Batch]:
    """The 001s of `contents` to `queue` (its `packet`; or, with `publish`, the 108s of an
    event), `batch_messages` a frame at most, each with the next of `keys`, `headers`,
    `message_keys` and `tags` when given; content or headers over `max_content_bytes` are
    refused (413), as the broker would refuse the frame's decoding. Lazy: contents, keys,
    headers and message keys are read as the batches are taken."""
    # A confirmed, idempotent batch given both headers and message keys gives every message
    # both packets, an empty one for none (the broker keeps nothing of it, docs/protocol.md
    # §6): one form for the whole frame, which the broker reads as a run by its packet
    # headers instead of decoding each message (a Spark sink's rows). Other batches send no
    # packet for none, as older brokers (before MESSAGE_KEY) and the forms the broker decodes
    # anyway want.
    if (
        keys is not None
        and tags is not None
        and ttl is not None
        and headers is not None
        and message_keys is not None
    ):
        yield from _one_form_batches(
            queue, packet, contents, ttl, keys, tags, batch_messages, max_content_bytes,
            headers, message_keys, encode_keyed_publish if publish else encode_keyed_send,
        )  # fmt: skip
        return
    encoder = encode_publish if publish else encode_send
    key_iter = iter(keys) if keys is not None else None
    keyed = headers is not None or message_keys is not None
    header_items = iter(headers) if headers is not None else itertools.repeat(None)
    key_items = iter(message_keys) if message_keys is not None else itertools.repeat(None)
    key_limit = max(max_content_bytes, MIN_CONTROL_PACKET_BYTES)
    batch: list[bytes] = []
    batch_tags: list[int] = []
    size = 0
    key = tag = None
    for content in contents:
        if key_iter is not None:
            key = next(key_iter, None)
            if key is None:
                raise ValueError("fewer keys than messages")
            if not key or len(key) > _SURELY_SHORT_KEY:
                check_key(key)
        if tags is not None:
            tag = next(tags)
            batch_tags.append(tag)
        body = content if content.__class__ is bytes else content_bytes(content)
        if len(body) > max_content_bytes:
            raise too_large(queue, len(body), max_content_bytes)
        if not keyed:  # the plain batch: nothing more per message
            data = encoder(packet, body, ttl, tag, key)
        else:
            header = next(header_items, _MISSING)
            message_key = next(key_items, _MISSING)
            if header is _MISSING or message_key is _MISSING:
                raise ValueError("fewer headers or message keys than messages")
            header = _header_packet(header, None, queue, max_content_bytes)
            if message_key is not None:
                message_key = _message_key_packet(message_key, queue, key_limit)
            data = encoder(packet, body, ttl, tag, key, header, message_key)
        batch.append(data)
        size += len(data)
        if len(batch) >= batch_messages or size >= BATCH_BYTES:
            yield b"".join(batch), len(batch), batch_tags
            batch, batch_tags, size = [], [], 0
    if batch:
        yield b"".join(batch), len(batch), batch_tags


def _one_form_batches(
    queue: str,
    target_packet: bytes,
    contents: Iterable[bytes | str],
    ttl: int,
    keys: Iterable[str],
    tags: Iterator[int],
    batch_messages: int,
    max_content_bytes: int,
    headers: Iterable[HeadersItem],
    message_keys: Iterable[MessageKeyItem],
    encoder: Encoder,
) -> Iterator[Batch]:
    """send_batches of a confirmed, idempotent batch with headers and message keys: every
    message with every packet (encode_keyed_send), its own loop so that a keyed row costs
    what a plain one does (0.65 against 0.61 us a row; 1.08 through the general loop). It
    refuses what the general loop does, in the same order (tests/test_client_keyed_batches.py).
    """
    key_limit = max(max_content_bytes, MIN_CONTROL_PACKET_BYTES)
    ttl_bytes: bytes | None = None  # made at the first message, as encode_send checks it
    key_iter = iter(keys)
    rows = zip(
        contents,
        itertools.chain(headers, itertools.repeat(_MISSING)),
        itertools.chain(message_keys, itertools.repeat(_MISSING)),
        strict=False,  # endless: a row past the headers' or message keys' end gets _MISSING
    )
    batch: list[bytes] = []
    batch_tags: list[int] = []
    size = 0
    for content, header, message_key in rows:
        key = next(key_iter, None)
        if key is None:
            raise ValueError("fewer keys than messages")
        if not key or len(key) > _SURELY_SHORT_KEY:
            check_key(key)
        tag = next(tags)
        batch_tags.append(tag)
        body = content if content.__class__ is bytes else content_bytes(content)
        if len(body) > max_content_bytes:
            raise too_large(queue, len(body), max_content_bytes)
        if header is _MISSING or message_key is _MISSING:
            raise ValueError("fewer headers or message keys than messages")
        # Bytes that look like a JSON object (the sink's) are taken as they are, inline.
        if header.__class__ is bytes and header and header[0] == 123 and header[-1] == 125:
            if len(header) > max_content_bytes:
                raise too_large(queue, len(header), max_content_bytes, "headers (as JSON)")
        else:
            header = _header_packet(header, b"", queue, max_content_bytes)
        if message_key.__class__ is not bytes or len(message_key) > key_limit:
            message_key = _message_key_packet(message_key, queue, key_limit)
        if ttl_bytes is None:
            ttl_bytes = ttl_packet(ttl)
        data = encoder(target_packet, body, ttl_bytes, tag, key, header, message_key)
        batch.append(data)
        size += len(data)
        if len(batch) >= batch_messages or size >= BATCH_BYTES:
            yield b"".join(batch), len(batch), batch_tags
            batch, batch_tags, size = [], [], 0
    if batch:
        yield b"".join(batch), len(batch), batch_tags


def _header_packet(header: object, none: bytes | None, queue: str, limit: int) -> bytes | None:
    """A message's HEADERS packet content (`none` for none).

    Raises:
        InvalidArgument: headers that are not a JSON object (422), longer than `limit` (413).
    """
    if not header:
        return none
    encoded = encoded_headers(header)  # type: ignore[arg-type]
    if len(encoded) > limit:
        raise too_large(queue, len(encoded), limit, "headers (as JSON)")
    return encoded


def _message_key_packet(message_key: object, queue: str, limit: int) -> bytes:
    """A message's MESSAGE_KEY packet content (b"" for none).

    Raises:
        TypeError: a key that is neither bytes nor text.
        InvalidArgument: longer than `limit` (413).
    """
    if message_key is None:
        return b""
    if message_key.__class__ is str:
        message_key = message_key.encode()  # type: ignore[attr-defined]
    elif message_key.__class__ is not bytes:
        message_key = as_bytes(message_key)  # type: ignore[arg-type]
    assert isinstance(message_key, bytes)
    if len(message_key) > limit:
        raise too_large(queue, len(message_key), limit, "message key")
    return message_key


#: What a per-message iterable gives once it has run out.
_MISSING: Any = object()


def encoded_headers(headers: dict[str, Any] | bytes | bytearray | memoryview) -> bytes:
    """HEADERS JSON of a batch's message: a dict encoded; bytes (a producer that encoded its
    JSON objects already, such as the Spark sink) sent as they are, once they look like a
    JSON object: `{` first and `}` last (one send's are read whole: `checked_headers`).

    Raises:
        InvalidArgument: bytes that do not look like a JSON object, or neither a dict nor
            bytes (422).
    """
    if headers.__class__ is not bytes:
        if isinstance(headers, dict):
            return _headers.encode(headers)
        headers = _as_bytes(headers)
    assert isinstance(headers, bytes)
    if headers[:1] != b"{" or headers[-1:] != b"}":
        raise InvalidArgument("headers given as bytes must be a JSON object", repr(headers[:20]))
    return headers


def checked_headers(
    headers: dict[str, Any] | bytes | bytearray | memoryview, queue: str, limit: int
) -> bytes:
    """One send's HEADERS JSON: a dict encoded; bytes sent as they are once read whole as one
    JSON object (whitespace around it is fine); no longer than `limit` (the broker's
    max_content_bytes).

    Raises:
        InvalidArgument: bytes that are not a JSON object, or neither a dict nor bytes
            (422); longer than `limit` (413).
    """
    if isinstance(headers, dict):
        encoded = _headers.encode(headers)
    else:
        encoded = _as_bytes(headers)
        decoded_headers(encoded)
    if len(encoded) > limit:
        raise too_large(queue, len(encoded), limit, "headers (as JSON)")
    return encoded


def headers_dict(headers: HeadersItem) -> dict[str, Any]:
    """The headers as a dict (a request's, to add `reply_format` to): none as {}.

    Raises:
        InvalidArgument: bytes that are not a JSON object, or neither a dict nor bytes.
    """
    if not headers:
        return {}
    if isinstance(headers, dict):
        return headers
    return decoded_headers(_as_bytes(headers))


def _as_bytes(headers: object) -> bytes:
    """Headers given as bytes of any kind, as bytes.

    Raises:
        InvalidArgument: they are neither a dict nor bytes.
    """
    if isinstance(headers, bytes | bytearray | memoryview):
        return bytes(headers)
    raise InvalidArgument("headers must be a dict or a JSON object's bytes", type(headers).__name__)


def decoded_headers(headers: bytes) -> dict[str, Any]:
    """The JSON object `headers` holds.

    Raises:
        InvalidArgument: they are not one JSON object (not JSON, not UTF-8, nested too deep).
    """
    try:
        decoded = _headers_decoder.decode(headers)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        decoded = None
    if not isinstance(decoded, dict):
        raise InvalidArgument("headers given as bytes must be a JSON object", repr(headers[:20]))
    return decoded
