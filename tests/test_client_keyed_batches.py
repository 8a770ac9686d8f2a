"""send_many with per-message headers and message keys, and publish_many, with both clients
against a real broker (docs/client.md, docs/protocol.md §12.6 "batches"): what each message
carries arrives with it, idempotency keys hold per message, a refusal inside a batch is
reported by index, and bad input is refused before anything is sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from driven import Connect

import phpmq.protocol as p
from harness import BrokerProcess, configured_broker
from phpmq.client import ClientError, InvalidArgument, PartialSend, Paused, Unconfirmed
from phpmq.client.batches import BATCH_MESSAGES, messages_per_frame, partly_sent
from phpmq.client.connection import Connection
from phpmq.protocol.runs import send_run


def consumed(client: Any, queue: str, count: int) -> list[Any]:
    got = []
    for message in client.consume(queue, window=100, timeout=5):
        got.append(message)
        message.ack()
        if len(got) == count:
            break
    return got


@pytest.mark.parametrize("confirm", [False, True])
def test_send_many_carries_each_messages_headers_and_message_key(
    broker: BrokerProcess, connect: Connect, confirm: bool
) -> None:
    contents = [b"plain", b"keyed", b"headed", b"both"]
    headers = [None, None, {"by": "shop"}, {"n": 4}]
    message_keys = [None, b"user-2", None, "user-4"]
    with connect(broker.address) as client:
        sent = client.send_many(
            "orders", contents, 60, confirm=confirm, headers=headers, message_keys=message_keys
        )
        assert sent == 4 if not confirm else len(set(sent)) == 4
        got = consumed(client, "orders", 4)
    assert [m.content for m in got] == contents
    assert [m.headers for m in got] == [{}, {}, {"by": "shop"}, {"n": 4}]
    assert [m.message_key for m in got] == [None, b"user-2", None, b"user-4"]
    assert all(55 <= m.ttl <= 60 for m in got)


def test_headers_given_as_json_bytes_go_as_they_are_and_a_non_object_is_refused(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address) as client:
        client.send_many("orders", [b"a", b"b"], confirm=True, headers=[b'{"by":"spark"}', None])
        assert [m.headers for m in consumed(client, "orders", 2)] == [{"by": "spark"}, {}]
        with pytest.raises(InvalidArgument, match="headers given as bytes must be a JSON object"):
            client.send_many("orders", [b"c"], headers=[b'["not", "an", "object"]'])
    assert broker.stats()["queues"]["orders"]["ready"] == 0  # nothing of the refused call


def test_one_send_or_publish_takes_headers_as_json_bytes_too(
    broker: BrokerProcess, connect: Connect
) -> None:
    # (They were JSON-encoded again, as a base64 string: no consumer saw a header.)
    with connect(broker.address) as client:
        client.bind("orders", "order.*")
        client.send("orders", b"sent", headers=b' {"by": "php"}\n', confirm=True)
        assert client.publish("order.made", b"published", headers=bytearray(b'{"n":1}')) == 1
        got = consumed(client, "orders", 2)
        assert [(m.content, m.headers) for m in got] == [
            (b"sent", {"by": "php"}),
            (b"published", {"n": 1}),
        ]
        # One send's bytes are read whole: what only looks like an object is refused too.
        for bad in (b"[1]", b"{garbage}", b'{"a":1}{"b":2}', memoryview(b"1"), b'{"a":"\xff"}',
                    '{"a":1}', [1]):  # fmt: skip
            with pytest.raises(InvalidArgument, match="must be a"):
                client.send("orders", b"x", headers=bad)
            with pytest.raises(InvalidArgument, match="must be a"):
                client.publish("order.made", b"x", headers=bad)
    assert broker.stats()["queues"]["orders"]["ready"] == 0


def test_one_send_s_headers_over_the_broker_s_limit_are_refused_before_it_goes(
    tmp_path: Path, connect: Connect
) -> None:
    # (A confirmed one got the broker's 413 without its tag: Unconfirmed, not this.)
    broker = configured_broker(tmp_path, "max_content_bytes = 1024\n")
    with broker, connect(broker.address) as client:
        client.send("orders", b"first", confirm=True)  # the broker's limits are known now
        over = b'{"big":"%s"}' % (b"x" * 2_000)
        for headers in (over, {"big": "x" * 2_000}):
            for refused in (
                lambda h=headers: client.send("orders", b"x", headers=h, confirm=True),
                lambda h=headers: client.publish("order.made", b"x", headers=h),
                lambda h=headers: client.request("orders", b"x", 1.0, headers=h),
            ):
                with pytest.raises(InvalidArgument, match="headers \\(as JSON\\) of 2010 bytes"):
                    refused()
        assert broker.stats()["queues"]["orders"]["ready"] == 1


def test_keyed_send_many_is_idempotent_per_message(broker: BrokerProcess, connect: Connect) -> None:
    with connect(broker.address) as client:
        first = client.send_many(
            "orders", [b"a", b"b"], confirm=True, keys=["k-a", "k-b"], message_keys=[b"ka", b"kb"]
        )
        again = client.send_many(
            "orders", [b"b", b"c"], confirm=True, keys=["k-b", "k-c"], headers=[{"x": 1}, None]
        )
        assert again[0] == first[1] and again[1] not in first
    assert broker.stats()["queues"]["orders"]["ready"] == 3


def test_a_refusal_inside_a_keyed_batch_is_reported_by_index(
    tmp_path: Path, connect: Connect
) -> None:
    # One queue allowed: messages to a second queue are refused (429) with no PAUSE.
    broker = configured_broker(tmp_path, "max_queues = 1\n")
    with broker, connect(broker.address) as client:
        client.send("first", b"x", confirm=True)
        with pytest.raises(Unconfirmed) as raised:
            client.send_many(
                "second", [b"a", b"b"], confirm=True, message_keys=[b"k", None],
                headers=[None, {"h": 1}],
            )  # fmt: skip
        assert raised.value.ids == [None, None]
        assert {error.code for error in raised.value.errors.values()} == {429}


def test_bad_per_message_input_is_refused_before_anything_is_sent(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address) as client:
        with pytest.raises(ValueError, match="1 headers for 2 messages"):
            client.send_many("orders", [b"a", b"b"], headers=[None])
        with pytest.raises(ValueError, match="1 message keys for 2 messages"):
            client.publish_many("order.paid", [b"a", b"b"], message_keys=[b"k"])
        limit = client.broker_info["max_content_bytes"]
        with pytest.raises(InvalidArgument) as raised:
            client.send_many("orders", [b"a"], confirm=True, headers=[{"pad": "x" * limit}])
        assert raised.value.code == 413 and "headers" in str(raised.value)
    assert "orders" not in broker.stats()["queues"]


def test_publish_many_counts_each_messages_copies_and_carries_what_it_was_given(
    broker: BrokerProcess, connect: Connect
) -> None:
    with connect(broker.address) as client:
        client.bind("billing", "order.*")
        client.bind("audit", "order.paid")
        counts = client.publish_many(
            "order.paid", [b"1", b"2", b"3"], 60, keys=["p-1", "p-2", "p-3"],
            headers=[{"by": "shop"}, None, None], message_keys=[None, b"user-2", None],
        )  # fmt: skip
        assert counts == [2, 2, 2]
        # A repeated key copies nothing again; an event nobody binds reaches no queue.
        assert client.publish_many("order.paid", [b"2", b"4"], keys=["p-2", "p-4"]) == [0, 2]
        assert client.publish_many("nobody.listens", [b"x"]) == [0]
        assert client.publish_many("order.paid", [b"5"], confirm=False) == 1
        billing = consumed(client, "billing", 5)
    assert [m.content for m in billing] == [b"1", b"2", b"3", b"4", b"5"]
    assert all(m.event == "order.paid" for m in billing)
    assert billing[0].headers == {"by": "shop"} and billing[1].message_key == b"user-2"
    assert broker.stats()["queues"]["audit"]["ready"] == 5


def test_publish_many_refused_for_a_full_bound_queue_reports_that_message(
    tmp_path: Path, connect: Connect
) -> None:
    broker = configured_broker(tmp_path, '[queues.small]\nmax_length = 2\noverflow = "reject"\n')
    with broker, connect(broker.address, send_timeout=0.5) as client:
        client.bind("small", "tick")
        with pytest.raises(Unconfirmed) as raised:
            client.publish_many("tick", [b"1", b"2", b"3"])
        assert raised.value.ids[:2] != [None, None]
        assert raised.value.ids[2] is None
        assert {error.code for error in raised.value.errors.values()} == {429}


def test_publish_batches_pack_one_event_with_per_message_packets() -> None:
    connection = Connection()
    connection.start(0.0)
    headers, message_keys = [{"h": 1}, None], [None, "m"]
    batches = connection.publish_batches(
        "a.b", [b"x", "y"], 5, ["k1", "k2"], headers=headers, message_keys=message_keys
    )
    [(frame, count, tags)] = list(batches)
    messages, error = p.decode_frame(frame)
    assert error is None and count == 2 and tags == [0, 1]
    assert messages == [  # an empty packet for none (the broker takes it so)
        p.Publish("a.b", b"x", 5, 0, "k1", b'{"h":1}', b""),
        p.Publish("a.b", b"y", 5, 1, "k2", b"", b"m"),
    ]
    with pytest.raises(InvalidArgument):
        connection.publish_batches("a.*", [b"x"])


def test_a_keyed_frame_with_some_headers_and_message_keys_missing_is_read_as_one_run() -> None:
    """A message without headers or a message key carries an empty packet for it, so every
    message of a keyed frame has one form and the broker reads the frame by its packet headers
    (protocol/runs.py `send_run`, as a Spark sink's rows), not message by message."""
    connection = Connection()
    connection.start(0.0)
    contents = [b"%d" % n for n in range(6)]
    batches = connection.send_batches(
        "orders", contents, 60, [f"k{n}" for n in range(6)], confirm=True,
        headers=[{"n": 0}, None, {}, b'{"n":3}', None, None],
        message_keys=[None, b"m1", None, "m3", b"", None],
    )  # fmt: skip
    [(frame, count, _)] = list(batches)
    run = send_run(frame, p.DEFAULT_MAX_CONTENT_BYTES)
    assert count == 6 and run is not None and run.contents == contents
    assert run.headers == [b'{"n":0}', b"", b"", b'{"n":3}', b"", b""]
    assert run.message_keys == [b"", b"m1", b"", b"m3", b"", b""]


def test_other_batches_send_no_packet_for_a_message_without_headers_or_a_message_key() -> None:
    """Only the form the broker reads as a run gets empty packets: a batch given headers
    alone (a broker from before MESSAGE_KEY refuses packet 27), or one without confirms or
    keys (decoded message by message anyway), sends none for a message without them."""
    connection = Connection()
    connection.start(0.0)
    [(frame, _, _)] = connection.send_batches(
        "orders", [b"a", b"b"], 60, ["k1", "k2"], confirm=True, headers=[{"n": 1}, None]
    )
    assert p.decode_frame(frame)[0] == [
        p.Send("orders", b"a", 60, 0, "k1", b'{"n":1}'),
        p.Send("orders", b"b", 60, 1, "k2"),
    ]
    [(frame, _, _)] = connection.send_batches(
        "orders", [b"a", b"b"], 60, headers=[{"n": 1}, None], message_keys=[None, b"m"]
    )
    assert p.decode_frame(frame)[0] == [
        p.Send("orders", b"a", 60, headers=b'{"n":1}'),
        p.Send("orders", b"b", 60, message_key=b"m"),
    ]


def test_confirmed_frames_hold_no_more_than_may_be_out_unconfirmed() -> None:
    assert messages_per_frame(False, 3) == BATCH_MESSAGES
    assert messages_per_frame(True, 3) == 3
    assert messages_per_frame(True, 0) == 1
    assert messages_per_frame(True, 10 * BATCH_MESSAGES) == BATCH_MESSAGES


def test_a_send_many_stopped_part_way_says_how_many_went() -> None:
    untaken = partly_sent(ClientError("not taken"), 7)
    assert type(untaken) is PartialSend and untaken.sent == 7
    pause = p.Error(429, "nearly full", queue="q")
    paused = partly_sent(Paused(pause, 1.5), 7)
    assert isinstance(paused, Paused) and paused.sent == 7 and paused.error is pause
    assert "7 messages sent before it" in str(paused)


@pytest.mark.parametrize("one_form", [True, False], ids=["one form", "general form"])
def test_each_form_of_a_keyed_batch_refuses_the_same_input(one_form: bool) -> None:
    """The one form (confirmed, idempotent, with headers and message keys) has a loop of its
    own for speed (batches._one_form_batches): it refuses what the general one does."""
    connection = Connection()
    connection.start(0.0)
    limit = 1024
    connection.receive(p.encode(p.Hello({"max_content_bytes": limit})), 0.0)

    def frames(headers: list[Any], message_keys: list[Any]) -> list[p.Message]:
        batches = connection.send_batches(
            "orders", iter([b"a", b"b"]), 60, ["k1", "k2"] if one_form else None,
            confirm=one_form, headers=iter(headers), message_keys=iter(message_keys),
        )  # fmt: skip
        return [message for frame, _, _ in batches for message in p.decode_frame(frame)[0]]

    sent = frames([memoryview(b'{"n":1}'), bytearray(b"{}")], [bytearray(b"m"), "k\u00e9"])
    assert [(m.headers, m.message_key) for m in sent] == [(b'{"n":1}', b"m"), (b"{}", b"k\xc3\xa9")]
    for headers, message_keys in (([None], [None, None]), ([None, None], [b"m"])):
        with pytest.raises(ValueError, match="fewer headers or message keys than messages"):
            frames(headers, message_keys)
    with pytest.raises(InvalidArgument, match="must be a JSON object") as raised:
        frames([b"{}", b"[1]"], [None, None])
    assert raised.value.code == 422
    for headers, message_keys, part in (
        ([b'{"p":"%s"}' % (b"x" * limit), None], [None, None], "headers"),
        ([None, None], [None, b"m" * (p.MIN_CONTROL_PACKET_BYTES + 1)], "message key"),
    ):
        with pytest.raises(InvalidArgument, match=part) as raised:
            frames(headers, message_keys)
        assert raised.value.code == 413
    with pytest.raises(InvalidArgument, match="headers must be a dict"):
        frames([b"{}", 5], [None, None])
    with pytest.raises(ValueError, match="fewer headers or message keys"):
        frames([b"[1]"], [])  # the message key that ran out is named before the bad header
    # A TTL is checked at the first message, as the batches are taken: none, no check.
    bad_ttl = connection.send_batches(
        "orders", [], -1, [] if one_form else None, confirm=one_form, headers=[], message_keys=[]
    )
    assert list(bad_ttl) == []
    bad_ttl = connection.send_batches(
        "orders", [b"a"], -1, ["k"] if one_form else None, confirm=one_form, headers=[None],
        message_keys=[None],
    )  # fmt: skip
    with pytest.raises(p.LocalProtocolError, match="TTL is 0 to"):
        next(bad_ttl)
