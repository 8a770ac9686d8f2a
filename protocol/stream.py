"""Incremental decoding of a PHPMQ byte stream (raw TCP), where a message may arrive split at
any byte and several may arrive in one read.

Use: `receive_data(chunk)` then `next_message()` until it returns None (need more data);
`receive_data(b"")` marks end of stream. After a RemoteProtocolError the decoder stays broken:
framing is lost, and every later call raises the same error.
"""

from __future__ import annotations

from .constants import DEFAULT_MAX_CONTENT_BYTES
from .errors import RemoteProtocolError, TruncatedError
from .messages import Message
from .reader import decode_message


class StreamDecoder:
    def __init__(self, max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES) -> None:
        self.max_content_bytes = max_content_bytes
        #: The bytes decoded from, and the offset of the first unread one. Messages are decoded
        #: in place (no copy per message), so draining N buffered messages is O(total bytes).
        self._data = b""
        self._offset = 0
        #: Chunks received since `_data` was built; joined to it once, at the next decode.
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        #: Bytes that must be buffered before another decode attempt can make progress.
        self._needed = 1
        self._eof = False
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._data) - self._offset + self._pending_bytes

    def receive_data(self, data: bytes) -> None:
        if self._eof:
            raise RemoteProtocolError("data received after end of stream")
        if data:
            self._pending.append(bytes(data))
            self._pending_bytes += len(data)
        else:
            self._eof = True

    def next_message(self) -> Message | None:
        """The next complete message, or None when more data is needed.

        Raises:
            RemoteProtocolError: the stream is malformed, or ended inside a message.
        """
        if self._error is not None:
            raise self._error
        if self.buffered < self._needed:
            return self._at_shortage()
        if self._pending:
            # One copy per batch of received chunks (the unread tail plus the new chunks).
            self._data = b"".join([self._data[self._offset :], *self._pending])
            self._offset = 0
            self._pending.clear()
            self._pending_bytes = 0
        try:
            message, end = decode_message(self._data, self._offset, self.max_content_bytes)
        except TruncatedError as exc:
            self._needed = exc.needed
            return self._at_shortage()
        except RemoteProtocolError as exc:
            self._error = exc
            raise
        if end == len(self._data):
            self._data = b""
            self._offset = 0
        else:
            self._offset = end
        self._needed = 1
        return message

    def _at_shortage(self) -> None:
        if self._eof and self.buffered:
            self._error = RemoteProtocolError(
                f"stream ended inside a message ({self.buffered} bytes unread)"
            )
            raise self._error
        return None
