"""A PHPMQ peer run as a subprocess by tests/test_fault_tolerance.py, so that a test can kill,
stop and resume it like a real worker process.

    python tests/peer_process.py hold ADDRESS QUEUE WINDOW HEARTBEAT_MS
    python tests/peer_process.py hold-then-ack ADDRESS QUEUE WINDOW HEARTBEAT_MS
    python tests/peer_process.py produce ADDRESS QUEUE COUNT HEARTBEAT_MS [--sleep S]
    python tests/peer_process.py consume ADDRESS QUEUE WINDOW HEARTBEAT_MS --last N [--sleep S]

Every mode talks through phpmq.client.Client and prints one line per fact on stdout,
flushed at once, so the parent can follow along:

    ready                         the client is subscribed (hold, hold-then-ack, consume)
    id ID DELIVERY_COUNT          hold modes: a message was received (and is held, unacked)
    got CONTENT DELIVERY_COUNT    consume: a message was received (and acked)
    sent N MONOTONIC_TIME         produce: message N was handed to the socket
    retry N                       produce: handing message N over failed; it is retried
    event EVENT DETAIL            the client's on_event callback fired
    resumed                       hold-then-ack: resumed after it stopped itself on SIGUSR1,
                                  and acked what was held
    acked N                       hold-then-ack: N held messages were acked (late)
    error CODE ID                 hold-then-ack: an ERROR the broker sent (from client.errors)
    done ...                      the mode ended normally

Every loop is bounded by --max-seconds (the process gives up and exits 3 when it is reached).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from phpmq.client import Client, ClientError

_print_lock = threading.Lock()


def say(*parts: object) -> None:
    """One line on stdout, flushed (on_event runs on the client's heartbeat thread too)."""
    line = " ".join(str(part) for part in parts)
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def on_event(event: str, detail: str) -> None:
    say("event", event, detail.replace("\n", " "))


def new_client(args: argparse.Namespace) -> Client:
    return Client(
        args.address,
        name=f"peer-{args.mode}",
        heartbeat_ms=args.heartbeat_ms,
        liveness=args.liveness,
        send_timeout=args.send_timeout,
        close_timeout=1.0,
        on_event=on_event,
    )


def hold(args: argparse.Namespace, ack_after_pause: bool) -> int:
    """Receive and never ack. With ack_after_pause: on SIGUSR1 the peer stops itself (SIGSTOP)
    holding the client's lock; when resumed (SIGCONT) it acks everything held before letting
    go of the lock, waits a little for the broker's answers, prints its errors and exits.

    Holding the lock across the pause is what makes the late acks reach the broker from the
    connection it gave up on: the client's heartbeat thread, which needs that lock, cannot run
    first. Its first heartbeat after the pause reveals that the broker gave up on this peer
    ("unknown peer": the client rejoins), or its silence check gives the broker up
    (reconnects), after which the client drops settlements of earlier messages by design;
    acking after that would test the client, not the broker's answer to late acks. (A SIGCONT
    handler raced that thread: run 77 of the suite saw the thread win.)
    """
    resumed = threading.Event()
    held: list = []
    late_acks: list[int] = []
    deadline = time.monotonic() + args.max_seconds
    with new_client(args) as client:

        def stop_then_ack(signum: int, frame: object) -> None:
            if resumed.is_set():
                return
            with client._lock:  # the heartbeat thread's too: it waits through the pause
                os.kill(os.getpid(), signal.SIGSTOP)
                for message in held:
                    message.ack()
                client.flush()
            late_acks.append(len(held))  # no printing here: stdout is not reentrant
            resumed.set()

        if ack_after_pause:
            signal.signal(signal.SIGUSR1, stop_then_ack)
        client.subscribe(args.queue, args.window)
        say("ready")
        while not resumed.is_set():
            if time.monotonic() > deadline:
                return 3
            message = client.receive(timeout=0.05)
            if message is not None:
                held.append(message)
                say("id", message.id, message.delivery_count)
        say("resumed")
        say("acked", late_acks[0])
        # Give the broker time to answer the late acks, and the client time to rejoin.
        settle_until = time.monotonic() + args.settle_seconds
        while time.monotonic() < settle_until:
            message = client.receive(timeout=0.05)
            if message is not None:  # dispatched after rejoining: not expected by the tests
                say("id", message.id, message.delivery_count)
        for error in list(client.errors):
            say("error", error.code, (error.message_id or b"").decode())
        say("done", "reconnects", client.reconnects)
    return 0


def produce(args: argparse.Namespace) -> int:
    """Send COUNT numbered messages ("0", "1", ...), each until the client takes it."""
    deadline = time.monotonic() + args.max_seconds
    with new_client(args) as client:
        number = 0
        while number < args.count:
            if time.monotonic() > deadline:
                return 3
            try:
                client.send(args.queue, str(number))
            except ClientError:
                say("retry", number)
                time.sleep(0.05)
                continue
            say("sent", number, f"{time.monotonic():.6f}")
            number += 1
            if args.sleep:
                time.sleep(args.sleep)
        say("done", "sent", number, "reconnects", client.reconnects)
    return 0


def consume(args: argparse.Namespace) -> int:
    """Receive and ack until message content `--last` was seen and nothing came for
    `--settle-seconds`, or until `--max-seconds`."""
    deadline = time.monotonic() + args.max_seconds
    last = str(args.last).encode()
    seen_last = False
    idle_since = time.monotonic()
    with new_client(args) as client:
        client.subscribe(args.queue, args.window)
        say("ready")
        while time.monotonic() < deadline:
            message = client.receive(timeout=0.05)
            now = time.monotonic()
            if message is None:
                if seen_last and now - idle_since > args.settle_seconds:
                    break
                continue
            idle_since = now
            say("got", message.content.decode(errors="replace"), message.delivery_count)
            if args.sleep:  # "processing" time, so that a backlog builds up in the broker
                time.sleep(args.sleep)
            message.ack()
            seen_last = seen_last or message.content == last
        else:
            return 3
        say("done", "reconnects", client.reconnects)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("hold", "hold-then-ack", "produce", "consume"))
    parser.add_argument("address")
    parser.add_argument("queue")
    parser.add_argument("amount", type=int, help="window (hold, consume) or count (produce)")
    parser.add_argument("heartbeat_ms", type=int)
    parser.add_argument("--liveness", type=int, default=3)
    parser.add_argument(
        "--sleep", type=float, default=0.0, help="pause per message sent or received"
    )
    parser.add_argument("--send-timeout", type=float, default=0.5)
    parser.add_argument("--last", type=int, default=-1, help="consume: the final content")
    parser.add_argument("--settle-seconds", type=float, default=1.0)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    args = parser.parse_args()
    args.window = args.count = args.amount
    if args.mode == "hold":
        return hold(args, ack_after_pause=False)
    if args.mode == "hold-then-ack":
        return hold(args, ack_after_pause=True)
    if args.mode == "produce":
        return produce(args)
    return consume(args)


if __name__ == "__main__":
    sys.exit(main())
