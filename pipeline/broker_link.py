"""Admin calls to the broker that ride through an outage, up to the `brokerTimeout` option.

The source runner (driver), its listener and the executors' tasks all talk to the broker with
admin commands (`lease`, `lease-read`, `lease-commit`, `stats`, `queue-peek`, `dlq-list`);
every one of them may be repeated (leases are named, commits idempotent). So while the broker
does not answer, a call is repeated on a fresh connection (a late answer on the old one could
be taken for the next call's), with a log line every few seconds, until `brokerTimeout`; then
it fails with a clear error. A call whose frame no socket took (NotTaken: nothing reached a
broker) or that was refused with 503 (a shard between leaders, or cut off) is repeated on the
same connection, which goes on to a replicated shard's next replica by itself. Any other
refusal fails at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

from ..client import BrokerRefused, Client, ClientError, NotTaken
from .options import CurveFiles

log = logging.getLogger("phpmq.pipeline")

#: How long one attempt waits for its answer, in seconds.
ATTEMPT_TIMEOUT_S = 5.0
#: Pause between attempts while the broker is away, in seconds.
RETRY_PAUSE_S = 0.5
#: A line in the log at most this often while waiting, in seconds.
LOG_EVERY_S = 5.0
#: How long closing waits for the broker's goodbye (nothing of ours is pending), in seconds.
CLOSE_TIMEOUT_S = 0.5
#: Refusals that say "not now" rather than "no": a shard that cannot be reached.
RETRIED_CODES = frozenset({503})


class SourceError(RuntimeError):
    """Raised when the broker will not serve the source (gone too long, or refusing)."""


class BrokerLink:
    """One lazily opened client of `address` whose admin calls wait out outages."""

    def __init__(
        self, address: str, name: str, timeout_ms: int, curve: CurveFiles | None = None
    ) -> None:
        """`curve`: the key files of the source's options (None: PHPMQ_CURVE_* if set)."""
        self.address = address
        self._curve = curve
        self._name = name
        self._timeout_s = timeout_ms / 1000
        self._client: Client | None = None

    def call(self, command: str, **options: Any) -> dict[str, Any]:
        """The broker's answer to an admin command; waits for the broker up to the timeout.

        Raises:
            BrokerRefused: the broker refused the command (not retried, except 503).
            SourceError: no answer within brokerTimeout.
        """
        started = time.monotonic()
        logged = started
        while True:
            left = self._timeout_s - (time.monotonic() - started)
            attempt_s = min(ATTEMPT_TIMEOUT_S, max(RETRY_PAUSE_S, left))
            try:
                return self.client().admin(command, timeout=attempt_s, **options)
            except BrokerRefused as refusal:
                if refusal.error.code not in RETRIED_CODES:
                    raise
                problem: ClientError = refusal
            except NotTaken as exc:
                # Nothing reached the broker, so no late answer can come: the same client asks
                # again, from the next replica of a replicated shard whose leader died (a
                # new client would start from the first, the dead one, again).
                problem = exc
            except ClientError as exc:
                problem = exc
                self.close()
            now = time.monotonic()
            waited = now - started
            if waited >= self._timeout_s:
                raise SourceError(
                    f"the broker at {self.address} did not answer {command!r} for"
                    f" {waited:.0f} s (option brokerTimeout is {self._timeout_s:g} s): {problem}"
                ) from None
            if now - logged >= LOG_EVERY_S:
                logged = now
                log.warning(
                    "phpmq: waiting for the broker at %s (%s): %.0f s of %g s (brokerTimeout)",
                    self.address,
                    problem,
                    waited,
                    self._timeout_s,
                )
            time.sleep(RETRY_PAUSE_S)

    def client(self) -> Client:
        if self._client is None:
            self._client = Client(
                self.address,
                name=f"{self._name} pid {os.getpid()}",
                role="spark-source",
                curve=self._curve.keys() if self._curve is not None else None,
                close_timeout=CLOSE_TIMEOUT_S,
                send_timeout=min(ATTEMPT_TIMEOUT_S, max(RETRY_PAUSE_S, self._timeout_s / 2)),
            )
        return self._client

    def every(self, command: str, key: str, **options: Any) -> Any:
        """The entries under `key` of every page of a paged answer (docs/protocol.md §9)."""
        entries: Any = None
        offset: int | None = 0
        while offset is not None:
            page = self.call(command, **options, offset=offset)
            if entries is None:
                entries = page[key]
            elif isinstance(entries, dict):
                entries.update(page[key])
            else:
                entries.extend(page[key])
            offset = page.get("next_offset")
        return entries

    def stats_everywhere(self) -> dict[str, dict[str, Any]]:
        """Every queue's stats, from every shard of a sharded broker (a shard answers `stats`
        for its own queues only, docs/cluster.md)."""
        queues = self.every("stats", "queues")
        mapping = self.client().cluster_map
        if mapping is None or len(mapping.shards) < 2:
            return queues
        home = self.client().broker_info.get("shard")
        for shard in mapping.shards:
            if shard.name != home:
                # Every replica of a replicated shard: its home's node may be the one down.
                where = ",".join(shard.replicas) if shard.replicas else shard.address
                other = BrokerLink(where, self._name, int(self._timeout_s * 1000), self._curve)
                try:
                    queues.update(other.every("stats", "queues"))
                finally:
                    other.close()
        return queues

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(ClientError):  # the broker is gone: nothing was pending
                client.close()

    def __enter__(self) -> BrokerLink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
