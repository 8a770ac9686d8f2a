"""`stats` over a sharded broker (docs/cluster.md): each shard answers for its own queues, so
`phpmq stats` and `phpmq queue list` ask every shard of the map the first one tells and show
them as one broker, each queue with the shard that owns it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .shared import stats

if TYPE_CHECKING:
    from ..client import Client

#: Figures of each shard's stats that add up to the cluster's.
SUMMED = ("peers", "bindings")


def cluster_stats(client: Client) -> dict[str, Any]:
    """The broker's stats; for a shard of a sharded broker, every shard's, merged: queues
    and clients of all (each queue with its `shard`), counters and memory summed, and
    `shards` listing each shard's address, peers and uptime.

    A shard that does not answer is listed with why (`shards[name]["unreachable"]`); the
    others are shown as they are.

    Raises:
        ClientError: the shard asked first did not answer (the command fails with one line).
    """
    from ..client import Client, ClientError

    home = stats(client)
    mapping = client.cluster_map
    if mapping is None or len(mapping.shards) < 2:
        return home
    mine = client.broker_info.get("shard")
    answers = {}
    unreachable = {}
    for shard in mapping.shards:
        if shard.name == mine:
            answers[shard.name] = home
            continue
        try:
            with Client(shard.address, name="phpmq-cli", send_timeout=client.send_timeout) as other:
                answers[shard.name] = stats(other)
        except ClientError as exc:
            unreachable[shard.name] = str(exc)
    addresses = {shard.name: shard.address for shard in mapping.shards}
    merged = _merged(answers, addresses)
    for name, why in unreachable.items():
        merged["shards"][name] = {"address": addresses[name], "unreachable": why}
    return merged


def _merged(answers: dict[str, dict[str, Any]], addresses: dict[str, str]) -> dict[str, Any]:
    first = next(iter(answers.values()))
    merged: dict[str, Any] = {**first, "queues": {}, "clients": [], "pools": {}, "bridges": {}}
    merged["counters"] = dict.fromkeys(first["counters"], 0)
    merged["memory"] = {**first["memory"], "held_bytes": 0, "paused_producers": 0}
    for name in SUMMED:
        merged[name] = 0
    merged["shards"] = {}
    for shard, answer in answers.items():
        for queue, figures in answer["queues"].items():
            merged["queues"][queue] = {**figures, "shard": shard}
        merged["clients"] += answer["clients"]
        merged["pools"].update(answer["pools"])
        merged["bridges"].update(answer["bridges"])
        for counter, value in answer["counters"].items():
            merged["counters"][counter] = merged["counters"].get(counter, 0) + value
        merged["memory"]["held_bytes"] += answer["memory"]["held_bytes"]
        merged["memory"]["paused_producers"] += answer["memory"]["paused_producers"]
        merged["memory"]["alarm"] = merged["memory"]["alarm"] or answer["memory"]["alarm"]
        for name in SUMMED:
            merged[name] += answer[name]
        merged["shards"][shard] = {
            "address": addresses[shard],
            "peers": answer["peers"],
            "queues": len(answer["queues"]),
            "uptime_seconds": answer["uptime_seconds"],
        }
    merged["queues"] = dict(sorted(merged["queues"].items()))
    return merged
