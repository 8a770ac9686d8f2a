"""The durable store's WAL checkpoints, off the loop thread (docs/durability.md,
"Checkpoints and space")."""

from __future__ import annotations

import logging
import os
import sqlite3
import struct
import threading
import time
from pathlib import Path
from typing import Protocol

log = logging.getLogger("phpmq.broker")

_MX_FRAME = struct.Struct("=I")

#: The checkpoint thread copies the WAL into the database once it holds the store's
#: `checkpoint_bytes` (sized to the volume, broker/disk.py: each checkpoint syncs the
#: database beside the loop's WAL syncs, so fewer, larger ones cost less, but one may have to
#: grow the database by as much), or once nothing was written for this long (then it also
#: truncates the WAL to nothing).
CHECKPOINT_IDLE_S = 1.0
#: How often the checkpoint thread looks at the WAL's size.
CHECKPOINT_POLL_S = 0.05
#: PASSIVE checkpoints in a row, at most, while each still copies more than
#: CATCH_UP_FRAMES: what is left for the loop's hand-off (below) is then about one commit.
CHECKPOINT_CATCH_UP = 5
CATCH_UP_FRAMES = 256


class Store(Protocol):
    """What the checkpoint thread reads of the store (broker/durable.py's DurableStore)."""

    path: Path
    commits: int
    reclaims: int
    hand_off: bool
    checkpoint_bytes: int
    wal_limit_bytes: int

    @property
    def reclaimable(self) -> bool: ...

    def wal_bytes(self) -> int: ...


class Checkpointer(threading.Thread):
    """Copies the WAL into the database off the loop thread, with its own connection.

    PASSIVE checkpoints never take the writer's lock, so the loop's COMMIT never waits for
    one (they run side by side; SQLite releases the GIL while it works). Once little is left
    to copy it sets `store.hand_off`, and the loop copies the rest (about one commit) before
    its next transaction, which then starts the WAL over. Once the store has
    been idle for CHECKPOINT_IDLE_S, a TRUNCATE checkpoint empties the WAL file: it takes the
    writer's lock, but only after a PASSIVE one copied everything, so it holds it for a
    truncate() and does not wait for anyone (busy timeout 0: a busy store is simply tried
    again later)."""

    def __init__(self, store: Store) -> None:
        super().__init__(name="phpmq-checkpoint", daemon=True)
        self._store = store
        self._stopping = threading.Event()
        self._db: sqlite3.Connection | None = None
        self._shm: int | None = None
        self._page_size = 4096
        self.checkpoints = 0
        self.truncations = 0
        self.errors = 0
        self.longest_ms = 0.0

    def run(self) -> None:
        try:
            # Busy timeout 0: a checkpoint that would have to wait gives up and is retried.
            self._db = sqlite3.connect(self._store.path, isolation_level=None, timeout=0)
        except sqlite3.Error as exc:
            log.error("no WAL checkpoints (the WAL will grow): %s", exc)
            return
        try:
            self._page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
            self._watch()
        except sqlite3.Error as exc:
            log.error("no more WAL checkpoints (the WAL will grow): %s", exc)
        finally:
            self._db.close()
            if self._shm is not None:
                os.close(self._shm)

    def _watch(self) -> None:
        store = self._store
        writes = -1
        quiet_since = time.monotonic()
        while not self._stopping.wait(CHECKPOINT_POLL_S):
            now = time.monotonic()
            seen = store.commits + store.reclaims
            if seen != writes:
                writes, quiet_since = seen, now
            wal = self._wal_frames_bytes()
            idle = store.wal_bytes() > 0 and now - quiet_since >= CHECKPOINT_IDLE_S
            try:
                if wal >= store.checkpoint_bytes and not store.hand_off:
                    # Past the limit the loop copies what is left itself, however much (a
                    # longer hand-off, but a WAL that keeps to its budget).
                    store.hand_off = self._catch_up()
                elif idle:
                    busy, frames, copied = self._checkpoint("PASSIVE")
                    if not busy and frames == copied and not store.reclaimable:
                        self._truncate()
            except sqlite3.Error as exc:
                self.errors += 1
                if self.errors == 1 or self.errors % 1000 == 0:
                    log.warning("WAL checkpoint failed (will retry): %s", exc)

    def _wal_frames_bytes(self) -> int:
        """How much the WAL holds since it last started over. The file's size cannot say (it
        keeps its blocks up to the journal_size_limit): the WAL index's header can, read without a
        lock (mxFrame, a 32-bit native-order integer at offset 16 of the -shm file;
        sqlite.org/walformat.html). A torn read only moves a checkpoint by one poll."""
        try:
            if self._shm is None:
                self._shm = os.open(f"{self._store.path}-shm", os.O_RDONLY)
            header = os.pread(self._shm, 20, 0)
        except OSError:
            return self._store.wal_bytes()
        if len(header) < 20:
            return 0
        return _MX_FRAME.unpack_from(header, 16)[0] * self._page_size

    def _catch_up(self) -> bool:
        """PASSIVE checkpoints until one copies no more than CATCH_UP_FRAMES (what the loop
        committed while the one before ran). Returns whether that happened: the rest, about
        one commit, is then the loop's to copy (DurableStore._take_hand_off).

        A checkpoint copies the frames committed when it began, and the WAL can only start
        over (and shrink back to its journal_size_limit) at a write that begins when every
        frame is copied; the loop is mostly in the middle of a commit, so without the hand-off the
        WAL would grow for as long as the loop is busy."""
        done = -1
        for _ in range(CHECKPOINT_CATCH_UP):
            if self._wal_frames_bytes() >= self._store.wal_limit_bytes:
                return True  # the loop copies the rest: a checkpoint here would make it busy
            busy, _, copied = self._checkpoint("PASSIVE")
            if busy or copied < 0:
                return False
            if done >= 0 and (copied < done or copied - done <= CATCH_UP_FRAMES):
                return True  # little was added meanwhile (or the WAL started over)
            done = copied
            if self._stopping.is_set():
                break
        return False

    def _truncate(self) -> None:
        """The store is idle and the WAL all copied: empty the WAL file. TRUNCATE takes the
        writer's lock but has nothing to copy, so it holds it for a truncate() only; a
        write that comes meanwhile waits that long."""
        if not self._checkpoint("TRUNCATE")[0]:
            self.truncations += 1

    def _checkpoint(self, mode: str) -> tuple[int, int, int]:
        """(busy, frames in the WAL, frames copied), as SQLite reports them."""
        assert self._db is not None
        started = time.perf_counter()
        result = self._db.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        self.longest_ms = max(self.longest_ms, (time.perf_counter() - started) * 1000)
        self.checkpoints += 1
        return result

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join()
