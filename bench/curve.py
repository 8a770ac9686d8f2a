"""The `curve` workload (`phpmq bench --curve`): the pipe (1 producer -> 1 queue -> 1 consumer
acking each message) through a plain broker and through a CURVE broker, in the same run, then
through the CURVE broker again while processes flood it with handshakes that fail (keys it
does not know). It prints the rates and their ratios; nothing is asserted.

The producer and consumer find their keys in PHPMQ_CURVE_SECRET / PHPMQ_CURVE_SERVER, as any
client process does (docs/security.md).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import zmq
from rich.console import Console

from ..testing import BrokerProcess
from .pipe import _consume_broker, _run, runs_table

#: Processes that try handshakes with unknown keys during the flood run, and how many each
#: tries a second at most.
FLOODERS = 2
FLOOD_PER_S = 40


def _flood(address: str, stop: Any, attempts: Any) -> None:
    """Try handshakes with a fresh unknown key pair, FLOOD_PER_S a second (each fails): the
    flood's own CPU stays small, so what the pipe loses is what the broker pays."""
    context = zmq.Context()
    server = os.environ["PHPMQ_CURVE_SERVER_KEY"].encode()
    pause = 1 / FLOOD_PER_S
    while not stop.is_set():
        started = time.monotonic()
        public, secret = zmq.curve_keypair()
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
        sock.connect(address)
        sock.poll(20)  # the handshake runs (and fails) meanwhile; nothing ever arrives
        sock.close()
        attempts.value += 1
        time.sleep(max(0.0, pause - (time.monotonic() - started)))
    context.term()


@contextmanager
def _environment(**values: str):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _keys(folder: Path) -> dict[str, str]:
    for name in ("broker", "bench"):
        subprocess.run(
            [sys.executable, "-m", "phpmq", "keys", "generate", name, "--dir", str(folder)],
            check=True,
            capture_output=True,
        )
    clients = folder / "clients"
    clients.mkdir()
    (clients / "bench.key").write_text((folder / "bench.key").read_text())
    public = next(
        line.split('"')[1]
        for line in (folder / "broker.key").read_text().splitlines()
        if "public-key" in line
    )
    return {"secret": str(folder / "bench.key_secret"), "server": public}


def run_curve_benchmark(messages: int = 200_000, size: int = 100, window: int = 100) -> dict:
    console = Console()
    console.print(
        f"curve: the pipe ({messages:,} messages of {size} bytes, window {window}) without and"
        f" with CURVE, then with CURVE under a flood of failed handshakes ({FLOODERS} processes,"
        f" up to {FLOOD_PER_S} a second each)"
    )
    runs: dict[str, dict] = {}
    with BrokerProcess("--log-level", "WARNING") as broker:
        runs["plain"] = _run(broker.address, _consume_broker, messages, size, window)
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        keys = _keys(folder)
        flags = ("--curve-secret", str(folder / "broker.key_secret"))
        flags += ("--curve-clients", str(folder / "clients"), "--log-level", "ERROR")
        with (
            _environment(PHPMQ_CURVE_SECRET=keys["secret"], PHPMQ_CURVE_SERVER=keys["server"]),
            BrokerProcess(*flags) as broker,
        ):
            address = broker.address
            runs["CURVE"] = _run(address, _consume_broker, messages, size, window)
            flooded_run, flood = _flooded(address, keys, messages, size, window)
            runs["CURVE, flood of bad handshakes"] = flooded_run
            denied = broker.stats()["security"]["handshakes_denied"]
    console.print(runs_table("pipe", runs))
    plain, curve = runs["plain"]["msgs_per_s"], runs["CURVE"]["msgs_per_s"]
    flooded = runs["CURVE, flood of bad handshakes"]["msgs_per_s"]
    console.print(
        f"CURVE/plain: {curve / plain:.0%}; flooded/CURVE: {flooded / curve:.0%}"
        f" ({flood:,} bad handshakes tried during the run, {denied:,} refused by the broker)"
    )
    return {"runs": runs, "curve_ratio": curve / plain, "flood_ratio": flooded / curve}


def _flooded(
    address: str, keys: dict[str, str], messages: int, size: int, window: int
) -> tuple[dict, int]:
    ctx = mp.get_context("spawn")
    stop, attempts = ctx.Event(), ctx.Value("q", 0)
    with _environment(PHPMQ_CURVE_SERVER_KEY=keys["server"]):
        flooders = [
            ctx.Process(target=_flood, args=(address, stop, attempts), daemon=True)
            for _ in range(FLOODERS)
        ]
        for process in flooders:
            process.start()
    time.sleep(1.0)  # the flood is under way before the pipe starts
    try:
        result = _run(address, _consume_broker, messages, size, window)
    finally:
        stop.set()
        for process in flooders:
            process.join(10)
    return result, int(attempts.value)
