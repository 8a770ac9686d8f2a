"""Acks a batch's leases right after Spark has committed it, in the driver's own process.

The source runner acks a batch when Spark plans the next one (`latestOffset(start)`), which
never comes for `trigger(once=True)`. Spark posts a query's progress after the batch's commit
log is written, so `pipeline.register(spark)` adds this listener: on each progress report it
commits the leases named in the phpmq sources' `endOffset`. Committing is idempotent, so the
runner committing the same leases later changes nothing. Errors are logged, never raised: the
runner commits the leases anyway when the query next plans a batch.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from ..client import ClientError
from .broker_link import BrokerLink, SourceError
from .lease_offsets import LeaseOffset
from .options import CurveFiles

log = logging.getLogger("phpmq.pipeline")

#: How long the listener waits for the broker, in milliseconds (the runner waits longer).
LISTENER_TIMEOUT_MS = 10_000
#: After a broker failed to answer, the listener leaves it alone this long: Spark runs the
#: listeners one event after another, so each wait would hold back every later event of
#: every query, and its stop (which waits for them); the runner commits the leases anyway.
UNREACHABLE_PAUSE_S = 60.0
#: Brokers remembered as unreachable (past it, the list starts over).
MAX_UNREACHABLE = 100
#: broker address -> when the listener may try it again.
_unreachable: dict[str, float] = {}


class LeaseCommitter(StreamingQueryListener):
    """Commits the leases of every phpmq batch a query finished (with these CURVE keys, else
    PHPMQ_CURVE_* if set)."""

    def __init__(self, curve: CurveFiles | None = None) -> None:
        super().__init__()
        self._curve = curve

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = event.progress
        if not progress.numInputRows:
            return
        for source in progress.sources:
            commit_finished(source.endOffset, self._curve)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass


def commit_finished(end_offset: str | None, curve: CurveFiles | None = None) -> int:
    """Commit the leases of a finished batch, given its end offset as Spark reports it;
    returns how many leases were committed (0 for another source's offset)."""
    try:
        offset = LeaseOffset.from_json(json.loads(end_offset or "null"))
    except (ValueError, TypeError):
        return 0
    leased = offset.leased()
    broker = offset.broker
    if not leased or not broker or _unreachable.get(broker, 0.0) > time.monotonic():
        return 0
    try:
        with BrokerLink(broker, "spark-listener", LISTENER_TIMEOUT_MS, curve) as link:
            for queue in leased:
                link.call("lease-commit", queue=queue, lease=offset.lease_name)
    except (ClientError, SourceError) as exc:
        if len(_unreachable) >= MAX_UNREACHABLE:
            _unreachable.clear()
        _unreachable[broker] = time.monotonic() + UNREACHABLE_PAUSE_S
        log.warning(
            "phpmq: could not commit lease %s yet (the query commits it when it plans its next"
            " batch; this listener leaves %s alone for %.0f s): %s",
            offset.lease_name, broker, UNREACHABLE_PAUSE_S, exc,
        )  # fmt: skip
        return 0
    _unreachable.pop(broker, None)
    return len(leased)
