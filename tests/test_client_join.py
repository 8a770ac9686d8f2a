"""Joining a broker (issue 27, finding 11), with real broker processes and both clients: a
small content limit does not refuse HELLO, and a client the broker will not let in says why
once, asks again after a growing back-off a bounded number of times, then raises."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from driven import Connect

from harness import BrokerProcess, free_port
from phpmq.client import Client, InvalidArgument, JoinRefused, Unconfirmed, greeting
from phpmq.client.greeting import JOIN_ATTEMPTS, JOIN_FIRST_S
from phpmq.protocol import MIN_CONTROL_PACKET_BYTES

SMALL_LIMIT = ("--max-content-bytes", "100")


def test_a_small_content_limit_leaves_hello_and_admin_alone(
    connect: Connect, tmp_path: Path
) -> None:
    """Before, `--max-content-bytes 100` refused every HELLO (105 bytes and more) with 413."""
    with BrokerProcess(tmp_path / "broker.log", *SMALL_LIMIT) as broker:
        client = connect(broker.address, name="a-client-with-a-name-long-enough" * 4)
        message_id = client.send("jobs", b"x" * 100, confirm=True)
        with pytest.raises(InvalidArgument, match="413"):
            client.send("jobs", b"x" * 101, confirm=True)
        [message] = list(client.consume("jobs", timeout=1))
        assert (message.id, message.content) == (message_id, b"x" * 100)
        message.ack()
        client.flush()
        assert client.admin("stats")["refusals"] == {}


def test_a_client_the_broker_will_not_let_in_says_why_once_and_stops(
    connect: Connect, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A HELLO over the limit for control packets (its name alone is 70,000 bytes): the
    broker refuses it with 413, and the client used to rejoin forever, two lines a time."""
    caplog.set_level(logging.INFO, logger="phpmq.client")
    with BrokerProcess(tmp_path / "broker.log", *SMALL_LIMIT) as broker:
        client = connect(broker.address, name="n" * (MIN_CONTROL_PACKET_BYTES + 4_000))
        started = time.monotonic()
        with pytest.raises(JoinRefused) as refused:
            client.send("jobs", b"x", confirm=True)
        took = time.monotonic() - started
        error = refused.value.error
        assert error.code == 413
        assert "options packet of" in error.reason and "not content" in error.reason
        assert f"refused this client's HELLO {JOIN_ATTEMPTS} time(s)" in str(refused.value)
        backoff = sum(JOIN_FIRST_S * 2**n for n in range(JOIN_ATTEMPTS - 1))
        assert backoff <= took < backoff + 5, took
        for call in (lambda: client.send("jobs", b"y"), lambda: client.receive(timeout=0.1)):
            with pytest.raises(JoinRefused):
                call()
        time.sleep(JOIN_FIRST_S * 4)  # nothing more is asked of the broker meanwhile
        assert broker.stats()["refusals"] == {"413": JOIN_ATTEMPTS}
        # Read before the broker stops: its goodbye (DISCONNECT) is a line of its own.
        # (Only this broker's: a client of an earlier test in this worker may still log.)
        lines = [
            r
            for r in caplog.records
            if r.name == "phpmq.client"
            and r.levelno >= logging.INFO
            and broker.address in r.getMessage()
        ]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "join-refused" in lines[0].getMessage() and "413" in lines[0].getMessage()


def test_a_confirmed_send_behind_a_refused_hello_is_unconfirmed_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker restarts with a limit the client's HELLO is over: the send that goes out
    with the next greeting is not read, and its Unconfirmed says why (it said nothing)."""
    monkeypatch.setattr(greeting, "JOIN_FIRST_S", 10.0)  # the next greeting goes with the send
    address = f"tcp://127.0.0.1:{free_port()}"
    events: list[tuple[str, str]] = []
    name = "n" * (MIN_CONTROL_PACKET_BYTES + 4_000)
    with BrokerProcess(tmp_path / "first.log", address=address):
        client = Client(
            address,
            name=name,
            heartbeat_ms=200,
            confirm_timeout=20,
            on_event=lambda event, detail: events.append((event, detail)),
        )
        client.send("jobs", b"before", confirm=True)
    with client, BrokerProcess(tmp_path / "second.log", *SMALL_LIMIT, address=address):
        deadline = time.monotonic() + 20
        while not any(event == "join-refused" for event, _ in events):
            assert time.monotonic() < deadline, events
            client.receive(timeout=0.1)
        started = time.monotonic()
        with pytest.raises(Unconfirmed) as unconfirmed:
            client.send("jobs", b"after", confirm=True)
        assert time.monotonic() - started < 10  # told when the refusal came, not at timeout
        assert "refused this client's HELLO" in str(unconfirmed.value)
        assert "413 options packet" in str(unconfirmed.value)
