"""Producer flow control: the broker's memory limit, and PAUSE/RESUME for producers that
said HELLO (docs/protocol.md §6.4).

Memory is measured as the bytes of the messages the broker holds (`record_bytes`: content,
headers and a fixed per-message overhead), not as the process's RSS: a count the broker
controls falls as messages leave, where RSS may not (the allocator keeps freed pages). At the
limit sends are refused with 503 until it is back under the resume mark, the way RabbitMQ's
memory alarm blocks publishers.

A HELLO producer is asked to PAUSE before it would be refused: when a send of its leaves a
queue at 90% of its `max_length` (or the broker at 90% of its memory limit), so that what it
sends before the PAUSE arrives still fits. When the queue falls under 80% (memory under 80%
of the limit) every producer paused there gets a RESUME. Stock peers get no notices; they keep
today's refusals.
"""

from __future__ import annotations

import logging

from ..protocol import ErrorCode, Pause, Resume
from .context import Context
from .model import Peer, Queue

log = logging.getLogger("phpmq.broker")


class Flow:
    __slots__ = ("_ctx", "_paused_all", "_watched", "limit", "memory_high", "pause_at")

    def __init__(self, ctx: Context, limit: int) -> None:
        self._ctx = ctx
        #: Bytes of held messages at which sends are refused (0: no limit).
        self.limit = limit
        #: Above the limit and not yet back under the resume mark: sends are refused.
        self.memory_high = False
        #: Held bytes at which HELLO producers are asked to pause (read on every send).
        self.pause_at = self.pause_bytes if limit else 1 << 62
        #: Producers told to pause broker-wide (memory), and queues with paused producers.
        self._paused_all: dict[Peer, None] = {}
        self._watched: dict[Queue, None] = {}

    # ----------------------------------------------------------------- the memory limit

    @property
    def pause_bytes(self) -> int:
        return self.limit - self.limit // 10

    @property
    def resume_bytes(self) -> int:
        return self.limit - self.limit // 5

    def admits(self, peer: Peer, queue_name: str | None, tag: int | None) -> bool:
        """Whether a send may be taken now; if not, its sender was refused (503) and, if it
        said HELLO, asked to pause."""
        if not self.memory_high:
            return True
        self.refuse(peer, queue_name, tag)
        return False

    def refuse(self, peer: Peer, queue_name: str | None, tag: int | None, count: int = 1) -> None:
        """Refuse `count` like sends (503) because memory is at its limit."""
        ctx = self._ctx
        ctx.counters.refused_memory += count
        self._pause_all(peer)  # before the ERROR it explains, as for a full queue
        reason = self._memory_reason()
        ctx.refuse(peer, ErrorCode.OVERLOADED, reason, None, queue_name, tag, count)

    def _memory_reason(self) -> str:
        return (
            f"broker memory is at its limit ({_mib(self._ctx.held_bytes)} of"
            f" {_mib(self.limit)} held in messages): sends are refused until it is under"
            f" {_mib(self.resume_bytes)}"
        )

    def after_put(self, peer: Peer, queue: Queue) -> None:
        """A send was queued: past 90% of a limit its sender (if it said HELLO) is asked to
        pause; at the memory limit every later send is refused."""
        full_soon = queue.max_length and queue.ready_count >= queue.pause_mark
        if full_soon and queue.overflow == "reject":  # a drop-oldest queue takes every send
            self.pause(peer, queue)
        if self._ctx.held_bytes >= self.pause_at:
            self._pause_all(peer)
            if self._ctx.held_bytes >= self.limit and not self.memory_high:
                self.memory_high = True
                log.warning("%s", self._memory_reason())

    # ----------------------------------------------------------------- pauses

    def pause(self, peer: Peer, queue: Queue) -> None:
        """Ask a HELLO producer to stop sending to this queue until it has room again."""
        if not peer.hello or peer in queue.paused:
            return
        queue.paused[peer] = None
        peer.paused_on.append(queue)
        self._watched[queue] = None
        ctx = self._ctx
        ctx.counters.pauses += 1
        ctx.reply(
            peer,
            Pause(
                int(ErrorCode.LIMIT_REACHED),
                f"queue {queue.name!r} is nearly full ({queue.ready_count} of"
                f" {queue.max_length} ready messages): wait for RESUME",
                queue.name,
            ),
        )

    def _pause_all(self, peer: Peer) -> None:
        if not peer.hello or peer in self._paused_all:
            return
        self._paused_all[peer] = None
        peer.paused_on.append(None)
        self._ctx.counters.pauses += 1
        self._ctx.reply(peer, Pause(int(ErrorCode.OVERLOADED), self._memory_reason()))

    def forget(self, peer: Peer) -> None:
        """The peer is gone: it is no longer waiting for a RESUME."""
        for queue in peer.paused_on:
            if queue is None:
                self._paused_all.pop(peer, None)
            else:
                queue.paused.pop(peer, None)
        peer.paused_on.clear()

    def end_turn(self) -> None:
        """RESUME the producers of queues back under 80%, and broker-wide once memory is."""
        if self._watched:
            for queue in list(self._watched):
                if queue.ready_count < queue.resume_mark or not queue.max_length:
                    self._resume_queue(queue)
                    del self._watched[queue]
        if (self.memory_high or self._paused_all) and self._ctx.held_bytes < self.resume_bytes:
            if self.memory_high:
                log.info("broker memory is under its resume mark again: sends are taken")
            self.memory_high = False
            ctx = self._ctx
            paused, self._paused_all = self._paused_all, {}
            for peer in paused:
                peer.paused_on.remove(None)
                ctx.counters.resumes += 1
                ctx.reply(peer, Resume())

    def _resume_queue(self, queue: Queue) -> None:
        ctx = self._ctx
        paused, queue.paused = queue.paused, {}
        for peer in paused:
            peer.paused_on.remove(queue)
            ctx.counters.resumes += 1
            ctx.reply(peer, Resume(queue.name))

    @property
    def paused_producers(self) -> int:
        return len(self._paused_all)


def _mib(size: int) -> str:
    """A size for people: MiB, or KiB and bytes when that would read 0.0."""
    if size >= 1048576:
        return f"{size / 1048576:.1f} MiB"
    return f"{size / 1024:.1f} KiB" if size >= 1024 else f"{size} bytes"
