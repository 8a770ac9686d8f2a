"""`phpmq web` as a process between a real broker and HTTP requests (no browser): where it
refuses to start, logins, CSRF, the read-only role, the audit log under the user's name,
escaping, the security headers, and each action's effect on the broker."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import BrokerProcess, free_port, phpmq
from web_harness import ConsoleProcess, Session, write_users

Console = Callable[..., ConsoleProcess]


@pytest.fixture
def start_console(broker: BrokerProcess, tmp_path: Path) -> Iterator[Console]:
    """Starts `phpmq web` for the broker with more flags; stopped after the test, its log
    printed (pytest shows it when the test failed)."""
    started: list[ConsoleProcess] = []

    def start(*flags: str) -> ConsoleProcess:
        process = ConsoleProcess(broker.address, tmp_path / f"web-{len(started)}.log", *flags)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
        print(f"--- {process.log_path.name}:\n{process.log()}")  # shown if the test failed


def wait_until(condition: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, "the condition did not become true in time"
        time.sleep(0.1)
    return result


def ready(broker: BrokerProcess, queue: str) -> int:
    return broker.stats()["queues"][queue]["ready"]


def flashes(session: Session, path: str) -> str:
    _, _, page = session.request(path)
    return html.unescape(" ".join(re.findall(r'<p class="flash \w+">([^<]*)</p>', page)))


def test_off_loopback_without_users_or_tls_it_refuses_to_start(tmp_path: Path) -> None:
    port = free_port()
    result = phpmq("web", "--bind", f"0.0.0.0:{port}")
    assert result.returncode == 1
    assert result.stderr.startswith("phpmq: refusing to serve the console on 0.0.0.0")
    assert "--insecure" in result.stderr and len(result.stderr.splitlines()) == 1
    users = write_users(tmp_path / "users.toml")
    with_users = phpmq("web", "--bind", f"0.0.0.0:{port}", "--users", str(users))
    assert with_users.returncode == 1 and "no TLS" in with_users.stderr
    assert "--users" not in with_users.stderr.partition(":")[2].partition("(")[0]


def test_mistakes_at_start_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "users.toml"
    bad.write_text('[users.eve]\npassword = "hunter2"\n')
    result = phpmq("web", "--users", str(bad))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"phpmq: the users file {bad}, user 'eve': 'password'")
    assert phpmq("web", "--bind", "nowhere").stderr.startswith("phpmq: invalid value for '--bind'")
    lonely = phpmq("web", "--certfile", str(bad))
    assert lonely.returncode == 2 and "--certfile and --keyfile go together" in lonely.stderr


def test_a_taken_port_is_one_line(start_console: Console) -> None:
    console = start_console()
    result = phpmq("web", "--bind", f"127.0.0.1:{console.port}")
    assert result.returncode == 1
    assert result.stderr.startswith(f"phpmq: cannot listen on 127.0.0.1:{console.port}")


def test_hash_password_prints_a_hash_the_users_file_takes(tmp_path: Path) -> None:
    from phpmq.web.users import load_users, verify

    result = phpmq("web", "--hash-password", stdin="correct horse\n")
    assert result.returncode == 0 and result.stdout.startswith("$argon2id$")
    path = tmp_path / "users.toml"
    path.write_text(f'[users.carol]\nrole = "admin"\npassword = "{result.stdout.strip()}"\n')
    assert verify(load_users(path), "carol", "correct horse") is not None


def test_with_users_every_page_needs_a_login_even_on_loopback(
    start_console: Console, tmp_path: Path
) -> None:
    console = start_console("--users", str(write_users(tmp_path / "users.toml")))
    session = Session(console.url)
    for path in ("/", "/queues", "/queue?name=orders", "/events", "/schedules", "/peers"):
        status, headers, _ = session.request(path)
        assert status == 303 and headers["location"].startswith("/login?next="), path
    assert session.request("/queue/purge", {"name": "orders"})[0] == 401
    token = session.csrf("/login")
    status, _, page = session.request(
        "/login", {"csrf": token, "name": "alice", "password": "not hers"}
    )
    assert status == 401 and "wrong name or password" in page
    session.log_in("alice")
    status, _, page = session.request("/")
    assert status == 200 and "alice" in page and "(admin)" in page


def test_an_action_without_the_sessions_csrf_token_is_refused(
    broker: BrokerProcess, start_console: Console
) -> None:
    with broker.client() as client:
        client.send_many("orders", [b"a", b"b"], confirm=True)
    session = Session(start_console().url)
    session.csrf()  # the session exists, with its token
    for token in ("", "forged"):
        status, _, page = session.request("/queue/purge", {"name": "orders", "csrf": token})
        assert status == 403 and "CSRF" in page
    other = Session(session.base)  # another browser's token is not this session's
    status, _, _ = session.request("/queue/purge", {"name": "orders", "csrf": other.csrf()})
    assert status == 403
    assert ready(broker, "orders") == 2


def test_actions_reach_the_audit_log_under_the_users_name(
    broker: BrokerProcess, start_console: Console, tmp_path: Path
) -> None:
    with broker.client() as client:
        client.send_many("orders", [b"a", b"b", b"c"], confirm=True)
    session = Session(start_console("--users", str(write_users(tmp_path / "users.toml"))).url)
    session.log_in("alice")
    status, headers, _ = session.request("/queue/purge", {"name": "orders", "csrf": session.csrf()})
    assert status == 303 and headers["location"] == "/queue?name=orders"
    assert ready(broker, "orders") == 0
    assert "purged 3 messages from orders" in flashes(session, "/queues")
    line = wait_until(
        lambda: next((x for x in broker.log().splitlines() if "admin queue-purge" in x), None)
    )
    assert "'by': 'alice'" in line and "'queue': 'orders'" in line


def test_a_read_only_user_may_look_and_change_nothing(
    broker: BrokerProcess, start_console: Console, tmp_path: Path
) -> None:
    with broker.client() as client:
        client.send("orders", b"keep me", confirm=True)
    session = Session(start_console("--users", str(write_users(tmp_path / "users.toml"))).url)
    session.log_in("bob")
    status, _, page = session.request("/queue?name=orders")
    assert status == 200 and "keep me" in page
    assert "/queue/purge" not in page and 'action="/queue/send"' not in page
    token = session.csrf()
    assert session.request("/queue/purge?name=orders")[0] == 403  # not even the question
    for path, form in (
        ("/queue/purge", {"name": "orders"}),
        ("/queue/delete", {"name": "orders"}),
        ("/queue/send", {"name": "orders", "content": "x"}),
        ("/events/publish", {"event": "order.paid"}),
        ("/schedules/add", {"name": "t", "target": "orders", "every": "60"}),
    ):
        status, _, page = session.request(path, {**form, "csrf": token})
        assert status == 403 and "read role" in page, path
    assert ready(broker, "orders") == 1
    assert "admin queue-purge" not in broker.log()


def test_content_is_escaped_and_every_answer_has_the_security_headers(
    broker: BrokerProcess, start_console: Console
) -> None:
    with broker.client() as client:
        client.send("xss", b"<script>alert(1)</script>", confirm=True)
    session = Session(start_console().url)
    status, headers, page = session.request("/queue?name=xss")
    assert status == 200
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in page
    policy = headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert headers["x-content-type-options"] == "nosniff"
    cookie = headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()


def test_send_publish_replay_and_schedules_through_the_console(
    broker: BrokerProcess, start_console: Console
) -> None:
    with broker.client() as client:
        client.bind("billing", "order.*")
        client.bind("audit", "#")
        client.send("jobs", b"will fail", confirm=True)
        for message in client.consume("jobs", window=1, timeout=2.0):
            message.dead_letter("bad input")
            break
    session = Session(start_console().url)
    wait_until(lambda: "billing" in session.request("/events")[2])
    token = session.csrf()
    session.request("/queue/send", {"name": "orders", "content": "hello", "csrf": token})
    assert ready(broker, "orders") == 1
    session.request("/events/publish", {"event": "order.paid", "content": "x", "csrf": token})
    told = flashes(session, "/events")
    assert "published order.paid: 2 queue(s) got a copy: audit, billing" in told
    wait_until(lambda: broker.stats()["queues"]["jobs"]["dead_letters"] == 1)
    session.request("/queue/dlq-replay", {"name": "jobs", "csrf": token})
    assert "replayed 1 into jobs" in flashes(session, "/queue?name=jobs")
    assert ready(broker, "jobs") == 1
    session.request("/schedules/add", {"name": "tick", "kind": "queue", "target": "ticks",
                                       "every": "60", "csrf": token})  # fmt: skip
    assert "added schedule tick" in flashes(session, "/")
    assert 'data-schedule="tick"' in session.request("/schedules")[2]
    session.request("/schedules/remove", {"name": "tick", "csrf": token})
    assert "removed schedule tick" in flashes(session, "/")
    assert 'data-schedule="tick"' not in session.request("/schedules")[2]
    session.request("/schedules/remove", {"name": "tick", "csrf": token})
    assert "no schedule named 'tick'" in flashes(session, "/")


def test_a_refusal_of_the_broker_is_shown_with_its_code(start_console: Console) -> None:
    session = Session(start_console().url)
    token = session.csrf()
    session.request("/queue/purge", {"name": "nothing-here", "csrf": token})
    assert "refused (404): no queue named 'nothing-here'" in flashes(session, "/")
    session.request("/queue/send", {"name": "bad name", "content": "x", "csrf": token})
    assert "queue name contains whitespace" in flashes(session, "/")


def test_the_console_stops_on_sigterm_with_status_0(start_console: Console) -> None:
    console = start_console()
    assert console.stop() == 0
    assert "Traceback" not in console.log()


def test_a_sharded_broker_is_shown_as_one_with_each_queues_shard(tmp_path: Path) -> None:
    from phpmq.testing import free_ports

    names = [f"q{n}" for n in range(8)]
    with BrokerProcess(
        tmp_path / "broker.log", "--shards", "2", "--grace-seconds", "1", address=free_ports(2)
    ) as sharded:
        with sharded.client() as client:
            for name in names:
                client.send(name, f"hello {name}".encode(), confirm=True)
            owners = {name: client.shard_of(name) for name in names}
        assert len(set(owners.values())) == 2
        with_console = ConsoleProcess(sharded.address, tmp_path / "web.log")
        try:
            session = Session(with_console.url)
            page = wait_until(lambda: _all_listed(session, names))
            for name, shard in owners.items():
                assert re.search(rf'data-queue="{name}">\s*<td>.*?</td>\s*<td>{shard}</td>', page)
                assert f"hello {name}" in session.request(f"/queue?name={name}")[2]
            overview = session.request("/")[2]
            assert all(f"<td>{shard}</td>" in overview for shard in set(owners.values()))
        finally:
            with_console.stop()


def _all_listed(session: Session, names: list[str]) -> str | None:
    page = session.request("/queues")[2]
    return page if all(f'data-queue="{name}"' in page for name in names) else None


def test_with_tls_it_serves_https_and_its_cookie_is_secure(
    start_console: Console, tmp_path: Path
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (it makes the test's certificate)")
    key, certificate = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(certificate)],
        check=True, capture_output=True,
    )  # fmt: skip
    users = write_users(tmp_path / "users.toml")
    console = start_console(
        "--users", str(users), "--certfile", str(certificate), "--keyfile", str(key)
    )
    assert console.url.startswith("https://")
    session = Session(console.url)
    status, headers, _ = session.request("/login")
    assert status == 200 and "; secure" in headers["set-cookie"].lower()
    session.log_in("alice")
    assert "alice" in session.request("/")[2]


def test_the_web_benchmark_runs_to_its_figures() -> None:
    """`phpmq bench --web` at a tiny size: both kinds of run finish and the medians print
    (the figures are not judged here)."""
    result = phpmq("bench", "--web", "--messages", "2000", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, output
    assert "round 3, with console" in output and "broker/relay ratio" not in output
    assert "median msgs/s: without the console" in output
