"""One broker per data directory: an exclusive `flock` on `phpmq.lock` in it, held for the
store's life (docs/durability.md, "One broker per directory").

The kernel releases the lock when its holder dies, even by `kill -9`, so a stale lock file
never keeps a broker out; the pid written in it only names the holder for the error message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_NAME = "phpmq.lock"


class DataDirInUse(Exception):
    """Another process holds the data directory's lock."""


class DataDirLock:
    """The exclusive lock of one data directory, taken at construction.

    Raises:
        DataDirInUse: another process holds it (the message names its pid when known).
        OSError: the lock file cannot be opened.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_NAME
        # O_CLOEXEC (Python's default): a child process never inherits the lock.
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            self.release()
            raise DataDirInUse(
                f"the data directory {directory} is in use by another broker ({holder});"
                " stop it first, or give this one its own --data-dir"
            ) from None
        self._write_pid()

    def _holder(self) -> str:
        assert self._fd is not None
        with contextlib.suppress(OSError, ValueError):
            return f"pid {int(os.pread(self._fd, 32, 0).decode().strip())}"
        return "pid unknown"

    def _write_pid(self) -> None:
        """Write this process's pid over the last holder's. Only informative: on a full disk
        the old pid may stay, and the lock holds all the same."""
        text = f"{os.getpid()}\n".encode()
        assert self._fd is not None
        with contextlib.suppress(OSError):
            os.pwrite(self._fd, text, 0)
            os.ftruncate(self._fd, len(text))

    def release(self) -> None:
        """Closing the descriptor releases the lock; the file stays (removing it would let a
        broker lock a file that a third one is about to replace)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
