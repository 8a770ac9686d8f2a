"""The clients of the replicated LAN test (tests/test_replication_lan.py), run inside a
namespace of the LAN (`python replicated_lan_agent.py MODE ...`), since only there do the
nodes' addresses answer:

- `probe`: reads JSON lines from stdin, each a list of replica endpoints, and answers each
  with a line: every replica's role ("leader", "follower"; null: no answer), asked on bare
  sockets with `stats` "here" (a client would follow a follower to its leader).
- `workload EVENTS ENDPOINTS QUEUE...`: one producer per queue (confirmed sends with
  idempotency keys, each retried with its key until confirmed) and one consumer of every
  queue (acking), all phpmq Clients given every node's endpoint; and a stock-protocol
  producer to every queue through one node at a time (the brokers forward); until stdin
  closes.
- `drain EVENTS ENDPOINTS SECONDS QUEUE...`: consume and ack until the queues stay empty.
- `send EVENTS ENDPOINTS SECONDS QUEUE:KEY...`: keyed sends, each retried until confirmed
  (for SECONDS in all).
- `minority EVENTS ENDPOINT SECONDS QUEUE KEY`: prints "ready", waits for a line on stdin,
  then one keyed send on a bare socket to ENDPOINT only, sent again every second until
  confirmed or SECONDS are over.

Every attempt, confirm and delivery is a JSON line appended to EVENTS, timed with
time.monotonic() (one clock for every process of the machine): the test's checker reads it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from typing import Any

import zmq

import phpmq.protocol as p
from phpmq import Client, ClientError
from phpmq.protocol import admin_commands as cmd
from replicated_cluster import answer_to

#: A producer's pause between two confirmed sends (a few tens of messages per cycle).
PACE_S = 0.25
#: How long a send waits for its confirm before it is tried again.
CONFIRM_TIMEOUT_S = 1.5
#: A drain ends once nothing came for this long.
DRAIN_IDLE_S = 4.0


class Events:
    """The EVENTS file, one JSON object a line, written whole by any thread."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)
        self._lock = threading.Lock()

    def add(self, kind: str, queue: str, key: str, **more: Any) -> None:
        line = json.dumps({"e": kind, "queue": queue, "key": key, "t": time.monotonic(), **more})
        with self._lock:
            self._file.write(line + "\n")


def client(endpoints: str) -> Client:
    return Client(endpoints, confirm_timeout=CONFIRM_TIMEOUT_S, send_timeout=2.0, close_timeout=1)


def send_until_confirmed(
    producer: Client, events: Events, queue: str, key: str, until: float, stop: threading.Event
) -> bool:
    """One keyed send, retried with its key on any error; whether it was confirmed."""
    while time.monotonic() < until and not stop.is_set():
        events.add("attempt", queue, key)
        try:
            producer.send(queue, key.encode(), confirm=True, key=key)
        except ClientError as exc:
            events.add("error", queue, key, why=str(exc)[:200])
            time.sleep(0.1)
            continue
        events.add("confirmed", queue, key)
        return True
    return False


def produce(endpoints: str, events: Events, queue: str, stop: threading.Event) -> None:
    with client(endpoints) as producer:
        number = 0
        while not stop.is_set():
            key = f"{queue}-{number}"
            if send_until_confirmed(producer, events, queue, key, float("inf"), stop):
                number += 1
                stop.wait(PACE_S)


def produce_stock(endpoints: str, events: Events, queues: list[str], stop: threading.Event) -> None:
    """A stock-protocol producer (a bare socket, no map: the brokers forward its sends to
    each queue's leader), to every queue in turn, through one node's endpoint at a time:
    the next node's after any send not confirmed within its wait."""
    nodes = endpoints.split(",")
    number = 0
    while not stop.is_set():
        queue = queues[number % len(queues)]
        key = f"{queue}-stock-{number}"
        while not stop.is_set():
            events.add("attempt", queue, key)
            if _confirmed_at(nodes[0], queue, key):
                events.add("confirmed", queue, key)
                number += 1
                stop.wait(PACE_S)
                break
            events.add("error", queue, key, why=f"no confirm through {nodes[0]}")
            nodes.append(nodes.pop(0))


def _confirmed_at(endpoint: str, queue: str, key: str) -> bool:
    """One keyed send on a fresh bare socket to `endpoint`: whether it was confirmed."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(endpoint)
        sock.send(p.encode(p.Hello({})))
        sock.send(p.encode(p.Send(queue, key.encode(), tag=1, key=key)))
        return isinstance(answer_to(sock, 1, CONFIRM_TIMEOUT_S), p.Confirm)
    finally:
        close_saying_goodbye(sock)


def close_saying_goodbye(sock: zmq.Socket) -> None:
    """KBAI, then close: a broker remembers a peer that spoke the extensions and vanished
    for idle_peer_seconds (300 s), and every one counts against its host's quota of
    connections (1,000), which sockets opened for one send or one probe would fill."""
    with contextlib.suppress(zmq.Again):  # (a pipe full of unanswered sends: no goodbye)
        sock.send(p.encode(p.Kbai()), zmq.NOBLOCK)
    sock.close(linger=100)


def consume(endpoints: str, events: Events, queues: list[str], stop: threading.Event) -> None:
    with client(endpoints) as consumer:
        for queue in queues:
            while True:  # the first subscription waits for the broker's greeting
                try:
                    consumer.subscribe(queue, 50)
                    break
                except ClientError as exc:
                    events.add("error", queue, "", why=str(exc)[:200])
        while not stop.is_set():
            message = consumer.receive(timeout=0.5)
            if message is not None:
                events.add("delivered", message.queue, message.content.decode())
                message.ack()


def workload(events: Events, endpoints: str, queues: list[str]) -> None:
    """Until stdin closes; exits 1 if a producer or the consumer died of an exception."""
    stop = threading.Event()
    crashed: list[BaseException] = []

    def guarded(target: Any, *args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:
            crashed.append(exc)
            raise

    threads = [
        threading.Thread(target=guarded, args=(produce, endpoints, events, queue, stop))
        for queue in queues
    ]
    threads += [
        threading.Thread(target=guarded, args=(role, endpoints, events, queues, stop))
        for role in (produce_stock, consume)
    ]
    for thread in threads:
        thread.start()
    sys.stdin.read()  # the test closes it to stop the workload
    stop.set()
    for thread in threads:
        thread.join()
    if crashed:
        raise SystemExit(f"the workload's clients crashed: {crashed}")


def drain(events: Events, endpoints: str, seconds: float, queues: list[str]) -> None:
    deadline = time.monotonic() + seconds
    with client(endpoints) as consumer:
        for queue in queues:
            consumer.subscribe(queue, 200)
        last = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - last < DRAIN_IDLE_S:
            message = consumer.receive(timeout=0.5)
            if message is not None:
                last = time.monotonic()
                events.add("delivered", message.queue, message.content.decode(), drain=True)
                message.ack()


def send(events: Events, endpoints: str, seconds: float, sends: list[str]) -> None:
    with client(endpoints) as producer:
        until = time.monotonic() + seconds
        for queue, _, key in (pair.partition(":") for pair in sends):
            send_until_confirmed(producer, events, queue, key, until, threading.Event())


def minority(events: Events, endpoint: str, seconds: float, queue: str, key: str) -> None:
    """A producer that reaches only `endpoint` (a replica on a node cut off from the rest).
    It says "ready" on stdout once started and connects at a line on its stdin: the test
    cuts the node off in between, so that a loaded machine's slow start of Python does not
    eat the seconds the cut-off leader still leads. The broker's HELLO answer is noted first
    ("greeted", with whether it was a follower's): proof that the sends reach it."""
    print("ready", flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + seconds
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    sock.send(p.encode(p.Hello({})))
    greeting = _hello_answer(sock, deadline)
    if greeting is not None:
        events.add("greeted", queue, key, standby="standby" in greeting.options, minority=True)
    tag = 0
    while (left := deadline - time.monotonic()) > 0:
        tag += 1
        events.add("attempt", queue, key, minority=True)
        sock.send(p.encode(p.Send(queue, key.encode(), tag=tag, key=key)))
        answer = answer_to(sock, tag, min(1.0, left))
        if isinstance(answer, p.Confirm):
            events.add("confirmed", queue, key, minority=True)
            break
        if isinstance(answer, p.Error):
            events.add("error", queue, key, why=f"{answer.code} {answer.reason}", minority=True)
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    close_saying_goodbye(sock)


def _hello_answer(sock: zmq.Socket, deadline: float) -> p.Hello | None:
    while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000) + 1):
        for message in p.decode_frame(sock.recv())[0]:
            if isinstance(message, p.Hello):
                return message
    return None


def probe() -> None:
    for line in sys.stdin:
        print(json.dumps(roles(json.loads(line))), flush=True)


def roles(endpoints: list[str], wait: float = 1.0) -> list[str | None]:
    """Each endpoint's replication role, asked of all at once."""
    context = zmq.Context.instance()
    sockets = []
    for endpoint in endpoints:
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(endpoint)
        sock.send(p.encode(p.Admin({"command": cmd.STATS, "here": True})))
        sockets.append(sock)
    found: list[str | None] = [None] * len(endpoints)
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    deadline = time.monotonic() + wait
    while None in found and (left := deadline - time.monotonic()) > 0:
        for sock, _ in poller.poll(int(left * 1000) + 1):
            messages, _ = p.decode_frame(sock.recv())
            for message in messages:
                if isinstance(message, p.AdminReply):
                    replication = message.options.get("replication", {})
                    found[sockets.index(sock)] = replication.get("role")
    for sock in sockets:
        close_saying_goodbye(sock)
    return found


def main(mode: str, args: list[str]) -> None:
    if mode == "probe":
        probe()
        return
    events, rest = Events(args[0]), args[1:]
    if mode == "workload":
        workload(events, rest[0], rest[1:])
    elif mode == "drain":
        drain(events, rest[0], float(rest[1]), rest[2:])
    elif mode == "send":
        send(events, rest[0], float(rest[1]), rest[2:])
    elif mode == "minority":
        minority(events, rest[0], float(rest[1]), rest[2], rest[3])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
