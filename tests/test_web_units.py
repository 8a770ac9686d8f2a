"""The web console's pure parts: content shown safely, where it may listen, failed logins,
the users file, the queue table's order, the rate graph, the login's next page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from phpmq.web.access import safe_next
from phpmq.web.content import MAX_SHOWN_BYTES, shown
from phpmq.web.exposure import is_loopback, refusal_to_start
from phpmq.web.tables import QueueLine, rate_graph, table_order
from phpmq.web.throttle import LoginThrottle
from phpmq.web.users import UsersFileError, hash_password, load_users, verify


def test_markup_is_text_and_json_is_pretty_and_binary_is_hex() -> None:
    script = shown(b"<script>alert(1)</script>")
    assert (script.kind, script.text) == ("text", "<script>alert(1)</script>")
    document = shown(b'{"id":17,"items":[1,2]}')
    assert document.kind == "json" and json.loads(document.text) == {"id": 17, "items": [1, 2]}
    assert "\n" in document.text
    binary = shown(bytes(range(20)))
    assert binary.kind == "binary"
    assert binary.text.splitlines()[0].startswith("00000000  00 01 02")
    assert shown(b"\xff\xfe").kind == "binary"


def test_long_content_is_cut_even_inside_a_character() -> None:
    content = "é".encode() * MAX_SHOWN_BYTES
    seen = shown(content)
    assert seen.cut and seen.kind == "text" and seen.size == len(content)
    assert len(seen.text.encode()) <= MAX_SHOWN_BYTES
    assert shown(b"[" * (MAX_SHOWN_BYTES + 1)).kind == "text"  # cut JSON is not parsed


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("example.org", False)],
)  # fmt: skip
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_off_loopback_the_console_needs_users_and_tls_or_insecure() -> None:
    assert refusal_to_start("127.0.0.1", False, False, False) is None
    both = refusal_to_start("0.0.0.0", False, False, False)
    assert both is not None and "--users" in both and "TLS" in both and "--insecure" in both
    no_tls = refusal_to_start("0.0.0.0", True, False, False)
    assert no_tls is not None and "TLS" in no_tls and "--users" not in no_tls
    assert refusal_to_start("0.0.0.0", True, True, False) is None
    assert refusal_to_start("0.0.0.0", False, False, True) is None


def test_failed_logins_are_throttled_per_address_within_bounds() -> None:
    throttle = LoginThrottle(max_failures=3, window_s=60, max_addresses=2)
    for second in range(3):
        assert throttle.allows("a", second)
        throttle.failed("a", second)
    assert not throttle.allows("a", 10) and throttle.refused == 1
    assert throttle.allows("a", 61)  # the first failure left the window
    throttle.failed("b", 11)
    throttle.failed("c", 12)  # past max_addresses: the oldest ("a") is forgotten
    assert throttle.forgotten == 1 and throttle.allows("a", 13)
    throttle.succeeded("b")
    assert throttle.allows("b", 14)


def test_users_file(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    path.write_text(
        f'[users.alice]\nrole = "admin"\npassword = "{hash_password("secret one")}"\n'
        f'[users.bob]\npassword = "{hash_password("secret two")}"\n'
    )
    users = load_users(path)
    assert users["alice"].may_change and not users["bob"].may_change  # read by default
    assert verify(users, "alice", "secret one") is users["alice"]
    assert verify(users, "alice", "secret two") is None
    assert verify(users, "carol", "secret one") is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("not toml [", "is not TOML"),
        ("[other]\n", "no [users.NAME] table"),
        ('[users.a]\nrole = "root"\npassword = "$argon2id$x"\n', "role must be one of"),
        ('[users.a]\npassword = "plain text"\n', "must be an argon2 hash"),
    ],
)
def test_a_bad_users_file_is_named_with_what_is_wrong(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "users.toml"
    path.write_text(text)
    with pytest.raises(UsersFileError, match=re.escape(said)) as raised:
        load_users(path)
    assert str(path) in str(raised.value)
    with pytest.raises(UsersFileError, match="cannot read"):
        load_users(tmp_path / "missing.toml")


def _line(name: str, ready: int, in_rate: float | None) -> QueueLine:
    return QueueLine(name, "", ready, 0, 0, 0, 0, in_rate, None, None)


def test_the_queue_table_sorts_by_a_column_and_filters_by_name() -> None:
    lines = [_line("orders", 5, 2.0), _line("emails", 9, None), _line("Order-log", 1, 7.0)]
    by_ready = table_order(lines, "ready", True, "")
    assert [line.name for line in by_ready] == ["emails", "orders", "Order-log"]
    by_rate = table_order(lines, "in_rate", True, "")
    assert [line.name for line in by_rate] == ["Order-log", "orders", "emails"]  # None last
    assert [line.name for line in table_order(lines, "nonsense", False, "ORDER")] == [
        "Order-log",
        "orders",
    ]


def test_the_rate_graph_scales_to_the_peak_and_ends_at_the_right() -> None:
    graph = rate_graph([(None, None), (10.0, 5.0), (20.0, 0.0)], slots=3)
    assert graph.peak == 20.0
    points = [tuple(map(float, point.split(","))) for point in graph.in_points.split()]
    assert points[-1][0] == pytest.approx(graph.width)
    assert points[-1][1] == pytest.approx(1.0)  # the peak: the top, less the line's margin
    assert points[0][1] == pytest.approx(graph.height - 1)  # unknown: drawn as 0
    assert rate_graph([], slots=10).in_points == ""


@pytest.mark.parametrize(
    ("target", "goes_to"),
    [("/queues?sort=ready", "/queues?sort=ready"), ("//evil.example", "/"),
     ("https://evil.example", "/"), ("/\\evil.example", "/"), (None, "/")],
)  # fmt: skip
def test_the_login_sends_only_to_this_site(target: str | None, goes_to: str) -> None:
    assert safe_next(target) == goes_to
