"""What the overload benchmarks (flood, memory, steady) measure around a broker process: its
resident memory read from /proc, latency percentiles, and the size of a durable data dir.

Linux only for RSS (/proc/PID/status); elsewhere a sample is None and tables print "-".
"""

from __future__ import annotations

import contextlib
import threading
import time
from array import array
from pathlib import Path

MB = 1024 * 1024
#: The files of a durable broker's store (`--data-dir`).
DATA_FILES = ("phpmq.sqlite3", "phpmq.sqlite3-wal", "phpmq.sqlite3-shm")


def rss_bytes(pid: int) -> int | None:
    """The resident set size of process `pid` (VmRSS), or None if it cannot be read (the
    process is gone, or this is not Linux)."""
    return _proc_kb_field(f"/proc/{pid}/status", b"VmRSS:")


def pss_bytes(pid: int) -> int | None:
    """The proportional set size of `pid`: its RSS with each page it shares with N processes
    counted 1/N (forked workers share most of theirs); None if it cannot be read."""
    return _proc_kb_field(f"/proc/{pid}/smaps_rollup", b"Pss:")


def _proc_kb_field(path: str, field: bytes) -> int | None:
    """The value in bytes of the `field` line (in kB) of a /proc file; None if unreadable."""
    try:
        with open(path, "rb") as lines:
            for line in lines:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def mb(value: float | None) -> str:
    """Bytes as MB for a table cell; "-" for no reading."""
    return "-" if value is None else f"{value / MB:,.1f} MB"


class RssSampler:
    """Samples the RSS of `pid` every `interval` seconds on a daemon thread while in a `with`
    block: `samples` holds (seconds since start, bytes); `peak`, `low` and `last` read them."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss {pid}", daemon=True)

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def sample(self) -> int | None:
        rss = rss_bytes(self.pid)
        if rss is not None:
            self.samples.append((time.monotonic() - self.started, rss))
        return rss

    @property
    def peak(self) -> int | None:
        return max((rss for _, rss in self.samples), default=None)

    @property
    def low(self) -> int | None:
        return min((rss for _, rss in self.samples), default=None)

    @property
    def last(self) -> int | None:
        return self.samples[-1][1] if self.samples else None

    def between(self, start: float, end: float) -> list[int]:
        """The samples taken from `start` to `end` seconds after the sampler started."""
        return [rss for at, rss in self.samples if start <= at < end]

    def __enter__(self) -> RssSampler:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()


def percentiles(latencies_ns: array | list[int], *points: float) -> dict[str, float | None]:
    """`p50`, `p99`, ... (one key per point, e.g. 0.999 -> "p99.9") and `max`, in ms; None
    for each when there are no latencies."""
    ordered = sorted(latencies_ns)
    names = [f"p{point * 100:g}" for point in points]
    if not ordered:
        return {**dict.fromkeys(names), "max": None}
    result: dict[str, float | None] = {
        name: ordered[min(len(ordered) - 1, int(len(ordered) * point))] / 1e6
        for name, point in zip(names, points, strict=True)
    }
    result["max"] = ordered[-1] / 1e6
    return result


def ms(value: float | None) -> str:
    """Milliseconds for a table cell; "-" for no reading."""
    return "-" if value is None else f"{value:,.2f} ms"


def data_dir_bytes(data_dir: str | Path) -> int:
    """The size of a durable broker's store: its SQLite file, WAL and shared memory file."""
    total = 0
    for name in DATA_FILES:
        with contextlib.suppress(FileNotFoundError):
            total += (Path(data_dir) / name).stat().st_size
    return total


def verdict(value: float | None, target: float) -> str:
    """The verdict "met" or "missed" for a figure against an upper bound; "-" without a figure."""
    if value is None:
        return "-"
    return "met" if value <= target else "missed"


class SeenSequence:
    """Which sequence numbers a consumer has received (a bit per number, grown as needed):
    tells a first delivery from a duplicate."""

    __slots__ = ("_seen", "duplicates")

    def __init__(self) -> None:
        self._seen = bytearray()
        self.duplicates = 0

    def first_time(self, seq: int) -> bool:
        """True the first time `seq` is seen; after that, counts a duplicate."""
        seen = self._seen
        if seq >= len(seen):
            seen.extend(bytes(seq + 1 - len(seen) + 65536))
        if seen[seq]:
            self.duplicates += 1
            return False
        seen[seq] = 1
        return True
