"""The key window (broker/idempotency.py) against a plain model of what it promises: a key is
known with its first accepted ID until its window ends, the oldest go first when it is full,
and a key added again keeps its newer entry."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import phpmq.protocol as p
from harness import CoreHarness, errors
from phpmq.broker.idempotency import KeyWindow, entry, split_entry
from phpmq.broker.key_holds import KeyHolds


class ModelWindow:
    """Every key with its own expiry, in the order added: slow and obviously right."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        #: key -> (ID, expiry, which add put it there)
        self.ids: dict[str, tuple[bytes, int, int]] = {}
        self.order: list[tuple[int, str, int]] = []
        self.evicted = 0
        #: How many of `order` were dropped (the rest are in the window).
        self.dropped = 0

    def get(self, joined: str, now: int) -> bytes | None:
        self.expire(now)  # so that no key past its window is ever counted as evicted
        found = self.ids.get(joined)
        return None if found is None or found[1] <= now else found[0]

    def add(self, joined: str, message_id: bytes, expires_at: int) -> None:
        self.ids[joined] = (message_id, expires_at, len(self.order))
        self.order.append((expires_at, joined, len(self.order)))
        while len(self.ids) > self.max_keys:
            self.evicted += self._drop_oldest()

    def expire(self, now: int) -> None:
        while self.dropped < len(self.order) and self.order[self.dropped][0] <= now:
            self._drop_oldest()

    def _drop_oldest(self) -> bool:
        _, joined, added = self.order[self.dropped]
        self.dropped += 1
        if self.ids[joined][2] != added:
            return False  # added again since: the newer one stays
        del self.ids[joined]
        return True


#: (what, key number, time step): add a key, look one up, or run the expiry.
steps = st.lists(
    st.tuples(st.sampled_from(["add", "get", "expire"]), st.integers(0, 12), st.integers(0, 4)),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(1, 6))
def test_the_window_answers_as_its_model_does(operations: list, max_keys: int) -> None:
    window_ns = 5
    window, model = KeyWindow(window_ns, max_keys), ModelWindow(max_keys)
    now = 0
    for number, (what, key, step) in enumerate(operations):
        now += step
        joined = entry("jobs", f"k{key}")
        if what == "add":
            message_id = b"%d" % number
            window.add(joined, message_id, now + window_ns)
            model.add(joined, message_id, now + window_ns)
        elif what == "get":
            assert window.get(joined, now) == model.get(joined, now)
        else:
            window.expire(now)
            model.expire(now)
            assert len(window) == len(model.ids)
        assert window.evicted == model.evicted
        assert len(window) <= max_keys


def test_keys_added_in_one_turn_share_one_expiry_entry() -> None:
    window = KeyWindow(10, 100)
    for number in range(50):
        window.add(entry("jobs", f"k{number}"), b"id", 10)
    window.add(entry("jobs", "late"), b"id", 12)
    assert window.next_expiry() == 10
    assert window.expire(10) == 50 and window.expired == 50
    assert window.next_expiry() == 12 and len(window) == 1


def test_a_lookup_after_the_window_forgets_what_expired_first() -> None:
    window = KeyWindow(10, 100)
    window.add(entry("jobs", "a"), b"id-a", 10)
    window.add(entry("jobs", "b"), b"id-b", 20)
    assert window.get(entry("jobs", "b"), 15) == b"id-b"
    assert len(window) == 1 and window.expired == 1  # a went, counted, without expire()


def test_an_entry_splits_back_into_its_scope_and_key() -> None:
    assert split_entry(entry("event orders.*", "a\x00b/c")) == ("event orders.*", "a\x00b/c")


def test_a_queue_name_that_holds_the_separator_is_refused_not_taken_for_a_repeat() -> None:
    core = CoreHarness()
    core.send(b"producer", p.Send("a", b"x", 0, tag=1, key="b\x00c"))
    out = core.send(b"producer", p.Send("a\x00b", b"x", 0, tag=2, key="c"))
    assert [e.code for e in errors(out)] == [p.ErrorCode.INVALID_VALUE]


def test_a_hold_reads_a_batch_of_keys_by_its_prefix_and_sees_commits_and_new_holds() -> None:
    holds = KeyHolds(10, 100)
    first = holds.add("q", "", -1, 0.0)
    assert holds.batch_of("q/5/0/1") == (first, 5)
    assert holds.batch_of("q/5/0/2") == (first, 5)  # the same prefix
    assert holds.batch_of("q/51/0/1") == (first, 51)  # not q/5/'s
    holds.commit(first, 52)
    assert holds.batch_of("q/51/0/3") is None  # committed past it
    holds.drop("q")
    assert holds.batch_of("q/51/0/4") is None
    again = holds.add("q", "", -1, 0.0)
    assert holds.batch_of("q/51/0/5") == (again, 51)
    assert holds.batch_of("\x00") is None and holds.batch_of("q/x/1") is None
