"""`phpmq bench`: the broker's throughput and latency against a bare pyzmq relay, and the
overload workloads (flood, memory, steady)."""

from __future__ import annotations

import click


@click.command()
@click.option(
    "--messages",
    type=click.IntRange(min=1),
    default=200_000,
    show_default=True,
    help="Messages through the pipe.",
)
@click.option(
    "--size",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="Content bytes per message.",
)
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="The consumer's window of unacked messages.",
)
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
@click.option(
    "--flood",
    is_flag=True,
    help="Run the flood workload: N producers that never read overload a queue with a small"
    " limit while a calm pair moves 2,000 msg/s through another; peak RSS, calm latency.",
)
@click.option(
    "--memory",
    is_flag=True,
    help="Run the memory workload: RSS for --count queued 100-byte messages in memory and"
    " durable mode, and the durable store's size after the queue drains.",
)
@click.option(
    "--steady",
    is_flag=True,
    help="Run the steady workload: a paced pair at --rate msg/s for --seconds, in memory and"
    " durable mode; p50/p99/p99.9/max latency and RSS over time.",
)
@click.option(
    "--events",
    is_flag=True,
    help="Run the events workload: publish-to-delivery with 10,000 bindings (1,000 patterns)"
    " and 10 matching queues per event, beside the plain pipe's p99.",
)
@click.option(
    "--curve",
    is_flag=True,
    help="Run the curve workload: the pipe without and with CURVE in one run, then with CURVE"
    " under a flood of failed handshakes (docs/security.md).",
)
@click.option(
    "--rpc",
    is_flag=True,
    help="Run the rpc workload: requests answered by a pool of 4 workers, round trips/s and"
    " p50/p99 with 1 in flight (Client) and 64 in flight (AsyncClient), beside the pipe's"
    " msgs/s.",
)
@click.option(
    "--web",
    is_flag=True,
    help="Run the web workload: the pipe without and with `phpmq web` attached and polling,"
    " alternated for 3 rounds (needs the web extra; docs/web.md).",
)
@click.option(
    "--replicated",
    is_flag=True,
    help="Run the replicated workload: the durable pipe through one broker, then through a"
    " shard replicated on 3 loopback nodes, and the failover time over 5 kill -9s of its"
    " leader (docs/cluster.md).",
)
@click.option(
    "--shards",
    type=click.IntRange(min=2),
    default=None,
    help="Run the shards workload: --queues queues over 1 shard, then over this many"
    " (`phpmq broker --shards`), for --seconds each: msgs/s, per-shard CPU, scaling."
    "  [default: off]",
)
@click.option(
    "--queues",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Queues of the shards workload (--shards).",
)
@click.option(
    "--pipe",
    "pipe",
    is_flag=True,
    help="Run the pipe workload too when --flood, --memory or --steady is given (without"
    " them it always runs).",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.5),
    default=None,
    help="How long the flood lasts, and each steady run."
    " [default: 20 for --flood, 120 for --steady]",
)
@click.option(
    "--flooders",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Flooding producer processes (--flood).",
)
@click.option(
    "--calm",
    type=click.Choice(["stock", "client"]),
    default="stock",
    show_default=True,
    help="The calm pair of --flood: stock (one message per frame, raw DEALERs speaking the"
    " stock protocol) or client (phpmq.Client, a few messages per frame).",
)
@click.option(
    "--queue-limit",
    type=click.IntRange(min=1),
    default=100_000,
    show_default=True,
    help="The flooded broker's --max-queue-length (--flood).",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=1_000_000,
    show_default=True,
    help="Messages queued (--memory).",
)
@click.option(
    "--watch-seconds",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="How long --memory watches the drained store shrink (it stops once the size is"
    " unchanged for 10 s).",
)
@click.option(
    "--rate",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Messages a second (--steady).",
)
def bench(
    messages: int,
    size: int,
    window: int,
    codec: bool,
    durable: bool,
    pool: bool,
    flood: bool,
    memory: bool,
    steady: bool,
    events: bool,
    curve: bool,
    rpc: bool,
    web: bool,
    replicated: bool,
    shards: int | None,
    queues: int,
    pipe: bool,
    seconds: float | None,
    flooders: int,
    calm: str,
    queue_limit: int,
    count: int,
    watch_seconds: float,
    rate: int,
) -> None:
    """Benchmark the `pipe` workload against a bare pyzmq relay on loopback.

    Starts its own broker, producer and consumer processes on free loopback ports, and prints
    msgs/s, p50/p99 latency and the ratio to the relay ceiling measured in the same run.
    --codec, --durable and --pool add workloads after it.

    --flood, --memory and --steady run the long overload workloads instead of the pipe (add
    --pipe to keep it), in that order, each printing its figures beside its targets; so does
    --events (event routing: publish once, a copy to every bound queue), --rpc (requests
    and replies through a worker pool), --web (the pipe without and with a web console) and
    --replicated (the durable pipe on one node and on 3 replicas, and failover times).
    Figures are printed, never asserted. The first line says whether the broker's hot path
    runs compiled or as pure Python (docs/performance.md).
    """
    from ..bench.pipe import run_pipe_benchmark
    from ..broker.build import hot_path

    click.echo(f"hot path: {hot_path()} (docs/performance.md)")
    if codec:
        from ..bench.codec import run_codec_benchmark

        run_codec_benchmark()
    only = flood or memory or steady or events or rpc or shards or curve or web or replicated
    if pipe or not only:
        run_pipe_benchmark(messages=messages, size=size, window=window)
    if durable:
        from ..bench.pipe import run_durable_pipe

        run_durable_pipe(messages=messages, size=size, window=window)
    if replicated:
        from ..bench.replicated import run_replicated_benchmark

        run_replicated_benchmark(messages=min(messages, 100_000), size=size, window=window)
    if pool:
        from ..bench.pool import run_pool_benchmark

        run_pool_benchmark()
    if flood:
        from ..bench.flood import run_flood_benchmark

        run_flood_benchmark(
            seconds=20.0 if seconds is None else seconds,
            flooders=flooders,
            queue_limit=queue_limit,
            calm=calm,
        )
    if memory:
        from ..bench.memory import run_memory_benchmark

        run_memory_benchmark(count=count, watch_seconds=watch_seconds)
    if steady:
        from ..bench.steady import run_steady_benchmark

        run_steady_benchmark(rate=rate, seconds=120.0 if seconds is None else seconds)
    if curve:
        from ..bench.curve import run_curve_benchmark

        run_curve_benchmark(messages=messages, size=size, window=window)
    if events:
        from ..bench.events import run_events_benchmark

        run_events_benchmark(messages=messages, size=size, window=window)
    if shards:
        from ..bench.shards import run_shards_benchmark

        run_shards_benchmark(shards, queues, 10.0 if seconds is None else seconds)
    if rpc:
        from ..bench.rpc import run_rpc_benchmark

        run_rpc_benchmark(size=size, pipe_messages=messages)
    if web:
        from ..bench.web import run_web_benchmark

        run_web_benchmark(messages=messages, size=size, window=window)
