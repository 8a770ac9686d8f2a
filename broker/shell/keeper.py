"""What keeps the durable store writing through a full disk (docs/durability.md, "Disk
space"): the volume's floor (sends refused with 507 under `min_free_disk`), the reserve file
given up when a write fails for want of space, the operations a failed commit left (written
first at every later commit), and, at a stop that still cannot write them, a file they are
kept in and written from at the next start.

The server asks it once per turn to `commit` the turn's journal; `problem` is then the reason
sends are refused, or None.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter
from typing import Any

import msgspec

from ..config import BrokerConfig
from ..journal import BACK, DEAD, DELAY, DROP, PUT, UNDEAD
from .disk import DiskFloor, free_and_total, min_free_bytes
from .durable import DurableStore, StorageError

log = logging.getLogger("phpmq.broker")

#: Operations a stop could not write, kept beside the store until a start writes them.
LEFT_OVER_NAME = "phpmq.unwritten"
#: A stop retries a failing store this often while it waits for it.
RETRY_S = 0.1
#: Operations per transaction when a full disk made the turn's one transaction fail.
SLICE_OPERATIONS = 64
#: After a failed attempt to allocate the reserve, the next waits this long.
RESERVE_RETRY_S = 10.0
#: Message IDs a stop that could keep its operations nowhere names in its log, at most...
NAMED_IDS = 1000
#: ...found at this place of each operation that concerns one message.
_ID_AT = {PUT: 1, BACK: 1, DELAY: 1, DROP: 1, DEAD: 2, UNDEAD: 2}


class StoreKeeper:
    """The durable store, kept writing (or told why not) as disk space comes and goes.

    Raises:
        StorageError: the data directory cannot be opened (in use, unreadable).
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.store = store = DurableStore(config.data_dir)
        directory = store.directory
        self.left_over = directory / LEFT_OVER_NAME
        total = free_and_total(directory)[1]
        self.floor = DiskFloor(directory, min_free_bytes(config.min_free_disk, total))
        #: Operations no commit has written yet, oldest first: written before any others.
        self.unwritten: list[tuple] = []
        #: Why the last commit failed (None: it did not).
        self.write_failure: str | None = None
        self.write_errors = 0
        #: When the reserve may be allocated again after an attempt failed.
        self._retry_at = 0.0
        #: A left-over file was read: removed once its operations are written.
        self._left_over_read = False
        self._read_left_over()
        self.watch()

    # ------------------------------------------------------------------ start

    def _read_left_over(self) -> None:
        """Operations the last stop could not write come first. Written now if the store
        can; if not, the recovery reads the store with them applied (read_with) and they
        stay first in line, so what it loads is what they say."""
        try:
            operations = [tuple(op) for op in msgspec.msgpack.decode(self.left_over.read_bytes())]
        except FileNotFoundError:
            return
        except (OSError, msgspec.DecodeError, TypeError) as exc:
            self.store.close()
            raise StorageError(
                f"cannot read {self.left_over} (operations the last stop could not write):"
                f" {exc}; move it away to start without them"
            ) from None
        self._left_over_read = True
        log.warning(
            "%d operations the last stop could not write are in %s", len(operations), self.left_over
        )
        if self.commit(operations):
            log.info("wrote the %d operations of %s", len(operations), self.left_over)
            return
        try:
            self.store.read_with(operations)
        except StorageError:
            self.store.close()
            raise

    # ------------------------------------------------------------------ every turn

    @property
    def problem(self) -> str | None:
        """Why sends are refused now (None: they are not)."""
        if self.write_failure is not None:
            return f"storage unavailable: {self.write_failure}"
        if self.store.read_only:
            return f"storage unavailable: the store is read-only ({self.store.unopened})"
        return self.floor.reason() if self.floor.low else None

    def commit(self, operations: list[tuple]) -> bool:
        """Write what earlier commits left, then `operations`; what cannot be written is
        kept for the next call. Measures the free space first. Whether nothing is left
        unwritten."""
        self.watch()
        pending = self.unwritten + operations if self.unwritten else operations
        if not pending:
            self.store.try_open()  # read-only (a full disk): is there room again?
            return True
        self.unwritten, failure = self._write(pending)
        if failure is not None:
            self.write_errors += 1
            if self.write_failure is None:
                log.error("storage write failed, refusing sends until it recovers: %s", failure)
            self.write_failure = str(failure)
            return False
        if self.write_failure is not None:
            log.warning("storage writes again (%d pending operations written)", len(pending))
            self.write_failure = None
        if self._left_over_read:
            self._left_over_read = False
            with contextlib.suppress(OSError):
                self.left_over.unlink()
        return True

    def _write(self, operations: list[tuple]) -> tuple[list[tuple], StorageError | None]:
        """Write `operations` in one transaction; failing that (a full disk), again with the
        room the reserve gives, then in slices, each after a checkpoint of its own, so that
        the WAL starts over in the room it has instead of growing. What is left, and why
        (nothing and None: all written)."""
        store = self.store
        try:
            store.commit(operations)
            return [], None
        except StorageError as exc:
            failure = exc
        if store.read_only:
            return operations, failure
        if store.reserve.release():
            try:
                store.commit(operations)
                return [], None
            except StorageError as exc:
                failure = exc
        for start in range(0, len(operations), SLICE_OPERATIONS):
            try:
                store.commit(operations[start : start + SLICE_OPERATIONS], copy_first=True)
            except StorageError as exc:
                return operations[start:], exc
        return [], None

    def watch(self) -> None:
        """Read the free space: the floor's state, and the reserve held again once the
        volume can spare it."""
        floor = self.floor
        floor.measure()
        self.store.room_above_floor(floor.free - floor.floor)
        reserve = self.store.reserve
        if reserve.held or self.write_failure is not None or time.monotonic() < self._retry_at:
            return
        if floor.free - reserve.size >= floor.resume_at and not reserve.hold():
            self._retry_at = time.monotonic() + RESERVE_RETRY_S

    # ------------------------------------------------------------------ stop

    def settle(self, seconds: float) -> bool:
        """At a stop: retry what is left unwritten for up to `seconds` (the checkpoint
        thread may free space meanwhile). Whether it was all written."""
        deadline = time.monotonic() + seconds
        if self.unwritten and self.store.reserve.release(keep_last=False):
            self.commit([])
        while self.unwritten:
            if time.monotonic() >= deadline:
                return False
            time.sleep(RETRY_S)
            self.commit([])
        return True

    def close(self) -> None:
        """Close the store; what is still unwritten goes to the left-over file, written at
        the next start, or, where that cannot be written either, is named in the log."""
        if self.unwritten:
            self._keep_left_over(self.unwritten)
        self.store.close()

    def _keep_left_over(self, operations: list[tuple]) -> None:
        temporary = self.left_over.with_suffix(".tmp")
        try:
            with open(temporary, "wb") as file:
                file.write(msgspec.msgpack.encode(operations))
                file.flush()
                os.fsync(file.fileno())
            temporary.replace(self.left_over)
            directory = os.open(self.left_over.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            self._name_losses(operations, exc)
            return
        log.warning(
            "the store could not write %d operations (%s): kept in %s, written at the next start",
            len(operations),
            _kinds(operations),
            self.left_over,
        )

    @staticmethod
    def _name_losses(operations: list[tuple], why: OSError) -> None:
        ids = [op[_ID_AT[op[0]]].decode(errors="replace") for op in operations if op[0] in _ID_AT]
        log.error(
            "exiting with %d operations neither the store nor %s could keep (%s): %s; after a"
            " restart these messages are as the store last wrote them (acked ones come back;"
            " IDs%s): %s",
            len(operations),
            LEFT_OVER_NAME,
            _kinds(operations),
            why,
            f", the first {NAMED_IDS}" if len(ids) > NAMED_IDS else "",
            " ".join(ids[:NAMED_IDS]),
        )

    # ------------------------------------------------------------------ reporting

    def stats(self) -> dict[str, Any]:
        floor, reserve = self.floor, self.store.reserve
        return {
            **self.store.stats(),
            "disk_free_bytes": floor.free,
            "disk_total_bytes": floor.total,
            "min_free_disk_bytes": floor.floor,
            "disk_low": floor.low,
            "disk_lows": floor.lows,
            "reserve_bytes": reserve.size if reserve.held else 0,
            "reserve_releases": reserve.releases,
            "write_errors": self.write_errors,
            "unwritten_operations": len(self.unwritten),
        }


def _kinds(operations: list[tuple]) -> str:
    """How many operations of each journal kind, e.g. "750 ack, 6 put"."""
    counts = Counter(op[0] for op in operations)
    return ", ".join(f"{count} {kind}" for kind, count in counts.most_common())
