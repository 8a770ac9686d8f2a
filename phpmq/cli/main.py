"""`phpmq`: run a broker, move messages from the shell, inspect queues, benchmark.

Every command that talks to a broker takes --broker (or PHPMQ_BROKER). Errors print one line
on stderr and exit non-zero: 1 for a refused or failed request, 2 for bad usage.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import click
import msgspec

from ..broker.config import ConfigError, load_config
from ..client import DEFAULT_ADDRESS, Client, ClientError

broker_option = click.option(
    "--broker",
    "address",
    envvar="PHPMQ_BROKER",
    default=DEFAULT_ADDRESS,
    show_default=True,
    help="Broker address (env PHPMQ_BROKER).",
)


def _fail(message: str) -> None:
    click.echo(f"phpmq: {message}", err=True)
    sys.exit(1)


def _with_client(address: str, action: Callable[[Client], Any], timeout: float = 5.0) -> Any:
    client = Client(address, name="phpmq-cli", send_timeout=timeout, close_timeout=timeout)
    try:
        return action(client)
    except ClientError as exc:
        _fail(str(exc))
    finally:
        client.close()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """phpmq-zmq: a PHPMQ message broker on ZeroMQ.

    Start a broker with `phpmq broker`, then `phpmq send QUEUE MESSAGE` and
    `phpmq consume QUEUE`. The wire protocol is documented in docs/protocol.md.
    """


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML file.")
@click.option("--bind", help="ROUTER address to bind. [default: tcp://127.0.0.1:5555]")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Keep messages in this directory (SQLite, fsync per loop turn). [default: in memory]",
)
@click.option(
    "--tcp-bind",
    help="Also listen for stock PHPMQ clients on plain TCP (e.g. tcp://0.0.0.0:5556)."
    " [default: off]",
)
@click.option(
    "--dialect",
    type=click.Choice(["ttl", "pre-ttl"]),
    help="Form of 003 for peers that have not spoken the TTL form. [default: ttl]",
)
@click.option("--max-content-bytes", type=int, help="Largest message content accepted.")
@click.option("--max-window", type=int, help="Largest consume window a consumer may ask for.")
@click.option("--dead-letter-limit", type=int, help="Dead letters kept per queue.")
@click.option("--grace-seconds", type=float, help="On SIGTERM, how long to wait for acks.")
@click.option(
    "--heartbeat-ms",
    type=int,
    help="Heartbeat interval the broker suggests in HELLO. [default: 1000]",
)
@click.option(
    "--lease-ms",
    type=int,
    help="Ack timeout for peers that do not heartbeat (stock PHPMQ); 0 = never. [default: 60000]",
)
@click.option("--max-in-flight-ms", type=int, help="Ack timeout for every peer; 0 = none.")
@click.option(
    "--max-deliveries", type=int, help="Dead-letter a message after this many; 0 = no limit."
)
@click.option("--max-queue-length", type=int, help="Ready messages per queue; 0 = no limit.")
@click.option(
    "--overflow",
    type=click.Choice(["reject", "drop-oldest"]),
    help="A send to a full queue: refuse it, or dead-letter the oldest. [default: reject]",
)
@click.option(
    "--dedup-window-seconds",
    type=float,
    help="How long a producer's idempotency key is remembered; 0 = not kept. [default: 120]",
)
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def broker(config_path: str | None, **flags: Any) -> None:
    """Run a broker in the foreground until SIGINT/SIGTERM.

    Settings come from (later wins) defaults, --config FILE.toml, PHPMQ_* environment
    variables (e.g. PHPMQ_BIND) and these flags. On the first signal the broker stops taking
    sends, waits --grace-seconds for acks, and exits; a second signal exits at once.
    """
    from ..broker.server import BrokerError, BrokerServer

    try:
        config = load_config(config_path, flags)
    except ConfigError as exc:
        _fail(str(exc))
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        server = BrokerServer(config)
    except BrokerError as exc:
        _fail(str(exc))
    server.install_signal_handlers()
    server.run()


@main.command()
@broker_option
@click.argument("queue")
@click.argument("message", required=False)
@click.option(
    "--ttl",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seconds to live; 0 never expires.",
)
@click.option("--lines", is_flag=True, help="Read stdin; send each line as one message.")
@click.option(
    "--confirm",
    is_flag=True,
    help="Wait for the broker's confirm (on disk with --data-dir) and print each message ID.",
)
@click.option(
    "--key",
    help="Idempotency key: sent again within the broker's window, the message is not queued"
    " twice. With --lines, KEY-1, KEY-2, ... per line.",
)
def send(
    address: str,
    queue: str,
    message: str | None,
    ttl: int,
    lines: bool,
    confirm: bool,
    key: str | None,
) -> None:
    """Send MESSAGE to QUEUE. With MESSAGE '-' or absent, read it from stdin."""
    if lines:
        contents = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    elif message is None or message == "-":
        contents = [sys.stdin.buffer.read()]
    else:
        contents = [message.encode()]
    keys = None
    if key is not None:
        keys = [f"{key}-{n}" for n in range(1, len(contents) + 1)] if lines else [key]
    if not confirm:
        sent = _with_client(address, lambda c: c.send_many(queue, contents, ttl, keys=keys))
        click.echo(f"sent {sent} message{'s' if sent != 1 else ''} to {queue}", err=True)
        return
    ids = _with_client(
        address, lambda c: c.send_many(queue, contents, ttl, confirm=True, keys=keys)
    )
    for message_id in ids:
        click.echo(message_id)
    click.echo(f"{len(ids)} confirmed in {queue}", err=True)


@main.command()
@broker_option
@click.argument("queue")
@click.option(
    "--count",
    "-n",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Stop after this many messages.",
)
@click.option("--window", type=click.IntRange(min=1), help="Unacked messages at a time.")
@click.option(
    "--ack/--no-ack",
    default=True,
    show_default=True,
    help="--no-ack leaves messages unacked: they return to the queue on exit.",
)
@click.option("--timeout", type=float, help="Stop after this many seconds without a message.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
def consume(
    address: str,
    queue: str,
    count: int,
    window: int | None,
    ack: bool,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Print messages from QUEUE, one per line (content as text)."""

    def run(client: Client) -> int:
        received = 0
        for message in client.consume(queue, window or count, timeout):
            if as_json:
                out = msgspec.json.encode(
                    {
                        "queue": message.queue,
                        "id": message.id,
                        "ttl": message.ttl,
                        "delivery_count": message.delivery_count,
                        "content": message.content.decode(errors="replace"),
                    }
                ).decode()
            else:
                out = message.content.decode(errors="replace")
            click.echo(out)
            if ack:
                message.ack()
            received += 1
            if received >= count:
                break
        return received

    received = _with_client(address, run)
    if received < count:
        click.echo(f"got {received} of {count} messages before the timeout", err=True)


@main.command()
@broker_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def stats(address: str, as_json: bool) -> None:
    """Show queues (ready, in flight, consumers, dead letters) and counters."""
    result = _with_client(address, lambda c: _admin(c, "stats"))
    if as_json:
        click.echo(msgspec.json.encode(result).decode())
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"phpmq broker {address}")
    for column in ("queue", "ready", "in flight", "consumers", "dead letters"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for name, q in result["queues"].items():
        table.add_row(
            name, *(str(q[k]) for k in ("ready", "in_flight", "consumers", "dead_letters"))
        )
    console = Console()
    console.print(table)
    if result.get("pools"):
        pools = Table(title="worker pools")
        for column in ("pool", "queue", "workers", "busy", "idle", "held"):
            pools.add_column(column, justify="left" if column in ("pool", "queue") else "right")
        for pool_name, pool in result["pools"].items():
            for queue_name, q in pool["queues"].items():
                idle = q["workers"] - q["busy"]
                pools.add_row(
                    pool_name,
                    queue_name,
                    str(q["workers"]),
                    str(q["busy"]),
                    str(idle),
                    str(q["held"]),
                )
        console.print(pools)
    for bridge_name, report in result.get("bridges", {}).items():
        numbers = ", ".join(f"{k} {v}" for k, v in report["counters"].items())
        console.print(f"bridge {bridge_name} ({report['kind']}): {numbers}")
    counters = ", ".join(f"{k} {v}" for k, v in result["counters"].items())
    console.print(f"peers {result['peers']}, up {result['uptime_seconds']:.0f}s; {counters}")


def _admin(client: Client, command: str, **options: Any) -> dict[str, Any]:
    from ..client import BrokerRefused

    try:
        return client.admin(command, **options)
    except BrokerRefused as exc:
        _fail(exc.error.reason)
        raise  # unreachable


@main.group()
def dlq() -> None:
    """Inspect, replay and purge a queue's dead letters."""


@dlq.command("list")
@broker_option
@click.argument("queue")
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def dlq_list(address: str, queue: str, limit: int, as_json: bool) -> None:
    """List QUEUE's dead letters, oldest first."""
    result = _with_client(address, lambda c: _admin(c, "dlq-list", queue=queue, limit=limit))
    if as_json:
        click.echo(msgspec.json.encode(result).decode())
        return
    import base64

    for entry in result["entries"]:
        content = base64.b64decode(entry["content"]).decode(errors="replace")
        preview = content if len(content) <= 60 else content[:57] + "..."
        click.echo(
            f"{entry['id']}  {entry['reason']:<15} deliveries={entry['deliveries']}  {preview}"
        )
    click.echo(f"{result['total']} dead letters in {queue} ({result['dropped']} dropped)", err=True)


@dlq.command("replay")
@broker_option
@click.argument("queue")
@click.option("--id", "ids", multiple=True, help="Replay only these IDs (repeatable).")
def dlq_replay(address: str, queue: str, ids: tuple[str, ...]) -> None:
    """Put QUEUE's dead letters back at the tail of QUEUE (same IDs, no TTL)."""
    options: dict[str, Any] = {"queue": queue}
    if ids:
        options["ids"] = list(ids)
    result = _with_client(address, lambda c: _admin(c, "dlq-replay", **options))
    click.echo(f"replayed {result['replayed']} dead letters into {queue}")


@dlq.command("purge")
@broker_option
@click.argument("queue")
def dlq_purge(address: str, queue: str) -> None:
    """Delete all of QUEUE's dead letters."""
    result = _with_client(address, lambda c: _admin(c, "dlq-purge", queue=queue))
    click.echo(f"purged {result['purged']} dead letters from {queue}")


@main.group()
def bridge() -> None:
    """Connect existing ZeroMQ tools to the broker's queues (one process per bridge).

    In: pull-in (PULL -> queue), sub-in (SUB -> queue). Out: push-out (queue -> PUSH),
    pub-out (queue -> PUB), req-out (queue -> REQ to REP/ROUTER workers). Each logs its
    counters periodically, reports them to `phpmq stats`, and stops gracefully on
    SIGTERM/SIGINT, acking nothing it did not deliver.
    """


def _bridge_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """Options every bridge takes."""
    options = [
        click.option(
            "--broker",
            "broker",
            envvar="PHPMQ_BROKER",
            default=DEFAULT_ADDRESS,
            show_default=True,
            help="Broker address (env PHPMQ_BROKER).",
        ),
        click.option(
            "--bind", "bind", is_flag=True, help="Bind ADDRESS instead of connecting to it."
        ),
        click.option(
            "--hwm",
            type=click.IntRange(min=1),
            default=1000,
            show_default=True,
            help="High-water mark of the socket facing the tool.",
        ),
        click.option("--name", help="Name in logs and `phpmq stats`. [default: the kind]"),
        click.option(
            "--report-seconds",
            type=click.FloatRange(min=0.1),
            default=10.0,
            show_default=True,
            help="How often the counters are logged and reported.",
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def _run_bridge(make: Callable[[], Any]) -> None:
    import zmq

    from ..workers.logs import configure_logging

    configure_logging(False, "bridge")
    try:
        running = make()
    except (zmq.ZMQError, ClientError) as exc:
        _fail(str(exc))
    running.install_signal_handlers()
    sys.exit(running.run())


@bridge.command("pull-in")
@_bridge_options
@click.argument("address")
@click.option(
    "--queue",
    help="Queue for single-part messages. Without it, each message must"
    " have two parts: [queue, content].",
)
def bridge_pull_in(
    broker: str,
    address: str,
    queue: str | None,
    bind: bool,
    hwm: int,
    name: str | None,
    report_seconds: float,
) -> None:
    """PULL from ADDRESS; every message becomes a send to a queue.

    When the broker does not take messages, the bridge stops reading, so the PUSH side
    blocks at its high-water mark: backpressure, never a drop.
    """
    from ..bridges.inbound import PullIn

    _run_bridge(
        lambda: PullIn(broker, address, bind, queue, name or "pull-in", report_seconds, hwm)
    )


@bridge.command("sub-in")
@_bridge_options
@click.argument("address")
@click.option(
    "--topic",
    "topics",
    multiple=True,
    required=True,
    help="TOPIC=QUEUE (repeatable): subscribe to TOPIC, queue its messages in QUEUE."
    " TOPIC alone queues in a queue of the same name; '' subscribes to everything.",
)
def bridge_sub_in(
    broker: str,
    address: str,
    topics: tuple[str, ...],
    bind: bool,
    hwm: int,
    name: str | None,
    report_seconds: float,
) -> None:
    """SUB to a PUB at ADDRESS; each message is queued, so a lossy stream becomes durable
    from the moment the bridge reads it. Parts: [topic, content], or one part that starts
    with its topic (then the whole part is the content)."""
    from ..bridges.inbound import SubIn

    mapping = {}
    for entry in topics:
        topic, sep, queue = entry.partition("=")
        mapping[topic] = queue if sep else topic
    if any(not queue for queue in mapping.values()):
        _fail("every --topic needs a queue: TOPIC=QUEUE (an empty topic needs one too)")
    _run_bridge(
        lambda: SubIn(broker, address, bind, mapping, name or "sub-in", report_seconds, hwm)
    )


@bridge.command("push-out")
@_bridge_options
@click.argument("queue")
@click.argument("address")
@click.option("--window", type=click.IntRange(min=1), default=100, show_default=True)
def bridge_push_out(
    broker: str,
    queue: str,
    address: str,
    window: int,
    bind: bool,
    hwm: int,
    name: str | None,
    report_seconds: float,
) -> None:
    """Consume QUEUE and PUSH each message to PULL workers at ADDRESS.

    A message is acked once ZeroMQ accepted the send: past the bridge, delivery is at most
    once (a worker that dies with messages in its buffer loses them).
    """
    from ..bridges.outbound import PushOut

    _run_bridge(
        lambda: PushOut(
            broker, queue, address, bind, window, name or "push-out", report_seconds, hwm
        )
    )


@bridge.command("pub-out")
@_bridge_options
@click.argument("queue")
@click.argument("address")
@click.option("--topic", help="First frame of each message. [default: the queue name]")
@click.option("--window", type=click.IntRange(min=1), default=100, show_default=True)
def bridge_pub_out(
    broker: str,
    queue: str,
    address: str,
    topic: str | None,
    window: int,
    bind: bool,
    hwm: int,
    name: str | None,
    report_seconds: float,
) -> None:
    """Consume QUEUE and PUB each message as [topic, content] on ADDRESS (acked once
    published; PUB drops for slow or absent subscribers)."""
    from ..bridges.outbound import PubOut

    _run_bridge(
        lambda: PubOut(
            broker, queue, address, bind, topic, window, name or "pub-out", report_seconds, hwm
        )
    )


@bridge.command("req-out")
@_bridge_options
@click.argument("queue")
@click.argument("address")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.001),
    default=5.0,
    show_default=True,
    help="Seconds to wait for each reply.",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Retries on a fresh socket before the message is requeued.",
)
@click.option("--reply-queue", help="Send each reply to this queue.")
def bridge_req_out(
    broker: str,
    queue: str,
    address: str,
    timeout: float,
    retries: int,
    reply_queue: str | None,
    bind: bool,
    hwm: int,
    name: str | None,
    report_seconds: float,
) -> None:
    """Consume QUEUE and send each message over REQ to REP/ROUTER workers at ADDRESS
    (lazy pirate): acked on reply, requeued after the last timeout. At least once."""
    from ..bridges.outbound import ReqOut

    if bind:
        _fail("req-out connects to its workers; --bind is not supported")
    _run_bridge(
        lambda: ReqOut(
            broker, queue, address, timeout, retries, reply_queue, name or "req-out", report_seconds
        )
    )


def _queue_weight(value: str) -> tuple[str, int]:
    name, _, weight = value.rpartition(":")
    if not name:
        return value, 1
    if not weight.isdigit() or int(weight) < 1:
        raise click.BadParameter(f"weight must be a positive integer in {value!r}")
    return name, int(weight)


@main.command()
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
@click.option("--processes", "-p", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--prefetch",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Messages each worker holds ahead of the one it runs (split among queues by weight).",
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
@click.option("--max-retry-delay", type=click.FloatRange(min=0), default=300.0, show_default=True)
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
    Returning acks it; raising workers.Retry(delay=...) or any exception requeues it with
    backoff until --max-retries, then dead-letters it with the exception as reason; raising
    workers.Reject dead-letters it at once. Async handlers are awaited. SIGTERM/SIGINT stop
    gracefully (a second signal kills), SIGHUP reloads the handler code worker by worker.
    """
    from ..client import check_address
    from ..workers.child import ChildSpec, load_handler
    from ..workers.logs import configure_logging
    from ..workers.pool import Pool, PoolSpec

    configure_logging(log_json, "supervisor")
    try:
        load_handler(handler)  # fail here, once, rather than in every worker
        check_address(address)
    except (ValueError, ClientError) as exc:
        _fail(str(exc))
    try:
        parsed = tuple(_queue_weight(queue) for queue in queues)
    except click.BadParameter as exc:
        _fail(str(exc.message))
    child = ChildSpec(
        broker=address,
        handler=handler,
        queues=parsed,
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
    sys.exit(Pool(spec).run())


@main.command()
@click.option("--messages", type=click.IntRange(min=1), default=200_000, show_default=True)
@click.option(
    "--size",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="Content bytes per message.",
)
@click.option("--window", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--codec", is_flag=True, help="Also run the encode+decode micro-benchmark.")
@click.option(
    "--durable",
    is_flag=True,
    help="Also run the durable workload: --data-dir and a confirming producer.",
)
@click.option(
    "--pool",
    "pool",
    is_flag=True,
    help="Also run the worker pool benchmark (no-op handler, 1/2/4 processes).",
)
def bench(messages: int, size: int, window: int, codec: bool, durable: bool, pool: bool) -> None:
    """Benchmark the `pipe` workload against a bare pyzmq relay on loopback.

    Starts its own broker, producer and consumer processes on free loopback ports, and prints
    msgs/s, p50/p99 latency and the ratio to the relay ceiling measured in the same run.
    """
    from ..bench.pipe import run_pipe_benchmark

    if codec:
        from ..bench.codec import run_codec_benchmark

        run_codec_benchmark()
    run_pipe_benchmark(messages=messages, size=size, window=window)
    if durable:
        from ..bench.pipe import run_durable_pipe

        run_durable_pipe(messages=messages, size=size, window=window)
    if pool:
        from ..bench.pool import run_pool_benchmark

        run_pool_benchmark()


def _add_pipeline() -> None:
    # pipeline.cli imports click and the client only: pyspark loads when a command runs.
    from ..pipeline.cli import pipeline

    main.add_command(pipeline)


_add_pipeline()

if __name__ == "__main__":
    main()
