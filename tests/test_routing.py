"""Event routing (broker/routing.py) and the rules for event names and patterns: the MQKS
cases, AMQP's `#`, and a hypothesis property against a reference matcher."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phpmq.broker.routing import Bindings
from phpmq.protocol.rules import event_name_problem, pattern_problem


def reference_match(pattern: str, event: str) -> bool:
    """The meaning of a pattern, said as plainly as possible."""

    def matches(p: list[str], e: list[str]) -> bool:
        if not p:
            return not e
        head, rest = p[0], p[1:]
        if head == "#":
            return any(matches(rest, e[i:]) for i in range(len(e) + 1))
        if not e:
            return False
        return (head == "*" or head == e[0]) and matches(rest, e[1:])

    return matches(pattern.split("."), event.split("."))


def test_the_mqks_cases() -> None:
    bindings = Bindings()
    bindings.bind("q1", "e1")
    bindings.bind("q2", "e1")
    bindings.bind("q2", "e2")
    bindings.bind("updates", "*.updated")
    bindings.bind("connections", "user.*.connected")
    bindings.bind("deletes", "*.*.deleted")
    assert bindings.match("e1") == {"q1", "q2"}
    assert bindings.match("e2") == {"q2"}
    assert bindings.match("user.updated") == {"updates"}
    assert bindings.match("user.42.updated") == set()  # `*` is exactly one segment
    assert bindings.match("user.42.connected") == {"connections"}
    assert bindings.match("user.42.deleted") == {"deletes"}
    assert bindings.match("deleted") == set()


def test_hash_matches_zero_or_more_segments() -> None:
    bindings = Bindings()
    bindings.bind("all", "#")
    bindings.bind("orders", "order.#")
    bindings.bind("ends", "#.done")
    bindings.bind("middle", "a.#.z")
    assert bindings.match("order") == {"all", "orders"}
    assert bindings.match("order.1.paid") == {"all", "orders"}
    assert bindings.match("done") == {"all", "ends"}
    assert bindings.match("x.y.done") == {"all", "ends"}
    assert bindings.match("a.z") == {"all", "middle"}
    assert bindings.match("a.b.c.z") == {"all", "middle"}


def test_a_queue_bound_by_two_matching_patterns_is_matched_once() -> None:
    bindings = Bindings()
    bindings.bind("q", "user.*")
    bindings.bind("q", "user.#")
    bindings.bind("q", "user.1")
    assert bindings.match("user.1") == {"q"}


def test_unbind_removes_only_that_binding_and_prunes_the_trie() -> None:
    bindings = Bindings()
    bindings.bind("a", "x.*.z")
    bindings.bind("b", "x.*.z")
    assert not bindings.bind("a", "x.*.z")  # already bound
    assert bindings.unbind("a", "x.*.z")
    assert not bindings.unbind("a", "x.*.z")
    assert bindings.match("x.y.z") == {"b"}
    assert bindings.unbind_all("b") == ["x.*.z"]
    assert bindings._root.empty() and len(bindings) == 0


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("", "empty"),
        ("a..b", "empty segment"),
        (".a", "empty segment"),
        ("a b", "whitespace"),
        ("a*", "stand alone"),
        ("a.#b", "stand alone"),
        ("x" * 256, "longer than 255"),
    ],
)
def test_bad_patterns_say_why(pattern: str, reason: str) -> None:
    problem = pattern_problem(pattern)
    assert problem is not None and reason in problem


def test_event_names_take_no_wildcards() -> None:
    assert event_name_problem("user.42.updated") is None
    assert "wildcard" in (event_name_problem("user.*") or "")
    assert pattern_problem("user.*.#") is None


segments = st.sampled_from(["a", "b", "c", "user", "42"])
events = st.lists(segments, min_size=1, max_size=5).map(".".join)
patterns = st.lists(st.one_of(segments, st.sampled_from(["*", "#"])), min_size=1, max_size=5).map(
    ".".join
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["q1", "q2", "q3", "q4"]), patterns), max_size=12),
    st.lists(st.tuples(st.sampled_from(["q1", "q2", "q3", "q4"]), patterns), max_size=4),
    st.lists(events, min_size=1, max_size=10),
)
def test_routing_agrees_with_the_reference_matcher(
    bound: list[tuple[str, str]], unbound: list[tuple[str, str]], names: list[str]
) -> None:
    bindings = Bindings()
    for queue, pattern in bound:
        bindings.bind(queue, pattern)
    for queue, pattern in unbound:
        bindings.unbind(queue, pattern)
    live = set(bound) - set(unbound)
    for event in names:
        expected = {queue for queue, pattern in live if reference_match(pattern, event)}
        assert bindings.match(event) == expected, event
