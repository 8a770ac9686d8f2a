"""Sans-IO PHPMQ v01 codec: bytes in, typed messages out, and back. No sockets, no clocks.

The wire format and the extension types are specified in docs/protocol.md.
"""

from .constants import (
    DEFAULT_MAX_CONTENT_BYTES,
    ErrorCode,
    MessageType,
    PacketType,
)
from .errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    TruncatedError,
)
from .messages import (
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
    Pause,
    Requeue,
    Resume,
    Send,
)
from .reader import decode_frame, decode_message
from .rules import (
    DEFAULT_ADDRESS,
    MAX_KEY_BYTES,
    MAX_QUEUE_NAME_BYTES,
    clamp_liveness,
    key_problem,
    queue_name_problem,
)
from .stream import StreamDecoder
from .table import EXTENSION_TYPES
from .writer import (
    encode,
    encode_ack,
    encode_all,
    encode_confirm,
    encode_dispatch,
    encode_send,
    queue_packet,
)

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_MAX_CONTENT_BYTES",
    "EXTENSION_TYPES",
    "MAX_KEY_BYTES",
    "MAX_QUEUE_NAME_BYTES",
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
    "Pause",
    "ProtocolError",
    "RemoteProtocolError",
    "Requeue",
    "Resume",
    "Send",
    "StreamDecoder",
    "TruncatedError",
    "clamp_liveness",
    "decode_frame",
    "decode_message",
    "encode",
    "encode_ack",
    "encode_all",
    "encode_confirm",
    "encode_dispatch",
    "encode_send",
    "key_problem",
    "queue_name_problem",
    "queue_packet",
]
