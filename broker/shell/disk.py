"""Disk space as a resource of the durable store (docs/durability.md, "Disk space"), the way
`max_memory` makes memory one: what the volume of the data directory has free, the floor
below which sends are refused, the WAL's byte budget sized to the volume, and a reserve file
given up when a write fails for want of space.

Reading the free space is one statvfs (about 1.5 us), done once per loop turn.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from ..config import AUTO, byte_size

log = logging.getLogger("phpmq.broker")

MIB = 1024 * 1024
#: The WAL is checkpointed once it holds this share of the volume, within the bounds below:
#: a checkpoint may have to grow the database by as much, so on a small volume it must be
#: small, and on a big one it is the size that costs the loop least (docs/durability.md).
WAL_SHARE = 32
MIN_CHECKPOINT_BYTES = 1 * MIB
MAX_CHECKPOINT_BYTES = 16 * MIB
#: The WAL is kept under this many checkpoints' worth: past it the loop copies it itself
#: before its next write, which then starts it over (and cuts the file back to this size).
WAL_LIMIT_CHECKPOINTS = 2
#: "auto" floor: room for this many checkpoints' worth, or this share of the volume...
AUTO_FLOOR_CHECKPOINTS = 4
AUTO_FLOOR_SHARE = 50
#: ...at most this much.
AUTO_FLOOR_MAX = 1024 * MIB
#: Sends are taken again once the free space is the floor plus this share of it.
RESUME_SHARE = 4
RESERVE_NAME = "phpmq.reserve"
#: The reserve's last part, kept for a stop: this share of it, at least RESERVE_LAST_MIN.
RESERVE_LAST_SHARE = 4
RESERVE_LAST_MIN = 256 * 1024
#: At most one notice of the disk going under its floor per this many seconds.
NOTICE_EVERY_S = 60.0


def free_and_total(directory: Path) -> tuple[int, int]:
    """Bytes free (for an unprivileged writer) and in all on the volume of `directory`."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize


def checkpoint_bytes(total: int) -> int:
    """The WAL's budget on a volume of `total` bytes: checkpointed past this, and cut back to
    twice this when it starts over."""
    return min(max(total // WAL_SHARE, MIN_CHECKPOINT_BYTES), MAX_CHECKPOINT_BYTES)


def min_free_bytes(setting: int | str, total: int) -> int:
    """The floor `min_free_disk` sets on a volume of `total` bytes."""
    if setting == AUTO:
        room = AUTO_FLOOR_CHECKPOINTS * checkpoint_bytes(total)
        return min(max(room, total // AUTO_FLOOR_SHARE), AUTO_FLOOR_MAX)
    return byte_size("min_free_disk", setting, lambda: total)


def _mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"


class Reserve:
    """A file of `size` bytes kept in the data directory while space allows, and given back
    the moment the store cannot write for want of space (a failed commit, a start or a stop
    on a full disk): that much room for the acks, the checkpoint and the operations a stop
    must keep, even when something else filled the volume. A running broker gives up all but
    its `last` part; a stop that still has something to write, or a start that cannot open
    the store, gives up the rest. A file system that does not really allocate (compression,
    copy-on-write) makes it an empty promise: docs/durability.md."""

    def __init__(self, directory: Path, size: int) -> None:
        self.path = directory / RESERVE_NAME
        self.size = size
        self.last = min(size, max(size // RESERVE_LAST_SHARE, RESERVE_LAST_MIN))
        self.releases = 0
        try:
            self.held_bytes = self.path.stat().st_size
        except OSError:
            self.held_bytes = 0

    @property
    def held(self) -> bool:
        return self.held_bytes >= self.size

    def hold(self) -> bool:
        """Allocate the whole file; whether it is now held."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError:
            return False
        try:
            os.posix_fallocate(fd, 0, self.size)
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):  # what it did allocate goes back
                os.ftruncate(fd, self.held_bytes)
            return False
        finally:
            os.close(fd)
        self.held_bytes = self.size
        return True

    def release(self, keep_last: bool = True) -> bool:
        """Give the file's room back to the volume, all but its last part if `keep_last`;
        whether that freed anything."""
        keep = self.last if keep_last else 0
        if self.held_bytes <= keep:
            return False
        try:
            if keep:
                os.truncate(self.path, keep)
            else:
                self.path.unlink()
        except OSError:
            return False
        freed, self.held_bytes = self.held_bytes - keep, keep
        self.releases += 1
        log.warning("the disk is full: gave up %s of the reserve %s", _mib(freed), self.path)
        return True


class DiskFloor:
    """Whether the volume is below `min_free_disk`: then sends are refused until it has a
    quarter more than that free again (the hysteresis keeps sends from flapping)."""

    def __init__(self, directory: Path, floor: int) -> None:
        self.directory = directory
        self.floor = floor
        self.resume_at = floor + floor // RESUME_SHARE
        self.free = 0
        self.total = 0
        #: Below the floor and not yet back over the resume mark.
        self.low = False
        #: Times the volume went below the floor.
        self.lows = 0
        #: Notices of the floor are rate-limited: the next is due then; those left out, and
        #: the level of the "taken again" line that follows the last low.
        self._notice_at = 0.0
        self._quiet = 0
        self._level = logging.INFO

    def measure(self) -> None:
        """Read the free space, and whether the volume is under the floor now."""
        try:
            self.free, self.total = free_and_total(self.directory)
        except OSError:
            return  # the volume went away: the next commit says so
        if self.low and self.free >= self.resume_at:
            self.low = False
            log.log(self._level, "%s free on %s: sends are taken again", _mib(self.free), self)
        elif not self.low and self.free < self.floor:
            self.low = True
            self.lows += 1
            now = time.monotonic()
            if now >= self._notice_at:
                # At the edge a drain and a producer may take it over and under many times a
                # second: one notice a minute, with the count of the quiet ones.
                self._notice_at = now + NOTICE_EVERY_S
                quiet, self._quiet = self._quiet, 0
                again = f" (under the floor {quiet} more times since the last notice)"
                log.warning("%s%s", self.reason(), again if quiet else "")
                self._level = logging.INFO
            else:
                self._quiet += 1
                self._level = logging.DEBUG

    def __str__(self) -> str:
        return f"the volume of {self.directory}"

    def reason(self) -> str:
        return (
            f"disk space low: {_mib(self.free)} free on {self}, under"
            f" min_free_disk {_mib(self.floor)}: sends are refused until {_mib(self.resume_at)}"
            " are free"
        )
