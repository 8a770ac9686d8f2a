"""Each test's CPU time, with that of every process it started (`TEST_CPU_LOG=FILE`): where
the suite's CPU goes on a machine it keeps busy (issue #29). Off by default.

A test's CPU is the pytest process's own (its threads: clients, helpers) and its descendants':
those reaped during the test (RUSAGE_CHILDREN) and those still alive, read from /proc (a
worker's shared Spark JVM lives across tests). One JSON line per test is appended to FILE, with
its worker's pid and its start and end on CLOCK_MONOTONIC; `python tests/cpu_accounting.py
FILE` sums them by file and lists the costliest tests.

Processes that outlive their parent (a replica whose forkserver exits first) are lost to
RUSAGE_CHILDREN. For an exact count, run the suite under `perf record -a -k CLOCK_MONOTONIC
-e cpu-clock -F 49` and give `perf script --show-task-events -F comm,pid,tid,time`'s output
as a second argument: each sample then counts for the test its process descends from (by
the fork events, which survive re-parenting), running on that worker at that moment.
"""

from __future__ import annotations

import collections
import json
import os
import re
import resource
import sys
import time
from collections.abc import Mapping
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def _descendants_cpu() -> float:
    """CPU seconds of the live processes below this one: each one's own and that of the
    children it reaped (the pytest process's own reaped ones are RUSAGE_CHILDREN)."""
    parents: dict[int, int] = {}
    spent: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        # Its own CPU and its reaped children's: a forker's brokers, a forkserver's replicas.
        spent[pid] = sum(int(field) for field in fields[11:15]) / _TICKS
    below = {os.getpid()}
    total = 0.0
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in below and pid not in below:
                below.add(pid)
                total += spent[pid]
                grew = True
    return total


def cpu_now() -> tuple[float, float]:
    """(this process's CPU, its descendants' CPU: reaped and alive), in seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime + _descendants_cpu()


def record(
    path: str, nodeid: str, before: tuple[float, float], after: tuple[float, float], start: float
) -> None:
    line = {
        "test": nodeid,
        "own": after[0] - before[0],
        "children": after[1] - before[1],
        "worker": os.getpid(),
        "start": start,
        "end": time.monotonic(),
    }
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")


def _by_file(per_test: Mapping[str, float]) -> collections.Counter[str]:
    """The tests' figures summed by the file (or document) each test is in."""
    by_file: collections.Counter[str] = collections.Counter()
    for test, spent in per_test.items():
        by_file[test.split("::")[0]] += spent
    return by_file


def report(path: str, top: int = 40) -> None:
    tests = [json.loads(line) for line in Path(path).read_text().splitlines()]
    by_file = _by_file({test["test"]: test["own"] + test["children"] for test in tests})
    total = sum(by_file.values())
    print(f"{len(tests)} tests, {total:.0f} CPU seconds")
    for name, spent in by_file.most_common(top):
        print(f"{spent:8.1f}  {name}")
    print("--- costliest tests (own + children)")
    for test in sorted(tests, key=lambda t: -(t["own"] + t["children"]))[:top]:
        print(f"{test['own'] + test['children']:7.1f} {test['own']:6.1f}  {test['test']}")


_FORK = re.compile(r"PERF_RECORD_FORK\((\d+):\d+\):\((\d+):\d+\)")
_SAMPLE = re.compile(r"^\s*(.+?)\s+(\d+)/\d+\s+([\d.]+):\s*$")


def from_perf(path: str, perf_script: str, top: int = 40) -> None:
    """Each test's share of the perf samples (see the module's docstring), by file and test,
    and the samples no test's processes took (by command)."""
    tests = [json.loads(line) for line in Path(path).read_text().splitlines()]
    by_worker: dict[int, list[dict]] = collections.defaultdict(list)
    for test in tests:
        by_worker[test["worker"]].append(test)
    parent: dict[int, int] = {}
    per_test: collections.Counter[str] = collections.Counter()
    per_comm: collections.Counter[str] = collections.Counter()
    outside: collections.Counter[str] = collections.Counter()
    samples = 0
    with open(perf_script, errors="replace") as lines:
        for line in lines:
            fork = _FORK.search(line)
            if fork:
                child, mother = int(fork[1]), int(fork[2])
                if child != mother:
                    parent[child] = mother
                continue
            sample = _SAMPLE.match(line)
            if not sample or sample[1] == "swapper":
                continue
            samples += 1
            test = _test_at(int(sample[2]), float(sample[3]), parent, by_worker)
            if test is None:
                outside[sample[1]] += 1
            else:
                per_test[test] += 1
                per_comm[sample[1]] += 1
    seconds = 1 / 49  # one sample per CPU every 1/49 s
    by_file = _by_file(per_test)
    print(f"{samples} samples ({samples * seconds:.0f} CPU s); in tests {sum(per_test.values())}")
    for name, count in by_file.most_common(top):
        print(f"{count * seconds:8.1f}  {name}")
    print("--- costliest tests")
    for name, count in per_test.most_common(top):
        print(f"{count * seconds:8.1f}  {name}")
    print(
        "--- in tests, by command:", [(c, round(n * seconds)) for c, n in per_comm.most_common(8)]
    )
    print("--- outside tests:", [(c, round(n * seconds)) for c, n in outside.most_common(8)])


def _test_at(
    pid: int, when: float, parent: dict[int, int], by_worker: dict[int, list[dict]]
) -> str | None:
    seen = 0
    while pid not in by_worker and pid in parent and seen < 64:
        pid, seen = parent[pid], seen + 1
    for test in by_worker.get(pid, ()):
        if test["start"] <= when <= test["end"]:
            return str(test["test"])
    return None


if __name__ == "__main__":
    if len(sys.argv) > 2:
        from_perf(sys.argv[1], sys.argv[2])
    else:
        report(sys.argv[1])
