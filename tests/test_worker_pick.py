"""A worker's weighted pick among its queues (workers/child.py WeightedPick), without
processes: its count of waiting messages is asked before every job, so it is kept as messages
come and go instead of summed, and must stay exact."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from phpmq.workers.child import WeightedPick


def message(queue: str, number: int) -> Any:
    return SimpleNamespace(queue=queue, number=number)


def test_the_count_of_waiting_messages_follows_every_change() -> None:
    picker = WeightedPick((("a", 1), ("b", 1)))
    assert len(picker) == 0 and picker.pick() is None
    for number in range(3):
        picker.add(message("a", number))
    picker.add(message("b", 0))
    assert len(picker) == 4
    first = picker.pick()
    assert first is not None and len(picker) == 3
    picker.put_back(first)
    assert len(picker) == 4
    picker.forget("b")
    assert len(picker) == 3
    assert [m.number for m in picker.drain()] == [2, 1, 0]
    assert len(picker) == 0 and picker.pick() is None


def test_busy_queues_share_the_picks_by_weight_then_the_last_one_takes_the_rest_in_order() -> None:
    picker = WeightedPick((("heavy", 3), ("light", 1)))
    for number in range(8):
        picker.add(message("heavy", number))
        picker.add(message("light", number))
    firsts = [picker.pick().queue for _ in range(8)]  # type: ignore[union-attr]
    assert firsts.count("heavy") == 6 and firsts.count("light") == 2
    rest = [picker.pick() for _ in range(8)]
    assert [m.number for m in rest if m.queue == "heavy"] == [6, 7]  # type: ignore[union-attr]
    assert [m.number for m in rest if m.queue == "light"] == [2, 3, 4, 5, 6, 7]  # type: ignore[union-attr]
    assert rest[-4:] == [m for m in rest if m.queue == "light"][-4:]  # heavy ran out first
    assert len(picker) == 0 and picker.pick() is None
