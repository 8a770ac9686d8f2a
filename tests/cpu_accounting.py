"""Each test's CPU time, with that of every process it started (`PHPMQ_TEST_CPU=FILE`): where
the suite's CPU goes on a machine it keeps busy (issue #29). Off by default.

A test's CPU is the pytest process's own (its threads: clients, helpers) and its descendants':
those reaped during the test (RUSAGE_CHILDREN) and those still alive, read from /proc (a
worker's shared Spark JVM lives across tests). One JSON line per test is appended to FILE;
`python tests/cpu_accounting.py FILE` sums them by file and lists the costliest tests.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def _descendants_cpu() -> float:
    """CPU seconds of the live processes below this one (each one's own, not its children's)."""
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
        spent[pid] = (int(fields[11]) + int(fields[12])) / _TICKS
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


def record(path: str, nodeid: str, before: tuple[float, float], after: tuple[float, float]) -> None:
    line = {"test": nodeid, "own": after[0] - before[0], "children": after[1] - before[1]}
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")


def report(path: str, top: int = 40) -> None:
    tests = [json.loads(line) for line in Path(path).read_text().splitlines()]
    by_file: collections.Counter[str] = collections.Counter()
    for test in tests:
        by_file[test["test"].split("::")[0]] += test["own"] + test["children"]
    total = sum(by_file.values())
    print(f"{len(tests)} tests, {total:.0f} CPU seconds")
    for name, spent in by_file.most_common(top):
        print(f"{spent:8.1f}  {name}")
    print("--- costliest tests (own + children)")
    for test in sorted(tests, key=lambda t: -(t["own"] + t["children"]))[:top]:
        print(f"{test['own'] + test['children']:7.1f} {test['own']:6.1f}  {test['test']}")


if __name__ == "__main__":
    report(sys.argv[1])
