"""Requests through real broker processes, spoken as bare PHPMQ bytes: a request and its reply
route survive kill -9 of a durable broker, and a stock consumer can take a request."""

from __future__ import annotations

from pathlib import Path

import zmq

import phpmq.protocol as p
from harness import BrokerProcess, free_port, raw_dealer, recv_messages, wait_for


def next_dispatch(sock: zmq.Socket) -> p.Dispatch:
    """The next 003 the socket receives (the HELLO answer and other replies are skipped)."""
    while True:
        for message in recv_messages(sock):
            if isinstance(message, p.Dispatch):
                return message


def test_a_request_to_a_reply_queue_survives_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    address = f"tcp://127.0.0.1:{free_port()}"
    request = p.Send("jobs", b"2+2", 0, 1, None, None, "answers", "c-42")
    with BrokerProcess(tmp_path / "first.log", "--data-dir", str(data), address=address) as first:
        with raw_dealer(address) as asker:
            asker.send(p.encode(request))
            [confirm] = recv_messages(asker)
            assert isinstance(confirm, p.Confirm)  # on disk
        first.kill()
    second = BrokerProcess(tmp_path / "second.log", "--data-dir", str(data), address=address)
    with second, raw_dealer(address) as worker, raw_dealer(address) as asker:
        worker.send(p.encode_all([p.Hello({}), p.Consume("jobs", 1)]))
        job = next_dispatch(worker)
        assert (job.content, job.reply_to, job.correlation) == (b"2+2", "answers", "c-42")
        worker.send(p.encode(p.Reply(b"4", "jobs", job.message_id)))
        asker.send(p.encode_all([p.Hello({}), p.Consume("answers", 1)]))
        answer = next_dispatch(asker)
        assert (answer.content, answer.correlation) == (b"4", "c-42")


def test_a_stock_consumer_takes_a_request_and_never_sees_its_route(broker: BrokerProcess) -> None:
    with raw_dealer(broker.address) as asker, raw_dealer(broker.address) as stock:
        # A request back to its sender gets no CONFIRM (its REPLY would be the answer).
        asker.send(p.encode(p.Send("jobs", b"job", 0, 1, None, None, "", "c1")))
        stock.send(p.encode(p.Consume("jobs", 1)))
        job = next_dispatch(stock)
        assert (job.content, job.reply_to, job.correlation, job.delivery_count) == (
            b"job",
            None,
            None,
            None,
        )
        stock.send(p.encode(p.Ack("jobs", job.message_id)))
        wait_for(
            lambda: broker.stats()["counters"]["acked"] == 1,
            "the stock consumer's ack taken",
            timeout=5,
        )
