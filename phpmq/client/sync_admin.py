# auto-generated from aio_admin.py by tools/unasync.py; do not edit.
"""`Client.admin`: operator commands (docs/protocol.md §9), and the schedules they
keep (§6.7, docs/client.md "Schedules": jobs the broker runs itself; their arguments are
checked in schedules.py). A mixin of `Client` (sync.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ..protocol import ErrorCode
from ..protocol import admin_commands as cmd
from . import sync_backend as backend
from .errors import BrokerRefused, ClientError
from .schedules import Duration, schedule_options


class SyncAdmin:
    """Admin commands and schedules for the blocking client (every method is
    `Client`'s)."""

    def admin(self, command: str, timeout: float = 5.0, **options: Any) -> dict[str, Any]:
        """Run an operator command (stats, dlq-list, dlq-replay, dlq-purge) on the broker.

        A command about one queue (a `queue` option) goes to its owning shard.

        Raises:
            BrokerRefused: the broker refused the command (bad command or options).
            ClientError: no answer within `timeout` seconds, or the command was not sent: the
                client was busy the whole `timeout` (the blocking client's other admin commands,
                which go one at a time; any other call of the blocking client's threads).
        """
        queue = options.get("queue")
        if self._routing is not None and isinstance(queue, str) and command != cmd.STATS:
            link = self._link_for(queue)
            if link is not None:
                return link.admin(command, timeout, **options)
        connection = self._connection
        deadline = time.monotonic() + timeout
        with backend.admin_turn(self._admin_lock, self._lock, timeout, command):
            self._read_available()
            self._send_frame(connection.admin(command, options))
            sent_on = self._reconnected
            while not connection.admin_replies:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise ClientError(
                        f"no answer from the broker at {self.address} within {timeout}s"
                        " (is it running?)"
                    )
                self._news_within(wait)
                if self._reconnected != sent_on and command in cmd.READ_ONLY:
                    # Asked on a socket given up on (a dead leader's): ask the new one.
                    sent_on = self._reconnected
                    self._send_frame(connection.admin(command, options))
            result = connection.admin_replies.popleft().options
        return self._admin_result(result)

    def admin_pages(
        self, command: str, key: str, timeout: float = 5.0, **options: Any
    ) -> dict[str, Any]:
        """A command whose answer lists its entries under `key` a page at a time (`stats`:
        `queues`; `leases`; `schedule-list`: `schedules`): every page asked for in turn, their
        entries in one answer (the other figures are the first page's)."""
        whole = self.admin(command, timeout, **options, offset=0)
        while whole.get("next_offset") is not None:
            page = self.admin(command, timeout, **options, offset=whole["next_offset"])
            whole = self._with_page(whole, page, key)
        return whole

    def stats(self, timeout: float = 5.0) -> dict[str, Any]:
        """The broker's `stats` with every queue, however many pages they take."""
        return self.admin_pages(cmd.STATS, "queues", timeout)

    def replication(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The `replication` figures of the replica at this client's address, its own
        (`stats` with `here`; make the client with `follow_leader=False` to stay at a
        follower): `role`, `node`, `term`, `commit_index`, `applied_index`, and each other
        replica's `node`, `endpoint`, `connected` and `match_index` (docs/protocol.md §9).
        None: the broker is no replica of a replicated shard."""
        answer = self.admin(cmd.STATS, timeout, limit=0, here=True)
        return answer.get("replication")

    def move_leadership(self, node: str, timeout: float = 5.0) -> dict[str, Any]:
        """`replica-lead`: the replica of this client's replicated shard on `node` is to
        lead it. At the leader: handed over (`leads` false: watch the target's `role`) or
        refused (BrokerRefused: 409 it lacks entries, 503 it is not connected); at the
        replica on `node` once it leads: `leads` true, and it keeps leading (no hand-back
        to the shard's home replica)."""
        return self.admin(cmd.REPLICA_LEAD, timeout, node=node)

    def peek(self, queue: str, limit: int = 10) -> dict[str, Any]:
        """`queue`'s first `limit` ready messages, left in place (no delivery is counted):
        `entries` (`id`, `ttl`, `deliveries`, `content` in base64), `ready`, `truncated`."""
        return self.admin(cmd.QUEUE_PEEK, queue=queue, limit=limit)

    def dead_letters(self, queue: str, limit: int = 100) -> dict[str, Any]:
        """`queue`'s dead letters, oldest first, at most `limit`: `entries` (`id`, `reason`,
        `deliveries`, `content` in base64), `total`, `dropped`."""
        return self.admin(cmd.DLQ_LIST, queue=queue, limit=limit)

    def replay_dead_letters(self, queue: str, ids: Iterable[str] = ()) -> int:
        """Put `queue`'s dead letters (only `ids`, if given) back at its tail; how many."""
        options: dict[str, Any] = {"ids": list(ids)} if ids else {}
        reply = self.admin(cmd.DLQ_REPLAY, queue=queue, **options)
        return int(reply["replayed"])

    def purge_dead_letters(self, queue: str) -> int:
        """Delete all of `queue`'s dead letters; how many."""
        reply = self.admin(cmd.DLQ_PURGE, queue=queue)
        return int(reply["purged"])

    # ------------------------------------------------------------------ leases and holds

    def leases(self, queue: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
        """The batch leases (a Spark source's micro-batches) of `queue`, or of every queue of
        the shard asked: `leases` (`queue`, `lease`, `messages`, `bytes`, `idle_seconds`,
        `timeout_ms`), however many pages they take."""
        options = {} if queue is None else {"queue": queue}
        return self.admin_pages(cmd.LEASES, "leases", timeout, **options)

    def release_lease(self, queue: str, lease: str, timeout: float = 5.0) -> int:
        """Put the messages of `queue`'s batch lease `lease` back at the head of the queue
        now, as its timeout would; how many (0: no such lease, or committed already)."""
        reply = self.admin(cmd.LEASE_RELEASE, timeout, queue=queue, lease=lease)
        return int(reply["released"])

    def key_holds(self, timeout: float = 5.0) -> dict[str, Any]:
        """The key holds (a Spark sink query's idempotency keys, kept until its next commit):
        `holds` (`scope`, `committed`, `held_keys`, `batches`, `owner`, `created`) and
        `held_keys`, however many pages they take."""
        return self.admin_pages(cmd.KEY_HOLDS, "holds", timeout)

    def release_key_hold(self, scope: str, timeout: float = 5.0) -> int:
        """Drop the key hold `scope`: its keys get the dedup window from now; how many."""
        reply = self.admin(cmd.KEY_RELEASE, timeout, scope=scope)
        return int(reply["released"])

    # ------------------------------------------------------------------ schedules

    def schedule(
        self,
        name: str,
        queue: str | None = None,
        content: bytes | str = b"",
        *,
        event: str | None = None,
        every: Duration | None = None,
        cron: str | None = None,
        tz: str = "UTC",
        nohaste: bool = False,
        catch_up: str = "run-once",
        ttl: int = 0,
        headers: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Have the broker send `content` to `queue` (or publish it as `event`) every
        `every` seconds (at least 0.1; a float or timedelta) or on `cron` (five fields, read
        in the IANA zone `tz`). It runs at once unless `nohaste` (then after one interval; a
        cron schedule always waits for its first time). A schedule with the same name is
        replaced. `catch_up` says what a durable broker does about runs missed while it was
        down: "run-once" (one run at start) or "skip". Returns `{"name", "replaced",
        "next_run"}` (next_run: wall-clock seconds).

        Raises:
            InvalidArgument: (nothing sent) a bad name, queue or event, interval, catch_up.
            BrokerRefused: 422 with the reason: a bad cron expression or time zone, more
                schedules than the broker's `max_schedules`.
        """
        options = schedule_options(
            name, queue, content, event, every, cron, tz, nohaste, catch_up, ttl, headers
        )
        # A schedule with a queue goes to its owning shard, as `admin` sends every command
        # with a `queue` option.
        return self.admin(cmd.SCHEDULE_ADD, **options)

    def unschedule(self, name: str) -> bool:
        """Remove the schedule `name`: it stops at once. False if there was none (on a
        sharded broker: on any shard)."""
        removed = False
        for shard in self._every_shard():
            try:
                shard.admin(cmd.SCHEDULE_REMOVE, name=name)
            except BrokerRefused as exc:
                if exc.error.code != ErrorCode.NOT_FOUND:
                    raise
            else:
                removed = True
        return removed

    def schedules(self) -> list[dict[str, Any]]:
        """Every schedule, sorted by name: `name`, `queue` or `event`, `every_ms` or `cron`
        with `tz`, `nohaste`, `catch_up`, `next_run` and `last_run` (wall-clock seconds;
        last_run None before the first), `runs` and `refused` (runs the queue refused).
        On a sharded broker: those of every shard."""
        found = []
        for shard in self._every_shard():
            listed = shard.admin_pages(cmd.SCHEDULE_LIST, "schedules")
            found.extend(listed["schedules"])
        return sorted(found, key=lambda schedule: str(schedule["name"]))
