"""Key holds (docs/protocol.md §6.3, "Key holds"; broker/key_holds.py): a writer's keys kept
past the dedup window until it commits a later batch, through a kill -9 of a durable broker,
within their limits and rights. Real broker processes on loopback; a 1 s window, so that "after
the window" is a short wait.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

import phpmq.protocol as p
from harness import (
    BrokerProcess,
    CoreHarness,
    StoredCore,
    configured_broker,
    curve_broker,
    generate_keys,
    phpmq,
)
from phpmq.broker.journal import HELD_GONE, LET_GO
from phpmq.broker.key_holds import LET_GO_PER_TURN
from phpmq.client import BrokerRefused, Client
from phpmq.protocol import admin_commands as cmd

WINDOW_S = 1.0
#: Long enough that every key of the window is gone (the broker expires keys at its deadline).
PAST_WINDOW_S = WINDOW_S + 0.6
SCOPE = "3f1c2a9e-query"


def windowed(tmp_path: Path, *flags: str, data_dir: Path | None = None) -> BrokerProcess:
    return BrokerProcess(
        tmp_path / "broker.log", "--dedup-window-seconds", str(WINDOW_S), *flags, data_dir=data_dir
    )


def send_keys(client: Client, queue: str, keys: list[str]) -> None:
    for key in keys:
        client.send(queue, key, confirm=True, key=key)


def ready(client: Client, queue: str) -> int:
    return client.stats()["queues"][queue]["ready"]


def test_a_held_key_deduplicates_after_the_window_passed_and_an_unheld_one_does_not(
    tmp_path: Path,
) -> None:
    with windowed(tmp_path) as broker, broker.client() as client:
        answer = client.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")
        assert answer == {"scope": SCOPE, "committed": None, "held_keys": 0, "made": True}
        assert client.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")["made"] is False
        held, unheld = [f"{SCOPE}/0/0/{row}" for row in range(3)], ["other/0/0/0"]
        send_keys(client, "out", held + unheld)
        time.sleep(PAST_WINDOW_S)
        send_keys(client, "out", held + unheld)  # Spark's replay of batch 0, after the window
        assert ready(client, "out") == 5  # the unheld key's window was over: queued again
        stats = client.stats()
        assert stats["counters"]["deduplicated"] == 3
        assert stats["key_holds"]["holds"] == 1 and stats["key_holds"]["held_keys"] == 3


def test_a_commit_lets_the_earlier_batches_go_and_keeps_its_own(tmp_path: Path) -> None:
    with windowed(tmp_path) as broker, broker.client() as client:
        client.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")
        batch = {b: [f"{SCOPE}/{b}/0/{row}" for row in range(2)] for b in range(3)}
        send_keys(client, "out", batch[0] + batch[1] + batch[2])
        answer = client.admin(cmd.KEY_COMMIT, scope=SCOPE, queue="out", batch=2)
        assert answer == {"scope": SCOPE, "committed": 2, "held_keys": 2, "released": 4}
        send_keys(client, "out", batch[0])  # let go with a window from the commit: still known
        assert ready(client, "out") == 6
        time.sleep(PAST_WINDOW_S)
        send_keys(client, "out", batch[0] + batch[2])
        assert ready(client, "out") == 8  # batch 0's window was over; batch 2 is held
        later = client.admin(cmd.KEY_COMMIT, scope=SCOPE, queue="out", batch=1)
        assert later["released"] == 0 and later["committed"] == 2  # an older commit: nothing
        nobody = client.admin(cmd.KEY_COMMIT, scope="no-such-query", queue="out", batch=5)
        assert nobody["released"] == 0 and nobody["committed"] is None


def test_a_publish_s_held_key_deduplicates_after_the_window(tmp_path: Path) -> None:
    with windowed(tmp_path) as broker, broker.client() as client:
        client.admin(cmd.QUEUE_BIND, queue="orders", patterns=["order.*"])
        client.admin(cmd.KEY_HOLD, scope=SCOPE, event="order.paid")
        for _ in range(2):
            client.publish("order.paid", b"paid", key=f"{SCOPE}/0/0/0")
            client.publish("order.paid", b"paid", key="unheld/0/0/0")
            time.sleep(PAST_WINDOW_S)
        assert ready(client, "orders") == 3  # the unheld key's copy came twice


def test_holds_and_held_keys_survive_a_kill_of_a_durable_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = windowed(tmp_path, data_dir=data)
    with first.client() as client:
        client.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")
        send_keys(client, "out", [f"{SCOPE}/4/0/{row}" for row in range(3)])
        send_keys(client, "out", [f"{SCOPE}/5/0/{row}" for row in range(2)])
        client.admin(cmd.KEY_COMMIT, scope=SCOPE, queue="out", batch=5)
    first.kill()
    time.sleep(PAST_WINDOW_S)
    with windowed(tmp_path, data_dir=data) as second, second.client() as client:
        [hold] = client.admin(cmd.KEY_HOLDS)["holds"]
        assert hold["scope"] == SCOPE and hold["committed"] == 5 and hold["held_keys"] == 2
        assert hold["batches"] == [5, 5]
        send_keys(client, "out", [f"{SCOPE}/5/0/{row}" for row in range(2)])  # held: nothing
        send_keys(client, "out", [f"{SCOPE}/4/0/0"])  # let go before the kill, window over
        assert ready(client, "out") == 6
        client.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")  # the restarted query's tasks
        client.admin(cmd.KEY_COMMIT, scope=SCOPE, queue="out", batch=6)
    third = windowed(tmp_path, data_dir=data)
    with third, third.client() as client:
        [hold] = client.admin(cmd.KEY_HOLDS)["holds"]
        assert hold["committed"] == 6 and hold["held_keys"] == 0


def test_limits_of_holds_and_held_keys_refuse_with_429_naming_them(tmp_path: Path) -> None:
    toml = f"dedup_window_seconds = {WINDOW_S}\nmax_key_holds = 1\nmax_held_keys = 2\n"
    with configured_broker(tmp_path, toml) as broker, broker.client() as client:
        client.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")
        with pytest.raises(BrokerRefused) as refused:
            client.admin(cmd.KEY_HOLD, scope="second", queue="out")
        assert refused.value.error.code == 429
        assert "max_key_holds is 1" in refused.value.error.reason
        send_keys(client, "out", [f"{SCOPE}/0/0/0", f"{SCOPE}/0/0/1"])
        with pytest.raises(BrokerRefused) as refused:
            send_keys(client, "out", [f"{SCOPE}/0/0/2"])
        assert refused.value.error.code == 429
        assert "max_held_keys is 2" in refused.value.error.reason
        send_keys(client, "out", ["unheld/0/0/0"])  # a key no hold keeps: the window's
        client.admin(cmd.KEY_COMMIT, scope=SCOPE, queue="out", batch=1)
        send_keys(client, "out", [f"{SCOPE}/1/0/0"])  # room again
        stats = client.stats()["key_holds"]
        assert stats["refused"] == {"max_key_holds": 1, "max_held_keys": 1}
        assert ready(client, "out") == 4


PERMISSIONS = """
[keys.writer]
send = ["out.#"]

[keys.ops]
admin = true
"""


def test_a_writer_needs_send_on_the_queue_its_quota_counts_and_release_needs_admin(
    tmp_path: Path,
) -> None:
    keys = generate_keys(tmp_path / "keys", ["broker", "writer", "ops"], ["writer", "ops"])
    permissions = tmp_path / "permissions.toml"
    permissions.write_text(PERMISSIONS)
    config = tmp_path / "broker.toml"
    config.write_text(f"dedup_window_seconds = {WINDOW_S}\nquota_held_keys = 1\n")
    broker = curve_broker(
        tmp_path, keys, "--permissions", str(permissions), "--config", str(config), as_key="ops"
    )
    with broker, broker.client() as ops:
        from phpmq.client import curve_keys

        writer_keys = curve_keys(keys / "writer.key_secret", keys / "broker.key")
        with Client(broker.address, curve=writer_keys) as writer:
            with pytest.raises(BrokerRefused) as refused:
                writer.admin(cmd.KEY_HOLD, scope=SCOPE, queue="elsewhere")
            assert refused.value.error.code == 403
            assert "no send right on 'elsewhere'" in refused.value.error.reason
            with pytest.raises(BrokerRefused) as refused:
                writer.admin(cmd.KEY_HOLD, scope=SCOPE)  # names nothing it sends to
            assert refused.value.error.code == 403
            assert writer.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out.a")["made"] is True
            send_keys(writer, "out.a", [f"{SCOPE}/0/0/0"])
            with pytest.raises(BrokerRefused) as refused:
                send_keys(writer, "out.a", [f"{SCOPE}/0/0/1"])
            assert refused.value.error.code == 429
            assert "quota_held_keys is 1" in refused.value.error.reason
            with pytest.raises(BrokerRefused) as refused:
                writer.admin(cmd.KEY_RELEASE, scope=SCOPE)
            assert refused.value.error.code == 403
            [hold] = writer.admin(cmd.KEY_HOLDS)["holds"]  # listing is open
            assert hold["owner"] == "key 'writer'" and hold["held_keys"] == 1
            assert ops.admin(cmd.KEY_RELEASE, scope=SCOPE) == {"scope": SCOPE, "released": 1}
            send_keys(writer, "out.a", [f"{SCOPE}/0/0/1"])  # no hold: the window's
            # Made again once the released key is let go (503 until then), the hold holds
            # the writer's next key: the quota was given back at the release.
            deadline = time.monotonic() + 5
            while True:
                try:
                    writer.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out.a")
                    break
                except BrokerRefused as exc:
                    assert exc.error.code == 503 and time.monotonic() < deadline, exc
                    time.sleep(0.01)
            send_keys(writer, "out.a", [f"{SCOPE}/1/0/0"])
            [hold] = writer.admin(cmd.KEY_HOLDS)["holds"]
            assert hold["held_keys"] == 1


def test_the_cli_lists_holds_and_releases_one(tmp_path: Path) -> None:
    with windowed(tmp_path) as broker, broker.client() as client:
        client.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")
        send_keys(client, "out", [f"{SCOPE}/0/0/0"])
        listed = phpmq("keys", "holds", "--broker", broker.address)
        assert listed.returncode == 0, listed.stderr
        [row] = [line for line in listed.stdout.splitlines() if SCOPE in line]
        cells = [cell.strip() for cell in row.split("│")]
        assert cells[1:4] == [SCOPE, "none", "1"] and cells[4] == "0"
        assert "1 key holds, 1 held keys" in listed.stderr
        released = phpmq("keys", "release", SCOPE, "--yes", "--broker", broker.address)
        assert released.returncode == 0, released.stderr
        assert f"released key hold {SCOPE!r}: 1 key(s)" in released.stdout
        again = phpmq("keys", "release", SCOPE, "-y", "--broker", broker.address)
        assert again.returncode != 0
        assert again.stderr.startswith("phpmq: ") and "Traceback" not in again.stderr
        assert client.stats()["key_holds"]["holds"] == 0


WRITER = b"\x00writer"


def send_held(stored: StoredCore, keys: list[str], first_tag: int = 0) -> list:
    return stored.send(
        WRITER, *[p.Send("out", b"x", 0, tag=first_tag + n, key=k) for n, k in enumerate(keys)]
    )


def test_a_commit_lets_its_keys_go_a_bounded_number_a_turn(tmp_path: Path) -> None:
    """A committed batch's keys are let go LET_GO_PER_TURN a turn, not all in the commit's
    turn (a Spark batch of 100,000 rows took 0.2-0.6 s there, every other peer waiting);
    until then they are deduplicated as held keys are, after as any key in its window. The
    store deletes the batch's held rows once every key is let go (HELD_GONE)."""
    stored = StoredCore(tmp_path)
    stored.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")
    count = 2 * LET_GO_PER_TURN + 10
    keys = [f"{SCOPE}/0/0/{row}" for row in range(count)]
    send_held(stored, keys)
    answer = stored.admin(cmd.KEY_COMMIT, scope=SCOPE, queue="out", batch=1)
    assert answer["released"] == count and answer["held_keys"] == 0
    let_go, held_gone = [], []
    send_held(stored, [keys[-1]], count)  # released, not let go yet: still a repeat
    while stored.core.core.intake.holds.released:
        operations = stored.turn()
        let_go.append(sum(op[0] == LET_GO for op in operations))
        held_gone.append([op[1:] for op in operations if op[0] == HELD_GONE])
    assert let_go == [LET_GO_PER_TURN, LET_GO_PER_TURN, 10]
    assert held_gone == [[], [], [("out", f"{SCOPE}/0")]]
    send_held(stored, [keys[0]], count + 1)  # in its window now
    assert stored.core.stats("out")["ready"] == count
    assert stored.core.core.counters.deduplicated == 2
    assert stored.store.load_keys() and all(
        k.expires_wall != math.inf for k in stored.store.load_keys()
    )


def test_a_kill_while_a_commit_s_keys_are_let_go_loses_none(tmp_path: Path) -> None:
    """Killed after one of the turns that let a commit's keys go: a restart finds every key,
    held on disk until all were let go, and gives the batch's the window (its hold is
    committed past it), the store's held rows deleted then."""
    stored = StoredCore(tmp_path)
    stored.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")
    keys = [f"{SCOPE}/0/0/{row}" for row in range(LET_GO_PER_TURN + 500)]
    send_held(stored, keys)
    stored.admin(cmd.KEY_COMMIT, scope=SCOPE, queue="out", batch=1)
    stored.turn()  # one turn of let-go, then kill -9
    restarted = stored.reopened()
    known = restarted.core.intake.keys
    assert all(known.get(f"out\x00{k}", restarted.clock.monotonic_ns()) for k in keys)
    assert not restarted.core.intake.holds.ids, "a committed batch's keys are not held"
    assert not [k for k in stored.store.load_keys() if k.expires_wall == math.inf]


def test_a_new_hold_of_a_released_scope_waits_until_its_keys_are_let_go(
    tmp_path: Path,
) -> None:
    """key-release, then the writer's next task asks to hold the scope again while the
    released keys wait to be let go: refused with 503 (the sink asks again) until they are,
    so that the store's delete of their writer batch cannot take the new hold's keys with
    it, and a single turn need not let them all go."""
    stored = StoredCore(tmp_path)
    stored.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")
    send_held(stored, [f"{SCOPE}/5/0/{row}" for row in range(LET_GO_PER_TURN + 10)])
    stored.admin(cmd.KEY_RELEASE, scope=SCOPE)
    refused = stored.core.send(
        b"\x00ops", p.Admin({"command": cmd.KEY_HOLD, "scope": SCOPE, "queue": "out"})
    )
    [reply] = refused
    assert reply.options["error"]["code"] == 503, reply
    assert f"{LET_GO_PER_TURN + 10} keys of an earlier hold" in reply.options["error"]["reason"]
    while stored.core.core.intake.holds.released:
        stored.turn()
    assert stored.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")["made"] is True
    send_held(stored, [f"{SCOPE}/5/1/new"], 10**6)
    held = {k.key for k in stored.store.load_keys() if k.expires_wall == math.inf}
    assert held == {f"{SCOPE}/5/1/new"}
    restarted = stored.reopened()
    assert set(restarted.core.intake.holds.ids) == {f"out\x00{SCOPE}/5/1/new"}


def test_released_keys_past_the_limit_count_against_it(tmp_path: Path) -> None:
    """A writer that holds and commits faster than released keys are let go cannot grow
    the broker without bound: those waiting count against max_held_keys past as many
    again, so memory stays within twice the limit and its sends are refused (429)."""
    core = CoreHarness(durable=True, dedup_window_seconds=60, max_held_keys=LET_GO_PER_TURN)
    core.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")
    holds, refused, tag = core.core.intake.holds, 0, 0
    for batch in range(8):
        rows = [f"{SCOPE}/{batch}/0/{row}" for row in range(LET_GO_PER_TURN)]
        sends = [p.Send("out", b"x", 0, tag=tag + n, key=key) for n, key in enumerate(rows)]
        tag += len(rows)
        got = core.send(WRITER, *sends, *sends)  # twice a turn's let-go
        refused += sum(1 for m in got if type(m) is p.Error and m.code == 429)
        core.admin(cmd.KEY_COMMIT, scope=SCOPE, queue="out", batch=batch + 1)
        assert len(holds.ids) <= 2 * LET_GO_PER_TURN + len(rows)
    assert refused > 0


def test_a_commit_frees_room_for_the_next_batch_at_once(tmp_path: Path) -> None:
    """Released keys wait to be let go, but no longer count against max_held_keys nor
    their owner's quota: the next batch's rows are held in the commit's turn already."""
    core = CoreHarness(durable=True, dedup_window_seconds=60, max_held_keys=3)
    core.admin(cmd.KEY_HOLD, scope=SCOPE, queue="out")
    core.send(WRITER, *[p.Send("out", b"x", 0, tag=n, key=f"{SCOPE}/0/0/{n}") for n in range(3)])
    core.admin(cmd.KEY_COMMIT, scope=SCOPE, queue="out", batch=1)
    assert core.core.intake.holds.releasing == 3
    got = core.send(
        WRITER, *[p.Send("out", b"x", 0, tag=9 + n, key=f"{SCOPE}/1/0/{n}") for n in range(3)]
    )
    assert not [m for m in got if type(m) is p.Error]
    assert core.core.intake.holds.stats()["held_keys"] == 3  # batch 1's, as the 3 waiting go
