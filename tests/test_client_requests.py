"""Requests and replies as the sans-IO `Connection` keeps them (phpmq/client/requests.py):
matching by correlation, refusals by tag, dropped replies, lost transports, the encoding of
a request and what `request` makes of its outcome. No sockets: frames in, outcomes out."""

from __future__ import annotations

import math

import msgspec
import pytest

from phpmq import protocol as p
from phpmq.client import (
    BrokerRefused,
    Client,
    ClientError,
    InvalidArgument,
    ReplyError,
    RequestLost,
)
from phpmq.client.connection import Connection
from phpmq.client.requests import (
    SMALL_REQUEST_BYTES,
    Lost,
    check_request,
    encode_request,
    result,
)
from phpmq.client.schedules import delay_ms


def reply(correlation: str | None, content: bytes = b"ok", **error: object) -> bytes:
    return p.encode(p.Reply(content, message_id=b"id-1", correlation=correlation, **error))


def opened(connection: Connection) -> tuple[int, str]:
    tag = connection.next_tag()
    correlation = connection.requests.open(tag)
    connection.sent(b"", 0.0, 1, (tag,))
    return tag, correlation


def test_each_reply_reaches_its_own_request_by_correlation() -> None:
    connection = Connection()
    connection.start(0.0)
    (_, first), (_, second) = opened(connection), opened(connection)
    assert first != second
    connection.receive(reply(second, b"two") + reply(first, b"one"), 1.0)
    one, two = connection.requests.outcome(first), connection.requests.outcome(second)
    assert isinstance(one, p.Reply) and one.content == b"one"
    assert isinstance(two, p.Reply) and two.content == b"two"
    assert connection.requests.dropped == 0


def test_unknown_repeated_and_late_replies_are_dropped_and_counted() -> None:
    connection = Connection()
    connection.start(0.0)
    tag, correlation = opened(connection)
    connection.receive(reply("999") + reply(None), 1.0)  # unknown; none at all
    connection.receive(reply(correlation, b"first") + reply(correlation, b"second"), 1.0)
    outcome = connection.requests.close(correlation, tag)
    assert isinstance(outcome, p.Reply) and outcome.content == b"first"
    connection.receive(reply(correlation, b"late"), 2.0)  # the requester gave up
    assert connection.requests.dropped == 4
    assert len(connection.requests) == 0
    assert not connection.errors  # nothing logged as a broker error


def test_a_refusal_answers_the_request_with_its_tag_and_is_not_a_send_refusal() -> None:
    connection = Connection()
    connection.start(0.0)
    _, other = opened(connection)
    tag, correlation = opened(connection)
    refusal = p.Error(429, "queue is full", queue="rpc", tag=tag, refused=p.MessageType.SEND)
    assert connection.receive(p.encode(refusal), 1.0) == ()
    assert connection.requests.outcome(correlation) == refusal
    assert connection.requests.outcome(other) is None
    assert not connection.refusals.sends  # told by request, not by the next send


def test_a_refusal_after_its_requester_timed_out_is_dropped_not_kept_for_close() -> None:
    """A request refused (503: its shard between leaders) after the requester gave up: the
    requester was told by its timeout, so close() has nothing to raise for it."""
    connection = Connection()
    connection.start(0.0)
    tag, correlation = opened(connection)
    assert connection.requests.close(correlation, tag) is None  # timed out
    connection.take_answers([tag])
    refusal = p.Error(503, "no leader yet", queue="rpc", tag=tag, refused=p.MessageType.SEND)
    assert connection.receive(p.encode(refusal), 2.0) == ()
    assert not connection.refusals.sends and not connection.errors
    assert connection.requests.dropped == 1
    again = p.Error(503, "no leader yet", queue="rpc", tag=tag, refused=p.MessageType.SEND)
    assert connection.receive(p.encode(again), 2.0) != ()  # once only: not a request's now
    assert len(connection.refusals.sends) == 1


def test_a_refusal_after_the_reply_came_is_dropped_not_kept_for_close() -> None:
    """A replicated shard's leader dispatched the request and died before its confirm: the
    reply came, then the shard the client talks to refuses the request's tag (503). The
    requester has its answer; close() has nothing to raise (a failover test once saw it)."""
    connection = Connection()
    connection.start(0.0)
    tag, correlation = opened(connection)
    connection.receive(reply(correlation, b"answered"), 1.0)
    outcome = connection.requests.close(correlation, tag)
    assert isinstance(outcome, p.Reply)
    connection.take_answers([tag])
    lost = p.Error(503, "shard lost before it answered", tag=tag, refused=p.MessageType.SEND)
    assert connection.receive(p.encode(lost), 2.0) == ()
    assert not connection.refusals.sends and not connection.errors


def test_a_refusal_of_a_request_lost_with_its_transport_is_dropped() -> None:
    """A rejoin on the same socket lost the request (RequestLost told its requester); a
    refusal of its tag that the broker sent after is not a send refusal for close()."""
    connection = Connection()
    connection.start(0.0)
    tag, correlation = opened(connection)
    connection.receive(p.encode(p.Disconnect("unknown peer: say HELLO")), 1.0)
    assert isinstance(connection.requests.outcome(correlation), Lost)
    assert isinstance(connection.requests.close(correlation, tag), Lost)
    connection.take_answers([tag])
    refusal = p.Error(503, "no leader yet", tag=tag, refused=p.MessageType.SEND)
    assert connection.receive(p.encode(refusal), 2.0) == ()
    assert not connection.refusals.sends and not connection.errors
    assert connection.requests.dropped == 1


def test_a_replaced_transport_or_a_rejoin_loses_every_awaited_request() -> None:
    connection = Connection()
    told: list[str] = []
    connection.requests.notify = told.append
    connection.start(0.0)
    _, answered = opened(connection)
    connection.receive(reply(answered), 0.5)
    _, pending = opened(connection)
    connection.start(1.0)
    assert isinstance(connection.requests.outcome(pending), Lost)
    assert isinstance(connection.requests.outcome(answered), p.Reply)  # came before
    _, after_rejoin = opened(connection)
    connection.receive(p.encode(p.Disconnect("unknown peer: restarted")), 2.0)
    assert isinstance(connection.requests.outcome(after_rejoin), Lost)
    assert told == [answered, pending, after_rejoin]


def test_a_request_is_a_tagged_send_with_a_route_its_correlation_and_the_timeout_as_ttl() -> None:
    frame = encode_request("rpc", "hi", 2.5, {"a": 1}, "json", 7, "42", 1024)
    [send], error = p.decode_frame(frame)
    assert error is None
    assert (send.queue, send.content, send.ttl, send.tag) == ("rpc", b"hi", math.ceil(2.5), 7)
    assert (send.reply_to, send.correlation) == ("", "42")
    assert msgspec.json.decode(send.headers) == {"a": 1, "reply_format": "json"}
    [raw], _ = p.decode_frame(encode_request("rpc", b"x", 1, None, "raw", 1, "1", 1024))
    assert raw.headers is None and raw.ttl == 1
    # Headers given as a JSON object's bytes: read, then merged the same way (or sent raw).
    [send], _ = p.decode_frame(encode_request("rpc", "hi", 1, b'{"a": 1}', "json", 7, "4", 1024))
    assert msgspec.json.decode(send.headers) == {"a": 1, "reply_format": "json"}
    [raw], _ = p.decode_frame(encode_request("rpc", b"x", 1, b' {"a": 1}', "raw", 1, "1", 1024))
    assert raw.headers == b' {"a": 1}'  # as given, as a send's
    [none], _ = p.decode_frame(encode_request("rpc", b"x", 1, b"", "raw", 1, "1", 1024))
    assert none.headers is None  # empty: none, as for a send
    deep = b'{"a":' + b"[" * 2000 + b"]" * 2000 + b"}"
    for bad in (b"[1]", b'{"a":"\xff"}', deep, memoryview(b"{1}"), '{"a":1}', [1]):
        for reply_format in ("raw", "json"):
            with pytest.raises(InvalidArgument, match="must be a"):
                encode_request("rpc", b"x", 1, bad, reply_format, 1, "1", 1 << 20)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("queue", "content", "code"), [("bad queue", b"x", 422), ("rpc", b"x" * 11, 413)]
)
def test_a_bad_request_is_refused_before_sending(queue: str, content: bytes, code: int) -> None:
    with pytest.raises(InvalidArgument) as refused:
        encode_request(queue, content, 1, None, "raw", 1, "1", 10)
    assert refused.value.code == code


def test_a_connections_request_is_awaited_unless_the_broker_limit_refuses_it() -> None:
    connection = Connection()
    connection.start(0.0)
    assert not connection.limits_wanted(b"x" * SMALL_REQUEST_BYTES)
    assert connection.limits_wanted(b"x" * (SMALL_REQUEST_BYTES + 1))
    connection.receive(p.encode(p.Hello({"max_content_bytes": 10})), 1.0)
    assert not connection.limits_wanted(b"x" * (SMALL_REQUEST_BYTES + 1))
    tag, correlation, frame = connection.request("rpc", b"hi", 1, None, "raw")
    [send], _ = p.decode_frame(frame)
    assert (send.tag, send.correlation) == (tag, correlation)
    assert len(connection.requests) == 1
    with pytest.raises(InvalidArgument) as refused:
        connection.request("rpc", b"x" * 11, 1, None, "raw")
    assert refused.value.code == 413 and len(connection.requests) == 1


@pytest.mark.parametrize(("timeout", "reply_format"), [(0, "raw"), (-1, "raw"), (1, "xml")])
def test_a_bad_timeout_or_format_is_a_value_error(timeout: float, reply_format: str) -> None:
    with pytest.raises(ValueError):
        check_request(timeout, reply_format)


def test_the_outcome_becomes_the_reply_or_an_exception() -> None:
    assert result(p.Reply(b"raw"), "raw") == b"raw"
    assert result(p.Reply(b'{"a":[1]}'), "json") == {"a": [1]}
    assert result(p.Reply(msgspec.msgpack.encode([1, "b"])), "msgpack") == [1, "b"]
    assert result(p.Reply(b""), "json") is None
    with pytest.raises(ReplyError) as failed:
        result(p.Reply(b"", code=500, reason="ValueError: bad: input"), "raw")
    error = failed.value
    assert (error.code, error.type_name, error.text) == (500, "ValueError", "bad: input")
    assert error.reason == "ValueError: bad: input"
    with pytest.raises(RequestLost):
        result(Lost("gone"), "raw")
    with pytest.raises(BrokerRefused):
        result(p.Error(429, "queue is full"), "raw")
    with pytest.raises(ClientError, match="not json"):
        result(p.Reply(b"{oops"), "json")
    # msgspec's own exceptions for bad UTF-8 in a string and for deep nesting
    for content in (b'{"a":"\xff"}', b"[" * 3000 + b"]" * 3000):
        with pytest.raises(ClientError, match="not json"):
            result(p.Reply(content), "json")


@pytest.mark.parametrize(
    ("reason", "type_name", "text"),
    [
        ("KeyError: 'k'", "KeyError", "'k'"),
        ("mod.CustomError: deep", "mod.CustomError", "deep"),
        ("it broke: badly, really", "", "it broke: badly, really"),
        ("no colon", "", "no colon"),
    ],
)
def test_an_error_reply_reason_splits_into_type_and_text(
    reason: str, type_name: str, text: str
) -> None:
    error = ReplyError(500, reason)
    assert (error.type_name, error.text) == (type_name, text)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 10**30, "5", True])
@pytest.mark.parametrize("name", ["send_timeout", "close_timeout", "confirm_timeout"])
def test_a_timeout_no_socket_can_wait_is_refused_at_once(name: str, value: object) -> None:
    """nan and inf once failed deep in the socket's setup (int(nan * 1000))."""
    with pytest.raises(InvalidArgument, match=name):
        Client("tcp://127.0.0.1:1", **{name: value})


@pytest.mark.parametrize("delay", [float("nan"), float("inf"), 10**15, 1e300])
def test_a_delay_no_packet_can_carry_is_refused_at_once(delay: float) -> None:
    with pytest.raises(InvalidArgument, match="a delay must be"):
        delay_ms(delay)
