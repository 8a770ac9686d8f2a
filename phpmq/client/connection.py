"""The client's side of a PHPMQ conversation, sans-IO (the h11 shape; docs/protocol.md §6).

Rules of this module:

1. No sockets, no threads, no clock. A method that needs the time takes `now`: monotonic
   seconds that the driver read. So the same connection serves the blocking driver (sync.py)
   and an asyncio one, and tests drive it with plain numbers.
2. It decides what to send and returns the bytes; the driver moves them and reports back
   with `sent()`. Until HELLO has gone out on a transport, `frame()` puts the greeting (HELLO
   and a consume per window) in front of whatever is sent first.
3. It says what a received frame means: dispatched messages queue in `received`, answers to
   tagged sends wait for `take_answers()`, ADMIN replies queue in `admin_replies`, PAUSE and
   RESUME set what `paused()` says; the rest (the broker's HELLO answer, ERRORs, DISCONNECT,
   KBAI, undecodable frames, and changes of pause) `receive()` returns as events for the
   driver to log or act on.
4. One transport at a time: `start(now)` begins one and gives up what was in flight on the
   last (messages held, settles buffered, answers awaited, pauses: the broker asks again).
5. Not thread-safe: a driver that uses it from several threads holds one lock around every
   call, except the encoders of sends (`next_tag`, `send`, `send_batches`): they touch no
   state but the tag counter, so a producer need not hold the lock while it reads its input;
   and taking a message from `received` (a deque: its popleft is atomic).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..protocol import (
    DEFAULT_MAX_CONTENT_BYTES,
    Admin,
    AdminReply,
    Cancel,
    Confirm,
    Disconnect,
    Dispatch,
    Error,
    Hello,
    Kbai,
    Message,
    MessageType,
    Pause,
    Reply,
    Resume,
    decode_frame,
    encode,
    encode_send,
    event_packet,
)
from ..protocol import admin_commands as cmd
from ..protocol.runs import CONFIRM_RUN_HEADER, confirm_run
from .answers import Answer, Answers
from .batches import (
    BATCH_MESSAGES,
    HeadersItem,
    MessageKeyItem,
    check_key,
    check_lengths,
    checked_headers,
    encode_full_send,
    send_batches,
    too_large,
)
from .errors import JoinRefused
from .events import (
    NO_EVENTS,
    BrokerError,
    BrokerGreeted,
    BrokerLeaving,
    Event,
    GoodbyeAnswered,
    HelloRefused,
    Rejoined,
    SendsPaused,
    SendsResumed,
    SubscriptionEnded,
    UndecodableFrame,
)
from .greeting import Greeting
from .liveness import HEARTBEAT, Liveness
from .message import AckSettle, ReceivedMessage, Settle, as_bytes, content_bytes, queue_packet
from .outbox import Outbox
from .pauses import Pauses
from .refusals import Refusals
from .requests import SMALL_REQUEST_BYTES, Requests, encode_request
from .topics import Topics, check_event, encode_publish

#: Largest packet the client decodes from a broker that announced a smaller limit.
TRUSTED_PACKET_BYTES = 256 * 1024 * 1024
#: Producer headers (a JSON object) are encoded here; the broker passes the bytes on.


class Connection:
    """One client's protocol state over a series of transports (sockets)."""

    def __init__(
        self,
        *,
        name: str = "phpmq-python",
        role: str = "client",
        heartbeat_ms: int = 1000,
        liveness: int = 3,
        settle: Settle | None = None,
        ack: AckSettle | None = None,
        message_type: type[ReceivedMessage] = ReceivedMessage,
        admin_secret: str = "",
    ) -> None:
        """`heartbeat_ms` and `liveness` are asked for in HELLO (0: no heartbeats); until the
        broker answers, they count as the broker will clamp them. `settle` is where received
        messages hand their settle frames (default: `buffer_settle`), `ack` their acks
        (default: `buffer_ack`); `message_type` is what dispatched messages are made as (the
        asyncio driver's settle methods are awaitable)."""
        #: HELLO and the consumes, owed to each new transport.
        self._greeting = Greeting(name, role, heartbeat_ms, liveness, admin_secret)
        self._liveness = Liveness(heartbeat_ms, liveness)
        self._message_type = message_type
        #: Subscriptions, consumed again by the greeting of every new transport.
        self._windows: dict[str, int] = {}
        #: Settles (and the goodbye) waiting for the next flush.
        self._outbox = Outbox()
        #: Keep an ack, requeue or dead letter (its frame, the generation its message came
        #: on) for the next flush; True when enough are kept that they should go without
        #: waiting. One from an earlier transport is dropped (the broker has taken it back).
        self.buffer_settle = self._outbox.add
        #: `buffer_settle` for an ack (queue, message ID, generation): its frame is not
        #: built on its own. (Both are the outbox's own: one call less per settle.)
        self.buffer_ack = self._outbox.add_ack
        self._settle = settle or self.buffer_settle
        self._ack = ack or self.buffer_ack
        self._tags = itertools.count()
        #: Requests awaiting replies (§6.6); a refusal answers a request's tag.
        self.requests = Requests()
        #: Tags sent and not yet answered, and the answers come.
        self._answers = Answers(self.requests.refused)
        #: The broker's PAUSEs in force, and which refusals they explain (§6.4).
        self._pauses = Pauses()
        #: Consume options, publish counts, cancels and deleted queues (§6.5).
        self.topics = Topics()
        #: The broker is trusted: its packets are bounded by its own limit (it says which in
        #: its HELLO answer), so the client only guards against nonsense lengths.
        self._max_content_bytes = max(DEFAULT_MAX_CONTENT_BYTES, TRUSTED_PACKET_BYTES)
        #: The largest content the broker takes, once its HELLO answer said (sends over it
        #: are refused here, at once, instead of by a 413 that answers no tag).
        self._broker_limit = TRUSTED_PACKET_BYTES
        #: Counts transports and rejoins; messages from an earlier one cannot be settled.
        self.generation = 0
        self.received: deque[ReceivedMessage] = deque()
        self.admin_replies: deque[AdminReply] = deque()
        #: An ADMIN went out on this transport and its reply has not come.
        self._admin_awaited = False
        #: The ref of the last ADMIN sent: a reply with another is a late answer to an
        #: earlier command its caller gave up on, and is dropped (counted here).
        self._admin_ref = 0
        self.late_admin_replies = 0
        self.broker_info: dict[str, Any] = {}
        #: The broker of this transport answered its HELLO.
        self.hello_answered = False
        self.errors: deque[Error] = deque(maxlen=1000)
        #: Refused sends and subscriptions that answer no tag, until the caller is told.
        self.refusals = Refusals()
        #: ERRORs received in all (the deque keeps the last 1000).
        self.error_count = 0
        #: Messages handed over since the broker was last heard from: what a broker crash
        #: could have taken with it (exact counts need confirms).
        self.sent_since_heard = 0
        self.goodbye_answered = False
        #: How far leaving has come: 0 not begun, 1 dispatches stopped, 2 goodbye said.
        self._leaving = 0
        #: The tags of the sends in the frame that carried the last greeting: if the broker
        #: refuses that HELLO, it read nothing after it (§8).
        self._greeting_tags: tuple[int, ...] = ()

    # ------------------------------------------------------------------ transports

    def start(self, now: float) -> None:
        """A new transport (the first, or one replacing a lost one): HELLO and the consumes
        go first; messages, settles and awaited answers of the last one are given up."""
        self._start_over()
        self._liveness.last_heard = self._liveness.last_sent = now

    def _start_over(self) -> None:
        """A new peer for the broker (a new transport, or a rejoin on the same one): what it
        dispatched, and its pauses, are gone (it asks again); the greeting is owed. The
        answers awaited are given up (LOST) either way: a broker that did not know us has
        restarted or given up on us, and owes nothing it was sent before."""
        self._answers.give_up()
        self._admin_awaited = False
        self.hello_answered = False
        self.generation += 1
        self.requests.give_up("the connection to the broker was replaced before the reply")
        self.received.clear()
        self._outbox.clear(self.generation)
        self._pauses.clear()
        topics = self.topics
        topics.restart()
        windows = self._windows.items()
        self._greeting.renew(b"".join(encode(topics.consume(q, w)) for q, w in windows if w))

    @property
    def greeted(self) -> bool:
        """HELLO went out on this transport (so there is a conversation to end)."""
        return self._greeting.owed is None

    @property
    def join_failed(self) -> bool:
        """The broker refused this client's HELLO JOIN_ATTEMPTS times in a row: the client
        asks no more, and every call raises JoinRefused."""
        return self._greeting.refusals.gave_up

    def join_trouble(self) -> str:
        """Why the broker may not have read what was sent: its last refusal of this client's
        HELLO ("" when it answered the last one)."""
        return self._greeting.refusals.why()

    def frame(self, payload: bytes) -> bytes:
        """What to hand the transport for `payload`: the greeting first if it is owed.

        Raises:
            JoinRefused: the broker refused every HELLO this client said (`join_failed`).
        """
        if self._greeting.owed is not None:
            self.raise_if_refused()
        return self._greeting.frame(payload)

    def raise_if_refused(self) -> None:
        """Raise JoinRefused once the client gave up asking the broker to let it in."""
        refusals = self._greeting.refusals
        if refusals.gave_up:
            assert refusals.last is not None
            raise JoinRefused(refusals.last, refusals.why())

    def sent(self, frame: bytes, now: float, messages: int = 0, tags: Iterable[int] = ()) -> None:
        """The transport took `frame` (from `frame()`), holding `messages` sends whose
        `tags` now await an answer."""
        self._liveness.last_sent = now
        if self._greeting.went_out(frame):
            self._liveness.last_heard = now  # the broker's silence counts from HELLO
            self._greeting_tags = tuple(tags)
        if messages:
            self.sent_since_heard += messages
            self._answers.expect(tags)

    # ------------------------------------------------------------------ producing

    def next_tag(self) -> int:
        """A tag for one send that asks for an answer; it is awaited once `sent()`."""
        return next(self._tags)

    def send(
        self,
        queue: str,
        content: bytes | str,
        ttl: int = 0,
        headers: HeadersItem = None,
        tag: int | None = None,
        key: str | None = None,
        delay_ms: int = 0,
        message_key: bytes | str | None = None,
    ) -> bytes:
        """One 001 (with `delay_ms`, a delayed send: §6.7; `message_key`: packet 27).

        Raises:
            InvalidArgument: the queue name or key breaks the protocol's rules; content or
                headers over the broker's limit; headers as bytes that are not a JSON object.
        """
        packet = queue_packet(queue)
        if key is not None:
            check_key(key)
        body = content_bytes(content)
        self._check_size(queue, body)
        if headers or delay_ms or message_key is not None:
            encoded = checked_headers(headers, queue, self._broker_limit) if headers else None
            return encode_full_send(queue, body, ttl, encoded, tag, key, delay_ms, message_key)
        return encode_send(packet, body, ttl, tag, key)

    def publish(
        self,
        event: str,
        content: bytes | str,
        ttl: int = 0,
        headers: HeadersItem = None,
        tag: int | None = None,
        key: str | None = None,
        message_key: bytes | str | None = None,
    ) -> bytes:
        """One 108 (InvalidArgument: a bad event name or key, content or headers over the
        limit, headers as bytes that are not a JSON object)."""
        return encode_publish(
            event, content, ttl, headers, tag, key, self._broker_limit, as_bytes(message_key)
        )

    def request(
        self,
        queue: str,
        content: bytes | str,
        timeout: float,
        headers: HeadersItem,
        reply_format: str,
    ) -> tuple[int, str, bytes]:
        """A new request (requests.py): its tag, its correlation (awaited from now on, until
        `requests.close`) and its 001.

        Raises:
            InvalidArgument: a bad queue name, content or headers over the broker's limit,
                headers that are not a dict or a JSON object's bytes (then nothing is
                awaited).
        """
        tag = self.next_tag()
        correlation = self.requests.open(tag)
        try:
            frame = encode_request(
                queue, content, timeout, headers, reply_format, tag, correlation, self._broker_limit
            )
        except BaseException:
            self.requests.close(correlation, tag)
            raise
        return tag, correlation, frame

    def limits_wanted(self, content: bytes | str) -> bool:
        """Whether a request should wait for the broker's limits before it goes: its content
        could be over them and they are not known yet (a 413 would answer no tag)."""
        return not self.knows_limits and len(content) > SMALL_REQUEST_BYTES

    def publish_count(self, tag: int) -> int:
        """How many queues the confirmed publish tagged `tag` reached."""
        return self.topics.take_count(tag)

    def send_batches(
        self,
        queue: str,
        contents: Iterable[bytes | str],
        ttl: int = 0,
        keys: Iterable[str] | None = None,
        *,
        confirm: bool = False,
        batch_messages: int = BATCH_MESSAGES,
        headers: Iterable[HeadersItem] | None = None,
        message_keys: Iterable[MessageKeyItem] | None = None,
    ) -> Iterator[tuple[bytes, int, list[int]]]:
        """001s packed into frames: (frame, message count, tags), tagged with `confirm`.
        Lazy: `contents`, `keys`, `headers` and `message_keys` are read as the batches are
        taken.

        Raises:
            InvalidArgument: (at once) a bad queue name; (when reached) a bad key.
            ValueError: (at once) fewer `keys`, `headers` or `message_keys` than `contents`,
                both sized; (when reached) one of them ran out.
        """
        packet = queue_packet(queue)
        check_lengths(contents, keys=keys, headers=headers, message_keys=message_keys)
        tags = self._tags if confirm else None
        return send_batches(
            queue, packet, contents, ttl, keys, tags, batch_messages, self._broker_limit,
            headers, message_keys,
        )  # fmt: skip

    def publish_batches(
        self,
        event: str,
        contents: Iterable[bytes | str],
        ttl: int = 0,
        keys: Iterable[str] | None = None,
        *,
        confirm: bool = True,
        batch_messages: int = BATCH_MESSAGES,
        headers: Iterable[HeadersItem] | None = None,
        message_keys: Iterable[MessageKeyItem] | None = None,
    ) -> Iterator[tuple[bytes, int, list[int]]]:
        """108s of one event packed into frames, as `send_batches` packs 001s.

        Raises:
            InvalidArgument: (at once) a bad event name; (when reached) a bad key.
            ValueError: as `send_batches`.
        """
        check_event(event)
        check_lengths(contents, keys=keys, headers=headers, message_keys=message_keys)
        tags = self._tags if confirm else None
        return send_batches(
            event, event_packet(event), contents, ttl, keys, tags, batch_messages,
            self._broker_limit, headers, message_keys, publish=True,
        )  # fmt: skip

    def _check_size(self, queue: str, body: bytes) -> None:
        """Raise InvalidArgument (413) for content over the broker's limit."""
        if len(body) > self._broker_limit:
            raise too_large(queue, len(body), self._broker_limit)

    @property
    def knows_limits(self) -> bool:
        """The broker's HELLO answer came: sizes are checked against its limit."""
        return "max_content_bytes" in self.broker_info

    def paused(self, queue: str | None) -> Pause | None:
        """The PAUSE that says to wait before sending to `queue`: its own, else the
        broker-wide one (None: sends may go; docs/protocol.md §6.4)."""
        return self._pauses.paused(queue)

    @property
    def pauses(self) -> dict[str | None, Pause]:
        """The PAUSEs in force, by queue (None: the broker-wide one)."""
        return self._pauses.in_force

    @property
    def awaiting_answers(self) -> bool:
        """Whether something sent on the current transport still waits for its answer: a
        tagged send, an ADMIN, a request's reply."""
        return self._answers.awaiting or self._admin_awaited or len(self.requests) > 0

    def take_answers(self, tags: list[int]) -> list[Answer]:
        """The answers to `tags`, in order (an ID, the refusing ERROR, a FlowRefusal: to be
        sent again once the pause is over, or LOST: none came), which are no longer
        awaited."""
        return self._answers.take(tags)

    def answered(self, tags: list[int], start: int = 0) -> int:
        """How many of `tags` from the first are answered (counting on from `start`, all
        answered before it): answers come mostly in order."""
        return self._answers.count(tags, start)

    # ------------------------------------------------------------------ consuming

    def subscribe(
        self,
        queue: str,
        window: int,
        patterns: Iterable[str] = (),
        unused_ms: int | None = None,
    ) -> bytes:
        """The consume for `window` unacked messages of `queue` at a time (0 stops), which
        every later greeting repeats, binding `patterns` and asking to delete the queue once
        unused for `unused_ms` (docs/protocol.md §6.5).

        Raises:
            InvalidArgument: (window > 0) the queue name or a pattern breaks the rules.
        """
        if window > 0:
            queue_packet(queue)
            self.topics.set_options(queue, patterns, unused_ms)
        else:
            self.topics.forget(queue)
        frame = encode(self.topics.consume(queue, window))
        self._windows[queue] = window
        self.refusals.forget(queue)
        self._outbox.windows(self._windows.values())
        return frame

    def _subscription_refused(self, queue: str, error: Error, now: float) -> None:
        if not self._windows.get(queue):
            return  # stopped since: nothing to retry or report
        if not self.refusals.subscription_refused(queue, error, now):
            del self._windows[queue]  # for good: later greetings do not ask again

    def resubscribes(self, now: float) -> bytes:
        """The consumes to send again now, for subscriptions refused for a limit (429) whose
        backoff is over (b"" if none)."""
        if self.join_failed:
            return b""
        queues = self.refusals.due(now)
        windows = self._windows
        topics = self.topics
        return b"".join(
            encode(topics.consume(queue, windows[queue])) for queue in queues if windows.get(queue)
        )

    def window(self, queue: str) -> int | None:
        """The window last asked for on `queue`, or None."""
        return self._windows.get(queue)

    def cancel(self, queue: str) -> bytes:
        """The 109 that ends the subscription to `queue` (no later greeting consumes it); its
        deliveries not handed out are dropped. The answer lands in `topics.cancelled`.

        Raises:
            InvalidArgument: the queue name breaks the protocol's rules.
        """
        queue_packet(queue)
        self._windows.pop(queue, None)
        self.refusals.forget(queue)
        return self.topics.cancel(queue, self.received)

    def take_settles(self) -> bytes:
        """Every buffered settle in one payload (b"" if none), no longer buffered."""
        return self._outbox.take()

    def keep_settles(self, payload: bytes) -> None:
        """Buffer again what `take_settles` gave and the transport did not take."""
        self._outbox.keep(payload)

    def leave_step(self) -> bytes | None:
        """The next payload of leaving, after which the driver awaits the broker's KBAI
        answer (`goodbye_answered`); None once the goodbye was said.

        A client that consumed leaves in two steps. First the settles and DISCONNECT: the
        broker sends no new work, and its KBAI answer proves that every dispatch to us has
        arrived. Then what came but was never handed out goes back unstarted, last first
        (docs/protocol.md §3.6: its delivery count stays), with DISCONNECT + KBAI, whose
        answer proves the broker read it all (§1, Leaving). Others say the goodbye at once.
        """
        self.goodbye_answered = False
        if self._leaving == 0 and self._windows:
            self._leaving = 1
            self._outbox.stop_dispatches()
            return self._outbox.take()
        if self._leaving < 2:
            self._leaving = 2
            received = self.received
            while received:
                self._outbox.add(received.pop().unstarted_frame(), self.generation)
            self._outbox.goodbye()
            return self._outbox.take()
        return None

    # ------------------------------------------------------------------ admin

    def admin(self, command: str, options: dict[str, Any]) -> bytes:
        """An ADMIN command, numbered (its `ref`): replies still queued, and any that come
        later with an earlier ref (answers to commands given up on), are dropped, so the
        next one in `admin_replies` answers this."""
        self.admin_replies.clear()
        self._admin_awaited = True
        self._admin_ref += 1
        return encode(Admin({"command": command, **options, cmd.REF: self._admin_ref}))

    # ------------------------------------------------------------------ receiving

    def receive(self, frame: bytes, now: float) -> Sequence[Event]:
        """Take in one frame from the broker; what in it needs the driver's attention."""
        self._liveness.last_heard = now
        self.sent_since_heard = 0
        if frame.startswith(CONFIRM_RUN_HEADER):
            confirms = confirm_run(frame)
            if confirms is not None:  # a confirmed send_many's answers, read by their headers
                self._confirmed_run(*confirms)
                return NO_EVENTS
        messages, error = decode_frame(frame, self._max_content_bytes)
        received = self.received
        settle = self._settle
        ack = self._ack
        make_message = self._message_type
        generation = self.generation
        events: list[Event] | None = None
        for message in messages:
            if type(message) is Dispatch:
                received.append(make_message(settle, ack, message, generation))
                continue
            event = self._on_control(message, now)
            if event is not None:
                if events is None:
                    events = []
                events.append(event)
        self._pauses.end_frame(self._answers.by_tag)
        if error is not None:
            events = [*(events or ()), UndecodableFrame(error.reason)]
        return events or NO_EVENTS

    def _confirmed_run(self, message_ids: list[bytes], tags: list[int]) -> None:
        """CONFIRMs of sends, as `_on_control` takes each (without a count there is none
        for `topics` to keep)."""
        confirmed = self._answers.confirmed
        for tag, message_id in zip(tags, message_ids, strict=True):
            confirmed(tag, message_id)
        self._pauses.end_frame(self._answers.by_tag)

    def _on_control(self, message: Message, now: float) -> Event | None:
        if isinstance(message, Confirm):
            if self._answers.confirmed(message.tag, message.message_id):
                self.topics.confirmed(message.tag, message.count)
            return None
        if isinstance(message, Error):
            if message.refused == MessageType.HELLO:
                return self._hello_refused(message, now)
            if self._answers.refused(message):  # raised to the sender, not logged
                self._pauses.refused(message)
                return None
            if self.requests.late_refusal(message):  # a request's, its requester told
                return None
            self.errors.append(message)
            self.error_count += 1
            if message.refused in (MessageType.SEND, MessageType.PUBLISH):
                self.refusals.send_refused(message)
            elif message.refused == MessageType.CONSUME and message.queue is not None:
                self._subscription_refused(message.queue, message, now)
            return BrokerError(message)
        if isinstance(message, Reply):
            self.requests.replied(message)
            return None
        if isinstance(message, AdminReply):
            ref = message.options.pop(cmd.REF, None)
            if ref is not None and ref != self._admin_ref:
                self.late_admin_replies += 1
                return None
            self.admin_replies.append(message)  # (a broker from before refs echoes none)
            self._admin_awaited = False
            return None
        if isinstance(message, Cancel):
            subscribed = bool(self._windows.get(message.queue))
            if not self.topics.on_cancel(message, self.received, subscribed):
                return None
            self._windows.pop(message.queue, None)
            return SubscriptionEnded(message)
        if isinstance(message, Pause):
            return SendsPaused(message) if self._pauses.pause(message) else None
        if isinstance(message, Resume):
            return SendsResumed(message.queue) if self._pauses.resume(message.queue) else None
        if isinstance(message, Hello):
            self._greeting.refusals.accepted()
            self.broker_info = message.options
            self.hello_answered = True
            self._adopt_terms(message.options)
            return BrokerGreeted(message.options)
        if isinstance(message, Kbai):
            self.goodbye_answered = True
            return GoodbyeAnswered()
        if isinstance(message, Disconnect):
            reason = message.reason or ""
            if not reason.startswith("unknown peer"):
                # Shutting down: keep settling what we hold while it drains; when it is
                # gone, liveness notices it.
                return BrokerLeaving(reason)
            # The broker restarted (or declared us dead): same transport, start over.
            self._start_over()
            return Rejoined(reason)
        return None  # HEARTBEAT: hearing anything is what counts

    def _hello_refused(self, error: Error, now: float) -> HelloRefused:
        """The broker refused the HELLO: the sends in its frame are answered LOST (a refused
        HELLO ends what the broker reads of a frame), and the greeting is owed again, after
        a back-off (or never, once the client gave up)."""
        retry_in = self._greeting.refusals.refused(error, now)
        self._answers.lose(self._greeting_tags)
        self._greeting_tags = ()
        self._start_over()
        return HelloRefused(error, self._greeting.refusals.count, retry_in)

    def _adopt_terms(self, options: dict[str, Any]) -> None:
        """Heartbeat by the interval and liveness the broker agreed to, not the ones asked;
        decode its frames with its packet limit when that is above ours."""
        self._liveness.adopt(options)
        limit = options.get("max_content_bytes")
        if type(limit) is int:
            self._broker_limit = limit
            if limit > self._max_content_bytes:
                self._max_content_bytes = limit

    # ------------------------------------------------------------------ liveness

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats when nothing else is sent (0: no heartbeats)."""
        return self._liveness.interval

    @property
    def broker_timeout(self) -> float:
        """Seconds of silence after which the broker counts as lost (0: never)."""
        return self._liveness.timeout

    def silence(self, now: float) -> float:
        """Seconds since the broker was last heard from."""
        return now - self._liveness.last_heard

    def broker_lost(self, now: float) -> bool:
        """The broker was silent for interval x liveness since the greeting went out; or the
        greeting, free to go, found nothing to take it for that long since the transport
        started (nobody listens at the address: a dead host, a leader hint that is out of
        date). Not while a refusal's back-off holds the greeting."""
        heard = self._liveness.last_heard
        if self.greeted:
            return self._liveness.lost(now, heard)
        if not self._greeting.may_go(now):
            return False
        return self._liveness.lost(now, max(heard, self._greeting.refusals.retry_at))

    def lost_why(self, now: float) -> str:
        """Why `broker_lost` said so, for the event and the log."""
        silence = self.silence(now)
        if self.greeted:
            return f"no word from the broker for {silence:.1f}s"
        return f"nothing at the address took the greeting for {silence:.1f}s"

    def keepalive(self, now: float) -> bytes | None:
        """The frame liveness asks to send now, or None: the greeting, owed as soon as
        possible, or a HEARTBEAT when nothing was sent for an interval."""
        if not self._liveness.interval:
            return None
        if not self.greeted:
            return self.frame(b"") if self._greeting.may_go(now) else None
        return HEARTBEAT if self._liveness.heartbeat_due(now) else None

    def next_deadline(self) -> float | None:
        """When `keepalive`, `broker_lost` or `resubscribes` next has something to say
        (None: never)."""
        deadline = self._liveness.deadline(self.greeted, self.refusals.next_due())
        if deadline is None or self.greeted:
            return deadline
        refusals = self._greeting.refusals  # the greeting waits out a refusal's back-off
        return None if refusals.gave_up else max(deadline, refusals.retry_at)
