"""`phpmq bench`: the broker's throughput and latency against a bare pyzmq relay."""

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
