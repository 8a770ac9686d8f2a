"""Batch leases (docs/protocol.md §6.9): named sets of a queue's messages, taken from its head
and held together for a reader (a Spark micro-batch) until it commits or releases them.

A lease is not tied to a peer: it is named by the reader (`<query>/<batch>`), so a reader
that restarted asks for the same name and gets the same messages, and any peer may read,
commit or release it. Asking again for a lease that exists takes nothing more. Its messages
come back to the head of their queue (one more delivery) when it is released, or when
nothing touched it for its timeout. LEASED records sit in exactly one lease's list.
"""

from __future__ import annotations

from typing import Any

from ..protocol import ErrorCode
from ..protocol import admin_commands as cmd
from .browse import Entry, entry_of_record, oldest_sent_at, page_budget
from .context import Context
from .deadletters import DeadLetters
from .deadlines import BATCH_LEASE_TIMEOUT
from .errors import CommandError
from .expiry import Expiry
from .model import LEASED, NS_PER_MS, NS_PER_SECOND, READY, Queue, Record, record_bytes
from .pages import page, page_request
from .queues import Queues
from .quotas import LEASES

#: Lease timeouts (ms) a reader may ask for, and the default.
DEFAULT_TIMEOUT_MS = 3_600_000
MIN_TIMEOUT_MS = 1_000
MAX_TIMEOUT_MS = 604_800_000
#: Lease names are 1 to this many bytes of UTF-8.
MAX_NAME_BYTES = 255
#: Entries one lease-read returns at most when it does not say.
DEFAULT_READ_LIMIT = 1_000


class Lease:
    """One named lease of one queue."""

    __slots__ = (
        "bytes",
        "due",
        "gone",
        "name",
        "owner",
        "queue",
        "records",
        "timeout_ns",
        "touched",
    )

    def __init__(self, queue: Queue, name: str, timeout_ns: int, now: int) -> None:
        self.queue = queue
        self.name = name
        #: Whose quota it counts against (quotas.py).
        self.owner = ""
        self.records: list[Record] = []
        self.bytes = 0
        self.timeout_ns = timeout_ns
        self.touched = now
        #: When its timeout entry is due (0: none armed); older entries are moot.
        self.due = 0
        self.gone = False


class BatchLeases:
    __slots__ = ("_ctx", "_dead", "_expiry", "_queues", "count")

    def __init__(self, ctx: Context, queues: Queues, dead: DeadLetters, expiry: Expiry) -> None:
        self._ctx = ctx
        self._queues = queues
        self._dead = dead
        self._expiry = expiry
        #: BatchLeases held now, across queues (bounded by `max_leases`).
        self.count = 0

    def commands(self) -> dict[str, Any]:
        return {
            cmd.LEASE: self.take,
            cmd.LEASE_READ: self.read,
            cmd.LEASE_COMMIT: self.commit,
            cmd.LEASE_RELEASE: self.release_command,
            cmd.LEASES: self.listing,
        }

    # ----------------------------------------------------------------- commands

    def take(self, options: dict[str, Any]) -> dict[str, Any]:
        """Up to `max_messages` ready messages within `max_bytes` (at least one) from the
        queue's head into the named lease; an existing lease is described, not grown."""
        name, lease_name = _queue(options), _lease_name(options)
        max_messages = _positive(options, "max_messages", None)
        limit = self._ctx.config.max_window
        if max_messages > limit:
            raise ValueError(f"'max_messages' is above max_window ({limit})")
        max_bytes = _positive(options, "max_bytes", None)
        timeout_ms = _timeout_ms(options)
        queue = self._queues.get(name)
        if queue is None:
            return _taken(name, lease_name, None, False, None)
        lease = queue.leases.get(lease_name)
        created = lease is None
        if lease is None:
            lease = self._new(queue, lease_name, timeout_ms, max_messages, max_bytes)
        else:
            self._touch(lease)
        return _taken(name, lease_name, lease, created, queue)

    def read(self, options: dict[str, Any]) -> dict[str, Any]:
        queue, lease = self._named(options)
        offset = _non_negative(options, "offset", 0)
        limit = _positive(options, "limit", DEFAULT_READ_LIMIT)
        budget = page_budget(self._ctx.config, options)
        self._touch(lease)
        now = self._ctx.now
        entries: list[Entry] = []
        for record in lease.records[offset : offset + limit]:
            size = record_bytes(record)
            if entries and size > budget:
                break
            budget -= size
            entries.append(entry_of_record(record, now, record.deliveries))
        return {
            "queue": queue.name,
            "lease": lease.name,
            "messages": len(lease.records),
            "entries": entries,
        }

    def commit(self, options: dict[str, Any]) -> dict[str, Any]:
        """Every message of the lease is acked; an unknown lease commits nothing."""
        name, lease_name = _queue(options), _lease_name(options)
        queue = self._queues.get(name)
        lease = queue.leases.get(lease_name) if queue is not None else None
        if lease is None:
            return {"queue": name, "lease": lease_name, "acked": 0}
        ctx = self._ctx
        for record in lease.records:
            ctx.retire(record)
        acked = len(lease.records)
        ctx.journal.lease_committed(name, lease_name)
        ctx.counters.acked += acked
        ctx.counters.lease_committed += acked
        queue.acked += acked
        self._forget(lease)
        return {"queue": name, "lease": lease_name, "acked": acked}

    def release_command(self, options: dict[str, Any]) -> dict[str, Any]:
        name, lease_name = _queue(options), _lease_name(options)
        queue = self._queues.get(name)
        lease = queue.leases.get(lease_name) if queue is not None else None
        released = self.release(lease) if lease is not None else 0
        return {"queue": name, "lease": lease_name, "released": released}

    def listing(self, options: dict[str, Any]) -> dict[str, Any]:
        name = options.get("queue")
        if name is not None and not isinstance(name, str):
            raise CommandError("'queue' must be a string")
        queues = self._queues.by_name
        chosen = [queues[name]] if name in queues else [] if name else list(queues.values())
        leases = [lease for queue in chosen for lease in queue.leases.values()]
        now = self._ctx.now

        def entry_at(index: int) -> dict[str, Any]:
            lease = leases[index]
            return {
                "queue": lease.queue.name,
                "lease": lease.name,
                "messages": len(lease.records),
                "bytes": lease.bytes,
                "idle_seconds": (now - lease.touched) / NS_PER_SECOND,
                "timeout_ms": lease.timeout_ns // NS_PER_MS,
            }

        listed, next_offset = page(len(leases), entry_at, page_request(options))
        return {"leases": listed, "next_offset": next_offset}

    # ----------------------------------------------------------------- the parts

    def _new(
        self, queue: Queue, lease_name: str, timeout_ms: int, max_messages: int, max_bytes: int
    ) -> Lease | None:
        if not queue.ready_count:
            return None
        quotas = self._ctx.quotas
        owner = self._ctx.owner
        problem = quotas.problem(LEASES, owner)
        if problem is not None:
            raise CommandError(f"{problem}: commit or release some first", ErrorCode.LIMIT_REACHED)
        limit = self._ctx.config.max_leases
        if self.count >= limit:
            raise CommandError(
                f"the broker holds {limit} leases (max_leases): commit or release some first",
                ErrorCode.LIMIT_REACHED,
            )
        ctx = self._ctx
        lease = Lease(queue, lease_name, timeout_ms * NS_PER_MS, ctx.now)
        self._fill(lease, max_messages, max_bytes)
        if not lease.records:
            return None
        queue.leases[lease_name] = lease
        queue.leased += len(lease.records)
        self.count += 1
        lease.owner = owner
        quotas.take(LEASES, owner)
        ctx.counters.leased += len(lease.records)
        self._arm(lease)
        return lease

    def _fill(self, lease: Lease, max_messages: int, max_bytes: int) -> None:
        """Take the queue's head while the lease has room (the first message always fits)."""
        queue, records, ctx = lease.queue, lease.records, self._ctx
        ready, now = queue.ready, ctx.now
        first_seq = last_seq = 0
        durable = ctx.journal.durable
        while ready and len(records) < max_messages:
            record = ready[0]
            if record.state != READY:
                ready.popleft()
                queue.stale -= 1
                continue
            if record.expires_at and record.expires_at <= now:
                ready.popleft()
                self._expiry.expire(queue, record)
                continue
            size = record_bytes(record)
            if records and lease.bytes + size > max_bytes:
                break
            ready.popleft()
            record.state = LEASED
            records.append(record)
            lease.bytes += size
            if durable:
                if len(records) == 1:
                    first_seq = record.seq  # type: ignore[attr-defined]
                last_seq = record.seq  # type: ignore[attr-defined]
        if records:
            ctx.journal.leased(queue.name, lease.name, first_seq, last_seq)

    def release(self, lease: Lease) -> int:
        """The lease's messages back at the head of their queue, in lease order, one more
        delivery each (past max-deliveries: dead-lettered); how many."""
        queue, records = lease.queue, lease.records
        for record in reversed(records):
            if not self._dead.count_delivery(queue, record):
                continue
            record.state = READY
            was = self._queues.place(queue, record, to_head=True)
            self._ctx.journal.back(record, queue.name, was)
            if record.expires_at:
                self._expiry.watch(queue, record)
        self._ctx.counters.lease_released += len(records)
        self._ctx.mark_dirty(queue)
        self._forget(lease)
        return len(records)

    def restore(self, queue: Queue, lease_name: str, record: Record) -> None:
        """Recovery: a stored leased message joins its lease again (created on first use,
        with the default timeout from now)."""
        lease = queue.leases.get(lease_name)
        if lease is None:
            ctx = self._ctx
            lease = Lease(queue, lease_name, DEFAULT_TIMEOUT_MS * NS_PER_MS, ctx.now)
            queue.leases[lease_name] = lease
            self.count += 1
            self._arm(lease)
        record.state = LEASED
        lease.records.append(record)
        lease.bytes += record_bytes(record)
        queue.leased += 1

    def _named(self, options: dict[str, Any]) -> tuple[Queue, Lease]:
        name, lease_name = _queue(options), _lease_name(options)
        queue = self._queues.get(name)
        lease = queue.leases.get(lease_name) if queue is not None else None
        if queue is None or lease is None:
            raise CommandError(
                f"no lease {lease_name!r} on queue {name!r}: committed, released, timed out,"
                " or lost in a restart of a broker without --data-dir",
                ErrorCode.NOT_FOUND,
            )
        return queue, lease

    def _forget(self, lease: Lease) -> None:
        queue = lease.queue
        del queue.leases[lease.name]
        queue.leased -= len(lease.records)
        lease.records = []
        lease.gone = True
        self.count -= 1
        self._ctx.quotas.give_back(LEASES, lease.owner)

    def _touch(self, lease: Lease) -> None:
        lease.touched = self._ctx.now  # the armed entry re-arms itself when it comes due

    def _arm(self, lease: Lease) -> None:
        lease.due = lease.touched + lease.timeout_ns
        self._ctx.deadlines.arm(lease.due, BATCH_LEASE_TIMEOUT, lease)

    def drop_all(self, queue: Queue) -> int:
        """A deleted queue's leases go with it (the store deletes their rows with the queue);
        how many messages they held."""
        ctx = self._ctx
        dropped = 0
        for lease in list(queue.leases.values()):
            for record in lease.records:
                ctx.retire(record)
            dropped += len(lease.records)
            self._forget(lease)
        return dropped

    # ----------------------------------------------------------------- timeouts

    @staticmethod
    def is_timeout_live(due: int, lease: Lease) -> bool:
        return not lease.gone and due == lease.due

    def on_timeout_due(self, due: int, lease: Lease) -> None:
        if lease.gone or due != lease.due:
            return
        if self._ctx.now < lease.touched + lease.timeout_ns:
            self._arm(lease)  # touched since it was armed
            return
        self._ctx.counters.leases_timed_out += 1
        self.release(lease)


def _taken(
    name: str, lease_name: str, lease: Lease | None, created: bool, queue: Queue | None
) -> dict[str, Any]:
    return {
        "queue": name,
        "lease": lease_name,
        "messages": len(lease.records) if lease is not None else 0,
        "bytes": lease.bytes if lease is not None else 0,
        "created": created and lease is not None,
        "ready": queue.ready_count if queue is not None else 0,
        "oldest_sent_at": oldest_sent_at(queue) if queue is not None else None,
    }


def _queue(options: dict[str, Any]) -> str:
    name = options.get("queue")
    if not isinstance(name, str):
        raise CommandError("this command needs a 'queue' string")
    return name


def _lease_name(options: dict[str, Any]) -> str:
    name = options.get("lease")
    if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME_BYTES:
        raise CommandError(f"this command needs a 'lease' name of 1 to {MAX_NAME_BYTES} bytes")
    return name


def _positive(options: dict[str, Any], key: str, default: int | None) -> int:
    value = options.get(key, default)
    if type(value) is not int or value < 1:
        raise CommandError(f"{key!r} must be a positive integer")
    return value


def _non_negative(options: dict[str, Any], key: str, default: int) -> int:
    value = options.get(key, default)
    if type(value) is not int or value < 0:
        raise CommandError(f"{key!r} must be a non-negative integer")
    return value


def _timeout_ms(options: dict[str, Any]) -> int:
    value = _positive(options, "timeout_ms", DEFAULT_TIMEOUT_MS)
    return min(max(value, MIN_TIMEOUT_MS), MAX_TIMEOUT_MS)
