"""Messages a consumer took but never started are not deliveries (issue 33, item 3).

A closing client hands back unstarted what its window brought but it never returned, also
what was still on its way when it closed; `return_unstarted()` hands back one it did return.
Either way the next consumer sees the delivery count the first would have seen, and
`max_deliveries` is not used up (docs/protocol.md §3.6). Real broker, both clients.
"""

from __future__ import annotations

from pathlib import Path

from driven import Connect

from harness import BrokerProcess, phpmq


def _delivery_counts(broker: BrokerProcess, queue: str) -> dict[str, int]:
    """Content -> delivery count of every message left in `queue`, taken and acked."""
    counts = {}
    with broker.client() as client:
        for message in client.consume(queue, window=100, timeout=1):
            counts[message.content.decode()] = message.delivery_count
            message.ack()
    return counts


def test_closing_hands_back_what_the_window_brought_unstarted(
    broker: BrokerProcess, connect: Connect
) -> None:
    contents = [f"m{i}" for i in range(10)]
    with broker.client() as producer:
        producer.send_many("work", contents)
    with connect(broker.address) as consumer:
        for message in consumer.consume("work", window=10, timeout=5):
            message.ack()  # frees a slot: the broker sends one more, maybe still on its way
            break
    counters = broker.stats()["counters"]
    assert (counters["redelivered"], counters["returned_unstarted"]) == (0, 9)
    assert _delivery_counts(broker, "work") == dict.fromkeys(contents[1:], 1)


def test_a_message_handed_back_unstarted_keeps_its_count_and_place(
    broker: BrokerProcess, connect: Connect
) -> None:
    with broker.client() as producer:
        producer.send_many("work", ["first", "second"])
    with connect(broker.address) as consumer:
        first = next(consumer.consume("work", window=1, timeout=5))
        first.return_unstarted()
        again = consumer.receive(5)
        assert (again.content, again.delivery_count) == (b"first", 1)
        again.requeue()  # a real requeue still counts
    assert _delivery_counts(broker, "work") == {"second": 1, "first": 2}


def test_unstarted_returns_leave_max_deliveries_alone(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "broker.log", "--max-deliveries", "1") as broker:
        with broker.client() as client:
            client.send("work", b"job")
            for _ in range(3):
                message = next(client.consume("work", window=1, timeout=5))
                message.return_unstarted()
                client.flush()
        assert broker.stats()["queues"]["work"]["dead_letters"] == 0
        assert _delivery_counts(broker, "work") == {"job": 1}


def test_consume_count_hands_back_what_it_took_beyond_count(broker: BrokerProcess) -> None:
    """`phpmq consume -n 2` acks as it goes, so its window refills while it prints: what came
    beyond 2 (in its buffer, or still on its way at exit) goes back with its count."""
    for trial in range(6):
        queue = f"q{trial}"
        with broker.client() as producer:
            producer.send_many(queue, [f"m{i}" for i in range(10)])
        result = phpmq("consume", "--broker", broker.address, queue, "-n", "2")
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["m0", "m1"]
        assert _delivery_counts(broker, queue) == {f"m{i}": 1 for i in range(2, 10)}, trial
    assert broker.stats()["counters"]["redelivered"] == 0
