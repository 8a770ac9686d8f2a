"""The client's sans-IO connection (phpmq/client/connection.py), driven with plain bytes and
plain numbers for the clock: no sockets, no threads, no sleeping.

The broker's side of each exchange is built with the protocol encoder, and what the
connection sends is read back with the protocol decoder.
"""

from __future__ import annotations

import pytest

import phpmq.protocol as p
from phpmq.client import ClientError, JoinRefused, Paused, Unconfirmed
from phpmq.client.confirms import ConfirmedSends
from phpmq.client.connection import HEARTBEAT, Connection
from phpmq.client.events import (
    BrokerError,
    BrokerGreeted,
    BrokerLeaving,
    GoodbyeAnswered,
    HelloRefused,
    Rejoined,
    SendsPaused,
    SendsResumed,
    UndecodableFrame,
)
from phpmq.client.greeting import JOIN_ATTEMPTS, JOIN_FIRST_S
from phpmq.client.refusals import FlowRefusal
from phpmq.protocol.rules import MAX_LIVENESS, MIN_HEARTBEAT_MS

QUEUE = "jobs"
ID_1, ID_2, ID_3 = b"a" * 32, b"b" * 32, b"c" * 32


def decoded(frame: bytes) -> list[p.Message]:
    messages, error = p.decode_frame(frame)
    assert error is None, error
    return messages


def dispatch(message_id: bytes, content: bytes = b"work", delivery_count: int = 1) -> bytes:
    return p.encode_dispatch(p.queue_packet(QUEUE), content, message_id, 60, delivery_count)


def greeted(now: float = 0.0, heartbeat_ms: int = 1000, liveness: int = 3) -> Connection:
    """A connection whose greeting went out at `now`."""
    connection = Connection(heartbeat_ms=heartbeat_ms, liveness=liveness)
    connection.start(now)
    connection.sent(connection.frame(b""), now)
    return connection


# --------------------------------------------------------------------------- greeting


def test_the_first_frame_carries_hello_and_the_consumes_then_no_more() -> None:
    connection = Connection(name="w1", role="worker", heartbeat_ms=200, liveness=4)
    connection.start(now=5.0)
    first = connection.frame(connection.subscribe(QUEUE, 10))
    hello, consume = decoded(first)
    assert hello == p.Hello(
        {
            "name": "w1",
            "role": "worker",
            "heartbeat_ms": 200,
            "liveness": 4,
            "version": "phpmq-zmq-python/0.1",
        }
    )
    assert consume == p.Consume(QUEUE, 10)
    assert not connection.greeted
    connection.sent(first, now=5.0)
    assert connection.greeted
    assert decoded(connection.frame(connection.send(QUEUE, b"x"))) == [p.Send(QUEUE, b"x", 0)]


def test_a_frame_the_transport_did_not_take_leaves_the_greeting_owed() -> None:
    connection = Connection()
    connection.start(now=0.0)
    connection.frame(connection.send(QUEUE, b"lost"))  # never reported as sent
    retried = decoded(connection.frame(connection.send(QUEUE, b"again")))
    assert [type(m) for m in retried] == [p.Hello, p.Send]


HELLO_REFUSED = p.Error(413, "options packet of 70000 bytes is over the limit", refused=101)


def test_a_refused_hello_is_asked_again_after_a_growing_back_off_then_never() -> None:
    """Finding 11 of issue 27: the sends behind a refused HELLO are answered at once (the
    broker read nothing after it), the greeting waits a back-off, and after JOIN_ATTEMPTS
    refusals in a row nothing more is asked and every frame raises JoinRefused."""
    connection = Connection()
    connection.start(now=0.0)
    tag = connection.next_tag()
    frame = connection.frame(connection.send(QUEUE, b"x", tag=tag))
    connection.sent(frame, 0.0, 1, [tag])
    now, retries = 0.0, []
    for count in range(1, JOIN_ATTEMPTS + 1):
        [event] = connection.receive(p.encode(HELLO_REFUSED), now)
        assert isinstance(event, HelloRefused) and event.count == count
        if count == 1:
            assert connection.take_answers([tag]) == [None]  # LOST, not after a wait
            assert "413 options packet" in connection.join_trouble()
        if event.retry_in is None:
            break
        retries.append(event.retry_in)
        assert connection.keepalive(now + event.retry_in - 0.01) is None
        now += event.retry_in
        assert connection.next_deadline() == now
        [hello] = decoded(connection.keepalive(now))  # type: ignore[arg-type]
        assert isinstance(hello, p.Hello)
        connection.sent(connection.frame(b""), now)
    assert retries == [JOIN_FIRST_S * 2**n for n in range(JOIN_ATTEMPTS - 1)]
    assert connection.join_failed and connection.keepalive(now + 60) is None
    assert connection.next_deadline() is None
    with pytest.raises(JoinRefused, match=f"HELLO {JOIN_ATTEMPTS} time"):
        connection.frame(connection.send(QUEUE, b"y"))


def test_a_hello_answer_ends_the_refusals() -> None:
    connection = greeted()
    connection.receive(p.encode(HELLO_REFUSED), 0.0)
    connection.sent(connection.frame(b""), JOIN_FIRST_S)
    connection.receive(p.encode(p.Hello({"broker": "phpmq-zmq"})), JOIN_FIRST_S)
    assert connection.join_trouble() == "" and not connection.join_failed
    [event] = connection.receive(p.encode(HELLO_REFUSED), 1.0)
    assert event.count == 1  # type: ignore[union-attr]


def test_the_brokers_hello_answer_sets_the_agreed_terms() -> None:
    connection = greeted(heartbeat_ms=1000, liveness=3)
    assert (connection.heartbeat_interval, connection.broker_timeout) == (1.0, 3.0)
    options = {"broker": "phpmq-zmq", "heartbeat_ms": 200, "liveness": 2, "durable": True}
    events = connection.receive(p.encode(p.Hello(options)), now=0.1)
    assert events == [BrokerGreeted(options)]
    assert connection.broker_info == options
    assert (connection.heartbeat_interval, connection.broker_timeout) == (0.2, 0.4)


def test_a_broker_announcing_larger_packets_is_decoded_with_its_limit() -> None:
    connection = greeted()
    frame = dispatch(ID_1)
    at = frame.index(b"P02")  # the content packet, claiming 300 MiB and cut short
    oversized = frame[:at] + b"P02%029d" % (300 * 1024 * 1024) + b"x"
    [refused] = connection.receive(oversized, now=1.0)
    assert isinstance(refused, UndecodableFrame) and "over the limit" in refused.reason
    connection.receive(p.encode(p.Hello({"max_content_bytes": 512 * 1024 * 1024})), now=1.1)
    [truncated] = connection.receive(oversized, now=1.2)
    assert isinstance(truncated, UndecodableFrame) and "truncated" in truncated.reason


def test_asked_terms_count_as_the_broker_will_clamp_them_until_it_answers() -> None:
    connection = Connection(heartbeat_ms=10, liveness=99)
    assert connection.heartbeat_interval == MIN_HEARTBEAT_MS / 1000
    assert connection.broker_timeout == connection.heartbeat_interval * MAX_LIVENESS
    connection.start(now=0.0)
    [hello] = decoded(connection.frame(b""))
    assert (hello.options["heartbeat_ms"], hello.options["liveness"]) == (10, 99)  # as asked


# --------------------------------------------------------------------------- receiving


def test_dispatches_become_received_messages_in_order() -> None:
    connection = greeted()
    frame = dispatch(ID_1, b"one") + p.encode(
        p.Dispatch(QUEUE, b"two", ID_2, 0, 3, headers=b'{"timeout": 30}')
    )
    assert connection.receive(frame, now=1.0) == ()
    first, second = connection.received
    assert (first.queue, first.content, first.id, first.ttl, first.delivery_count) == (
        QUEUE,
        b"one",
        ID_1.decode(),
        60,
        1,
    )
    assert (second.content, second.delivery_count, second.headers) == (b"two", 3, {"timeout": 30})


def test_settles_are_buffered_and_flushed_in_one_frame() -> None:
    connection = greeted()
    connection.subscribe(QUEUE, 100)
    connection.receive(dispatch(ID_1) + dispatch(ID_2) + dispatch(ID_3), now=1.0)
    first, second, third = connection.received
    first.ack()
    second.requeue(ttl=30, delay=0.5)
    third.dead_letter("poison")
    assert decoded(connection.take_settles()) == [
        p.Ack(QUEUE, ID_1),
        p.Requeue(QUEUE, ID_2, 30, 500),
        p.DeadLetter(QUEUE, ID_3, "poison"),
    ]
    assert connection.take_settles() == b""


def test_half_the_smallest_window_settled_asks_for_a_flush() -> None:
    connection = greeted()
    connection.subscribe(QUEUE, 4)
    connection.subscribe("other", 100)
    ack = p.encode(p.Ack(QUEUE, ID_1))
    assert connection.buffer_settle(ack, connection.generation) is False
    assert connection.buffer_settle(ack, connection.generation) is True


def test_acks_go_as_the_codec_encodes_them_in_order_with_other_settles() -> None:
    """An ack is buffered as its queue's ack prefix and the ID (joined once per flush): the
    payload is still the codec's own frames, in the order settled, for any queue and any ID
    length."""
    connection = greeted()
    connection.subscribe(QUEUE, 100)
    frames = dispatch(ID_1) + dispatch(b"short") + dispatch(ID_2)
    frames += p.encode_dispatch(p.queue_packet("other"), b"work", ID_3, 60, 1)
    connection.receive(frames, now=1.0)
    first, short, second, other = connection.received
    first.ack()
    second.requeue(ttl=30)
    short.ack()
    other.ack()
    assert decoded(connection.take_settles()) == [
        p.Ack(QUEUE, ID_1),
        p.Requeue(QUEUE, ID_2, 30),
        p.Ack(QUEUE, b"short"),
        p.Ack("other", ID_3),
    ]


def test_acks_count_once_each_towards_a_flush() -> None:
    connection = greeted()
    connection.subscribe(QUEUE, 4)
    assert connection.buffer_ack(QUEUE, ID_1, connection.generation) is False
    assert connection.buffer_ack(QUEUE, ID_2, connection.generation) is True
    assert connection.buffer_ack(QUEUE, ID_3, connection.generation - 1) is False  # a lost one's
    assert decoded(connection.take_settles()) == [p.Ack(QUEUE, ID_1), p.Ack(QUEUE, ID_2)]


def test_settles_the_transport_did_not_take_are_kept_in_front() -> None:
    connection = greeted()
    connection.buffer_settle(p.encode(p.Ack(QUEUE, ID_1)), connection.generation)
    payload = connection.take_settles()
    connection.buffer_settle(p.encode(p.Ack(QUEUE, ID_2)), connection.generation)
    connection.keep_settles(payload)
    assert decoded(connection.take_settles()) == [p.Ack(QUEUE, ID_1), p.Ack(QUEUE, ID_2)]


def test_messages_of_a_replaced_transport_are_given_up_and_their_settles_dropped() -> None:
    connection = greeted()
    connection.receive(dispatch(ID_1) + dispatch(ID_2), now=1.0)
    held = connection.received.popleft()
    connection.start(now=2.0)  # a reconnect: the broker takes back what the old peer held
    assert not connection.received
    held.ack()
    assert connection.take_settles() == b""


def test_a_confirm_or_an_error_is_matched_to_its_tag() -> None:
    connection = greeted()
    tags = [connection.next_tag() for _ in range(3)]
    frames = b"".join(connection.send(QUEUE, b"x", tag=tag) for tag in tags)
    connection.sent(frames, now=1.0, messages=3, tags=tags)
    refusal = p.Error(429, "queue is full", queue=QUEUE, tag=tags[1])
    answers = p.encode_confirm(ID_1, tags[0]) + p.encode(refusal)
    assert connection.receive(answers, now=1.1) == ()  # answers are not events
    assert connection.answered(tags) == 2
    assert connection.take_answers(tags) == [ID_1.decode(), refusal, None]
    assert connection.error_count == 0 and not connection.errors
    # Taken answers are no longer awaited: a late one is ignored.
    connection.receive(p.encode_confirm(ID_3, tags[2]), now=1.2)
    assert connection.answered(tags[2:]) == 0


def test_an_error_that_answers_no_send_is_an_event_and_kept() -> None:
    connection = greeted()
    error = p.Error(404, "unknown message", ID_1, QUEUE)
    assert connection.receive(p.encode(error), now=1.0) == [BrokerError(error)]
    assert (list(connection.errors), connection.error_count) == ([error], 1)


@pytest.mark.parametrize("replaced_by", ["a new transport", "a rejoin"])
def test_answers_awaited_on_a_replaced_transport_are_lost(replaced_by: str) -> None:
    connection = greeted()
    tag = connection.next_tag()
    frame = connection.send(QUEUE, b"x", tag=tag, key="order-17")
    assert decoded(frame) == [p.Send(QUEUE, b"x", 0, tag, "order-17")]
    connection.sent(frame, now=1.0, messages=1, tags=[tag])
    assert connection.sent_since_heard == 1
    if replaced_by == "a new transport":
        connection.start(now=2.0)
    else:  # the broker restarted on the address: it owes nothing it was sent before
        connection.receive(p.encode(p.Disconnect("unknown peer: say HELLO")), now=2.0)
    assert connection.answered([tag]) == 1
    assert connection.take_answers([tag]) == [None]


def test_admin_replies_queue_and_a_new_command_drops_late_ones() -> None:
    connection = greeted()
    connection.receive(p.encode(p.AdminReply({"late": True})), now=1.0)
    request = connection.admin("dlq-list", {"queue": QUEUE})
    assert decoded(request) == [p.Admin({"command": "dlq-list", "queue": QUEUE, "ref": 1})]
    assert not connection.admin_replies
    connection.receive(p.encode(p.AdminReply({"entries": []})), now=1.1)
    assert connection.admin_replies.popleft().options == {"entries": []}


def test_an_undecodable_frame_is_an_event_but_still_news_from_the_broker() -> None:
    connection = greeted(now=0.0, heartbeat_ms=100, liveness=2)
    [event] = connection.receive(b"not phpmq", now=0.15)
    assert isinstance(event, UndecodableFrame)
    assert not connection.broker_lost(now=0.3)


# --------------------------------------------------------------------------- liveness


def test_heartbeat_and_broker_lost_due_times_move_with_now() -> None:
    # Times are binary fractions, so that "due at" compares exactly.
    connection = Connection(heartbeat_ms=250, liveness=3)
    connection.start(now=10.0)
    greeting = connection.keepalive(now=10.0)  # owed at once
    assert greeting is not None and isinstance(decoded(greeting)[0], p.Hello)
    connection.sent(greeting, now=10.0)
    assert connection.keepalive(now=10.125) is None
    assert connection.next_deadline() == 10.25
    assert connection.keepalive(now=10.25) == HEARTBEAT
    assert decoded(HEARTBEAT) == [p.Heartbeat()]
    connection.sent(HEARTBEAT, now=10.25)
    assert connection.keepalive(now=10.375) is None
    assert connection.next_deadline() == 10.5
    # Lost after interval x liveness of silence, counted from HELLO.
    assert not connection.broker_lost(now=10.75)
    assert connection.broker_lost(now=10.875)
    assert connection.silence(now=10.875) == 0.875
    connection.receive(p.encode(p.Heartbeat()), now=10.875)
    assert not connection.broker_lost(now=11.625)
    assert connection.broker_lost(now=11.75)


def test_sending_anything_postpones_the_heartbeat() -> None:
    connection = greeted(now=0.0, heartbeat_ms=250)
    connection.sent(connection.frame(connection.send(QUEUE, b"x")), now=0.125)
    assert connection.keepalive(now=0.25) is None
    assert connection.keepalive(now=0.375) == HEARTBEAT


def test_silence_counts_from_the_greeting_or_from_the_start_if_nothing_takes_it() -> None:
    connection = Connection(heartbeat_ms=250, liveness=2)
    connection.start(now=0.0)
    assert connection.next_deadline() == 0.0  # the greeting is due
    assert not connection.broker_lost(now=0.5)
    # Nothing took the greeting (nobody listens at the address) for interval x liveness.
    assert connection.broker_lost(now=0.625)
    assert connection.lost_why(now=0.625) == "nothing at the address took the greeting for 0.6s"
    connection.start(now=60.0)
    # The socket took it only a little later: the broker's silence counts from there.
    greeting = connection.keepalive(now=60.25)
    assert greeting is not None
    connection.sent(greeting, now=60.25)
    assert not connection.broker_lost(now=60.75)
    assert connection.broker_lost(now=60.875)
    assert connection.lost_why(now=60.875) == "no word from the broker for 0.6s"


def test_a_refusals_back_off_is_not_silence_that_loses_the_broker() -> None:
    """While a refused HELLO waits out its back-off the broker is not lost; once the greeting
    may go again and nothing takes it, the silence counts from then."""
    connection = Connection(heartbeat_ms=250, liveness=2)  # lost after 0.5 s of silence
    connection.start(now=0.0)
    connection.sent(connection.frame(b""), 0.0)
    now = 0.0
    for _ in range(3):  # back-offs of 0.25, 0.5 and 1 s
        [event] = connection.receive(p.encode(HELLO_REFUSED), now)
        assert isinstance(event, HelloRefused) and event.retry_in is not None
        assert not connection.broker_lost(now + event.retry_in - 0.01)
        now += event.retry_in
        assert not connection.broker_lost(now + 0.5)  # counted from the back-off's end
        connection.sent(connection.frame(b""), now)
    assert connection.greeted and connection.broker_lost(now + 0.6)


def test_without_heartbeats_nothing_is_due_and_the_broker_is_never_lost() -> None:
    connection = greeted(now=0.0, heartbeat_ms=0)
    assert connection.heartbeat_interval == 0
    assert connection.keepalive(now=1e6) is None
    assert not connection.broker_lost(now=1e6)
    assert connection.next_deadline() is None


# --------------------------------------------------------------------------- reconnects


def test_a_new_transport_greets_again_with_every_open_window() -> None:
    connection = greeted()
    for queue, window in ((QUEUE, 10), ("stopped", 5), ("other", 3)):
        connection.sent(connection.subscribe(queue, window), now=0.1)
    connection.sent(connection.subscribe("stopped", 0), now=0.2)
    generation = connection.generation
    connection.start(now=1.0)
    assert connection.generation == generation + 1
    assert decoded(connection.frame(b""))[1:] == [p.Consume(QUEUE, 10), p.Consume("other", 3)]


def test_an_unknown_peer_disconnect_rejoins_on_the_same_transport() -> None:
    connection = greeted()
    connection.subscribe(QUEUE, 10)
    connection.receive(dispatch(ID_1), now=1.0)
    held = connection.received[0]
    reason = "unknown peer: say HELLO first"
    assert connection.receive(p.encode(p.Disconnect(reason)), now=1.1) == [Rejoined(reason)]
    assert not connection.received and not connection.greeted
    assert [type(m) for m in decoded(connection.frame(b""))] == [p.Hello, p.Consume]
    held.ack()  # the broker forgot who held it
    assert connection.take_settles() == b""


def test_a_draining_broker_says_it_is_leaving_and_nothing_is_given_up() -> None:
    connection = greeted()
    connection.receive(dispatch(ID_1), now=1.0)
    events = connection.receive(p.encode(p.Disconnect("broker shutting down")), now=1.1)
    assert events == [BrokerLeaving("broker shutting down")]
    assert connection.greeted and len(connection.received) == 1
    connection.received[0].ack()
    assert decoded(connection.take_settles()) == [p.Ack(QUEUE, ID_1)]


def test_goodbye_follows_the_settles_and_kbai_answers_it() -> None:
    connection = greeted()
    connection.receive(dispatch(ID_1), now=1.0)
    connection.received.popleft().ack()
    assert decoded(connection.leave_step()) == [
        p.Ack(QUEUE, ID_1),
        p.Disconnect("client closing"),
        p.Kbai(),
    ]
    assert connection.receive(p.encode(p.Kbai()), now=1.1) == [GoodbyeAnswered()]
    assert connection.goodbye_answered
    assert connection.leave_step() is None


def test_a_consumer_leaves_in_two_steps_handing_back_what_it_never_handed_out() -> None:
    """Dispatches may be on their way when a consumer closes: DISCONNECT first (no new work),
    and once its KBAI answer proved they all came, those never handed out go back unstarted
    (delivery count kept, docs/protocol.md §3.6), last first, before the goodbye."""
    connection = greeted()
    connection.subscribe(QUEUE, 10)
    connection.receive(dispatch(ID_1), now=1.0)
    connection.received.popleft().ack()
    assert decoded(connection.leave_step()) == [p.Ack(QUEUE, ID_1), p.Disconnect("client closing")]
    connection.receive(dispatch(ID_2) + dispatch(ID_3) + p.encode(p.Kbai()), now=1.1)
    assert connection.goodbye_answered
    unstarted = p.REQUEUE_UNSTARTED
    assert decoded(connection.leave_step()) == [
        p.Requeue(QUEUE, ID_3, 0, None, unstarted),
        p.Requeue(QUEUE, ID_2, 0, None, unstarted),
        p.Disconnect("client closing"),
        p.Kbai(),
    ]
    assert not connection.goodbye_answered and not connection.received
    connection.receive(p.encode(p.Kbai()), now=1.2)
    assert connection.goodbye_answered and connection.leave_step() is None


# --------------------------------------------------------------------------- producing


def test_send_batches_pack_frames_and_tag_confirmed_sends() -> None:
    connection = greeted()
    keys = [f"k{i}" for i in range(5)]
    contents = ["m0", b"m1", b"m2", b"m3", b"m4"]  # str is sent as UTF-8
    batches = list(
        connection.send_batches(QUEUE, contents, 30, keys, confirm=True, batch_messages=2)
    )
    assert [count for _, count, _ in batches] == [2, 2, 1]
    tags = [tag for _, _, batch_tags in batches for tag in batch_tags]
    assert tags == list(range(tags[0], tags[0] + 5))
    sends = [message for frame, _, _ in batches for message in decoded(frame)]
    assert sends == [p.Send(QUEUE, b"m%d" % i, 30, tags[i], keys[i]) for i in range(5)]


def test_unconfirmed_batches_carry_no_tags() -> None:
    connection = greeted()
    [(frame, count, tags)] = connection.send_batches(QUEUE, [b"a", b"b"])
    assert (count, tags) == (2, [])
    assert decoded(frame) == [p.Send(QUEUE, b"a", 0), p.Send(QUEUE, b"b", 0)]


@pytest.mark.parametrize("queue", ["", "has space", "tab\there", "x" * 256])
def test_a_queue_name_the_broker_would_refuse_raises_before_anything_is_sent(queue: str) -> None:
    connection = greeted()
    with pytest.raises(ClientError, match="422") as raised:
        connection.send(queue, b"x")
    assert isinstance(raised.value, ValueError)
    with pytest.raises(ValueError):
        connection.send_batches(queue, iter([b"x"]))  # at once, not when iterated
    with pytest.raises(ValueError):
        connection.subscribe(queue, 1)
    connection.subscribe(queue, 0)  # stopping a window names no queue to create
    assert connection.take_settles() == b""


@pytest.mark.parametrize("key", ["", "k" * 256, "é" * 128])
def test_a_key_the_broker_would_refuse_raises_when_it_is_reached(key: str) -> None:
    connection = greeted()
    with pytest.raises(ValueError, match="idempotency key"):
        connection.send(QUEUE, b"x", key=key)
    batches = connection.send_batches(QUEUE, [b"a", b"b"], keys=["fine", key], batch_messages=1)
    assert decoded(next(batches)[0]) == [p.Send(QUEUE, b"a", 0, key="fine")]
    with pytest.raises(ClientError, match="422 idempotency key"):
        next(batches)


def test_too_few_keys_raise() -> None:
    connection = greeted()
    with pytest.raises(ValueError, match="1 keys for 2 messages"):
        connection.send_batches(QUEUE, [b"a", b"b"], keys=["k"])
    with pytest.raises(ValueError, match="fewer keys than messages"):
        list(connection.send_batches(QUEUE, iter([b"a", b"b"]), keys=iter(["k"])))


# --------------------------------------------------------------------------- confirmed send_many


def test_confirmed_sends_wait_for_the_oldest_past_max_unconfirmed() -> None:
    confirmed: list[tuple[int, str]] = []
    sends = ConfirmedSends(max_unconfirmed=3, on_confirm=lambda i, m: confirmed.append((i, m)))
    first = sends.read(2)
    assert sends.to_wait_for(2) == []
    sends.sent(first, [10, 11])
    second = sends.read(2)
    assert sends.to_wait_for(2) == [10]  # 2 out + 2 more > 3
    sends.record([ID_1])
    sends.sent(second, [12, 13])
    sends.record([ID_2, ID_3, "d" * 32])
    assert confirmed == [(0, ID_1), (1, ID_2), (2, ID_3), (3, "d" * 32)]
    assert not sends.stopped
    assert sends.result(timeout=1.0) == [ID_1, ID_2, ID_3, "d" * 32]


def test_confirmed_sends_report_refusals_silences_and_what_was_not_sent() -> None:
    sends = ConfirmedSends(max_unconfirmed=10)
    sends.sent(sends.read(3), [0, 1, 2])
    refusal = p.Error(429, "queue is full", queue=QUEUE, tag=1)
    sends.record([ID_1, refusal, None])
    assert sends.stopped
    sends.read(2)  # read for the next batch, which is then not sent
    with pytest.raises(Unconfirmed, match="1 of 5 messages confirmed, 1 refused") as raised:
        sends.result(timeout=1.0)
    assert raised.value.ids == [ID_1, None, None, None, None]
    assert raised.value.errors == {1: refusal}
    assert "1 without an answer within 1s, 2 not sent" in str(raised.value)


# --------------------------------------------------------------------------- flow control


def pause(queue: str | None = QUEUE, code: int = 429) -> bytes:
    return p.encode(p.Pause(code, "nearly full", queue))


def resume(queue: str | None = QUEUE) -> bytes:
    return p.encode(p.Resume(queue))


def test_pause_and_resume_are_tracked_per_queue_and_broker_wide() -> None:
    connection = greeted()
    assert connection.paused(QUEUE) is None
    [event] = connection.receive(pause(), 1.0)
    assert event == SendsPaused(p.Pause(429, "nearly full", QUEUE))
    assert connection.paused(QUEUE) == p.Pause(429, "nearly full", QUEUE)
    assert connection.paused("other") is None
    assert connection.receive(pause(), 1.1) == ()  # already paused: no news
    [event] = connection.receive(pause(None, 503), 1.2)
    assert event == SendsPaused(p.Pause(503, "nearly full", None))
    assert connection.paused("other") == p.Pause(503, "nearly full", None)
    assert connection.paused(QUEUE).code == 429  # its own pause first
    assert connection.receive(resume(), 1.3) == [SendsResumed(QUEUE)]
    assert connection.paused(QUEUE).code == 503  # still paused broker-wide
    assert connection.receive(resume(None), 1.4) == [SendsResumed(None)]
    assert connection.paused(QUEUE) is None and connection.paused("other") is None
    assert connection.receive(resume(), 1.5) == ()  # not paused: nothing changes


def test_a_new_transport_or_a_rejoin_forgets_the_pauses() -> None:
    connection = greeted()
    connection.receive(pause() + pause(None, 503), 1.0)
    connection.start(2.0)
    assert connection.pauses == {}
    connection.sent(connection.frame(b""), 2.0)
    connection.receive(pause(), 3.0)
    connection.receive(p.encode(p.Disconnect("unknown peer: restarted")), 4.0)
    assert connection.paused(QUEUE) is None


def awaiting(connection: Connection, tags: list[int]) -> None:
    connection.sent(b"sends", 0.5, len(tags), tags)


def test_a_confirmed_send_refused_under_a_pause_is_a_flow_refusal() -> None:
    connection = greeted()
    awaiting(connection, [7, 8, 9])
    full = p.Error(429, "queue is full", queue=QUEUE, tag=7, refused=1, count=2)
    # The broker may send the ERROR before its PAUSE (memory) or after it (a full queue).
    connection.receive(p.encode(full) + pause(), 1.0)
    first, second = connection.take_answers([7, 8])
    assert first == second == FlowRefusal(full, p.Pause(429, "nearly full", QUEUE))
    # Under a pause still in force: a flow refusal too.
    memory = p.Error(503, "memory", queue=QUEUE, tag=9, refused=1)
    connection.receive(p.encode(memory), 1.1)
    assert connection.take_answers([9]) == [FlowRefusal(memory, p.Pause(429, "nearly full", QUEUE))]


def test_a_pause_lifted_in_the_same_frame_still_covers_its_refusal() -> None:
    connection = greeted()
    awaiting(connection, [3])
    full = p.Error(429, "queue is full", queue=QUEUE, tag=3, refused=1)
    connection.receive(pause() + p.encode(full) + resume(), 1.0)
    assert connection.paused(QUEUE) is None
    [answer] = connection.take_answers([3])
    assert isinstance(answer, FlowRefusal) and answer.error == full


def test_a_refusal_no_pause_covers_stays_a_refusal() -> None:
    connection = greeted()
    awaiting(connection, [1, 2, 3])
    too_many_queues = p.Error(429, "too many queues", queue=QUEUE, tag=1, refused=1)
    connection.receive(pause("other"), 0.9)  # a pause of another queue covers nothing here
    connection.receive(p.encode(too_many_queues), 1.0)
    invalid = p.Error(422, "bad key", queue=QUEUE, tag=2, refused=1)
    connection.receive(pause() + p.encode(invalid), 1.1)  # only 429 and 503 are flow codes
    assert connection.take_answers([1, 2]) == [too_many_queues, invalid]
    # A pause seen in an earlier frame and lifted since covers nothing either.
    connection.receive(resume(), 1.2)
    late = p.Error(429, "queue is full", queue=QUEUE, tag=3, refused=1)
    connection.receive(p.encode(late), 1.3)
    assert connection.take_answers([3]) == [late]


def test_confirmed_sends_send_flow_refusals_again_with_their_bytes_and_tags() -> None:
    connection = greeted()
    sends = ConfirmedSends(max_unconfirmed=10)
    [(frame, count, tags)] = connection.send_batches(
        QUEUE, [b"m0", b"m1", b"m2"], 5, ["k0", "k1", "k2"], confirm=True
    )
    sends.sent(sends.read(count), tags, frame)
    full = p.Error(429, "queue is full", queue=QUEUE, tag=tags[1], refused=1, count=2)
    flow = FlowRefusal(full, p.Pause(429, "nearly full", QUEUE))
    sends.record([ID_1, flow, flow])
    assert not sends.stopped and sends.to_resend == 2
    again, again_count, again_tags = sends.resends()
    assert (again_count, again_tags) == (2, tags[1:])
    assert decoded(again) == [p.Send(QUEUE, b"m%d" % i, 5, tags[i], f"k{i}") for i in (1, 2)]
    sends.resent(again)
    assert sends.outstanding_tags() == tags[1:] and sends.to_resend == 0
    sends.record([ID_2, ID_3])
    assert sends.result(timeout=1.0) == [ID_1, ID_2, ID_3]


def test_flow_refusals_given_up_count_as_refused() -> None:
    sends = ConfirmedSends(max_unconfirmed=10)
    sends.sent(sends.read(2), [0, 1], b"")
    full = p.Error(429, "queue is full", queue=QUEUE, tag=1, refused=1)
    sends.record([ID_1, FlowRefusal(full, p.Pause(429, "nearly full", QUEUE))])
    paused = p.Error(429, "nearly full", queue=QUEUE, refused=1)
    raised = sends.interrupted(Paused(paused, 5.0))
    assert isinstance(raised, Paused) and isinstance(raised, Unconfirmed)
    assert raised.ids == [ID_1, None] and raised.errors == {1: full}
    assert "paused sends to queue 'jobs'" in str(raised) and "5.0s" in str(raised)
