"""`phpmq workers`: a Python function over queues in supervised worker processes."""

from __future__ import annotations

import sys

import click

from .shared import broker_option, fail, stop_status


def _queue_weight(value: str) -> tuple[str, int]:
    name, _, weight = value.rpartition(":")
    if not name:
        return value, 1
    if not weight.isdigit() or int(weight) < 1:
        raise click.BadParameter(f"weight must be a positive integer in {value!r}")
    return name, int(weight)


@click.command()
@broker_option
@click.argument("handler")
@click.option(
    "--queue",
    "-q",
    "queues",
    multiple=True,
    required=True,
    help="Queue to consume, as NAME or NAME:WEIGHT (repeatable). When every queue has work,"
    " each gets a share of the jobs proportional to its weight.",
)
@click.option(
    "--bind",
    "patterns",
    multiple=True,
    help="Bind every --queue to this event pattern (order.*, audit.#) when the workers"
    " consume it, so published events reach them; repeatable.  [default: none]",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Messages each worker holds at a time, the one it runs included (its window, split"
    " among the queues by weight, each at least its weight); 1: the next comes once one is done.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    help="Seconds a job may run before its worker is killed and replaced (0: no limit);"
    ' a message header {"timeout": S} overrides it.',
)
@click.option(
    "--max-retries",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Failed deliveries retried before the message is dead-lettered.",
)
@click.option(
    "--retry-delay",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="First retry backoff in seconds; it doubles with each delivery.",
)
@click.option(
    "--max-retry-delay",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    help="Longest retry backoff in seconds.",
)
@click.option(
    "--max-jobs-per-child",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Replace a worker after this many jobs (0: never).",
)
@click.option(
    "--max-memory-mb",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Replace a worker, after its job, once it uses more memory (0: no limit).",
)
@click.option(
    "--grace-seconds",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="On SIGTERM/SIGINT, how long running jobs may take to finish.",
)
@click.option(
    "--heartbeat-ms",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Heartbeat interval of each worker's connection.",
)
@click.option(
    "--summary-seconds",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="How often the one-line summary is logged.",
)
@click.option("--name", help="Pool name shown in logs and `phpmq stats`. [default: the handler]")
@click.option("--json", "log_json", is_flag=True, help="Log one JSON object per line.")
def workers(
    address: str,
    handler: str,
    queues: tuple[str, ...],
    patterns: tuple[str, ...],
    processes: int,
    prefetch: int,
    timeout: float,
    max_retries: int,
    retry_delay: float,
    max_retry_delay: float,
    max_jobs_per_child: int,
    max_memory_mb: int,
    grace_seconds: float,
    heartbeat_ms: int,
    summary_seconds: float,
    name: str | None,
    log_json: bool,
) -> None:
    """Run HANDLER (module:function) over queues in supervised worker processes.

    The handler gets each message (.content, .queue, .id, .ttl, .delivery_count, .headers).
    Returning acks it; raising Retry(delay=...) (from phpmq import Retry) or any exception
    requeues it with backoff until --max-retries, then dead-letters it with the exception as
    reason; raising Reject (from phpmq import Reject) dead-letters it at once. Async handlers
    are awaited. SIGTERM/SIGINT stop gracefully (a second signal kills), SIGHUP reloads the
    handler code worker by worker.
    """
    from ..workers.child import ChildSpec, load_handler
    from ..workers.logs import configure_logging
    from ..workers.pool import Pool, PoolSpec

    configure_logging(log_json, "supervisor")
    try:
        load_handler(handler)  # fail here, once, rather than in every worker
    except ValueError as exc:
        fail(str(exc))
    try:
        parsed = tuple(_queue_weight(queue) for queue in queues)
    except click.BadParameter as exc:
        fail(str(exc.message))
    from ..client import CurveKeyError, InvalidArgument
    from ..client.curve import curve_from_environment
    from ..client.topics import checked_patterns

    try:
        bind = tuple(checked_patterns(patterns))
        curve_from_environment()  # the workers read the same keys: check them once, here
    except (InvalidArgument, CurveKeyError) as exc:
        fail(str(exc))
    child = ChildSpec(
        broker=address,
        handler=handler,
        queues=parsed,
        bind=bind,
        prefetch=prefetch,
        timeout=timeout,
        max_retries=max_retries,
        retry_delay=retry_delay,
        max_retry_delay=max_retry_delay,
        max_jobs=max_jobs_per_child,
        heartbeat_ms=heartbeat_ms,
        pool=name or handler,
    )
    spec = PoolSpec(
        child=child,
        processes=processes,
        max_memory_mb=max_memory_mb,
        grace_seconds=grace_seconds,
        summary_seconds=summary_seconds,
        log_json=log_json,
    )
    pool = Pool(spec)
    sys.exit(pool.run() or stop_status(pool.stopped_by))
