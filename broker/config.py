"""The broker's configuration: one msgspec Struct, filled (later wins) from its defaults, an
optional TOML file, PHPMQ_* environment variables, and command-line flags."""

from __future__ import annotations

import ipaddress
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from ..protocol import DEFAULT_MAX_CONTENT_BYTES, rules

ENV_PREFIX = "PHPMQ_"
DIALECTS = ("ttl", "pre-ttl")


#: Networks the raw TCP endpoint serves when `tcp_allow` is empty.
LOOPBACK = ("127.0.0.0/8", "::1/128")


def endpoint_is_local(endpoint: str) -> bool:
    """`tcp://127.0.0.1:5555`, `tcp://localhost:…`, `tcp://[::1]:…`, `ipc://`, `inproc://`."""
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    host = rest.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or `*`: reachable from elsewhere


class ConfigError(Exception):
    """Raised when a configuration source holds an unknown key or a bad value."""


OVERFLOW_POLICIES = ("reject", "drop-oldest")


class QueueSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per-queue overrides of the broker-wide defaults (TOML: `[queues.NAME]`)."""

    max_deliveries: int | None = None
    max_length: int | None = None
    overflow: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_deliveries", "max_length"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} cannot be negative")
        if self.overflow is not None and self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}")


class BrokerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Where the ROUTER socket binds. Loopback by default: opening to the LAN is a choice.
    bind: str = rules.DEFAULT_ADDRESS
    #: The form of 003 sent to a peer until it speaks the TTL form itself: "ttl" (the
    #: README's 4-packet dispatch) or "pre-ttl" (the stock php-mq client's 3 packets).
    dialect: str = "ttl"
    #: Durability: a directory for the message store (SQLite, fsync per loop turn). Empty: the
    #: broker keeps everything in memory and a restart loses it (it says so at start).
    data_dir: str = ""
    #: The raw-TCP endpoint for stock PHPMQ clients (plain sockets, no ZeroMQ), e.g.
    #: "tcp://0.0.0.0:5556"; empty: off.
    tcp_bind: str = ""
    #: The form of 003 on that endpoint until a peer speaks the TTL form: the stock client's.
    tcp_dialect: str = "pre-ttl"
    #: Where `/metrics` is served for Prometheus, "host:port" (e.g. "0.0.0.0:9464"); empty:
    #: off (docs/metrics.md). With shards, shard i serves port + i.
    metrics_bind: str = ""
    #: Largest packet content accepted (bytes); bigger sends get a 413 error.
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES
    #: Largest ZeroMQ frame accepted (bytes); libzmq drops the connection of a peer that sends
    #: more (ZMQ_MAXMSGSIZE), so a frame of garbage cannot make us allocate without bound.
    max_frame_bytes: int = 64 * 1024 * 1024
    #: Largest consume window (count in 002) a consumer may ask for.
    max_window: int = 100_000
    #: Dead letters kept per queue; beyond it the oldest is dropped (and counted).
    dead_letter_limit: int = 10_000
    #: Frames queued per peer in libzmq before a send reports EAGAIN (then the broker keeps
    #: them itself; what it sends a consumer is bounded by the consumer's window anyway).
    send_hwm: int = 10_000
    #: Frames queued per peer on receive before libzmq stops reading that peer's TCP socket,
    #: which pushes back on a producer that outruns the broker. This bounds what producers
    #: can make the broker hold before it reads a byte: peers x receive_hwm x frame size, each
    #: frame at most `max_frame_bytes` (in practice a client's frame of 256 small messages is
    #: ~10-30 KB: 1,000 frames ~ 10-30 MB per flooding peer), plus what the kernel's socket
    #: buffers hold. 1,000 (libzmq's default is 1,000 too) keeps the pipe benchmark's
    #: throughput (its producer never has more than a few dozen frames in flight).
    receive_hwm: int = 1_000
    #: Frames read per loop turn and transport before the turn's dispatches are sent.
    batch_frames: int = 2_000
    #: A loop turn stops reading once it has read for this long (milliseconds), whatever
    #: `batch_frames` allows: one busy producer cannot delay heartbeats, admin answers and
    #: dispatches to everyone else by more than about this much. The rest waits for the next
    #: turn (no peer is declared dead for silence while frames wait unread).
    turn_budget_ms: float = 5.0
    #: Bytes waiting in the broker for one peer that does not read them (beside
    #: `max_backlog_frames`): past this the peer counts as gone. 64 MiB is four of the largest
    #: messages (`max_content_bytes`), so a consumer of big messages that is merely slow
    #: is not given up after one of them, while a dead reader costs at most this much.
    max_backlog_bytes: int = 64 * 1024 * 1024
    #: On SIGTERM/SIGINT: seconds to wait for outstanding acks before exiting.
    grace_seconds: float = 5.0

    # Liveness (docs/protocol.md §6.2). A peer that says HELLO with a heartbeat interval is
    # dead after interval x liveness of silence; the broker heartbeats it when otherwise idle.
    #: The broker's own interval, stated in its HELLO answer as the one it suggests; a peer's
    #: requested interval is what is agreed (within the range below).
    heartbeat_ms: int = rules.DEFAULT_HEARTBEAT_MS
    #: Range a peer's requested interval is clamped to.
    min_heartbeat_ms: int = rules.MIN_HEARTBEAT_MS
    max_heartbeat_ms: int = rules.MAX_HEARTBEAT_MS
    #: Missed intervals before a peer counts as dead, when its HELLO does not say (2-10).
    liveness: int = rules.DEFAULT_LIVENESS
    #: How long a peer that does not heartbeat (a stock PHPMQ client) may hold a message before
    #: it goes back to its queue: the ack timeout (beanstalkd's TTR). 0 = forever.
    lease_ms: int = 60_000
    #: The same limit for every peer, heartbeating or not. 0 = none.
    max_in_flight_ms: int = 0
    #: A peer that does not heartbeat, holds nothing and has been quiet this long is forgotten.
    idle_peer_seconds: float = 300.0
    #: At its key's (host's) quota of connections, a new peer takes the place of one that
    #: does not heartbeat, holds nothing and has been quiet this long (docs/protocol.md §12.4).
    reclaim_silent_seconds: float = 15.0

    # Limits (each refusal is an ERROR to extension peers, a counted log line for stock ones).
    #: Deliveries after which a message goes to the dead-letter store (`max-deliveries`);
    #: RabbitMQ's quorum queues default to 20 too. 0 = no limit.
    max_deliveries: int = 20
    #: Ready messages per queue. 0 = no limit.
    max_queue_length: int = 1_000_000
    #: What a send to a full queue does: "reject" it (429) or "drop-oldest" into dead letters.
    overflow: str = "reject"
    #: Consumers (windows) per queue.
    max_consumers: int = 1_000
    #: Queues in the broker.
    max_queues: int = 10_000
    #: Bytes the held messages may take (content, headers and ~200 bytes each) before sends
    #: are refused (503) until they are under 80% again; producers that said HELLO are asked
    #: to pause at 90%. Bytes, a size ("512MB", "2GiB"), a share of the machine's RAM ("40%",
    #: RabbitMQ's classic memory watermark) or 0 for no limit.
    max_memory: int | str = "40%"
    #: Durable mode: free space the volume of `data_dir` keeps. Below it sends are refused
    #: (507) while consumers drain and acks are written; they are taken again once the
    #: volume has a quarter more than this free. Bytes, a size ("256MB"), a share of the
    #: volume ("5%"), "auto" (room for the WAL to be checkpointed twice over, or 2% of the
    #: volume if more, at most 1 GiB: docs/durability.md) or 0 for no floor.
    min_free_disk: int | str = "auto"
    #: Frames waiting for one peer that does not read them; past this the peer counts as gone
    #: (its messages go back to their queues) instead of growing the broker's memory.
    max_backlog_frames: int = 1_000
    # Publisher confirms and idempotent producers (docs/protocol.md §6.3).
    #: How long a producer's idempotency key (packet 14) is remembered per queue: a repeat
    #: within it is confirmed with the first message's ID instead of being queued again.
    #: NATS JetStream's duplicate window defaults to 2 minutes too. 0 = keys are not kept.
    dedup_window_seconds: float = 120.0
    #: Keys remembered at most; past it the oldest are forgotten early (and counted).
    max_dedup_keys: int = 1_000_000
    #: Key holds (a Spark sink query's, docs/pipeline.md) at once, and idempotency keys held
    #: by them (kept without expiry until their writer commits a later batch; beside
    #: max_dedup_keys). A held key costs about 200 bytes; a sink holds up to two batches' rows.
    max_key_holds: int = 1_000
    max_held_keys: int = 1_000_000
    # Events (docs/protocol.md §6.5).
    #: Patterns one queue may be bound to, and bindings of all queues together.
    max_bindings_per_queue: int = 1_000
    max_bindings: int = 100_000
    #: Where a publish that matches no binding goes ("": nowhere; it is counted).
    unrouted_queue: str = ""
    # Shards (docs/cluster.md).
    #: Broker processes on this host, each owning a share of the queues: a number, or
    #: "auto" for one per CPU core. 1: this process is the whole broker.
    shards: int | str = 1
    #: Set by the shard supervisor for each shard it starts: the cluster map (JSON) and this
    #: shard's name in it. Empty: not part of a cluster.
    cluster: str = ""
    shard: str = ""
    #: Set by the supervisor for a replica of a replicated shard (docs/cluster.md
    #: "Replicated queues"): its Raft address (host:port) and the other replicas'.
    raft_bind: str = ""
    raft_peers: list[str] = []
    #: ...and every replica's broker endpoint by its Raft address (where its leader is),
    #: and the Raft address of the replica that should lead when it can (its home's).
    replica_endpoints: dict[str, str] = {}
    raft_preferred: str = ""
    #: ...and the node (its cluster file name) holding each replica, by its Raft address.
    replica_nodes: dict[str, str] = {}
    #: ...and how it stands in its group (docs/cluster.md "Membership"): "" a member,
    #: "joining" added to a running group (while its log is new, it stands for no election
    #: before it has heard its leader), "leaving" no longer held here (it hands over, and
    #: stops once its group has removed it).
    raft_role: str = ""
    #: ...and where every node of the cluster file holds (or would hold) a replica of this
    #: shard: a joining replica's group may be led from any of them (a leaving node's too).
    raft_candidates: list[str] = []
    #: Several hosts: the cluster file every node shares, and which node this host is
    #: (docs/cluster.md "Several hosts"). Its shards bind the node's address from the file.
    cluster_file: str = ""
    node: str = ""
    #: Named schedules the broker keeps (docs/protocol.md §6.7).
    max_schedules: int = 1_000
    #: Batch leases held at once, across queues (docs/protocol.md §6.9).
    max_leases: int = 10_000
    #: Per-key quotas (per host address for peers without a key), checked before the
    #: broker-wide limits above: queues a key has created, the bindings it made, its
    #: consumers of one queue, its schedules, its leases.
    #: 0: half the broker-wide limit.
    quota_queues: int = 0
    quota_bindings: int = 0
    quota_consumers: int = 0
    quota_schedules: int = 0
    quota_leases: int = 0
    #: Requests (§6.6) one key may have held at once (sent, not yet answered or settled);
    #: there is no broker-wide count of them beside the queues' lengths.
    quota_requests: int = 100_000
    #: Peers (connections) one key, or one other host without a key, may have at once; past
    #: it a new one's every message is refused with 429 and it is forgotten (0: no quota).
    quota_connections: int = 1_000
    #: A shard's confirmed publishes one key may have waiting for their copies at the other
    #: shards (docs/cluster.md "Forwarding"); 0: half the broker-wide 100,000.
    quota_publishes: int = 0
    #: Key holds one key may have made, and keys it may have held by them; 0: half the
    #: broker-wide max_key_holds, max_held_keys.
    quota_key_holds: int = 0
    quota_held_keys: int = 0
    #: Security (docs/security.md). CURVE on the ZeroMQ endpoint: the broker's secret key
    #: file, and a directory or file of the client public keys allowed in; re-read on SIGHUP.
    curve_secret: str = ""
    curve_clients: str = ""
    #: Rights per client key, and for peers without one (TOML); re-read on SIGHUP.
    permissions: str = ""
    #: Without CURVE: a HELLO carrying this secret gets the admin right. A broker bound to
    #: a non-loopback address without CURVE runs no admin command of a peer without it.
    admin_secret: str = ""
    #: Shards of a cluster prove to each other that a link is theirs with the broker's own
    #: CURVE key or, without CURVE, with this secret in the link's HELLO (only proven links
    #: may forward). `--shards` on one host makes one up; a cluster file over several hosts
    #: without CURVE needs the same secret on every node.
    link_secret: str = ""
    #: The raw TCP endpoint serves only these client networks: CIDRs separated by commas
    #: (empty: loopback only).
    tcp_allow: str = ""
    #: Per-queue overrides, e.g. `[queues.emails] max_deliveries = 5`.
    queues: dict[str, QueueSettings] = {}
    log_level: str = "INFO"

    def secured(self) -> bool:
        """Whether any right is in force: CURVE, a permissions file, or an admin secret."""
        return bool(self.curve_secret or self.permissions or self.admin_secret)

    def binds_loopback(self) -> bool:
        """Whether the ZeroMQ endpoint is reachable from this host only (loopback, ipc,
        inproc): then peers without a key may run admin commands."""
        return endpoint_is_local(self.bind)

    def tcp_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """The client networks the raw TCP endpoint serves (`tcp_allow`; loopback if none).

        Raises:
            ValueError: an entry that is not a network (CIDR) or an address.
        """
        entries = [entry.strip() for entry in self.tcp_allow.split(",") if entry.strip()]
        try:
            return [ipaddress.ip_network(entry, strict=False) for entry in entries or LOOPBACK]
        except ValueError as exc:
            raise ValueError(f"tcp_allow: {exc}") from None

    def __post_init__(self) -> None:
        positive = (
            "max_content_bytes",
            "max_frame_bytes",
            "max_window",
            "dead_letter_limit",
            "send_hwm",
            "receive_hwm",
            "batch_frames",
            "turn_budget_ms",
            "max_backlog_bytes",
            "heartbeat_ms",
            "min_heartbeat_ms",
            "max_heartbeat_ms",
            "max_consumers",
            "max_queues",
            "max_backlog_frames",
            "max_dedup_keys",
            "max_bindings_per_queue",
            "max_bindings",
            "max_schedules",
            "max_leases",
            "max_key_holds",
            "max_held_keys",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        quotas = ("quota_queues", "quota_bindings", "quota_consumers", "quota_schedules")
        more = ("quota_leases", "quota_requests", "quota_connections", "quota_publishes")
        more += ("quota_key_holds", "quota_held_keys")
        for name in (*quotas, *more):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (half the broker-wide limit) or more")
        self.tcp_networks()  # raises on a bad CIDR
        if self.dialect not in DIALECTS or self.tcp_dialect not in DIALECTS:
            raise ValueError(f"dialect and tcp_dialect must be one of {', '.join(DIALECTS)}")
        for name in ("lease_ms", "max_in_flight_ms", "max_deliveries", "max_queue_length"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} cannot be negative")
        if self.grace_seconds < 0:
            raise ValueError("grace_seconds cannot be negative")
        if self.dedup_window_seconds < 0:
            raise ValueError("dedup_window_seconds cannot be negative")
        for name in ("idle_peer_seconds", "reclaim_silent_seconds"):
            if not 0 < getattr(self, name) < math.inf:  # (nan is neither)
                raise ValueError(f"{name} must be a positive number of seconds")
        if not rules.MIN_LIVENESS <= self.liveness <= rules.MAX_LIVENESS:
            raise ValueError(
                f"liveness must be between {rules.MIN_LIVENESS} and {rules.MAX_LIVENESS}"
            )
        if not self.min_heartbeat_ms <= self.heartbeat_ms <= self.max_heartbeat_ms:
            raise ValueError("heartbeat_ms must lie between min_heartbeat_ms and max_heartbeat_ms")
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}")
        memory_limit(self.max_memory)  # raises ValueError for a bad size
        if self.min_free_disk != AUTO:
            byte_size("min_free_disk", self.min_free_disk, lambda: 1)  # the same
        self.shard_count()  # raises ValueError for a bad count
        if self.metrics_bind:
            metrics_address(self.metrics_bind)  # raises ValueError for a bad address
        if bool(self.cluster_file) != bool(self.node):
            raise ValueError("cluster_file and node go together: give both or neither")
        if self.unrouted_queue and rules.queue_name_problem(self.unrouted_queue):
            raise ValueError(f"unrouted_queue: {rules.queue_name_problem(self.unrouted_queue)}")

    def shard_count(self) -> int:
        """How many shard processes `shards` asks for.

        Raises:
            ValueError: neither a positive number nor "auto".
        """
        shards = self.shards
        if shards == "auto":
            return os.cpu_count() or 1
        if isinstance(shards, str):
            try:
                shards = int(shards)
            except ValueError:
                raise ValueError(f"shards must be a number or 'auto', not {shards!r}") from None
        if shards < 1:
            raise ValueError("shards must be at least 1")
        return shards

    @property
    def max_memory_bytes(self) -> int:
        return memory_limit(self.max_memory)


def metrics_address(bind: str, index: int = 0) -> tuple[str, int]:
    """`metrics_bind` ("host:port", "[::1]:port" or ":port" for every interface) as the
    (host, port) to serve on; `index` is added to the port (shard i serves port + i). Port 0
    is any free port, for every shard alike (the ready file tells which).

    Raises:
        ValueError: not host:port with a port of 0-65535.
    """
    host, colon, port_text = bind.rpartition(":")
    port = int(port_text) if colon and port_text.isdigit() else -1
    if port == 0:
        return host.strip("[]"), 0
    if not 1 <= port + index <= 65535:
        raise ValueError(f"metrics_bind must be host:port (e.g. 127.0.0.1:9464), not {bind!r}")
    return host.strip("[]"), port + index


def metrics_bind_text(host: str, port: int) -> str:
    """(host, port) written back as a `metrics_bind` value ("[::1]:9464" for IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}


#: `min_free_disk`'s default: sized from the volume when the store opens (broker/disk.py).
AUTO = "auto"


def memory_limit(value: int | str) -> int:
    """`max_memory` in bytes: an int, "512MB", "2GiB", "40%" of the machine's RAM, 0 = none.

    Raises:
        ValueError: anything else.
    """
    return byte_size("max_memory", value, physical_memory)


def byte_size(name: str, value: int | str, whole: Callable[[], int]) -> int:
    """Setting `name` in bytes: an int, "512MB", "2GiB", or a share ("40%") of `whole()`.

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} cannot be negative")
        return value
    text = value.strip().lower()
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            raise ValueError(f"{name} {value!r} is not a percentage") from None
        if not 0 <= share <= 100:
            raise ValueError(f"{name} as a percentage must be 0-100%")
        return int(whole() * share / 100)
    number = text.rstrip("kmgib")
    unit = text[len(number) :]
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in _SIZE_UNITS or amount < 0:
        raise ValueError(f"{name} {value!r} is not a size (bytes, '512MB', '2GiB', '40%' or 0)")
    return int(amount * _SIZE_UNITS[unit])


def physical_memory() -> int:
    """The machine's RAM in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


FIELDS = BrokerConfig.__struct_fields__


#: Settings that are tables, not scalars: only the TOML file can give them.
TABLE_FIELDS = frozenset({"queues"})

#: The variables of the settings a client has a variable of the same meaning for
#: (PHPMQ_CURVE_SECRET, PHPMQ_ADMIN_SECRET: phpmq/client/curve.py): the broker's are its own,
#: so a shell that exports a client's key can still start a broker.
BROKER_ONLY_VARIABLES = {
    "curve_secret": "PHPMQ_BROKER_CURVE_SECRET",
    "admin_secret": "PHPMQ_BROKER_ADMIN_SECRET",
}


def env_variable(setting: str) -> str:
    """The environment variable of a setting: PHPMQ_<SETTING>, but for BROKER_ONLY_VARIABLES."""
    return BROKER_ONLY_VARIABLES.get(setting, ENV_PREFIX + setting.upper())


#: Every variable the broker reads.
ENVIRONMENT_VARIABLES = frozenset(env_variable(name) for name in FIELDS if name not in TABLE_FIELDS)


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings given as PHPMQ_* variables, each converted to its field's type here so
    that a bad one is reported under the variable's name, not the setting's."""
    values = {}
    for field in msgspec.structs.fields(BrokerConfig):
        variable = env_variable(field.name)
        if variable not in environ or field.name in TABLE_FIELDS:
            continue
        try:
            values[field.name] = msgspec.convert(environ[variable], field.type, strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid {variable}={environ[variable]!r}: {exc}") from None
    return values


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """Merge defaults < TOML file < environment < overrides (None values are ignored).

    Raises:
        ConfigError: a file that cannot be read, an unknown key, or a bad value.
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values.update(tomllib.loads(Path(path).read_text()))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:  # (not UTF-8)
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
    from_env = _from_env(os.environ if environ is None else environ)
    values.update(from_env)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    values.update(given)
    try:
        return msgspec.convert(values, BrokerConfig, strict=False)
    except (msgspec.ValidationError, ValueError) as exc:
        # Name the variable when a value it set breaks a rule (e.g. PHPMQ_MAX_WINDOW=0).
        culprits = [n for n in from_env if n not in given and n in str(exc)]
        source = f" (from {', '.join(env_variable(n) for n in culprits)})" if culprits else ""
        raise ConfigError(f"invalid configuration: {exc}{source}") from None
