"""`stats` over a sharded broker (docs/cluster.md): each shard answers for its own queues, so
`phpmq stats` and `phpmq queue list` ask every shard of the map the first one tells and show
them as one broker, each queue with the shard that owns it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..monitor import merged_stats
from .shared import stats

if TYPE_CHECKING:
    from ..client import Client


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
    return merged_stats(answers, addresses, unreachable)
