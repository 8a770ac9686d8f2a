"""Incremental decoding of a PHPMQ byte stream (raw TCP), where a message may arrive split at
any byte and several may arrive in one read.

Use: `receive_data(chunk)` then `next_message()` until it returns None (need more data);
`receive_data(b"")` marks end of stream. After a RemoteProtocolError the decoder stays broken:
framing is lost, and every later call raises the same error.
"""

from __future__ import annotations

from protocol.constants import DEFAULT_MAX_CONTENT_BYTES
from protocol.errors import RemoteProtocolError, TruncatedError
from protocol.messages import Message
from protocol.reader import decode_message


class StreamDecoder:
    def __init__(self, max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES) -> None:
        self.max_content_bytes = max_content_bytes
        self._buffer = bytearray()
        #: Bytes that must be buffered before another decode attempt can make progress.
        self._needed = 1
        self._eof = False
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def receive_data(self, data: bytes) -> None:
        if self._eof:
            raise RemoteProtocolError("data received after end of stream")
        if data:
            self._buffer += data
        else:
            self._eof = True

    def next_message(self) -> Message | None:
        """The next complete message, or None when more data is needed.

        Raises:
            RemoteProtocolError: the stream is malformed, or ended inside a message.
        """
        if self._error is not None:
            raise self._error
        if len(self._buffer) < self._needed:
            return self._at_shortage()
        try:
            message, end = decode_message(bytes(self._buffer), 0, self.max_content_bytes)
        except TruncatedError as exc:
            self._needed = exc.needed
            return self._at_shortage()
        except RemoteProtocolError as exc:
            self._error = exc
            raise
        del self._buffer[:end]
        self._needed = 1
        return message

    def _at_shortage(self) -> None:
        if self._eof and self._buffer:
            self._error = RemoteProtocolError(
                f"stream ended inside a message ({len(self._buffer)} bytes unread)"
            )
            raise self._error
        return None
