"""The worker pool (`phpmq workers`) as real processes: a real broker, a real supervisor, real
worker processes running the handlers of tests/pool_tasks.py.

Each handler appends one JSON line per call to a file (POOL_OUT), so a test can tell which
messages were handled, how often, by which process and at which delivery. Every wait polls a
condition against a deadline and fails with the pool's and the broker's logs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import REPO, BrokerProcess, read_until, wait_until

TESTS = Path(__file__).resolve().parent
#: Worker connections heartbeat fast, so a killed worker's messages come back within 0.6 s.
FAST = ("--heartbeat-ms", "200", "--summary-seconds", "0.5")
#: Recycling tests heartbeat at the default pace (liveness 3 s): they are about a worker replaced
#: after its job, not about how soon a dead one's messages come back, and a process starved on a
#: loaded machine outlasts a 0.6 s liveness (then its messages are redelivered, as promised).
RECYCLING = ("--heartbeat-ms", "1000", "--summary-seconds", "0.5")
SUMMARY = re.compile(
    r"done (\d+), failed (\d+) \(retried (\d+), dead-lettered (\d+)\), timeouts (\d+),"
    r" crashes (\d+), recycled (\d+); running (\d+)/(\d+)"
)


# --------------------------------------------------------------------------- processes


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[0], int(fields[1]), int(fields[2])


def alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class PoolProcess:
    """`phpmq workers pool_tasks:HANDLER` in its own process group, its log in a file."""

    def __init__(
        self,
        tmp_path: Path,
        broker: BrokerProcess,
        handler: str,
        *args: str,
        name: str = "pool",
        env: dict[str, str] | None = None,
    ) -> None:
        self.broker = broker
        self.log_path = tmp_path / f"{name}.log"
        self.out_path = tmp_path / f"{name}.jsonl"
        self.out_path.touch()
        python_path = [str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")]
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(part for part in python_path if part),
            "POOL_OUT": str(self.out_path),
            **(env or {}),
        }
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "phpmq",
                "workers",
                f"pool_tasks:{handler}",
                "--broker",
                broker.address,
                *args,
            ],
            cwd=REPO,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its group holds exactly the processes this test started
        )
        self.pid = self.process.pid

    # ------------------------------------------------------------------ looking

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def records(self, event: str | None = None) -> list[dict[str, Any]]:
        lines = self.out_path.read_text().splitlines()
        # A line being written right now may be incomplete: only whole lines count.
        records = [json.loads(line) for line in lines if line.endswith("}")]
        return [r for r in records if event is None or r["event"] == event]

    def worker_pids(self) -> set[int]:
        """The live worker processes of this supervisor (not its resource tracker)."""
        return {
            pid
            for pid in _all_pids()
            if (stat := _stat(pid)) is not None
            and stat[1] == self.pid
            and stat[0] not in ("Z", "X")
            and b"--multiprocessing-fork" in _cmdline(pid)
        }

    def group_pids(self) -> set[int]:
        """Every live process started by this pool, even those orphaned by its death."""
        return {pid for pid in _all_pids() if (s := _stat(pid)) and s[2] == self.pid and alive(pid)}

    def summaries(self) -> list[tuple[int, ...]]:
        return [tuple(int(g) for g in m.groups()) for m in SUMMARY.finditer(self.log())]

    def failure(self, what: str) -> str:
        return (
            f"{what}\n--- pool log (tail) ---\n{self.log()[-8000:]}"
            f"\n--- broker log (tail) ---\n{self.broker.log()[-3000:]}"
        )

    def wait_for(self, condition: Callable[[], Any], timeout: float, what: str) -> Any:
        """`condition`'s first true value; past `timeout` the test fails with both logs."""
        value = read_until(condition, bool, timeout)
        if not value:
            pytest.fail(self.failure(f"timed out after {timeout}s waiting for {what}"))
        return value

    # ------------------------------------------------------------------ stopping

    def stop_gracefully(self, timeout: float) -> None:
        """SIGTERM; the pool must exit with status 0 within `timeout` seconds."""
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(self.failure("the pool did not stop within its grace period"))
        assert status == 0, self.failure(f"exit status {status}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL; then kill, one by one, whatever it left behind."""
        started = self.group_pids()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        deadline = time.monotonic() + 3
        while (left := {pid for pid in started | self.group_pids() if alive(pid)}) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        for pid in left:
            if (stat := _stat(pid)) is not None and stat[2] == self.pid:
                os.kill(pid, signal.SIGKILL)
        self._log.close()


@pytest.fixture
def start_pool(tmp_path: Path, broker: BrokerProcess) -> Iterator[Callable[..., PoolProcess]]:
    """Start pools on the test's broker; every one is stopped at the end, pass or fail."""
    pools: list[PoolProcess] = []

    def start(handler: str, *args: str, **kwargs: Any) -> PoolProcess:
        pool = PoolProcess(tmp_path, broker, handler, *args, **kwargs)
        pools.append(pool)
        return pool

    try:
        yield start
    finally:
        for pool in pools:
            pool.stop()


# --------------------------------------------------------------------------- broker views


def queue_stats(broker: BrokerProcess, queue: str) -> dict[str, int]:
    empty = {"ready": 0, "in_flight": 0, "delayed": 0, "consumers": 0, "dead_letters": 0}
    return {**empty, **broker.stats()["queues"].get(queue, {})}


def settled(broker: BrokerProcess, queue: str) -> bool:
    """Nothing ready, in flight or waiting out a retry delay."""
    stats = queue_stats(broker, queue)
    return stats["ready"] == stats["in_flight"] == stats["delayed"] == 0


def dead_letters(broker: BrokerProcess, queue: str) -> dict[str, dict[str, Any]]:
    """The queue's dead letters by content."""
    with broker.client(close_timeout=1) as client:
        if queue not in client.admin("stats")["queues"]:
            return {}
        entries = client.admin("dlq-list", queue=queue, limit=10_000)["entries"]
    return {base64.b64decode(entry["content"]).decode(): entry for entry in entries}


def send(broker: BrokerProcess, queue: str, contents: list[str]) -> None:
    with broker.client() as client:
        client.send_many(queue, contents)


def deliveries(records: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Content -> the delivery counts it was handled at, in order."""
    seen: dict[str, list[int]] = {}
    for record in records:
        seen.setdefault(record["content"], []).append(record["delivery"])
    return seen


def connections_lost(pool: PoolProcess, broker: BrokerProcess) -> int:
    """How often a worker's connection was given up for silence: the broker declared a worker
    dead, or a worker's client declared the broker lost (and reconnected)."""
    return broker.stats()["counters"]["peers_expired"] + pool.log().count("broker-lost")


def assert_each_handled_once_or_redelivered(
    pool: PoolProcess, broker: BrokerProcess, contents: list[str], prefetch: int = 1
) -> None:
    """docs/workers.md "Guarantees": at least once. Every message is handled, and handled again
    only as a redelivery (a higher delivery count) after a worker's connection was lost to
    silence, at most `prefetch` messages per loss. A worker that leaves (recycled) has its acks
    reach the broker first: a message handled twice without such a loss is a defect."""
    handled = deliveries(pool.records())
    assert sorted(handled) == contents, pool.failure(f"handled: {sorted(handled)}")
    again = {content: runs for content, runs in handled.items() if len(runs) > 1}
    if not again:
        return
    same_delivery = {content: runs for content, runs in again.items() if len(set(runs)) < len(runs)}
    assert not same_delivery, pool.failure(f"one delivery handled twice: {same_delivery}")
    lost = connections_lost(pool, broker)
    repeats = sum(len(runs) - 1 for runs in again.values())
    assert repeats <= lost * prefetch, pool.failure(
        f"handled again {again} after {lost} lost connections: more than they held"
    )


# --------------------------------------------------------------------------- throughput


def test_ten_thousand_messages_are_each_handled_exactly_once(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    contents = [f"m{i:05d}" for i in range(10_000)]
    send(broker, "bulk", contents)
    pool = start_pool("record", "-q", "bulk", "-p", "4", "--prefetch", "20", *FAST)

    pool.wait_for(lambda: len(pool.records()) >= len(contents), 60, "10,000 handled messages")
    pool.wait_for(lambda: settled(broker, "bulk"), 10, "the queue to be empty and settled")

    handled = [record["content"] for record in pool.records()]
    duplicates = [content for content, n in Counter(handled).items() if n > 1]
    assert not duplicates, f"handled twice: {duplicates[:10]}"
    assert sorted(handled) == contents
    assert {record["ppid"] for record in pool.records()} == {pool.pid}
    stats = queue_stats(broker, "bulk")
    assert (stats["ready"], stats["in_flight"], stats["dead_letters"]) == (0, 0, 0)
    assert stats["consumers"] == 4
    assert len(pool.worker_pids()) == 4
    # The supervisor's own summary: every job done, none failed, 4 workers.
    pool.wait_for(
        lambda: any(s[0] == 10_000 for s in pool.summaries()), 5, "a summary with done 10000"
    )
    done, failed, _, dead, timeouts, crashes, _, _, workers = pool.summaries()[-1]
    assert (done, failed, dead, timeouts, crashes, workers) == (10_000, 0, 0, 0, 0, 4)


# --------------------------------------------------------------------------- outcomes


@pytest.mark.parametrize("handler", ["outcomes", "async_outcomes"])
def test_a_failing_handler_is_retried_then_dead_lettered_with_its_exception(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess], handler: str
) -> None:
    contents = [f"fail-{i}" for i in range(3)]
    send(broker, "jobs", contents)
    pool = start_pool(
        handler, "-q", "jobs", "-p", "2", "--max-retries", "2", "--retry-delay", "0.05", *FAST
    )

    pool.wait_for(lambda: len(dead_letters(broker, "jobs")) == 3, 20, "3 dead letters")
    pool.wait_for(lambda: settled(broker, "jobs"), 5, "the queue to settle")

    dead = dead_letters(broker, "jobs")
    for content in contents:
        assert "ValueError" in dead[content]["reason"], dead[content]
        assert f"cannot handle {content}" in dead[content]["reason"]
        assert dead[content]["deliveries"] == 3
    assert deliveries(pool.records()) == {content: [1, 2, 3] for content in contents}
    pool.wait_for(
        lambda: any(s[3] == 3 and s[2] == 6 for s in pool.summaries()),
        5,
        "a summary with 6 retries and 3 dead letters",
    )


def test_a_handler_asking_for_a_retry_gets_the_message_again_and_acks(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    contents = [f"retry-{i}" for i in range(3)]
    send(broker, "jobs", contents)
    pool = start_pool("outcomes", "-q", "jobs", "-p", "2", "--max-retries", "2", *FAST)

    pool.wait_for(lambda: len(pool.records()) >= 6, 20, "each message handled twice")
    pool.wait_for(lambda: settled(broker, "jobs"), 5, "the queue to settle")

    assert deliveries(pool.records()) == {content: [1, 2] for content in contents}
    first = {r["content"]: r["time"] for r in pool.records() if r["delivery"] == 1}
    second = {r["content"]: r["time"] for r in pool.records() if r["delivery"] == 2}
    for content in contents:  # Retry(delay=0.1): the broker held it back that long
        assert second[content] - first[content] >= 0.09
    assert dead_letters(broker, "jobs") == {}


@pytest.mark.parametrize("handler", ["outcomes", "async_outcomes"])
def test_a_rejected_message_is_dead_lettered_at_once_with_the_reason(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess], handler: str
) -> None:
    send(broker, "jobs", ["reject-0", "ok-0"])
    pool = start_pool(handler, "-q", "jobs", "--max-retries", "5", *FAST)

    pool.wait_for(lambda: len(dead_letters(broker, "jobs")) == 1, 20, "1 dead letter")
    pool.wait_for(lambda: settled(broker, "jobs"), 5, "the queue to settle")

    entry = dead_letters(broker, "jobs")["reject-0"]
    assert entry["reason"] == "Reject: reject-0 is unwanted"
    assert entry["deliveries"] == 1
    assert deliveries(pool.records()) == {"reject-0": [1], "ok-0": [1]}


def test_an_async_handler_is_awaited_and_its_messages_acked(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    contents = [f"a{i:02d}" for i in range(20)]
    send(broker, "async", contents)
    pool = start_pool("async_record", "-q", "async", "-p", "2", "--prefetch", "4", *FAST)

    pool.wait_for(lambda: len(pool.records()) >= 20, 20, "20 handled messages")
    pool.wait_for(lambda: settled(broker, "async"), 5, "the queue to settle")

    assert sorted(r["content"] for r in pool.records()) == contents
    assert {r["loop"] for r in pool.records()} <= {"_UnixSelectorEventLoop"}
    assert {r["message_type"] for r in pool.records()} == {"AsyncReceivedMessage"}
    assert dead_letters(broker, "async") == {}


def test_an_async_handler_awaiting_past_liveness_keeps_its_message(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    """The worker's event loop heartbeats while the handler awaits: 1 s jobs against a
    liveness of 3 x 200 ms are not taken back and handled twice."""
    contents = [f"long-{i}" for i in range(3)]
    send(broker, "long", contents)
    pool = start_pool("async_slow", "-q", "long", *FAST, env={"POOL_SLEEP": "1.0"})

    pool.wait_for(lambda: len(pool.records("end")) >= 3, 20, "3 finished jobs")
    pool.wait_for(lambda: settled(broker, "long"), 5, "the queue to settle")

    assert deliveries(pool.records("start")) == {content: [1] for content in contents}
    assert broker.stats()["counters"]["peers_expired"] == 0


# --------------------------------------------------------------------------- timeouts, crashes


def test_a_job_past_its_timeout_is_killed_retried_then_dead_lettered(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    contents = ["loop-0", "loop-1"]
    send(broker, "stuck", contents)
    pool = start_pool(
        "spin", "-q", "stuck", "-p", "2", "--timeout", "0.5", "--max-retries", "1", *FAST
    )

    pool.wait_for(lambda: len(dead_letters(broker, "stuck")) == 2, 20, "2 dead letters")
    pool.wait_for(lambda: settled(broker, "stuck"), 5, "the queue to settle")

    dead = dead_letters(broker, "stuck")
    for content in contents:
        assert "timeout" in dead[content]["reason"], dead[content]
    assert deliveries(pool.records()) == {content: [1, 2] for content in contents}
    # Every run was killed; the pool is back at 2 processes, all of them new.
    killed = {record["pid"] for record in pool.records()}
    assert len(killed) == 4
    pool.wait_for(lambda: len(pool.worker_pids()) == 2, 10, "2 workers again")
    assert not pool.worker_pids() & killed
    assert not any(alive(pid) for pid in killed)
    pool.wait_for(lambda: any(s[4] == 4 for s in pool.summaries()), 5, "a summary: 4 timeouts")


def test_a_timeout_header_stops_a_job_of_a_pool_without_a_timeout(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    pool = start_pool("spin", "-q", "stuck", "--timeout", "0", "--max-retries", "0", *FAST)
    with broker.client() as client:
        client.send("stuck", "forever", headers={"timeout": 0.3})

    pool.wait_for(lambda: dead_letters(broker, "stuck"), 20, "a dead letter")
    pool.wait_for(lambda: settled(broker, "stuck"), 5, "the queue to settle")

    entry = dead_letters(broker, "stuck")["forever"]
    assert "timeout after 0.3s" in entry["reason"]
    assert deliveries(pool.records()) == {"forever": [1]}
    pool.wait_for(lambda: len(pool.worker_pids()) == 1, 10, "the worker replaced")


def test_headers_no_worker_can_read_are_no_headers_not_a_dying_worker(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    """Headers pass through the broker unread: nested too deep to decode (a RecursionError,
    which killed the worker reading a job's timeout, again at each redelivery) or with bad
    UTF-8 in a string, a job runs as one without headers."""
    pool = start_pool("record", "-q", "odd", "--max-retries", "0", *FAST)
    deep, not_utf8 = b'{"timeout":' + b"[" * 5000 + b"]" * 5000 + b"}", b'{"timeout":"\xff"}'
    with broker.client() as client:  # (send_many sends JSON bytes as they are)
        client.send_many("odd", [b"deep", b"not utf-8"], headers=[deep, not_utf8], confirm=True)

    pool.wait_for(lambda: len(pool.records()) >= 2, 20, "both handled")
    pool.wait_for(lambda: settled(broker, "odd"), 5, "the queue to settle")
    assert deliveries(pool.records()) == {"deep": [1], "not utf-8": [1]}
    assert dead_letters(broker, "odd") == {} and len(pool.worker_pids()) == 1


def test_a_handler_that_aborts_the_process_is_dead_lettered_as_sigabrt(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    contents = ["crash-0", "crash-1"]
    send(broker, "crashy", contents)
    pool = start_pool("abort", "-q", "crashy", "-p", "2", "--max-retries", "1", *FAST)

    pool.wait_for(lambda: len(dead_letters(broker, "crashy")) == 2, 20, "2 dead letters")
    pool.wait_for(lambda: settled(broker, "crashy"), 5, "the queue to settle")

    dead = dead_letters(broker, "crashy")
    for content in contents:
        assert "SIGABRT" in dead[content]["reason"], dead[content]
    assert deliveries(pool.records()) == {content: [1, 2] for content in contents}
    crashed = {record["pid"] for record in pool.records()}
    pool.wait_for(lambda: len(pool.worker_pids()) == 2, 15, "2 workers again")
    assert not pool.worker_pids() & crashed


# --------------------------------------------------------------------------- recycling


def test_a_leaking_worker_is_recycled_and_every_message_acked(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    contents = [f"leak-{i:02d}" for i in range(30)]
    send(broker, "leaky", contents)
    pool = start_pool(
        "leak", "-q", "leaky", "-p", "2", "--max-memory-mb", "150", *RECYCLING,
        env={"POOL_SLEEP": "0.15"},
    )  # fmt: skip

    pool.wait_for(lambda: len(pool.records()) >= 30, 40, "30 handled messages")
    pool.wait_for(lambda: settled(broker, "leaky"), 5, "the queue to settle")

    assert_each_handled_once_or_redelivered(pool, broker, contents)
    assert dead_letters(broker, "leaky") == {}
    assert "recycling it after its current job" in pool.log()
    assert len({r["pid"] for r in pool.records()}) > 2
    pool.wait_for(lambda: len(pool.worker_pids()) == 2, 10, "2 workers")


def test_max_jobs_per_child_replaces_workers_and_loses_nothing(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    contents = [f"job-{i:02d}" for i in range(30)]
    send(broker, "jobs", contents)
    pool = start_pool("record", "-q", "jobs", "-p", "2", "--max-jobs-per-child", "5", *RECYCLING)

    pool.wait_for(lambda: len(pool.records()) >= 30, 30, "30 handled messages")
    pool.wait_for(lambda: settled(broker, "jobs"), 5, "the queue to settle")

    assert_each_handled_once_or_redelivered(pool, broker, contents)
    per_pid = Counter(r["pid"] for r in pool.records())
    assert len(per_pid) >= 6
    assert max(per_pid.values()) <= 5
    pool.wait_for(lambda: len(pool.worker_pids()) == 2, 10, "2 workers")


# --------------------------------------------------------------------------- stopping


def test_workers_of_a_killed_supervisor_exit_and_their_messages_come_back(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    contents = [f"held-{i:02d}" for i in range(20)]
    send(broker, "held", contents)
    first = start_pool(
        "slow", "-q", "held", "-p", "2", "--prefetch", "5", *FAST, name="first",
        env={"POOL_SLEEP": "0.5"},
    )  # fmt: skip
    first.wait_for(
        lambda: len({r["pid"] for r in first.records("start")}) == 2, 20, "both workers busy"
    )
    first.wait_for(lambda: queue_stats(broker, "held")["in_flight"] > 2, 5, "prefetched messages")
    workers = first.worker_pids()
    assert len(workers) == 2

    first.process.kill()
    first.process.wait(5)
    wait_until(lambda: not any(alive(pid) for pid in workers), 5)
    assert not any(alive(pid) for pid in workers), first.failure("orphaned workers still run")

    second = start_pool("record", "-q", "held", "-p", "2", *FAST, name="second")
    finished = {r["content"] for r in first.records("end")}
    second.wait_for(
        lambda: finished | {r["content"] for r in second.records()} == set(contents),
        20,
        "every message handled by one pool or the other",
    )
    second.wait_for(lambda: settled(broker, "held"), 5, "the queue to settle")
    # What the first pool finished, it acked: the second one did not get it again.
    assert not finished & {r["content"] for r in second.records()}


def test_workers_of_a_killed_supervisor_exit_quietly(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    send(broker, "held", ["one"])
    pool = start_pool("slow", "-q", "held", *FAST, env={"POOL_SLEEP": "0.3"})
    pool.wait_for(lambda: pool.records("start"), 20, "the job to start")
    workers = pool.worker_pids()
    pool.process.kill()
    pool.process.wait(5)
    pool.wait_for(lambda: not any(alive(pid) for pid in workers), 5, "the worker to exit")
    assert "Traceback" not in pool.log(), pool.log()


def test_a_stuck_worker_does_not_outlive_its_killed_supervisor(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    send(broker, "stuck", ["forever"])
    pool = start_pool("spin", "-q", "stuck", *FAST)
    pool.wait_for(lambda: pool.records("start"), 20, "the job to start")
    workers = pool.worker_pids()
    try:
        pool.process.kill()
        pool.process.wait(5)
        wait_until(lambda: not any(alive(pid) for pid in workers), 3)
        assert not any(alive(pid) for pid in workers)
    finally:
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_killed_while_writing_its_slot_does_not_hang_the_supervisor(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    send(broker, "jobs", ["victim"])
    pool = start_pool("die_mid_publish", "-q", "jobs", *FAST)
    try:
        pool.wait_for(lambda: pool.records("start"), 20, "the job to start")
        pool.wait_for(lambda: pool.records("handled"), 5, "a new worker to handle it again")
    finally:
        pool.process.kill()  # a hung supervisor never acts on SIGTERM


@pytest.mark.parametrize("handler", ["slow", "async_slow"])
def test_sigterm_lets_running_jobs_finish_and_leaves_the_rest_queued(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess], handler: str
) -> None:
    contents = [f"work-{i:02d}" for i in range(40)]
    send(broker, "work", contents)
    pool = start_pool(
        handler, "-q", "work", "-p", "4", "--prefetch", "3", "--grace-seconds", "10", *FAST,
        env={"POOL_SLEEP": "0.3"},
    )  # fmt: skip
    pool.wait_for(lambda: len(pool.records("start")) >= 6, 20, "the second round of jobs")

    stopped_at = time.monotonic()
    pool.stop_gracefully(10)
    assert time.monotonic() - stopped_at < 5
    assert "pool stopped" in pool.log()

    starts = Counter(r["content"] for r in pool.records("start"))
    ends = Counter(r["content"] for r in pool.records("end"))
    assert starts == ends, "a job that started did not finish"
    assert max(ends.values()) == 1, "a message was handled twice"
    pool.wait_for(lambda: queue_stats(broker, "work")["in_flight"] == 0, 5, "held messages back")
    stats = queue_stats(broker, "work")
    assert stats["ready"] + len(ends) == 40, (stats, len(ends))
    assert stats["consumers"] == 0


@pytest.mark.parametrize("prefetch", ["1", "3"])
@pytest.mark.parametrize("handler", ["slow", "async_slow"])
def test_a_stopping_pool_starts_no_new_job_and_hands_back_the_rest_undelivered(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess], handler: str, prefetch: str
) -> None:
    """Issue 33, items 1 and 3: after SIGTERM each worker finishes the job it runs and starts
    no other, even one its window refilled with as it acked; the messages it held but never
    ran go back with their delivery count unchanged."""
    contents = [f"job-{i}" for i in range(6)]
    send(broker, "drain", contents)
    pool = start_pool(
        handler, "-q", "drain", "-p", "2", "--prefetch", prefetch, "--grace-seconds", "20",
        *FAST, env={"POOL_SLEEP": "1.5"},
    )  # fmt: skip
    pool.wait_for(lambda: len(pool.records("start")) >= 2, 20, "both workers running a job")
    stopped_at = time.time()
    pool.stop_gracefully(20)

    late = [r["content"] for r in pool.records("start") if r["time"] > stopped_at]
    assert late == [], pool.failure(f"jobs started after the stop: {late}")
    ran = {r["content"] for r in pool.records("end")}
    assert len(ran) == 2, pool.failure(f"ran {sorted(ran)}")
    assert broker.stats()["counters"]["redelivered"] == 0
    with broker.client() as client:
        back = {m.content.decode(): m.delivery_count for m in client.consume("drain", 10, 2)}
    assert back == dict.fromkeys(sorted(set(contents) - ran), 1), pool.failure(f"{back}")


def test_ctrl_c_stops_the_pool_gracefully_with_status_130(
    start_pool: Callable[..., PoolProcess],
) -> None:
    """docs/cli.md's exit codes: 130 after Ctrl-C (SIGINT), as for every command; SIGTERM
    (above) is a plain stop, 0."""
    pool = start_pool("record", "-q", "jobs", "-p", "2", *FAST)
    pool.wait_for(lambda: len(pool.worker_pids()) == 2, 20, "both workers")
    pool.process.send_signal(signal.SIGINT)
    try:
        status = pool.process.wait(20)
    except subprocess.TimeoutExpired:
        pytest.fail(pool.failure("the pool did not stop after Ctrl-C"))
    assert status == 130, pool.failure(f"exit status {status}")
    assert "pool stopped" in pool.log()


# --------------------------------------------------------------------------- weights


def test_queue_weights_share_the_jobs_when_every_queue_has_work(
    broker: BrokerProcess, start_pool: Callable[..., PoolProcess]
) -> None:
    send(broker, "a", [f"a{i:03d}" for i in range(200)])
    send(broker, "b", [f"b{i:03d}" for i in range(200)])
    pool = start_pool("paced", "-q", "a:3", "-q", "b:1", "--prefetch", "4", *FAST)

    pool.wait_for(lambda: len(pool.records()) >= 100, 30, "100 handled messages")

    first = Counter(record["queue"] for record in pool.records()[:100])
    assert first["b"], first
    assert 2 <= first["a"] / first["b"] <= 4, first


# --------------------------------------------------------------------------- command line


def test_a_malformed_broker_address_is_a_usage_error(
    start_pool: Callable[..., PoolProcess],
) -> None:
    pool = start_pool("record", "-q", "jobs", "--broker", "nonsense", *FAST)
    try:
        status = pool.process.wait(4)
    except subprocess.TimeoutExpired:
        pytest.fail(pool.failure("the pool still runs with the broker address 'nonsense'"))
    assert status == 2
    last = pool.log().strip().splitlines()[-1]
    assert last == (
        "phpmq: invalid value for '--broker': not a ZeroMQ address: 'nonsense'"
        " (see 'phpmq workers --help')"
    ), last


@pytest.mark.parametrize(
    ("handler", "says"),
    [
        ("no_such_module:run", "cannot import 'no_such_module'"),
        ("pool_tasks:no_such_function", "'pool_tasks' has no 'no_such_function'"),
        ("pool_tasks", "handler must be 'module:function'"),
        ("pool_tasks:LEAK_BYTES", "is not callable"),
        pytest.param(".pool_tasks:record", "pool_tasks"),
    ],
)
def test_a_bad_handler_path_fails_with_one_clear_line(handler: str, says: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "phpmq", "workers", handler, "-q", "jobs"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)])},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("phpmq: ") and says in lines[0], lines[0]
