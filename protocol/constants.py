"""Every PHPMQ wire literal lives here; no other module spells out header bytes.

Sources: the PHPMQ README (current revision, with TTL) and the pinned pre-TTL form that the
stock php-mq client and server speak (shared/reference/phpmq.md §1, §2.1). Types and packets
numbered 100+ / 10+ are phpmq-zmq extensions, defined in docs/protocol.md.
"""

from __future__ import annotations

from enum import IntEnum

#: `H` + 2-digit version + 3-digit type + 2-digit packet count.
MESSAGE_HEADER_BYTES = 8
#: `P` + 2-digit packet type + 29-digit zero-padded content length. The README's 36-character
#: example is a leftover of a first draft; every implementation and test uses 32 (phpmq.md §1.2).
PACKET_HEADER_BYTES = 32
LENGTH_DIGITS = 29
MESSAGE_MARKER = 0x48  # b"H"
PACKET_MARKER = 0x50  # b"P"
#: Both dialects send version 01; they differ only in packet counts (phpmq.md §1.7).
PROTOCOL_VERSION = 1

#: The largest content a decoder accepts unless configured otherwise: beanstalkd defaults to
#: 64 KiB, RabbitMQ to 16 MiB (hard cap 512 MiB). Big enough for documents and images,
#: small enough that one bad length field cannot make us buffer gigabytes.
DEFAULT_MAX_CONTENT_BYTES = 16 * 1024 * 1024
#: Packets that are not content (HELLO's and ADMIN's options, reasons, patterns, ...) may be
#: this long however small the content limit is set: `--max-content-bytes 100` limits what
#: producers send, not the HELLO that says who they are. Above it they share content's limit.
MIN_CONTROL_PACKET_BYTES = 64 * 1024
#: Integer packets (count, TTL, delivery count, error code) are plain decimal; 18 digits keep
#: every value inside a 64-bit signed integer.
MAX_INTEGER_DIGITS = 18
#: Integer packets are below this (what MAX_INTEGER_DIGITS digits can say, and more).
INTEGER_LIMIT = 10**MAX_INTEGER_DIGITS


class MessageType(IntEnum):
    SEND = 1  # client -> broker: queue, content, [ttl]
    CONSUME = 2  # client -> broker: queue, count (window)
    DISPATCH = 3  # broker -> client: queue, content, id, [ttl], [delivery count]
    ACK = 4  # client -> broker: queue, id
    REQUEUE = 5  # client -> broker: queue, id, ttl
    DEAD_LETTER = 6  # client -> broker: queue, id, [reason]
    # phpmq-zmq extensions (100-199), spoken only with peers that used one first.
    ERROR = 100  # broker -> client: code, reason, [id], [queue]
    HELLO = 101  # both ways: options (JSON)
    HEARTBEAT = 102  # both ways: nothing
    DISCONNECT = 103  # both ways: [reason]
    KBAI = 104  # both ways: nothing
    CONFIRM = 105  # broker -> client: id, [tag]
    PAUSE = 106  # broker -> client: code, reason, [queue]: stop sending there until RESUME
    RESUME = 107  # broker -> client: [queue]: the pause is over
    PUBLISH = 108  # client -> broker: event, content, [ttl, tag, key, headers]
    CANCEL = 109  # both ways: queue, [reason, count]: a consumer's consumption of it ends
    ADMIN = 110  # client -> broker: options (JSON command)
    ADMIN_REPLY = 111  # broker -> client: options (JSON result)
    REPLY = 112  # both ways: the answer to a request (a 001 with REPLY_TO)
    FORWARD = 113  # shard <-> shard: a peer's messages relayed to the queue's owner, and back


class PacketType(IntEnum):
    QUEUE = 1
    CONTENT = 2
    MESSAGE_ID = 3
    COUNT = 4
    TTL = 5
    # phpmq-zmq extensions (10-49).
    ERROR_CODE = 10
    REASON = 11
    DELIVERY_COUNT = 12
    OPTIONS = 13
    KEY = 14
    LEASE_MS = 15
    DELAY_MS = 16
    HEADERS = 17
    TAG = 18
    REFUSED = 19
    EVENT = 20
    PATTERNS = 21
    UNUSED_MS = 22
    REPLY_TO = 23
    CORRELATION = 24
    PEER = 25
    FLAGS = 26
    MESSAGE_KEY = 27
    PRINCIPAL = 28


class ErrorCode(IntEnum):
    """Codes carried by the ERROR extension message; HTTP-like so they read at a glance."""

    MALFORMED = 400  # bytes that are not a valid PHPMQ message
    FORBIDDEN = 403  # the peer's key (or endpoint) lacks the right this needs
    UNKNOWN_MESSAGE = 404  # ack/requeue/dead-letter of an ID this peer does not hold
    #: The same code: an admin command names a queue that does not exist.
    NOT_FOUND = 404
    UNSUPPORTED_TYPE = 405  # a type the broker does not accept from clients
    #: The state forbids it now: e.g. a replica that lacks entries cannot take over.
    CONFLICT = 409
    TOO_LARGE = 413  # a packet or frame over the configured maximum
    INVALID_VALUE = 422  # well-formed, but a value is out of range (queue name, count...)
    LIMIT_REACHED = 429  # a broker limit (queue length, consumers) refuses the request
    INTERNAL = 500  # the broker failed; the request may be retried
    SHUTTING_DOWN = 503  # the broker is draining and takes no new sends
    #: The same code: the broker's memory is above its limit; sends wait for a RESUME.
    OVERLOADED = 503
    INSUFFICIENT_STORAGE = 507  # durable mode: the store cannot write (disk full, I/O error)
    UNSUPPORTED_VERSION = 505  # a protocol version other than 01
