"""A worker's job slot: shared memory the worker writes and the supervisor reads.

Per job the worker writes what it runs (message id, delivery count, deadline) and, when done,
bumps an outcome counter: a few stores, no system call, no wake-up of the supervisor, which
reads every slot on its own tick. (A pipe message per job capped a 1-process pool near 10k
jobs/s.) One writer, one reader: a sequence number that is odd while the worker writes lets the
reader retry instead of seeing half a record (a seqlock).
"""

from __future__ import annotations

import struct
from multiprocessing.context import SpawnContext
from typing import Any

#: seq, deliveries, acked, retried, dead (int64); deadline, started (monotonic, float64);
#: then the message id.
_LAYOUT = struct.Struct("<qqqqqdd32s")
_SEQ = struct.Struct("<q")
_TAIL = struct.Struct("<qqqqdd32s")
SEQ, DELIVERIES, ACKED, RETRIED, DEAD, DEADLINE, STARTED, MESSAGE_ID = range(8)
OUTCOME_FIELDS = {"acked": ACKED, "retried": RETRIED, "dead": DEAD}
#: Reads of a record being written before the reader gives up waiting for the writer.
READ_ATTEMPTS = 1000


class JobSlot:
    def __init__(self, context: SpawnContext) -> None:
        self._memory: Any = context.RawArray("b", _LAYOUT.size)
        self._view = memoryview(self._memory).cast("B")
        self._record: list[Any] = [0, 0, 0, 0, 0, 0.0, 0.0, b""]

    def __getstate__(self) -> dict[str, Any]:
        return {"_memory": self._memory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._memory = state["_memory"]
        self._view = memoryview(self._memory).cast("B")
        self._record = list(_LAYOUT.unpack_from(self._view))

    # ------------------------------------------------------------------ the worker writes

    def begin(self, message_id: str, deliveries: int, deadline: float, started: float) -> None:
        record = self._record
        record[DELIVERIES] = deliveries
        record[DEADLINE] = deadline
        record[STARTED] = started
        record[MESSAGE_ID] = message_id.encode()
        self._publish()

    def end(self, outcome: str) -> None:
        record = self._record
        record[OUTCOME_FIELDS[outcome]] += 1
        record[MESSAGE_ID] = b""
        self._publish()

    def _publish(self) -> None:
        record = self._record
        view = self._view
        record[SEQ] += 1  # odd: being written
        _SEQ.pack_into(view, 0, record[SEQ])
        _TAIL.pack_into(view, _SEQ.size, *record[1:])
        record[SEQ] += 1  # even: consistent again, written last
        _SEQ.pack_into(view, 0, record[SEQ])

    # ------------------------------------------------------------------ the supervisor reads

    def read(self) -> tuple[Any, ...]:
        """A consistent copy of the record: (seq, deliveries, acked, retried, dead, deadline,
        started, message id); message id b"" when the worker runs nothing."""
        view = self._view
        for _ in range(READ_ATTEMPTS):
            record = _LAYOUT.unpack_from(view)
            if record[SEQ] % 2 == 0 and _LAYOUT.unpack_from(view)[SEQ] == record[SEQ]:
                return record
        # Still odd: the worker died between its writes (SIGKILL). Nobody will finish the
        # record; take it as it is rather than wait forever.
        return record
