"""What a Spark task of the streaming source reads: a slice of one lease, from its executor.

The driver plans a batch as leases (pipeline.lease_offsets); each task opens its own client and
pages through its positions with `lease-read`, which changes nothing at the broker but the
lease's timeout, so a retried task reads the same messages. The client sends each call to the
shard that owns the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from ..client import BrokerRefused
from .broker_link import BrokerLink, SourceError
from .options import CurveFiles
from .rows import record_batch

log = logging.getLogger("phpmq.pipeline")

#: Messages one `lease-read` asks for at most.
PAGE_MESSAGES = 1_000
#: Content bytes one `lease-read` asks for at most (the broker always gives one message).
PAGE_BYTES = 4 << 20


@dataclass(frozen=True)
class LeasePart(InputPartition):
    """Positions `[first, first + count)` of lease `lease` of `queue`."""

    broker: str
    queue: str
    lease: str
    first: int
    count: int
    broker_timeout_ms: int
    fail_on_data_loss: bool
    client_name: str
    curve: CurveFiles | None = None


def read_lease(part: LeasePart) -> Iterator[pa.RecordBatch]:
    """The slice's messages as Arrow batches, one per page.

    Raises:
        SourceError: the lease is gone (unless failOnDataLoss is false), or the broker did not
            answer within brokerTimeout.
    """
    with BrokerLink(part.broker, part.client_name, part.broker_timeout_ms, part.curve) as link:
        done = 0
        while done < part.count:
            try:
                reply = link.call(
                    "lease-read",
                    queue=part.queue,
                    lease=part.lease,
                    offset=part.first + done,
                    limit=min(PAGE_MESSAGES, part.count - done),
                    max_bytes=PAGE_BYTES,
                )
            except BrokerRefused as refusal:
                if refusal.error.code != 404:
                    raise
                _lost(part, part.count - done, f"{refusal.error.code} {refusal.error.reason}")
                return
            entries = reply.get("entries") or []
            if not entries:
                _lost(part, part.count - done, "the lease holds fewer messages than planned")
                return
            yield record_batch(part.queue, entries)
            done += len(entries)


def _lost(part: LeasePart, missing: int, why: str) -> None:
    message = (
        f"lease {part.lease} of queue {part.queue!r} is gone from the broker at {part.broker}"
        f" ({why}): {missing} message(s) of this batch cannot be read. It was committed,"
        " timed out (option leaseTimeout), or lost in a restart of a broker without"
        " --data-dir. Set option failOnDataLoss to false to skip them."
    )
    if part.fail_on_data_loss:
        raise SourceError(message)
    log.warning("phpmq: %s (skipped: failOnDataLoss is false)", message)
