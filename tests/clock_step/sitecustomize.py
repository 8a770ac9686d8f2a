"""A wall clock that steps, for the clock-step test (tests/test_replication.py): put this
folder on PYTHONPATH with PHPMQ_TEST_CLOCK_OFFSET_FILE naming a file that holds an offset
in seconds; `time.time()` and `time.time_ns()` of the process (and of the processes it
spawns) then run that far off, read again every 0.2 s. The monotonic clocks are left alone,
as NTP stepping the wall clock leaves them. (libfaketime cannot do this: with the monotonic
clock left real, its sleep fails with EINVAL.)"""

from __future__ import annotations

import os
import time

_PATH = os.environ.get("PHPMQ_TEST_CLOCK_OFFSET_FILE")

if _PATH:
    _real_time, _real_time_ns, _monotonic = time.time, time.time_ns, time.monotonic
    _read_at = [-1.0]
    _offset = [0.0]

    def _current_offset() -> float:
        now = _monotonic()
        if now - _read_at[0] >= 0.2:
            _read_at[0] = now
            try:
                with open(_PATH) as source:
                    _offset[0] = float(source.read().strip() or 0)
            except (OSError, ValueError):
                pass
        return _offset[0]

    def _time() -> float:
        return _real_time() + _current_offset()

    def _time_ns() -> int:
        return _real_time_ns() + int(_current_offset() * 1e9)

    time.time = _time
    time.time_ns = _time_ns
