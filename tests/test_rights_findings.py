"""Issue #27's findings, each tried again as an attacker would, against real broker processes
with CURVE and a permissions file: `limited` may only send to `jobs.*`; `worker` may consume
`jobs.#` and send `replies.#`; `ops` has admin and everything. Every one of them must end in
a 403 naming the right (or a 429 for a quota), with nothing changed that the key may not
change."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq

import phpmq.protocol as p
from harness import BrokerProcess, curve_broker, generate_keys, recv_messages, wait_for
from phpmq.broker.shell.shards import shard_address
from phpmq.client import curve_keys
from phpmq.testing import free_ports

PERMISSIONS = """
[keys.limited]
send = ["jobs.*"]

[keys.worker]
consume = ["jobs.#"]
send = ["replies.#"]
bind = ["jobs.#"]
subscribe = ["order.*"]

[keys.ops]
admin = true
send = ["#"]
publish = ["#"]
consume = ["#"]
bind = ["#"]
subscribe = ["#"]
delete = ["#"]
"""


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    clients = ("limited", "worker", "ops")
    return generate_keys(tmp_path_factory.mktemp("keys"), ("broker", *clients), clients)


def start(tmp_path: Path, keys: Path, *flags: str, address: str | None = None) -> BrokerProcess:
    permissions = tmp_path / "permissions.toml"
    if not permissions.exists():
        permissions.write_text(PERMISSIONS)
    return curve_broker(
        tmp_path, keys, "--permissions", str(permissions), *flags, as_key="ops", address=address
    )


@pytest.fixture
def broker(tmp_path: Path, keys: Path) -> Iterator[BrokerProcess]:
    process = start(tmp_path, keys)
    try:
        yield process
    finally:
        process.stop()


@contextmanager
def raw(
    address: str, keys: Path, name: str, identity: bytes | None = None
) -> Iterator[zmq.Socket]:
    """A hand-made DEALER with `name`'s CURVE key: it sends whatever bytes it likes."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    if identity is not None:
        sock.identity = identity
    curve_keys(keys / f"{name}.key_secret", keys / "broker.key").apply(sock)
    sock.connect(address)
    try:
        yield sock
    finally:
        sock.close(linger=0)


def answers(sock: zmq.Socket, count: int, timeout: float = 5.0) -> list[p.Message]:
    """The next `count` answers (heartbeats left out)."""
    got: list[p.Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {got} of {count} answers"
        got += [m for m in recv_messages(sock, left) if not isinstance(m, p.Heartbeat)]
    return got


def refusals(messages: list[p.Message]) -> list[tuple[int, str]]:
    """(code, reason) of every ERROR and of every ADMIN_REPLY that carries an error."""
    found = []
    for message in messages:
        if isinstance(message, p.Error):
            found.append((message.code, message.reason))
        elif isinstance(message, p.AdminReply) and "error" in message.options:
            error = message.options["error"]
            found.append((error["code"], error["reason"]))
    return found


def ops_admin(broker: BrokerProcess, command: str, **options: object) -> dict:
    with broker.client(name="ops", close_timeout=1) as ops:
        return ops.admin(command, **options)



# --------------------------------------------------------------------------- 1. KBAI


def test_kbai_then_anything_is_checked_with_the_same_rights(broker: BrokerProcess, keys: Path):
    assert ops_admin(broker, "stats")  # ops creates nothing; billing gets one message:
    with broker.client(name="ops") as ops:
        ops.send("billing", b"salary", confirm=True)
    frame = p.encode_all(
        [
            p.Kbai(),
            p.Admin({"command": "queue-purge", "queue": "billing"}),
            p.Send("billing", b"x", 0, tag=1),
            p.Consume("billing", 1),
            p.Admin({"command": "schedule-add", "name": "s", "queue": "billing", "every_ms": 100}),
        ]
    )
    with raw(broker.address, keys, "limited") as sock:
        sock.send(frame)
        refused = refusals(answers(sock, 4))
    assert [code for code, _ in refused] == [403, 403, 403, 403], refused
    assert all("key 'limited'" in reason for _, reason in refused)
    stats = ops_admin(broker, "stats")
    assert stats["queues"]["billing"]["ready"] == 1 and stats["queues"]["billing"]["consumers"] == 0
    assert ops_admin(broker, "schedule-list")["schedules"] == []


def test_kbai_then_anything_on_the_raw_tcp_endpoint_and_for_anonymous_peers(tmp_path: Path):
    permissions = tmp_path / "permissions.toml"
    permissions.write_text('[anonymous]\nsend = ["jobs.*"]\n[tcp]\nsend = ["legacy.*"]\n')
    broker = BrokerProcess(
        tmp_path / "broker.log", "--permissions", str(permissions), "--admin-secret", "s", tcp=True
    )
    try:
        with broker.client(admin_secret="s") as ops:
            ops.send("jobs.a", b"work", confirm=True)
        purge = p.Admin({"command": "queue-purge", "queue": "jobs.a"})
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(broker.address)
        sock.send(p.encode_all([p.Kbai(), purge, p.Send("billing", b"x", 0, tag=1)]))
        assert [code for code, _ in refusals(answers(sock, 2))] == [403, 403]
        sock.close()
        assert broker.tcp_port is not None
        with socket.create_connection(("127.0.0.1", broker.tcp_port)) as tcp:
            tcp.sendall(p.encode_all([p.Kbai(), p.Send("billing", b"x"), p.Send("legacy.a", b"y")]))
            wait_for(lambda: _ready(broker, "legacy.a") == 1, "the stock send queued")
        assert _ready(broker, "jobs.a") == 1 and _ready(broker, "billing") == 0
    finally:
        broker.stop()
    assert "has no send right on 'billing'" in broker.log()


def _ready(broker: BrokerProcess, queue: str) -> int:
    with broker.client(admin_secret="s", close_timeout=1) as client:
        return client.admin("stats")["queues"].get(queue, {}).get("ready", 0)


# --------------------------------------------------------------------------- 2. links


@pytest.mark.xdist_group("shards")  # a sharded broker: one at a time
def test_a_client_key_posing_as_a_shard_link_cannot_forward(tmp_path: Path, keys: Path):
    address = free_ports(2)
    broker = start(tmp_path, keys, "--shards", "2", address=address)
    try:
        with broker.client(name="ops") as ops:
            ops.admin("stats")  # the HELLO answer, with the map, has come
            queue = next(f"jobs.{i}" for i in range(100) if ops.shard_of(f"jobs.{i}") == "local/1")
            ops.send(queue, b"keep me", confirm=True)
        inner = p.encode_all(
            [p.Admin({"command": "queue-purge", "queue": queue}), p.Consume(queue, 5)]
        )
        forward = p.Forward(b"me", inner, 1, b'[null,"","router",true]')
        with raw(shard_address(address, 1), keys, "limited") as sock:
            sock.send(p.encode(forward))  # no HELLO: asked to say HELLO again, nothing run
            [told] = answers(sock, 1)
            assert isinstance(told, p.Disconnect)
            sock.send(p.encode_all([p.Hello({"role": "link", "name": "local/0"}), forward]))
            got = answers(sock, 2)
        [(code, reason)] = refusals(got)
        assert code == 403 and "FORWARD" in reason
        with broker.client(name="ops") as ops:
            assert ops.admin("queue-peek", queue=queue)["ready"] == 1
    finally:
        broker.stop()
    assert "says it is a shard link" in broker.log()


# --------------------------------------------------------------------------- 3. reply_to


def test_a_request_may_not_name_a_reply_queue_its_key_may_not_send_to(
    broker: BrokerProcess, keys: Path
):
    request = p.Send("jobs.a", b"resize", 0, tag=1, reply_to="billing", correlation="c1")
    with raw(broker.address, keys, "limited") as sock:
        sock.send(p.encode_all([p.Hello({"confirm": True}), request]))
        got = answers(sock, 2)
    [(code, reason)] = refusals(got)
    assert code == 403 and "no send right on 'billing'" in reason
    assert "jobs.a" not in ops_admin(broker, "stats")["queues"]


# --------------------------------------------------------------------------- 4. routing ids


def test_a_reused_routing_id_does_not_inherit_the_rights_of_the_last_connection(
    broker: BrokerProcess, keys: Path
):
    with broker.client(name="ops") as ops:
        ops.send("billing", b"salary", confirm=True)
    stats = p.Admin({"command": "stats"})
    with raw(broker.address, keys, "ops", identity=b"chosen-id") as sock:
        sock.send(p.encode(stats))
        [reply] = answers(sock, 1)
        assert isinstance(reply, p.AdminReply) and "error" not in reply.options
    time.sleep(0.3)  # the first connection is gone at the broker: the id is free again
    with raw(broker.address, keys, "limited", identity=b"chosen-id") as sock:
        sock.send(p.encode_all([p.Hello({"name": "second"}), stats]))
        sock.send(p.encode(p.Admin({"command": "queue-purge", "queue": "billing"})))
        got = answers(sock, 3)
        [(code, reason)] = refusals(got)
        assert code == 403 and "key 'limited'" in reason
        peers = ops_admin(broker, "stats")["clients"]
        [second] = [c for c in peers if c["name"] == "second"]
        assert second["key"] == "limited"
    assert ops_admin(broker, "stats")["queues"]["billing"]["ready"] == 1
    assert "admin queue-purge by key 'limited'" not in broker.log()


# --------------------------------------------------------------------------- 5. delete


def test_delete_when_unused_needs_the_delete_right(broker: BrokerProcess, keys: Path):
    with broker.client(name="ops") as ops:
        ops.send("jobs.keep", b"x", confirm=True)
    with raw(broker.address, keys, "worker") as sock:
        sock.send(p.encode_all([p.Hello({}), p.Consume("jobs.keep", 1, unused_ms=0)]))
        got = answers(sock, 2)
        [(code, reason)] = refusals(got)
        assert code == 403 and "no delete right on 'jobs.keep'" in reason
        sock.send(p.encode(p.Cancel("jobs.keep")))
        answers(sock, 1)
    time.sleep(0.2)
    assert ops_admin(broker, "stats")["queues"]["jobs.keep"]["ready"] == 1
    with broker.client(name="ops") as ops:
        gone = ops.admin("queue-delete", queue="jobs.keep")
    assert gone["queue"] == "jobs.keep"


# --------------------------------------------------------------------------- 6. SIGHUP


def test_revoking_consume_closes_the_window_and_takes_back_what_it_held(
    tmp_path: Path, keys: Path
):
    broker = start(tmp_path, keys)
    try:
        with broker.client(name="ops") as ops:
            for i in range(3):
                ops.send("jobs.q", f"m{i}".encode(), confirm=True)
        with raw(broker.address, keys, "worker") as sock:
            sock.send(p.encode_all([p.Hello({}), p.Consume("jobs.q", 1)]))
            got = answers(sock, 2)
            assert any(isinstance(m, p.Dispatch) for m in got)
            (tmp_path / "permissions.toml").write_text(
                PERMISSIONS.replace('consume = ["jobs.#"]', "consume = []")
            )
            broker.signal(signal.SIGHUP)
            [cancel] = [m for m in answers(sock, 1, timeout=10) if isinstance(m, p.Cancel)]
            assert cancel.queue == "jobs.q" and "revoked" in (cancel.reason or "")
            assert cancel.count == 1
            stats = ops_admin(broker, "stats")["queues"]["jobs.q"]
            assert stats["ready"] == 3 and stats["consumers"] == 0 and stats["in_flight"] == 0
            sock.send(p.encode(p.Consume("jobs.q", 1)))
            [(code, _)] = refusals(answers(sock, 1))
            assert code == 403
    finally:
        broker.stop()


# --------------------------------------------------------------------------- 7. subscribe


def test_binding_needs_subscribe_rights_over_every_event_it_would_receive(
    broker: BrokerProcess, keys: Path
):
    with raw(broker.address, keys, "worker") as sock:
        sock.send(p.encode_all([p.Hello({}), p.Consume("jobs.mine", 1, patterns="#")]))
        [(code, reason)] = refusals(answers(sock, 2))
        assert code == 403 and "no subscribe right on '#'" in reason
        bind = p.Admin({"command": "queue-bind", "queue": "jobs.mine", "patterns": ["payroll.#"]})
        sock.send(p.encode(bind))
        [(code, reason)] = refusals(answers(sock, 1))
        assert code == 403 and "subscribe" in reason
        sock.send(p.encode(p.Consume("jobs.mine", 1, patterns="order.*")))
        time.sleep(0.3)
    bindings = ops_admin(broker, "queue-bindings", queue="jobs.mine")
    assert bindings["bindings"] == ["order.*"], bindings
    with broker.client(name="ops") as ops:
        assert ops.publish("payroll.salary.alice", b"100", confirm=True) == 0


# --------------------------------------------------------------------------- 8. quotas


def test_one_key_reaching_its_queue_quota_leaves_room_for_the_others(tmp_path: Path, keys: Path):
    config = tmp_path / "broker.toml"
    config.write_text("max_queues = 20\nquota_queues = 10\n")
    broker = start(tmp_path, keys, "--config", str(config))
    try:
        with raw(broker.address, keys, "limited") as sock:
            sends = [p.Send(f"jobs.{i}", b"x", 0, tag=i) for i in range(15)]
            sock.send(p.encode_all([p.Hello({"confirm": True}), *sends]))
            got = answers(sock, 16)
        refused = refusals(got)
        assert len(refused) == 5 and all(code == 429 for code, _ in refused), refused
        assert "quota_queues is 10" in refused[0][1]
        with broker.client(name="ops") as ops:
            for i in range(10):
                ops.send(f"other.{i}", b"y", confirm=True)  # room left for everyone else
            security = ops.admin("stats")["security"]
        assert security["quotas"]["refused"]["queues"] == 5
    finally:
        broker.stop()
