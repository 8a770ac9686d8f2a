"""Replies (docs/protocol.md §6.6): a worker's 112 REPLY settles the request it holds, like an
ACK, and the broker routes the answer by the route the request brought with it: to the
requester's peer, or into a reply queue.

A request gets at most one reply because only the peer holding it may answer, and answering
settles it: a worker that lost the request (its lease ran out, it was presumed dead) finds it
no longer held, and its late reply is refused and counted, never delivered.
"""

from __future__ import annotations

import msgspec

from ..protocol import ErrorCode, Reply, encode, encode_reply_to_requester
from .context import Context
from .dispatch import Dispatch
from .intake import Intake
from .model import Peer, Record
from .queues import Queues

_json_object = msgspec.json.Decoder(dict)
_json = msgspec.json.Encoder()


class Replies:
    __slots__ = ("_ctx", "_dispatch", "_intake", "_peers", "_queues")

    def __init__(
        self,
        ctx: Context,
        queues: Queues,
        dispatch: Dispatch,
        intake: Intake,
        peers: dict[bytes, Peer],
    ) -> None:
        self._ctx = ctx
        self._queues = queues
        self._dispatch = dispatch
        self._intake = intake
        #: The peers the broker knows, by id (owned by peers.py): where a reply goes.
        self._peers = peers

    def on_reply(self, peer: Peer, message: Reply) -> None:
        ctx = self._ctx
        queue_name, message_id = message.queue, message.message_id
        if queue_name is None or message_id is None:
            ctx.refuse(
                peer,
                ErrorCode.INVALID_VALUE,
                "a REPLY from a client names the request's queue (01) and ID (03)",
            )
            return
        window = peer.windows.get(queue_name)
        request = window.held.get(message_id) if window is not None else None
        if request is None:
            ctx.counters.replies_dropped += 1
            self._dispatch.ack(peer, queue_name, message_id, "reply to")  # refused: 404
            return
        if request.correlation is None or request.reply_to is None:
            ctx.refuse(
                peer,
                ErrorCode.INVALID_VALUE,
                f"message {message_id.decode(errors='replace')} on {queue_name!r} asked for"
                " no reply: ack it instead",
                message_id,
                queue_name,
            )
            return
        self._dispatch.ack(peer, queue_name, message_id, "reply to")
        if request.reply_to:
            self._into_queue(peer, request, message)
        else:
            self._to_requester(request, message)

    def _to_requester(self, request: Record, message: Reply) -> None:
        ctx = self._ctx
        requester = self._peers.get(request.reply_peer)
        if requester is None or requester.forgotten:
            ctx.counters.replies_dropped += 1
            ctx.log_limited(
                f"a reply to request {request.id.decode(errors='replace')} was dropped: its"
                " requester is gone",
                "reply-dropped",
            )
            return
        if message.code is None and message.reason is None and message.headers is None:
            reply = encode_reply_to_requester(message.content, request.id, request.correlation)  # type: ignore[arg-type]
        else:
            reply = encode(
                Reply(
                    message.content,
                    None,
                    request.id,
                    request.correlation,
                    message.code,
                    message.reason,
                    message.headers,
                )
            )
        ctx.reply_encoded(requester, reply)
        ctx.counters.replied += 1

    def _into_queue(self, peer: Peer, request: Record, message: Reply) -> None:
        """The reply becomes a message of the reply queue, with the correlation id; an error
        reply says so in its headers."""
        ctx = self._ctx
        intake = self._intake
        queue = self._queues.open(peer, request.reply_to)  # type: ignore[arg-type]
        if queue is None or (queue.max_length and not intake.has_room(peer, queue, None)):
            ctx.counters.replies_dropped += 1
            return
        intake.put(
            peer,
            queue,
            message.content,
            0,
            _reply_headers(message),
            correlation=request.correlation,
        )
        ctx.counters.replied += 1


def _reply_headers(message: Reply) -> bytes | None:
    if message.code is None and message.reason is None:
        return message.headers
    headers = {}
    if message.headers:
        try:
            headers = _json_object.decode(message.headers)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            # msgspec reports invalid UTF-8 inside a JSON string as a bare UnicodeDecodeError
            # and deep nesting as a RecursionError: headers that are no JSON object all the same.
            headers = {}
    headers["error"] = {"code": message.code or int(ErrorCode.INTERNAL), "reason": message.reason}
    return _json.encode(headers)
