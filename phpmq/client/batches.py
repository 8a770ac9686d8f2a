"""Many 001s packed into frames, for `send_many`: the fewer frames, the fewer syscalls and
broker turns, the higher the rate (the pipe benchmark sends frames of 512 messages)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from ..protocol import MAX_KEY_BYTES, ErrorCode, Send, encode, encode_send, key_problem
from .errors import InvalidArgument

_headers = msgspec.json.Encoder()

#: Messages packed into one frame by send_many, and the frame size that closes a batch early.
BATCH_MESSAGES = 512
BATCH_BYTES = 256 * 1024
#: Keys this short are valid whatever their characters (UTF-8: at most 4 bytes each).
_SURELY_SHORT_KEY = MAX_KEY_BYTES // 4

#: (frame, how many messages it holds, the tags it carries)
Batch = tuple[bytes, int, list[int]]


def check_key(key: str) -> None:
    """Raise InvalidArgument (422) for an idempotency key the broker would refuse."""
    if not key or len(key) > _SURELY_SHORT_KEY:
        problem = key_problem(key)
        if problem is not None:
            raise InvalidArgument(problem, key)


def too_large(queue: str, size: int, limit: int) -> InvalidArgument:
    """What to raise for content over the broker's limit (413, as the broker would answer)."""
    return InvalidArgument(
        f"content of {size} bytes is over the broker's limit of {limit}", queue, ErrorCode.TOO_LARGE
    )


def encode_full_send(
    queue: str,
    body: bytes,
    ttl: int,
    headers: dict[str, Any] | None,
    tag: int | None,
    key: str | None,
    delay_ms: int,
    message_key: bytes | str | None,
) -> bytes:
    """A 001 with the packets the fast `encode_send` has no place for: headers, a delay, a
    message key (already checked by the caller, as for the fast form)."""
    return encode(
        Send(
            queue,
            body,
            ttl,
            tag,
            key,
            _headers.encode(headers) if headers else None,
            delay_ms=delay_ms or None,
            message_key=message_key.encode() if isinstance(message_key, str) else message_key,
        )
    )


def send_batches(
    queue: str,
    packet: bytes,
    contents: Iterable[bytes | str],
    ttl: int,
    keys: Iterable[str] | None,
    tags: Iterator[int] | None,
    batch_messages: int,
    max_content_bytes: int,
) -> Iterator[Batch]:
    """The 001s of `contents` to `queue` (its `packet`), `batch_messages` a frame at most,
    each with the next of `keys` and `tags` when given; content over `max_content_bytes` is
    refused (413). Lazy: contents and keys are read as the batches are taken."""
    key_iter = iter(keys) if keys is not None else None
    batch: list[bytes] = []
    batch_tags: list[int] = []
    size = 0
    key = tag = None
    for content in contents:
        if key_iter is not None:
            key = next(key_iter, None)
            if key is None:
                raise ValueError("fewer keys than messages")
            check_key(key)
        if tags is not None:
            tag = next(tags)
            batch_tags.append(tag)
        body = content.encode() if isinstance(content, str) else content
        if len(body) > max_content_bytes:
            raise too_large(queue, len(body), max_content_bytes)
        data = encode_send(packet, body, ttl, tag, key)
        batch.append(data)
        size += len(data)
        if len(batch) >= batch_messages or size >= BATCH_BYTES:
            yield b"".join(batch), len(batch), batch_tags
            batch, batch_tags, size = [], [], 0
    if batch:
        yield b"".join(batch), len(batch), batch_tags
