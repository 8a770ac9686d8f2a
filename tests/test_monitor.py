"""phpmq.monitor, the data of `phpmq top`: rates from two stats answers, sorting, keys."""

from __future__ import annotations

from typing import Any

from phpmq.monitor import QUEUE_COLUMNS, Monitor, QueueRow, Sort, rate, sorted_rows


def queue(published: int, delivered: int, acked: int, ready: int = 0) -> dict[str, Any]:
    totals = {"published": published, "delivered": delivered, "acked": acked}
    return {"ready": ready, "in_flight": 0, "consumers": 1, "dead_letters": 0, "totals": totals}


def client(name: str, role: str, silent: float, hello: bool = True) -> dict[str, Any]:
    return {
        "id": "ab" * 4,
        "name": name,
        "role": role,
        "hello": hello,
        "transport": "zmq",
        "windows": 1,
        "held": 2,
        "refused": 0,
        "silent_seconds": silent,
    }


def stats(queues: dict[str, Any], clients: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"queues": queues, "clients": clients or []}


def test_rates_come_from_the_counters_difference_over_the_interval() -> None:
    monitor = Monitor()
    first = monitor.update(stats({"orders": queue(100, 50, 40)}), at=10.0)
    assert first.interval is None
    assert first.queues[0].in_rate is None  # nothing to compare with yet
    view = monitor.update(stats({"orders": queue(300, 150, 140, ready=7)}), at=12.0)
    assert view.interval == 2.0
    assert view.queues == [
        QueueRow("orders", 100.0, 50.0, 50.0, ready=7, in_flight=0, consumers=1, dead_letters=0)
    ]


def test_a_new_queue_and_a_counter_that_went_back_have_no_rate() -> None:
    monitor = Monitor()
    monitor.update(stats({"old": queue(10, 10, 10)}), at=0.0)
    view = monitor.update(stats({"old": queue(4, 4, 4), "new": queue(5, 0, 0)}), at=1.0)
    assert {row.name: row.in_rate for row in view.queues} == {"old": None, "new": None}
    assert rate(5, 5, 1.0) == 0.0
    assert rate(5, None, 1.0) is None
    assert rate(5, 3, None) is None


def test_queues_sort_by_in_rate_first_then_by_the_column_the_keys_pick() -> None:
    monitor = Monitor()
    monitor.update(stats({"a": queue(0, 0, 0), "b": queue(0, 0, 0), "c": queue(0, 0, 0)}), 0.0)
    later = {"a": queue(10, 0, 0, ready=3), "b": queue(30, 0, 0, ready=1), "c": queue(20, 0, 0)}
    assert [row.name for row in monitor.update(stats(later), 1.0).queues] == ["b", "c", "a"]
    assert monitor.press("r")  # ascending
    assert [row.name for row in monitor.update(stats(later), 2.0).queues][:1] == ["a"]
    for _ in range(3):  # in/s -> out/s -> acked/s -> ready
        monitor.press("s")
    assert QUEUE_COLUMNS[monitor.queue_sort.column][0] == "ready"
    monitor.press("r")  # highest first again
    assert [row.name for row in monitor.update(stats(later), 3.0).queues] == ["a", "b", "c"]


def test_sort_column_wraps_around_and_rows_without_a_figure_go_last() -> None:
    sort = Sort(column=len(QUEUE_COLUMNS) - 1)
    sort.next_column(len(QUEUE_COLUMNS))
    assert sort.column == 0
    rows = [
        QueueRow("x", None, None, None, 0, 0, 0, 0),
        QueueRow("y", 1.0, None, None, 0, 0, 0, 0),
    ]
    for descending in (True, False):
        ordered = sorted_rows(rows, QUEUE_COLUMNS, Sort(column=1, descending=descending))
        assert [row.name for row in ordered] == ["y", "x"]


def test_peers_show_kind_and_sort_by_last_heard_then_by_the_keys() -> None:
    monitor = Monitor()
    clients = [
        client("emails/0", "worker", 0.5),
        client("", "", 3.0, hello=False),
        client("shop", "", 1.0),
    ]
    view = monitor.update(stats({}, clients), 0.0)
    assert [(row.name, row.kind) for row in view.peers] == [
        ("emails/0", "worker"),
        ("shop", "hello"),
        ("abababab", "stock"),
    ]
    monitor.press("o")  # longest silent first, at once (no new answer needed)
    assert monitor.view().peers[0].kind == "stock"
    monitor.press("p")  # wraps to the name column, still descending
    assert [row.name for row in monitor.update(stats({}, clients), 2.0).peers] == [
        "shop",
        "emails/0",
        "abababab",
    ]


def test_q_quits_and_other_keys_do_not() -> None:
    monitor = Monitor()
    assert monitor.press("x")
    assert not monitor.press("q")
