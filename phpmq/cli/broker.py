"""`phpmq broker`: run a broker in the foreground."""

from __future__ import annotations

import json
import logging
import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..protocol import DEFAULT_ADDRESS
from .shared import fail, stop_status

if TYPE_CHECKING:
    from ..broker.config import BrokerConfig


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="TOML file. [default: none]",
)
@click.option("--bind", help=f"ROUTER address to bind. [default: {DEFAULT_ADDRESS}]")
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
    "--tcp-allow",
    help="Client networks the raw TCP endpoint serves: CIDRs separated by commas (e.g."
    " 10.0.0.0/8,192.168.1.0/24); other connections are closed. [default: loopback only]",
)
@click.option(
    "--curve-secret",
    type=click.Path(dir_okay=False),
    help="Encrypt and authenticate the ZeroMQ endpoint with CURVE: the broker's NAME.key_secret"
    " file (phpmq keys generate). Needs --curve-clients. [default: off]",
)
@click.option(
    "--curve-clients",
    type=click.Path(),
    help="The client public keys let in: a directory of NAME.key files, or a file of `NAME KEY`"
    " lines. Re-read on SIGHUP. [default: none]",
)
@click.option(
    "--permissions",
    type=click.Path(dir_okay=False),
    help="Rights per client key, and for peers without one (TOML, docs/security.md)."
    " Re-read on SIGHUP. [default: every allowed key may do everything]",
)
@click.option(
    "--admin-secret",
    help="Without CURVE: a HELLO carrying this secret may run admin commands (purge, delete,"
    " replay, schedules); prefer PHPMQ_BROKER_ADMIN_SECRET. [default: none: only on a loopback"
    " bind]",
)
@click.option(
    "--metrics-bind",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9464); with"
    " --shards, shard i serves PORT + i (docs/metrics.md). [default: off]",
)
@click.option(
    "--unrouted-queue",
    help="Keep published events that match no binding in this queue. [default: none: they"
    " are only counted]",
)
@click.option(
    "--shards",
    help="Broker processes on this host, each owning a share of the queues (a number, or"
    " 'auto': one per core). Shard i binds the --bind port + i; clients learn the map at"
    " HELLO (docs/cluster.md). [default: 1]",
)
@click.option(
    "--cluster-file",
    type=click.Path(dir_okay=False),
    help="Several hosts: the cluster file (TOML: epoch, replicas, raft_port_offset, and"
    " [[nodes]] with name, address and shards) that every node shares; needs --node. This host"
    " runs that node's shards (with replicas > 1: its replicas, which need --data-dir) at its"
    " address from the file (docs/cluster.md). [default: none]",
)
@click.option("--node", help="Which node of --cluster-file this host is. [default: none]")
@click.option(
    "--dialect",
    type=click.Choice(["ttl", "pre-ttl"]),
    help="Form of 003 for peers that have not spoken the TTL form. [default: ttl]",
)
@click.option(
    "--max-content-bytes",
    type=int,
    help="Largest message content accepted. [default: 16777216]",
)
@click.option(
    "--max-window",
    type=int,
    help="Largest consume window a consumer may ask for. [default: 100000]",
)
@click.option("--dead-letter-limit", type=int, help="Dead letters kept per queue. [default: 10000]")
@click.option(
    "--grace-seconds",
    type=float,
    help="On SIGTERM, how long to wait for acks. [default: 5.0]",
)
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
@click.option(
    "--max-in-flight-ms",
    type=int,
    help="Ack timeout for every peer; 0 = none. [default: 0]",
)
@click.option(
    "--max-deliveries",
    type=int,
    help="Dead-letter a message after this many; 0 = no limit. [default: 20]",
)
@click.option(
    "--max-queue-length",
    type=int,
    help="Ready messages per queue; 0 = no limit. [default: 1000000]",
)
@click.option(
    "--overflow",
    type=click.Choice(["reject", "drop-oldest"]),
    help="A send to a full queue: refuse it, or dead-letter the oldest. [default: reject]",
)
@click.option(
    "--max-memory",
    help="Bytes the held messages may take before sends are refused (503) and HELLO"
    " producers paused: bytes, 512MB, 2GiB, a share of RAM such as 40%, or 0 for no limit."
    " [default: 40%]",
)
@click.option(
    "--min-free-disk",
    help="With --data-dir: free space the volume keeps; below it sends are refused (507)"
    " while consumers drain: bytes, 256MB, a share of the volume such as 5%, 0 for no floor,"
    " or auto (4 WAL checkpoints' worth or 2% of the volume, at most 1 GiB). [default: auto]",
)
@click.option(
    "--dedup-window-seconds",
    type=float,
    help="How long a producer's idempotency key is remembered; 0 = not kept. [default: 120]",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    help="Once the broker serves, write where it listens into this file (JSON: pid, bind,"
    " tcp_bind, metrics_bind, and with --shards every shard's): with a '*' port in --bind or"
    " --tcp-bind, or port 0 in --metrics-bind, the port it got. [default: none]",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
    help="[default: INFO]",
)
def broker(config_path: str | None, ready_file: str | None, **flags: Any) -> None:
    """Run a broker in the foreground until SIGINT/SIGTERM.

    The defaults shown are the broker's own (broker/config.py); a --config file or a
    PHPMQ_* variable changes them.

    Settings come from (later wins) defaults, --config FILE.toml, PHPMQ_* environment
    variables (e.g. PHPMQ_BIND; the key file and admin secret are PHPMQ_BROKER_CURVE_SECRET
    and PHPMQ_BROKER_ADMIN_SECRET, apart from the clients' PHPMQ_CURVE_SECRET and
    PHPMQ_ADMIN_SECRET) and these flags. On the first signal the broker stops taking sends,
    waits --grace-seconds for acks, and exits (0; 130 after Ctrl-C); a second signal exits at
    once.
    """
    # The CLI names the broker's modules here and nowhere else: they load for this command only.
    from ..broker.config import ConfigError, load_config
    from ..broker.shell.server import BrokerError, BrokerServer

    try:
        config = load_config(config_path, flags)
    except ConfigError as exc:
        fail(str(exc))
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _note_client_variables(config)
    ready_path = None if ready_file is None else usable_ready_file(ready_file)
    on_ready = None if ready_path is None else partial(write_ready_file, ready_path)
    try:
        if config.shard_count() > 1 or config.cluster_file:
            from ..broker.shell.shards import ShardSupervisor

            try:
                supervisor = ShardSupervisor(config, on_ready)
                supervisor.wait_for_addresses()  # an earlier supervisor's shards may be draining
            except ValueError as exc:
                fail(str(exc))
            raise SystemExit(supervisor.run() or stop_status(supervisor.stopped_by))
        try:
            server = BrokerServer(config)
        except BrokerError as exc:
            fail(str(exc))
        server.install_signal_handlers()
        server.run(on_ready)
        raise SystemExit(stop_status(server.stopped_by))
    finally:
        if ready_path is not None:
            ready_path.unlink(missing_ok=True)  # it says where a running broker listens


def usable_ready_file(name: str) -> Path:
    """--ready-file's path, its old copy removed; one line and exit 1 if it cannot be written."""
    path = Path(name)
    folder = path.absolute().parent
    if not (folder.is_dir() and os.access(folder, os.W_OK)):
        fail(f"cannot write the ready file {name}: {folder} is not a writable folder")
    path.unlink(missing_ok=True)
    return path


def write_ready_file(path: Path, endpoints: dict[str, Any]) -> None:
    """The endpoints with this process's id, written whole or not at all (a reader that
    polls for the file never sees half of it)."""
    partial_path = path.with_name(f".{path.name}.{os.getpid()}")
    partial_path.write_text(json.dumps({**endpoints, "pid": os.getpid()}))
    partial_path.replace(path)


def _note_client_variables(config: BrokerConfig) -> None:
    """A client's key file or admin secret exported where the broker starts is not the
    broker's own: when the broker has none, say which name it reads."""
    from ..broker.config import BROKER_ONLY_VARIABLES, ENV_PREFIX

    for setting, broker_variable in BROKER_ONLY_VARIABLES.items():
        client_variable = ENV_PREFIX + setting.upper()  # the clients' name for the same thing
        if client_variable in os.environ and not getattr(config, setting):
            click.echo(
                f"phpmq: warning: {client_variable} is a client's variable; this broker's"
                f" {setting} is --{setting.replace('_', '-')} or {broker_variable}, not set",
                err=True,
            )
