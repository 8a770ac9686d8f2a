"""Intake: sends (001) into queues, within the broker's limits, with idempotency keys and
publisher confirms.

A send is refused (with its tag, so a confirming producer can match the refusal) while the
broker drains (503) or its store cannot write (507), for a bad key (422), a bad queue name
(422), too many queues or a full queue (429). A full queue either refuses or, with overflow
`drop-oldest`, dead-letters its oldest ready message to make room.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..protocol import ErrorCode, Send, encode_confirm, key_problem, queue_name_problem
from ..protocol.rules import correlation_problem
from ..protocol.runs import SendRun
from .context import Context
from .deadletters import DeadLetters
from .deadlines import DELAY_OVER, KEY_EXPIRY, KEY_LET_GO, NextTurn
from .expiry import Expiry
from .flow import Flow
from .idempotency import SEPARATOR, KeyWindow, entry
from .key_holds import LET_GO_PER_TURN, HeldKey, Hold, KeyHolds
from .model import (
    DELAYED,
    NS_PER_MS,
    NS_PER_SECOND,
    READY,
    RECORD_OVERHEAD_BYTES,
    DurableRecord,
    DurableRoutedRecord,
    Peer,
    Queue,
    Record,
    RoutedRecord,
)
from .queues import Queues
from .quotas import HELD_KEYS, REQUESTS

#: Expired idempotency keys are deleted from the durable store at most this often.
KEY_PURGE_INTERVAL_NS = 1_000_000_000


class Intake:
    __slots__ = (
        "_ctx",
        "_dead",
        "_expiry",
        "_flow",
        "_held_batch",
        "_joined",
        "_key_expiry_due",
        "_keys_expired_at_purge",
        "_keys_purged_at",
        "_let_go_turn",
        "_queues",
        "_routed_record",
        "_record",
        "holds",
        "keys",
    )

    def __init__(
        self,
        ctx: Context,
        queues: Queues,
        dead_letters: DeadLetters,
        expiry: Expiry,
        flow: Flow,
    ) -> None:
        self._ctx = ctx
        self._queues = queues
        self._dead = dead_letters
        self._expiry = expiry
        self._flow = flow
        #: What a send becomes: a durable broker's records carry their store position.
        self._record = DurableRecord if ctx.journal.durable else Record
        self._routed_record = DurableRoutedRecord if ctx.journal.durable else RoutedRecord
        config = ctx.config
        self.keys = KeyWindow(
            int(config.dedup_window_seconds * NS_PER_SECOND), config.max_dedup_keys
        )
        self.holds = KeyHolds(config.max_key_holds, config.max_held_keys)
        #: The hold and batch that keep the key of the send `is_repeat` just let through.
        self._held_batch: tuple[Hold, int] | None = None
        #: The key (as its `idempotency.entry`) `is_repeat` just let through, for `keep_key`.
        self._joined = ""
        self._keys_purged_at = ctx.now
        #: The window's count of expired keys at the last purge of the store's.
        self._keys_expired_at_purge = 0
        #: When the schedule's one key-expiry entry is due (0: none armed).
        self._key_expiry_due = 0
        #: The schedule's one entry for letting released held keys go, a slice a turn.
        self._let_go_turn = NextTurn(ctx.deadlines, KEY_LET_GO)

    def on_send(self, peer: Peer, message: Send) -> None:
        tag = message.tag
        if tag is not None:
            peer.opt_in()  # asking for an answer is speaking the extensions
        elif message.ttl is not None or message.headers is not None:
            peer.ttl_form = True
        ctx = self._ctx
        if (ctx.draining or ctx.storage_problem is not None) and self.refuses_now(
            peer, message.queue, tag
        ):
            return
        correlation = message.correlation
        if (correlation is not None or message.reply_to is not None) and not self._is_request(
            peer, message
        ):
            return
        if correlation is not None and peer.owner:
            problem = ctx.quotas.problem(REQUESTS, peer.owner)
            if problem is not None:
                ctx.refuse(
                    peer,
                    ErrorCode.LIMIT_REACHED,
                    f"{problem}: wait for answers",
                    None,
                    message.queue,
                    tag,
                )
                return
        key = message.key
        if key is not None and self.is_repeat(peer, message.queue, key, tag):
            return
        flow = self._flow
        if flow.memory_high:
            refused = 1 + ctx.take_repeats()
            flow.refuse(peer, message.queue, tag, refused)
            queue = self._queues.get(message.queue)
            if queue is not None:
                queue.refused += refused
            return
        queue = self._queues.open(peer, message.queue, tag)
        if queue is None:
            return
        max_length = queue.max_length
        if (
            max_length
            and len(queue.ready) - queue.stale + queue.delayed_sends >= max_length
            and not self._make_room(peer, queue, tag)
        ):
            return
        if correlation is None and not message.delay_ms:
            message_key = message.message_key
            if message_key is None:
                message_id = self.put(peer, queue, message.content, message.ttl, message.headers)
            else:  # a keyword less than a request's put: a keyed row costs what a plain one does
                message_id = self.put(
                    peer, queue, message.content, message.ttl, message.headers,
                    message_key=message_key,
                )  # fmt: skip
        else:
            message_id = self._put_request_or_delayed(peer, queue, message)
        if key is not None:
            self.keep_key(peer, message_id)
        ctx.counters.received += 1
        if correlation is None or message.reply_to:
            self.confirm(peer, message_id, tag)
        # else a request whose reply comes back to its sender: that REPLY is its answer

    def takes_run(self, name: str) -> Queue | None:
        """The queue a run of plain sends to `name` (protocol/runs.py `send_run`) may go to
        without a look at each send: one that exists, while the broker neither drains, nor
        cannot write, nor is over its memory limit. None: each is read."""
        ctx = self._ctx
        if ctx.draining or ctx.storage_problem is not None or self._flow.memory_high:
            return None
        return self._queues.by_name.get(name)

    def take_run(self, peer: Peer, queue: Queue, ttl: int | None, run: SendRun) -> int:
        """Put the run's contents into `queue` as as many 001s without request packets (`ttl`
        None: the stock form; a tag each or none; with tags, an idempotency key each or none;
        with keys, headers and a message key each or neither) that `on_send` would take, each
        as `put` would; returns how many were handled: the rest, from the first the queue is
        full for or the broker over its memory limit, are for `on_send` (a refusal, or room
        made)."""
        contents, tags, keys = run.contents, run.tags, run.keys
        headers, message_keys = run.headers or [], run.message_keys  # both, or neither
        if tags is not None:
            peer.opt_in()  # asking for an answer is speaking the extensions
        elif ttl is not None:
            peer.ttl_form = True
        ctx, flow = self._ctx, self._flow
        new_id, make, place = ctx.new_id, self._record, self._queues.place
        make_routed = self._routed_record
        # In memory the journal keeps nothing: no call a message for it.
        journal_put = ctx.journal.put if ctx.journal.durable else None
        watch = self._expiry.watch if ttl else None
        # Confirms go straight onto the peer's chunks (one call a send was a tenth of it);
        # through `confirm` only while publishes wait for copies (`copies.hold`).
        confirm: Callable[[Peer, bytes, int | None], None] | None = None
        confirm_box: dict[bytes, list[bytes]] | None = None
        if peer.confirm or tags is not None:
            if ctx.copies.routing:
                confirm = self.confirm
            else:
                confirm_box = ctx.confirms if ctx.journal.durable else ctx.outbox
        confirms: list[bytes] | None = None
        confirmed = 0
        expires_at = ctx.now + ttl * NS_PER_SECOND if ttl else 0
        name, ready, max_length = queue.name, queue.ready, queue.max_length
        pause_mark = queue.pause_mark if max_length else 0
        is_repeat, keep_key = self.is_repeat, self.keep_key
        taken = repeats = 0
        tag: int | None = None
        for content in contents:
            if flow.memory_high or (
                max_length and len(ready) - queue.stale + queue.delayed_sends >= max_length
            ):
                break
            if tags is not None:
                tag = int(tags[taken])
            if keys is not None:
                key = keys[taken].decode()  # valid UTF-8: send_run saw to it
                if is_repeat(peer, name, key, tag):
                    taken += 1  # confirmed with the first one's ID, or refused: a bad key
                    repeats += 1
                    continue
            message_id = new_id()
            if message_keys is None:
                record = make(message_id + content, expires_at)
                ctx.held_bytes += len(content) + RECORD_OVERHEAD_BYTES
            else:  # headers and a message key (either may be empty), inline: a keyed row
                header, message_key = headers[taken], message_keys[taken]
                if message_key:
                    record = make_routed(
                        message_id + content, expires_at, headers=header, message_key=message_key
                    )
                else:
                    record = make(message_id + content, expires_at, headers=header)
                ctx.held_bytes += (
                    len(content) + len(message_key) + len(header) + RECORD_OVERHEAD_BYTES
                )
            place(queue, record, False)
            if journal_put is not None:
                journal_put(name, record, message_id, content)
            if watch is not None:
                watch(queue, record)
            if keys is not None:
                keep_key(peer, message_id)
            if (max_length and len(ready) - queue.stale >= pause_mark) or (
                ctx.held_bytes >= flow.pause_at
            ):
                flow.after_put(peer, queue)
            if confirm_box is not None:
                if confirms is None:  # the same list `confirm` (a repeat's) appends to
                    confirms = confirm_box.get(peer.id)
                    if confirms is None:
                        confirms = confirm_box[peer.id] = []
                confirms.append(encode_confirm(message_id, tag))
                confirmed += 1
            elif confirm is not None:
                confirm(peer, message_id, tag)
            taken += 1
        ctx.counters.confirmed += confirmed
        put = taken - repeats
        queue.published += put
        ctx.counters.received += put
        if put and queue.windows:
            ctx.mark_dirty(queue)
        return taken

    def _put_request_or_delayed(self, peer: Peer, queue: Queue, message: Send) -> bytes:
        """`put` for a request (its reply route kept with it, §6.6) or a delayed send (§6.7)."""
        reply_to = message.reply_to
        requester = ""
        if message.correlation is not None:
            self._ctx.counters.requests += 1
            requester = peer.owner
        if message.delay_ms:
            peer.opt_in()
        return self.put(
            peer,
            queue,
            message.content,
            message.ttl,
            message.headers,
            reply_to=reply_to,
            reply_peer=b"" if reply_to else peer.id,
            correlation=message.correlation,
            delay_ms=message.delay_ms or 0,
            message_key=message.message_key or b"",
            requester=requester,
        )

    def refuses_sends_to(self, name: bytes) -> bool:
        """Whether a 001 to the queue named `name` is refused now for a reason every 001 like
        it shares (a drain, the store, memory, a full queue that rejects): the core then reads
        the run of them that follows by their headers only (protocol/runs.py)."""
        ctx = self._ctx
        if ctx.draining or ctx.storage_problem is not None or self._flow.memory_high:
            return True
        try:
            queue = self._queues.by_name.get(name.decode())
        except UnicodeDecodeError:
            return False
        return (
            queue is not None
            and queue.max_length > 0
            and queue.overflow == "reject"
            and len(queue.ready) - queue.stale + queue.delayed_sends >= queue.max_length
        )

    def refuses_now(self, peer: Peer, name: str | None, tag: int | None) -> bool:
        """Refused (and the peer told) because the broker drains or its store cannot write:
        nothing is taken at all then. `name` is the queue the ERROR names (None: none)."""
        ctx = self._ctx
        if ctx.draining:
            code, reason = ErrorCode.SHUTTING_DOWN, "broker is shutting down"
        elif ctx.storage_problem is not None:
            code, reason = ErrorCode.INSUFFICIENT_STORAGE, ctx.storage_problem
        else:
            return False
        ctx.refuse(peer, code, reason, None, name, tag, 1 + ctx.take_repeats())
        return True

    def has_room(self, peer: Peer, queue: Queue, tag: int | None) -> bool:
        """Whether a queue with a max length takes one more message, delayed sends counted
        (a drop-oldest queue makes room); a refusal is sent here."""
        waiting = len(queue.ready) - queue.stale + queue.delayed_sends
        return waiting < queue.max_length or self._make_room(peer, queue, tag)

    def put(
        self,
        peer: Peer,
        queue: Queue,
        content: bytes,
        ttl: int | None,
        headers: bytes | None,
        event: bytes = b"",
        reply_to: str | None = None,
        reply_peer: bytes = b"",
        correlation: str | None = None,
        delay_ms: int = 0,
        message_key: bytes = b"",
        requester: str = "",
    ) -> bytes:
        """A new message at the tail of `queue` (admitted already): placed, counted against
        memory, journaled, watched for its TTL; returns its ID. An `event` or a `correlation`
        (a request's, with its reply route; or a reply's) or a message key makes it a
        RoutedRecord; a
        `delay_ms` keeps it invisible that long (its TTL counts from then)."""
        ctx = self._ctx
        ttl = ttl or 0
        message_id = ctx.new_id()  # ID_BYTES long: IdSource makes it so
        visible_at = ctx.now + delay_ms * NS_PER_MS
        expires_at = visible_at + ttl * NS_PER_SECOND if ttl else 0
        if message_key and not event and correlation is None:
            record: Record = self._routed_record(
                message_id + content, expires_at, message_key=message_key
            )
        elif event or correlation is not None:
            record = self._routed_record(
                message_id + content,
                expires_at,
                event=event,
                reply_to=reply_to,
                reply_peer=reply_peer,
                correlation=correlation,
                message_key=message_key,
                requester=requester,
            )
            if requester:
                ctx.quotas.take(REQUESTS, requester)
            if reply_peer and correlation is not None:
                ctx.awaiting_reply(reply_peer)
        else:
            record = self._record(message_id + content, expires_at)
        size = len(content) + len(message_key) + RECORD_OVERHEAD_BYTES
        if headers:
            record.headers = headers  # passed on untouched, never parsed
            size += len(headers)
        ctx.held_bytes += size
        queue.published += 1
        if delay_ms:
            self._keep_delayed(queue, record, message_id, content, visible_at)
        else:
            self._queues.place(queue, record, to_head=False)
            ctx.journal.put(queue.name, record, message_id, content)
            if ttl:
                self._expiry.watch(queue, record)
            if queue.windows:
                ctx.mark_dirty(queue)
        flow = self._flow
        max_length = queue.max_length
        if (max_length and len(queue.ready) - queue.stale >= queue.pause_mark) or (
            ctx.held_bytes >= flow.pause_at
        ):
            flow.after_put(peer, queue)
        return message_id

    def _keep_delayed(
        self, queue: Queue, record: Record, message_id: bytes, content: bytes, visible_at: int
    ) -> None:
        """A delayed send waits, DELAYED, for its DELAY_OVER entry (dispatch.on_delay_over
        queues it then). The DELAY operation after the PUT marks it not ready on disk, so no
        dispatch range takes it (journal.py)."""
        ctx = self._ctx
        record.state = DELAYED
        queue.delayed += 1
        queue.delayed_sends += 1
        seq = 0
        if ctx.journal.durable:
            seq = record.seq = self._queues.next_seq(to_head=False)  # type: ignore[attr-defined]
        ctx.deadlines.arm_pair(visible_at, DELAY_OVER, queue.serial, record)
        ctx.journal.put(queue.name, record, message_id, content, visible_at)
        ctx.journal.delayed(record, queue.name, seq)

    def _is_request(self, peer: Peer, message: Send) -> bool:
        """A 001 with a reply route and a correlation id (§6.6); refused (422) when one is
        missing or bad."""
        peer.opt_in()
        problem = None
        if message.correlation is None or message.reply_to is None:
            problem = "a request carries both REPLY_TO (packet 23) and CORRELATION (packet 24)"
        else:
            problem = correlation_problem(message.correlation)
            if problem is None and message.reply_to:
                problem = queue_name_problem(message.reply_to)
                if problem is not None:
                    problem = f"reply queue: {problem}"
        if problem is None:
            return True
        self._ctx.refuse(peer, ErrorCode.INVALID_VALUE, problem, None, message.queue, message.tag)
        return False

    def is_repeat(self, peer: Peer, scope: str, key: str, tag: int | None) -> bool:
        """A send (publish) whose idempotency key is bad (refused) or was already accepted
        in its scope (the queue; for a publish, the event) within the window (confirmed with
        the first message's ID): nothing to queue."""
        ctx = self._ctx
        problem = key_problem(key)
        if problem is not None:
            ctx.refuse(peer, ErrorCode.INVALID_VALUE, problem, None, scope, tag)
            return True
        self._held_batch = None
        joined = self._joined = scope + SEPARATOR + key  # idempotency.entry, without a call
        if SEPARATOR in scope:
            return False  # no queue or event is named so: its name is refused
        holds = self.holds
        # Only while a hold exists, or a key is held (a released one waits to be let go), is
        # a key's prefix read.
        if holds.by_scope or holds.ids:
            first_id = holds.ids.get(joined)
            if first_id is None:
                first_id = self.keys.get(joined, ctx.now)
            if first_id is None:
                return self._is_refused_hold(peer, scope, key, tag)
        else:
            first_id = self.keys.get(joined, ctx.now)
            if first_id is None:
                return False
        ctx.counters.deduplicated += 1
        self.confirm(peer, first_id, tag)
        return True

    def confirm(
        self, peer: Peer, message_id: bytes, tag: int | None, count: int | None = None
    ) -> None:
        """CONFIRM a send that asked for it (a tag, or a HELLO with `confirm`): with the
        turn's replies in memory mode; in durable mode held until the turn's commit is on
        disk (the core's release_confirms)."""
        if tag is None and not peer.confirm:
            return
        ctx = self._ctx
        copies = ctx.copies
        if copies.routing and copies.hold(peer, tag, message_id, count):
            return  # a publish whose copies at other shards are not confirmed yet
        outbox = ctx.confirms if ctx.journal.durable else ctx.outbox
        chunks = outbox.get(peer.id)
        if chunks is None:
            chunks = outbox[peer.id] = []
        chunks.append(encode_confirm(message_id, tag, count))
        ctx.counters.confirmed += 1

    def _make_room(self, peer: Peer, queue: Queue, tag: int | None) -> bool:
        """A send to a full queue: refuse it, or bury the oldest ready message for it."""
        ctx = self._ctx
        if queue.overflow == "reject":
            refused = 1 + ctx.take_repeats()
            ctx.counters.overflowed += refused
            queue.refused += refused
            self._flow.pause(peer, queue)
            ctx.refuse(
                peer,
                ErrorCode.LIMIT_REACHED,
                f"queue {queue.name!r} is full ({queue.max_length} ready messages)",
                None,
                queue.name,
                tag,
                refused,
            )
            return False
        ctx.counters.overflowed += 1
        ready = queue.ready
        while ready:
            oldest = ready.popleft()
            if oldest.state == READY:
                self._dead.bury(queue, oldest, "overflow")
                return True
            queue.stale -= 1
        return True

    # ----------------------------------------------------------------- key window

    def _is_refused_hold(self, peer: Peer, scope: str, key: str, tag: int | None) -> bool:
        """A new key that a hold would keep: refused (429) past the broker's limit of held
        keys or the sender's quota; else noted for `keep_key`."""
        held_batch = self.holds.batch_of(key)
        if held_batch is None or not self.keys.window_ns:
            return False
        ctx = self._ctx
        problem = self.holds.hold_problem() or ctx.quotas.problem(HELD_KEYS, peer.owner)
        if problem is not None:
            reason = f"{problem}: commit the writer's batch, or release a hold (phpmq keys holds)"
            ctx.refuse(peer, ErrorCode.LIMIT_REACHED, reason, None, scope, tag)
            return True
        self._held_batch = held_batch
        return False

    def keep_key(self, peer: Peer, message_id: bytes) -> None:
        """The key of a send (publish) just accepted, the one `is_repeat` let through: held,
        if `is_repeat` found its hold; else remembered for the window (if keys are kept at
        all)."""
        window_ns = self.keys.window_ns
        if not window_ns:
            return
        held_batch = self._held_batch
        if held_batch is None:
            self.remember_key(self._joined, message_id, self._ctx.now + window_ns)
            return
        self._held_batch = None
        hold, batch = held_batch
        joined = self._joined
        self.holds.keep(hold, batch, (joined, peer.owner), message_id)
        self._ctx.quotas.take(HELD_KEYS, peer.owner)
        self._ctx.journal.held_key(joined, message_id)

    def restore_held_key(
        self, hold: Hold, batch: int, scope: str, key: str, message_id: bytes
    ) -> None:
        """A held key read back from the store (counted against no quota: the broker's)."""
        self.holds.keep(hold, batch, (entry(scope, key), ""), message_id)

    def released(self, owners: dict[str, int]) -> None:
        """A hold released keys (a commit, a release), `owners` holding how many each: their
        room under the quota is free now; they are let go from the next turn on,
        LET_GO_PER_TURN a turn (a Spark batch of a million rows would otherwise stop the
        broker for seconds in one turn), and stay held until then."""
        for owner, count in owners.items():
            self._ctx.quotas.give_back(HELD_KEYS, owner, count)
        self._arm_let_go()

    def _arm_let_go(self) -> None:
        if self.holds.released:
            self._let_go_turn.arm(self._ctx.now)

    def is_let_go_live(self, due: int, target: None) -> bool:
        return self._let_go_turn.is_live(due, target)

    def on_let_go_due(self, due: int, target: None) -> None:
        if not self._let_go_turn.take(due):
            return
        self._let_go(*self.holds.take_released(LET_GO_PER_TURN))
        self._arm_let_go()

    def _let_go(self, released: list[tuple[HeldKey, bytes]], gone: list[tuple[str, str]]) -> None:
        """Released keys remembered for the window from now, like new keys; the writer
        batches of `gone` are let go whole (what held their keys on disk is deleted)."""
        ctx = self._ctx
        expires_at = ctx.now + self.keys.window_ns
        add, journal = self.keys.add, ctx.journal
        journal_let_go = journal.let_go
        for (joined, _), message_id in released:
            add(joined, message_id, expires_at)
            journal_let_go(joined, message_id, expires_at)
        for queue_name, writer_batch in gone:
            journal.held_gone(queue_name, writer_batch)
        self._arm_key_expiry()

    def remember_key(
        self, joined: str, message_id: bytes, expires_at: int, was_held: bool = False
    ) -> None:
        """Remember the key `joined` (an `idempotency.entry`) for its window; `was_held`: it
        was held until now (on disk too)."""
        self.keys.add(joined, message_id, expires_at)
        journal = self._ctx.journal
        (journal.let_go if was_held else journal.key)(joined, message_id, expires_at)
        self._arm_key_expiry()

    def restore_key(self, queue_name: str, key: str, message_id: bytes, expires_at: int) -> None:
        """A key read back from the store: remembered, not journaled again."""
        self.keys.add(entry(queue_name, key), message_id, expires_at)
        self._arm_key_expiry()

    def forget_stored_keys(self, before_wall: float = math.inf) -> None:
        """Keys on disk whose window ended by `before_wall` are deleted (inf: all)."""
        self._ctx.journal.keys_expired(before_wall)

    def _arm_key_expiry(self) -> None:
        if self._key_expiry_due:
            return  # the entry for an older key comes first and re-arms for the next
        due = self.keys.next_expiry()
        if due is not None:
            self._key_expiry_due = due
            self._ctx.deadlines.arm(due, KEY_EXPIRY, None)

    def is_key_expiry_live(self, due: int, target: None) -> bool:
        return due == self._key_expiry_due

    def on_key_expiry(self, due: int, target: None) -> None:
        if due != self._key_expiry_due:
            return
        self._key_expiry_due = 0
        ctx = self._ctx
        keys = self.keys
        keys.expire(ctx.now)  # a lookup may have expired them already (KeyWindow.get)
        if (
            keys.expired != self._keys_expired_at_purge
            and ctx.now - self._keys_purged_at >= KEY_PURGE_INTERVAL_NS
        ):
            self._keys_purged_at = ctx.now
            self._keys_expired_at_purge = keys.expired
            ctx.journal.keys_expired(ctx.clock.wall())
        self._arm_key_expiry()
