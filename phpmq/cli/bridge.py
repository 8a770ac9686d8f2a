"""`phpmq bridge`: existing ZeroMQ tools in and out of the broker's queues."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from ..protocol import DEFAULT_ADDRESS
from .shared import checked_address, fail


@click.group()
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
            callback=checked_address,
            help="Broker address (env PHPMQ_BROKER).",
        ),
        click.option(
            "--bind",
            "bind",
            is_flag=True,
            show_default=True,
            help="Bind ADDRESS instead of connecting to it.",
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


def _run_bridge(address: str, bind: bool, make: Callable[[], Any]) -> None:
    import zmq

    from ..client import ClientError
    from ..workers.logs import configure_logging

    configure_logging(False, "bridge")
    try:
        running = make()
    except zmq.ZMQError as exc:
        fail(f"cannot {'bind' if bind else 'connect to'} {address}: {zmq.strerror(exc.errno)}")
    except ClientError as exc:
        fail(str(exc))
    running.install_signal_handlers()
    sys.exit(running.run())


@bridge.command("pull-in")
@_bridge_options
@click.argument("address")
@click.option(
    "--queue",
    help="Queue for single-part messages. Without it, each message must"
    " have two parts: [queue, content].  [default: none]",
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
        address,
        bind,
        lambda: PullIn(broker, address, bind, queue, name or "pull-in", report_seconds, hwm),
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
        fail("every --topic needs a queue: TOPIC=QUEUE (an empty topic needs one too)")
    _run_bridge(
        address,
        bind,
        lambda: SubIn(broker, address, bind, mapping, name or "sub-in", report_seconds, hwm),
    )


@bridge.command("push-out")
@_bridge_options
@click.argument("queue")
@click.argument("address")
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Messages taken from QUEUE and not yet acked, at most.",
)
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
        address,
        bind,
        lambda: PushOut(
            broker, queue, address, bind, window, name or "push-out", report_seconds, hwm
        ),
    )


@bridge.command("pub-out")
@_bridge_options
@click.argument("targets", nargs=-1, required=True, metavar="[QUEUE] ADDRESS")
@click.option(
    "--events",
    "events",
    multiple=True,
    metavar="PATTERN",
    help="Follow a live feed of these event patterns instead of a queue (repeat for more):"
    " a temporary queue bound to them, deleted when the bridge stops. Give no QUEUE then."
    "  [default: none: consume QUEUE]",
)
@click.option(
    "--topic",
    help="First frame of each message. [default: the queue name; with --events, each"
    " message's event name]",
)
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Messages taken from QUEUE and not yet acked, at most.",
)
def bridge_pub_out(
    broker: str,
    targets: tuple[str, ...],
    events: tuple[str, ...],
    topic: str | None,
    window: int,
    bind: bool,
    hwm: int,
    name: str | None,
    report_seconds: float,
) -> None:
    """Consume QUEUE (or, with --events, a live feed of events) and PUB each message as
    [topic, content] on ADDRESS (acked once published; PUB drops for slow or absent
    subscribers).

    \b
    phpmq bridge pub-out news tcp://*:6000 --bind
    phpmq bridge pub-out tcp://*:6000 --bind --events 'order.*' --events 'user.#'
    """
    from ..bridges.outbound import PubOut

    wanted = 1 if events else 2
    if len(targets) != wanted:
        fail(
            "give ADDRESS and --events PATTERN, or QUEUE and ADDRESS"
            if events
            else "give QUEUE and ADDRESS (or ADDRESS and --events PATTERN)"
        )
    queue, address = ("", targets[0]) if events else targets
    _run_bridge(
        address,
        bind,
        lambda: PubOut(
            broker,
            queue,
            address,
            bind,
            topic,
            window,
            name or "pub-out",
            report_seconds,
            hwm,
            events,
        ),
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
@click.option("--reply-queue", help="Send each reply to this queue. [default: replies dropped]")
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
        fail("req-out connects to its workers; --bind is not supported")
    _run_bridge(
        address,
        bind,
        lambda: ReqOut(
            broker, queue, address, timeout, retries, reply_queue, name or "req-out", report_seconds
        ),
    )
