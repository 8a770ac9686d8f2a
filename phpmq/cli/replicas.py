"""What `phpmq cluster status` and `cluster move` know of a cluster's replicas: each
replica's own `replication` figures (docs/cluster.md "Replicated queues"), asked of every
replica at once over connections that stay where they are sent (a follower's figures are
its own, not its leader's), and one row per replica made from them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ..client import Client, ClientError
    from ..protocol.cluster import ClusterMap, Shard

Result = TypeVar("Result")
#: Replicas asked at once.
MAX_ASKED_AT_ONCE = 32
#: A reachable broker that is no replica (a shard of a cluster without `replicas`).
SINGLE = "single"
UNREACHABLE = "unreachable"


def endpoints_of(shard: Shard) -> tuple[str, ...]:
    """A shard's replicas' endpoints, its home's first (a shard that is not replicated: its
    own address alone)."""
    return shard.replicas or (shard.address,)


#: How long closing waits for a replica's goodbye.
CLOSE_TIMEOUT_S = 1.0


@contextlib.contextmanager
def quiet_clients() -> Iterator[None]:
    """The clients' own warnings (a replica lost, a goodbye not answered) left out: what the
    commands print says it, in one table or one line."""
    client_log = logging.getLogger("phpmq.client")
    quiet, client_log.disabled = client_log.disabled, True
    try:
        yield
    finally:
        client_log.disabled = quiet


@contextlib.contextmanager
def staying_client(endpoint: str, timeout: float) -> Iterator[Client]:
    """A client of the broker at `endpoint` that stays there, follower or not."""
    from ..client import BrokerRefused, Client, ClientError

    client = Client(
        endpoint,
        name="phpmq-cli",
        send_timeout=timeout,
        close_timeout=min(timeout, CLOSE_TIMEOUT_S),
        follow_leader=False,
    )
    try:
        yield client
    except ClientError as exc:
        if not isinstance(exc, BrokerRefused):
            client.close_timeout = 0  # no goodbye to wait for from a broker that is silent
        raise
    finally:
        with contextlib.suppress(ClientError):
            client.close()


def ask(endpoint: str, timeout: float, call: Callable[[Client], Result]) -> Result | ClientError:
    """`call` with a staying client of `endpoint`; a ClientError (no answer, a refusal) is
    returned, not raised."""
    from ..client import ClientError

    try:
        with staying_client(endpoint, timeout) as client:
            return call(client)
    except ClientError as exc:
        return exc


def replication_of(shards: Iterable[Shard], timeout: float) -> dict[str, Any]:
    """Every replica's answer by its endpoint: its `replication` figures, None for a broker
    that is no replica, or the ClientError it gave (no answer within `timeout`)."""
    endpoints = [endpoint for shard in shards for endpoint in endpoints_of(shard)]
    with ThreadPoolExecutor(min(MAX_ASKED_AT_ONCE, len(endpoints))) as pool:
        answers = pool.map(
            lambda endpoint: ask(endpoint, timeout, lambda c: c.replication(timeout)), endpoints
        )
        return dict(zip(endpoints, answers, strict=True))


def rows(mapping: ClusterMap, answers: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per replica, shard by shard, each shard's home replica first."""
    return [
        row
        for shard in mapping.shards
        for row in shard_rows(shard, {e: answers[e] for e in endpoints_of(shard)})
    ]


def shard_rows(shard: Shard, answers: dict[str, Any]) -> list[dict[str, Any]]:
    figures = {e: a for e, a in answers.items() if isinstance(a, dict)}
    leader = next((f for f in figures.values() if f.get("role") == "leader"), None)
    # What the replicas that answered say of the others (a silent one's node, its match index).
    seen = {
        replica["endpoint"]: replica
        for answer in figures.values()
        for replica in answer.get("replicas", {}).values()
        if replica.get("endpoint")
    }
    if leader is not None:
        seen.update((r["endpoint"], r) for r in leader["replicas"].values() if r.get("endpoint"))
    highest = max((f.get("commit_index") or 0 for f in figures.values()), default=0)
    return [
        _row(shard, endpoint, answer, seen.get(endpoint, {}), leader, highest)
        for endpoint, answer in answers.items()
    ]


def _row(
    shard: Shard,
    endpoint: str,
    answer: Any,
    seen: dict[str, Any],
    leader: dict[str, Any] | None,
    highest: int,
) -> dict[str, Any]:
    row: dict[str, Any] = {"shard": shard.name, "endpoint": endpoint, "node": seen.get("node")}
    row.update(dict.fromkeys(("term", "commit_index", "applied_index", "lag", "connected")))
    if not isinstance(answer, dict):
        role = UNREACHABLE if answer is not None else SINGLE
        node = row["node"] or (shard.name.partition("/")[0] if answer is None else None)
        row.update(role=role, node=node, lag=_lag(seen, leader))
        return row
    peers = answer.get("replicas", {}).values()
    row.update(
        node=answer.get("node") or row["node"],
        role=answer.get("role"),
        term=answer.get("term"),
        commit_index=answer.get("commit_index"),
        applied_index=answer.get("applied_index"),
        connected=f"{sum(bool(peer.get('connected')) for peer in peers)}/{len(peers)}",
    )
    if answer is leader:
        row["lag"] = 0
    elif leader is not None:
        row["lag"] = _lag(seen, leader)
    else:
        row["lag"] = highest - (answer.get("commit_index") or 0)
    return row


def _lag(seen: dict[str, Any], leader: dict[str, Any] | None) -> int | None:
    """Committed entries the replica lacks, as its leader counts them (None: no leader
    answered, or it has no match index for the replica yet)."""
    if leader is None or seen.get("match_index") is None:
        return None
    return max(0, (leader.get("commit_index") or 0) - seen["match_index"])
