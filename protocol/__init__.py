"""Sans-IO PHPMQ v01 codec: bytes in, typed messages out, and back. No sockets, no clocks.

The wire format and the extension types are specified in docs/protocol.md.
"""

from protocol.constants import (
    DEFAULT_MAX_CONTENT_BYTES,
    ErrorCode,
    MessageType,
    PacketType,
)
from protocol.errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    TruncatedError,
)
from protocol.messages import (
    Ack,
    Admin,
    AdminReply,
    Confirm,
    Consume,
    DeadLetter,
    Disconnect,
    Dispatch,
    Error,
    Heartbeat,
    Hello,
    Kbai,
    Message,
    Requeue,
    Send,
)
from protocol.reader import decode_frame, decode_message
from protocol.stream import StreamDecoder
from protocol.table import EXTENSION_TYPES
from protocol.writer import (
    encode,
    encode_ack,
    encode_all,
    encode_confirm,
    encode_dispatch,
    encode_send,
    queue_packet,
)

__all__ = [
    "DEFAULT_MAX_CONTENT_BYTES",
    "EXTENSION_TYPES",
    "Ack",
    "Admin",
    "AdminReply",
    "Confirm",
    "Consume",
    "DeadLetter",
    "Disconnect",
    "Dispatch",
    "Error",
    "ErrorCode",
    "Heartbeat",
    "Hello",
    "Kbai",
    "LocalProtocolError",
    "Message",
    "MessageType",
    "PacketType",
    "ProtocolError",
    "RemoteProtocolError",
    "Requeue",
    "Send",
    "StreamDecoder",
    "TruncatedError",
    "decode_frame",
    "decode_message",
    "encode",
    "encode_ack",
    "encode_all",
    "encode_confirm",
    "encode_dispatch",
    "encode_send",
    "queue_packet",
]
