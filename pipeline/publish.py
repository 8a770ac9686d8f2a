"""How the sink hands messages to the broker, behind one seam for what the broker can promise.

The sink cuts each task's rows into runs (`Run`: consecutive rows for one queue or event with
one TTL) and computes a key for every row from the batch and the row's position
(`<scope>/<partition>/<row>`). `open_publisher` picks the publisher:

* a broker that announces publisher confirms and idempotent keys in its HELLO answer
  (docs/protocol.md §6.3) gets a `ConfirmingPublisher`: each row is sent with its key and
  confirmed (on disk, for a durable broker), and a retried task or batch that publishes the
  same rows again within the broker's key window adds nothing;
* an older broker gets a `BarrierPublisher`, which ignores the keys and proves delivery to the
  broker with a round trip.

A streaming task's keys are `<query id>/<batch id>/<partition>/<row>`: before its first row
to a queue (or event) it asks the broker to hold the query's keys there (`key-hold`,
docs/protocol.md §6.3 "Key holds"), so a batch replayed after any pause adds nothing; the
driver's commit of the batch (`commit_holds`) lets the keys of earlier batches go.

Each run goes out packed many rows to a frame, its confirms pipelined: `send_many` to a queue,
`publish_many` for an event, each row with its own headers and message key when it has them,
so a row with a key or headers costs what a plain one does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..client import BrokerRefused, Client, ClientError, NotTaken, Unconfirmed
from ..protocol import DEFAULT_MAX_CONTENT_BYTES, Error
from ..protocol import admin_commands as cmd
from .options import CurveFiles

#: Longest the end-of-task round trip to the broker may take, in seconds.
BARRIER_TIMEOUT_S = 30.0
#: Refusals quoted in a PublishError.
QUOTED_REFUSALS = 3
#: Content a packed send keeps out unconfirmed (the client holds those frames for a resend):
#: 5 000 sends of 100 KB would be 500 MB in a Python worker.
UNCONFIRMED_BYTES = 16 * 1024 * 1024
MAX_UNCONFIRMED = 5_000
MIN_UNCONFIRMED = 16
#: A replicated shard between leaders (docs/cluster.md "Failover") refuses with these (or
#: its dead leader answers nothing): a keyed run is sent again for this long (a failover
#: takes 2-5 s).
FAILOVER_CODES = frozenset({503})
FAILOVER_S = 30.0
FAILOVER_PAUSE_S = 0.5
#: One wait for the answer that proves a sink's connection, before it asks again.
HELLO_ATTEMPT_S = 5.0


class PublishError(RuntimeError):
    """Raised when the broker refused messages (queue full, broker draining, bad queue name),
    or a row cannot be sent at all (a packet over the broker's size limit): the message starts
    with the broker's code and says why."""


@dataclass(frozen=True)
class Run:
    """Consecutive rows of one task with one destination and one TTL. `first_row` is the
    task's row number of `contents[0]`; `headers` and `message_keys`, when the input has
    those columns, hold one entry per row (None: the row has none)."""

    is_event: bool
    target: str
    ttl: int
    contents: Sequence[bytes]
    first_row: int
    headers: Sequence[dict[str, str] | None] | None = None
    message_keys: Sequence[bytes | None] | None = None


@dataclass(frozen=True)
class Receipt:
    """What a publisher can vouch for once `finish()` returns."""

    published: int
    #: Each message was confirmed stored by the broker (not only read by it).
    confirmed: bool
    #: Keys went with the messages, so publishing the same rows again adds nothing.
    deduplicated: bool
    #: Where the broker holds this task's keys (is_event, target), for the driver's commit.
    held_at: tuple[Target, ...] = ()


#: A queue or an event a run goes to: (is_event, name).
Target = tuple[bool, str]


class Publisher(Protocol):
    #: The broker's limit for every packet of a message (its HELLO answer).
    max_content_bytes: int

    def publish(self, run: Run) -> None:
        """Send the run's rows; row `run.first_row + i` has key `<key_prefix>/<first_row + i>`.

        Raises:
            PublishError: the broker refused some of it (code and reason in the message).
        """

    def finish(self) -> Receipt:
        """Return once the broker has everything published so far.

        Raises:
            PublishError: the broker refused some of it.
            ClientError: the broker did not answer.
        """

    def close(self) -> None: ...


class BarrierPublisher:
    """For a broker without confirms. Messages are sent in packed frames; `finish()` makes a
    round trip (ADMIN stats): the broker handles a peer's frames in order and answers a refused
    001 with an ERROR, so when the answer comes, every message was stored or its refusal came
    first. Keys are ignored: a retried batch publishes its rows again."""

    def __init__(self, client: Client, key_prefix: str) -> None:
        self._client = client
        self.key_prefix = key_prefix
        self.max_content_bytes = _max_content_bytes(client)
        self._published = 0

    def publish(self, run: Run) -> None:
        client = self._client
        try:
            if run.is_event:
                client.publish_many(
                    run.target, run.contents, run.ttl, confirm=False, headers=run.headers,
                    message_keys=run.message_keys,
                )  # fmt: skip
            else:
                client.send_many(
                    run.target, run.contents, run.ttl, headers=run.headers,
                    message_keys=run.message_keys,
                )  # fmt: skip
        except BrokerRefused as exc:  # an earlier send's refusal, told at this call
            raise _refused(len(exc.refusals), exc.refusals) from None
        self._published += len(run.contents)

    def finish(self) -> Receipt:
        self._client.admin(cmd.STATS, timeout=BARRIER_TIMEOUT_S)
        if self._client.error_count:
            raise _refused(self._client.error_count, list(self._client.errors))
        return Receipt(self._published, confirmed=False, deduplicated=False)

    def close(self) -> None:
        self._client.close()


class ConfirmingPublisher:
    """Sends each row with its key and waits for the broker's confirms, pipelined (to a queue
    and as events alike). The first refusal stops the task: nothing more is sent. With a
    `hold_scope` (a streaming query's id) the broker holds the keys at each target first."""

    def __init__(
        self, client: Client, key_prefix: str, deduplicated: bool, hold_scope: str | None = None
    ) -> None:
        self._client = client
        self.key_prefix = key_prefix
        self.max_content_bytes = _max_content_bytes(client)
        self._deduplicated = deduplicated
        self._published = 0
        self._hold_scope = hold_scope
        self._held_at: dict[Target, None] = {}

    def _hold_at(self, target: Target) -> None:
        """Ask the broker to hold the query's keys where `target`'s rows go (once a task)."""
        if self._hold_scope is None or target in self._held_at:
            return
        _hold_command(self._client, cmd.KEY_HOLD, scope=self._hold_scope, **_target_option(target))
        self._held_at[target] = None

    def publish(self, run: Run) -> None:
        """Send the run until all of it is confirmed. A failover (a replicated shard between
        leaders answers 503, or its dead leader nothing) is ridden through for up to
        FAILOVER_S: the run is sent again with the same keys, so the rows already queued
        count once."""
        self._hold_at((run.is_event, run.target))
        first = run.first_row
        keys = [f"{self.key_prefix}/{first + i}" for i in range(len(run.contents))]
        deadline = time.monotonic() + FAILOVER_S
        while True:
            try:
                self._send(run, keys)
                break
            except ClientError as exc:
                if not self._may_send_again(exc) or time.monotonic() >= deadline:
                    raise self._failure(exc) from None
            time.sleep(FAILOVER_PAUSE_S)
        self._published += len(run.contents)

    def _send(self, run: Run, keys: list[str]) -> None:
        unconfirmed = _unconfirmed(run.contents)
        if run.is_event:
            self._client.publish_many(
                run.target, run.contents, run.ttl, keys=keys, headers=run.headers,
                message_keys=run.message_keys, max_unconfirmed=unconfirmed,
            )  # fmt: skip
        else:
            self._client.send_many(
                run.target, run.contents, run.ttl, confirm=True, keys=keys,
                headers=run.headers, message_keys=run.message_keys,
                max_unconfirmed=unconfirmed,
            )  # fmt: skip

    def _may_send_again(self, failure: ClientError) -> bool:
        """Whether a failure may be a failover's (a refusal 503, or no answer: the leader
        died, its socket takes nothing), and sending again cannot queue a row twice."""
        if not self._deduplicated and self._hold_scope is None:
            return False
        if isinstance(failure, Unconfirmed):  # (a Paused is one too, and a BrokerRefused)
            return all(error.code in FAILOVER_CODES for error in failure.errors.values())
        if isinstance(failure, BrokerRefused):
            return failure.error.code in FAILOVER_CODES
        return isinstance(failure, NotTaken)

    @staticmethod
    def _failure(failure: ClientError) -> ClientError:
        if isinstance(failure, Unconfirmed) and failure.errors:
            return _refused(len(failure.errors), list(failure.errors.values()))
        if isinstance(failure, BrokerRefused):
            return _refused(1, [failure.error])
        return failure  # no answer: the task fails and its retry sends the same keys

    def finish(self) -> Receipt:
        held_at = tuple(self._held_at)
        return Receipt(self._published, True, self._deduplicated, held_at)

    def close(self) -> None:
        self._client.close()


def _unconfirmed(contents: Sequence[bytes]) -> int:
    """Sends out at once for `contents`: MAX_UNCONFIRMED, fewer for large messages."""
    average = sum(map(len, contents)) // len(contents) or 1
    return max(MIN_UNCONFIRMED, min(MAX_UNCONFIRMED, UNCONFIRMED_BYTES // average))


def _refused(count: int, errors: list[Error]) -> PublishError:
    quoted = "; ".join(
        f"{error.code} {error.reason} (queue {error.queue!r})" for error in errors[:QUOTED_REFUSALS]
    )
    return PublishError(f"the broker refused {count} message(s): {quoted}")


def _hold_refused(error: Error) -> PublishError:
    return PublishError(f"{error.code} the broker refused to hold the query's keys: {error.reason}")


def _max_content_bytes(client: Client) -> int:
    limit = client.broker_info.get("max_content_bytes")
    return limit if type(limit) is int else DEFAULT_MAX_CONTENT_BYTES


def _target_option(target: Target) -> dict[str, str]:
    is_event, name = target
    return {"event": name} if is_event else {"queue": name}


def _answered_client(address: str, name: str, curve: CurveFiles | None) -> Client:
    """A client of the broker at `address` whose HELLO answer is in (with the CURVE keys of
    `curve`, else those of PHPMQ_CURVE_*, if any).

    Raises:
        ClientError: no answer from the broker.
    """
    keys = curve.keys() if curve is not None else None
    client = Client(address, name=f"{name} pid {os.getpid()}", role="spark-sink", curve=keys)
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while True:
        try:
            # Its answer follows the HELLO answer's. Asked again after a while without one
            # (any answer will do): a follower whose leader just died lost its forward.
            client.admin(cmd.STATS, timeout=HELLO_ATTEMPT_S, limit=0)
            return client
        except BrokerRefused as refusal:
            if refusal.error.code in FAILOVER_CODES:
                # A 503 is an answer too: a follower whose leader died meanwhile says so for
                # the forwarded STATS; the runs' sends ride that failover through themselves.
                return client
            client.close()
            raise
        except ClientError:  # no answer, or a dead replica first: the client goes on
            if time.monotonic() >= deadline:
                client.close()
                raise


def open_publisher(
    address: str,
    name: str,
    key_prefix: str,
    curve: CurveFiles | None = None,
    hold_scope: str | None = None,
) -> Publisher:
    """A publisher that uses what the broker at `address` supports; a `hold_scope` (a
    streaming query's id) has the broker hold its keys, where it can.

    Raises:
        ClientError: no answer from the broker.
    """
    client = _answered_client(address, name, curve)
    window_ms = client.broker_info.get("dedup_window_ms")
    if type(window_ms) is int:  # a broker with confirms and keys (docs/protocol.md §6.3)
        holds = client.broker_info.get("key_holds") is True
        return ConfirmingPublisher(
            client, key_prefix, deduplicated=window_ms > 0, hold_scope=hold_scope if holds else None
        )
    return BarrierPublisher(client, key_prefix)


def commit_holds(
    address: str,
    name: str,
    curve: CurveFiles | None,
    scope: str,
    batch: int,
    targets: Sequence[Target],
) -> int:
    """The driver's commit of streaming batch `batch`: at each target's broker (a shard's, on
    a sharded one) the query's keys of earlier batches are let go. Returns how many were.

    Raises:
        PublishError: the broker refused the commit.
        ClientError: no answer from the broker.
    """
    client = _answered_client(address, name, curve)
    released = 0
    try:
        for target in targets:
            options = _target_option(target)
            answer = _hold_command(client, cmd.KEY_COMMIT, scope=scope, batch=batch, **options)
            released += answer["released"]
    finally:
        client.close()
    return released


def _hold_command(client: Client, command: str, **options: Any) -> dict[str, Any]:
    """A key-hold or key-commit (both idempotent), asked again for up to FAILOVER_S while the
    answer is 503 (a replicated shard between leaders, or a link to it lost).

    Raises:
        PublishError: the broker refused it otherwise.
    """
    deadline = time.monotonic() + FAILOVER_S
    while True:
        try:
            return client.admin(command, BARRIER_TIMEOUT_S, **options)
        except BrokerRefused as exc:
            if exc.error.code not in FAILOVER_CODES or time.monotonic() >= deadline:
                raise _hold_refused(exc.error) from None
        time.sleep(FAILOVER_PAUSE_S)
