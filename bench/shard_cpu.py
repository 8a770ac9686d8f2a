"""What the shard benchmarks read of a sharded broker's processes: their pids (from the
supervisor's log) and the CPU each has used (from /proc)."""

from __future__ import annotations

import os

from ..broker.shell.shards import started_pids
from ..testing import BrokerProcess

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def shard_pids(broker: BrokerProcess, shards: int) -> list[int]:
    if shards == 1:
        return [broker.process.pid]
    found = started_pids(broker.log())
    return [found[f"local/{index}"] for index in range(shards)]
