"""What the blocking and the asyncio driver share, beyond the sans-IO `Connection`: their
settings, what they show of the connection, how they react to the broker's events (logging,
`on_event`, reconnect backoff), and how refusals the connection kept are told to the caller.
Nothing here touches a socket, a thread or an event loop.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..protocol import DEFAULT_ADDRESS, Error, ErrorCode, MessageType, Pause
from ..protocol.cluster import ClusterMap, Shard
from .connection import Connection
from .curve import Curve, curve_from_environment
from .errors import BrokerRefused, InvalidArgument, Paused, QueueDeleted, Unconfirmed
from .events import (
    BROKER_LEAVING,
    BROKER_LOST,
    JOIN_REFUSED,
    QUEUE_DELETED,
    REJOINED,
    BrokerError,
    BrokerGreeted,
    BrokerLeaving,
    Event,
    HelloRefused,
    Rejoined,
    SendsPaused,
    SendsResumed,
    SubscriptionEnded,
    UndecodableFrame,
)
from .greeting import JOIN_ATTEMPTS
from .refusals import FlowRefusal
from .shards import ShardRouting, cluster_in
from .topics import deleted_reason

log = logging.getLogger("phpmq.client")
#: Reconnect jitter from a generator of its own: the application's `random` (seeded, or
#: watched as hypothesis watches it) is not drawn from behind its back.
_JITTER = random.Random()

#: Reconnect delays: the first retry is quick, then doubling (Paranoid Pirate), with jitter so
#: that a pool of clients does not reconnect in lockstep.
RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 5.0
#: How long a socket whose broker has not answered yet may take a frame, at most, while the
#: client has somewhere else to go (another endpoint given, another replica): a dead
#: endpoint (a replica's host down) then costs this, not the whole send_timeout.
FIRST_CONTACT_S = 1.0
#: How long a replaced socket may still deliver what was handed to it.
RECONNECT_LINGER_S = 30.0
#: ERRORs refusing these message types are kept for the caller (refusals.py), not only logged.
TOLD_TO_THE_CALLER = frozenset((MessageType.SEND, MessageType.CONSUME, MessageType.PUBLISH))
#: Where a client connects when it is given no address (the CLI's --broker reads it too).
BROKER_VARIABLE = "PHPMQ_BROKER"


def broker_address(given: str | None) -> str:
    """The address a client connects to: `given`, else PHPMQ_BROKER, else loopback:5555."""
    return given or os.environ.get(BROKER_VARIABLE) or DEFAULT_ADDRESS


class Driver:
    """The part of a client that is neither protocol (Connection) nor I/O."""

    def __init__(
        self,
        address: str | None,
        connection: Connection,
        settings: dict[str, Any],
        *,
        routed_by: Driver | None = None,
        follow_leader: bool = True,
    ) -> None:
        """`settings`: the client's constructor arguments by name, with which each link is
        made too (`send_timeout`, `close_timeout`, `confirm_timeout`, `on_event` and `curve`
        are kept here). `routed_by`: the routing client this one is a link of, a connection
        to one more shard (it routes nothing itself and tells that client the maps it hears).
        `address` may list several endpoints, separated by commas: the others are tried in
        turn when the one in use is lost (and a replicated shard's replicas join them, unless
        not `follow_leader`: then a follower replica is not left for its leader, nor a lost
        replica for another, so that what is asked of it, e.g. `stats` with `here`, is its)."""
        #: Where this connection may go (docs/client.md "Replicated shards"), and the one it
        #: uses now.
        self._addresses = [part.strip() for part in broker_address(address).split(",")]
        self.address = self._addresses[0]
        #: The constructor arguments a link to another shard is made with: this client's.
        self._link_settings = settings
        #: CURVE keys (docs/security.md): given, or from PHPMQ_CURVE_SECRET/_SERVER.
        curve: Curve | None = settings["curve"]
        self.curve = curve if curve is not None else curve_from_environment()
        self.send_timeout: float = timeout_seconds(settings["send_timeout"], "send_timeout")
        self.close_timeout: float = timeout_seconds(settings["close_timeout"], "close_timeout")
        #: How long a confirmed send waits for the broker's answer (per message for send,
        #: without progress for send_many).
        self.confirm_timeout: float = timeout_seconds(
            settings["confirm_timeout"], "confirm_timeout"
        )
        self.on_event: Callable[[str, str], None] | None = settings["on_event"]
        self.closed = False
        #: Whether a follower replica is left for its leader (and a lost one for another).
        self.follows_leader = follow_leader
        #: How often this connection (not its links) was lost and made again.
        self._reconnected = 0
        self._connection = connection
        self._routed_by = routed_by
        #: Where queue-addressed calls go (docs/client.md "Sharded brokers"); links have none.
        self._shards: ShardRouting[Any] | None = None if routed_by else ShardRouting()
        #: The hot path's one check: None while not routing (not sharded, or a link).
        self._routing: ShardRouting[Any] | None = self._shards
        self._reconnect_delay = RECONNECT_FIRST_S
        self._reconnect_at: float | None = None

    @property
    def broker_info(self) -> dict[str, Any]:
        """The broker's HELLO answer (empty until it came)."""
        return self._connection.broker_info

    @property
    def cluster_map(self) -> ClusterMap | None:
        """The cluster map of a sharded broker, from its HELLO answer (None: not sharded, or
        no answer yet): `cluster_map.owner(queue).address` is where a queue lives
        (docs/cluster.md)."""
        return cluster_in(self._connection.broker_info)

    def shard_of(self, queue: str) -> str | None:
        """The name of the shard that queue-addressed calls for `queue` go to (None: the
        broker is not sharded, or its HELLO answer has not come yet)."""
        return None if self._shards is None else self._shards.shard_of(queue)

    def _links(self) -> list[Any]:
        """The connections to other shards made so far (each a whole client)."""
        return [] if self._shards is None else list(self._shards.links.values())

    @property
    def reconnects(self) -> int:
        """How often a connection was lost and made again: this one's and its links' summed."""
        return self._reconnected + sum(link.reconnects for link in self._links())

    @property
    def errors(self) -> deque[Error]:
        """The last 1000 ERRORs that answered no confirmed send: the home connection's, then
        each link's (a new deque; a lone connection's own)."""
        links = self._links()
        if not links:
            return self._connection.errors
        chained = deque(self._connection.errors, maxlen=1000)
        for link in links:
            chained.extend(link.errors)
        return chained

    @property
    def error_count(self) -> int:
        """ERRORs received in all, on every connection."""
        return self._connection.error_count + sum(link.error_count for link in self._links())

    @property
    def sent_since_heard(self) -> int:
        """Messages handed to the sockets since their broker was last heard from, summed over
        the connections: what a broker crash could have taken with it (exact counts need
        confirms)."""
        own = self._connection.sent_since_heard
        return own + sum(link.sent_since_heard for link in self._links())

    def _hello_heard(self, options: dict[str, Any]) -> None:
        """A HELLO answer: the routing client adopts its map (a newer epoch) and, from home,
        whether the broker is sharded; a follower replica's answer names its leader."""
        if self.follows_leader:
            self._learn_replicas(options)
            self._follow_leader(options)
        if self._routed_by is not None:
            self._routed_by._map_heard(options, from_home=False)
        else:
            self._map_heard(options, from_home=True)

    def _learn_replicas(self, options: dict[str, Any]) -> None:
        """The replicas of the shard this connection reaches are where it may go too."""
        cluster, name = cluster_in(options), options.get("shard")
        if cluster is None:
            return
        for shard in cluster.shards:
            if shard.name == name:
                self._addresses += [a for a in shard.replicas if a not in self._addresses]

    def _follow_leader(self, options: dict[str, Any]) -> None:
        """A follower answered: it forwards to its leader, but going there saves a hop. The
        move waits while answers are due on this socket (a reconnect would lose them)."""
        leader = options.get("leader")
        if (
            "standby" in options
            and type(leader) is str
            and leader != self.address
            and leader in self._addresses
            and not self._connection.awaiting_answers
        ):
            log.info(
                "broker %s is a follower replica: going to its leader %s", self.address, leader
            )
            self.address = leader
            self._reconnect_at = time.monotonic()

    def _map_heard(self, options: dict[str, Any], *, from_home: bool) -> None:
        shards = self._shards
        if shards is None:
            return
        shards.heard(options, from_home=from_home)
        self._routing = shards if shards.sharded else None

    def _routing_waited_for(self) -> None:
        """The wait for the home HELLO answer is over: routing is decided. Without an answer
        everything stays at home, as for a broker that is not sharded (a later answer may
        still turn routing on)."""
        if self._shards is not None:
            self._shards.decided = True
            self._routing = self._shards if self._shards.sharded else None

    def _settings_for_link(self) -> dict[str, Any]:
        """The constructor arguments a link to another shard is made with: this client's."""
        return dict(self._link_settings, _routed_by=self)

    def _client_at(self, shard: str) -> Any:
        """The connection to the shard named `shard`: this one (home), a link, or None."""
        shards = self._shards
        if shards is None or shard == shards.home:
            return self
        return shards.links.get(shard)

    def _new_link(self, shard: Shard) -> Any:
        """A connection to `shard`, a whole client of this one's kind and settings."""
        assert self._shards is not None
        addresses = ",".join(shard.replicas) if shard.replicas else shard.address
        link = type(self)(addresses, **self._settings_for_link())
        self._shards.links[shard.name] = link
        return link

    def _remember_subscription(
        self, queue: str, window: int, bind: tuple[str, ...], delete_when_unused: float | None
    ) -> None:
        """Where `queue` is consumed, kept by the routing client to move it with the map."""
        shards = (self._routed_by or self)._shards
        if shards is not None:
            shards.subscribed(queue, window, bind, delete_when_unused)

    def _forget_subscription(self, queue: str) -> None:
        shards = (self._routed_by or self)._shards
        if shards is not None:
            shards.unsubscribed(queue)

    # ------------------------------------------------------------------ refusals

    def _tell_refused_sends(self) -> None:
        """Raise BrokerRefused for refused sends the caller was not told of yet."""
        refused = self._connection.refusals.take_sends()
        if refused:
            raise BrokerRefused(refused[0], refused)

    def _tell_refused_subscription(self) -> None:
        """Raise BrokerRefused for a subscription the broker refused for good."""
        subscriptions = self._connection.refusals.subscriptions
        if subscriptions:
            _, refusal = subscriptions.popitem()
            raise BrokerRefused(refusal)

    def _tell_deleted(self) -> None:
        """Raise QueueDeleted for a consumed queue the broker deleted, not told yet."""
        deleted = self._connection.topics.deleted
        if deleted:
            _, cancel = deleted.popitem()
            error = Error(
                ErrorCode.UNKNOWN_MESSAGE,
                deleted_reason(cancel),
                queue=cancel.queue,
                refused=MessageType.CONSUME,
            )
            raise QueueDeleted(error, cancel.count or 0)

    def _one_answer(self, answer: str | Error | FlowRefusal | None) -> str:
        """A confirmed send's answer: its ID, or BrokerRefused / Unconfirmed."""
        if isinstance(answer, FlowRefusal):
            raise BrokerRefused(answer.error)
        if isinstance(answer, Error):
            raise BrokerRefused(answer)
        if answer is None:
            why = f"no confirm from the broker at {self.address}{self._unanswered_why()}"
            if self._connection.sent_since_heard:  # silent since: try the next replica
                self._untaken(why)
            raise Unconfirmed(why, [None], {})
        return answer

    def _unanswered_why(self) -> str:
        """What an Unconfirmed adds when the broker refused this client's HELLO (the sends
        behind it were not read)."""
        trouble = self._connection.join_trouble()
        return f": {trouble}" if trouble else ""

    @staticmethod
    def _pause_outlasted(queue: str | None, pause: Pause, waited: float) -> Paused:
        """What to raise when a send to `queue` waited `send_timeout` for a RESUME in vain."""
        error = Error(pause.code, pause.reason, queue=pause.queue, refused=MessageType.SEND)
        detail = "" if pause.queue is not None or queue is None else f" (sending to {queue!r})"
        return Paused(error, waited, ids=[None], detail=detail)

    @staticmethod
    def _with_page(whole: dict[str, Any], page: dict[str, Any], key: str) -> dict[str, Any]:
        """A paged admin answer (docs/protocol.md §9) with the entries of one more page (a
        list, or for `stats` a dict of queues) under `key`, and that page's `next_offset`."""
        entries = whole[key]
        if isinstance(entries, dict):
            entries.update(page[key])
        else:
            entries.extend(page[key])
        whole["next_offset"] = page.get("next_offset")
        return whole

    @staticmethod
    def _admin_result(options: dict[str, Any]) -> dict[str, Any]:
        """An ADMIN_REPLY's result, or BrokerRefused for the error it carries."""
        refusal = options.get("error")
        if isinstance(refusal, dict):
            raise BrokerRefused(Error(int(refusal.get("code", 0)), str(refusal.get("reason"))))
        return options

    # ------------------------------------------------------------------ events

    def _on_event(self, event: Event) -> None:
        if isinstance(event, BrokerGreeted):
            self._reconnect_delay = RECONNECT_FIRST_S
            self._hello_heard(event.options)
        elif isinstance(event, BrokerError):
            # Refused sends and subscriptions reach the caller as BrokerRefused (or are
            # retried): a warning as well would tell them twice.
            told = event.error.refused in TOLD_TO_THE_CALLER
            level = logging.DEBUG if told else logging.WARNING
            log.log(level, "broker error %d: %s", event.error.code, event.error.reason)
        elif isinstance(event, SendsPaused):
            pause = event.pause
            scope = "every queue" if pause.queue is None else f"queue {pause.queue!r}"
            log.info(
                "broker %s paused sends to %s: %d %s", self.address, scope, pause.code, pause.reason
            )
        elif isinstance(event, SendsResumed):
            scope = "every queue" if event.queue is None else f"queue {event.queue!r}"
            log.info("broker %s resumed sends to %s", self.address, scope)
        elif isinstance(event, SubscriptionEnded):
            self._event(QUEUE_DELETED, deleted_reason(event.cancel))
        elif isinstance(event, HelloRefused):
            self._hello_refused(event)
        elif isinstance(event, Rejoined):
            self._event(REJOINED, event.reason)
        elif isinstance(event, BrokerLeaving):
            self._event(BROKER_LEAVING, event.reason)
        elif isinstance(event, UndecodableFrame):
            log.error("undecodable frame from broker %s: %s", self.address, event.reason)

    def _hello_refused(self, event: HelloRefused) -> None:
        """Told once, at the first refusal in a row: the later ones (the greeting goes again
        after a growing back-off) and giving up reach the caller as JoinRefused, not as
        more lines."""
        if event.count == 1:
            self._event(
                JOIN_REFUSED,
                f"the broker refused this client's HELLO: {event.error.code}"
                f" {event.error.reason}; asking again up to {JOIN_ATTEMPTS - 1} times, then"
                " every call raises JoinRefused",
            )

    def _send_timeout_now(self) -> float:
        """The wait for the socket to take a frame now: send_timeout, or FIRST_CONTACT_S
        before this transport's broker answered, if there is somewhere else to go."""
        if len(self._addresses) > 1 and not self._connection.hello_answered:
            return min(self.send_timeout, FIRST_CONTACT_S)
        return self.send_timeout

    def _untaken(self, why: str) -> None:
        """The socket took nothing within send_timeout, or the broker was silent through a
        confirm's wait: with somewhere else to go (another replica, another endpoint
        given), that endpoint counts as lost now."""
        if len(self._addresses) > 1 and self._reconnect_at is None:
            now = time.monotonic()
            self._lost(why, now)
            self._reconnect_at = now  # at once: the next replica is not the one that failed

    def _reconnect_due(self, now: float) -> bool:
        """Whether to reconnect before sending: when due, or at once when a reconnect is
        pending and there is somewhere else to go (the next replica)."""
        due = self._reconnect_at
        return due is not None and (now >= due or len(self._addresses) > 1)

    def _lost(self, why: str, now: float) -> None:
        """The broker is lost: schedule a reconnect after the backoff, with jitter."""
        delay = self._reconnect_delay * _JITTER.uniform(0.5, 1.5)
        self._reconnect_delay = min(self._reconnect_delay * 2, RECONNECT_MAX_S)
        self._reconnect_at = now + delay
        addresses = self._addresses
        if len(addresses) > 1:  # another replica, or another endpoint the user gave
            self.address = addresses[(addresses.index(self.address) + 1) % len(addresses)]
        self._event(
            BROKER_LOST,
            f"{why}; reconnecting in {delay:.2f}s; {self._connection.sent_since_heard} messages"
            " sent since it was last heard may be lost",
        )

    def _event(self, event: str, detail: str) -> None:
        log.warning("broker %s: %s: %s", self.address, event, detail)
        if self.on_event is not None:
            try:
                self.on_event(event, detail)
            except Exception:
                log.exception("on_event callback failed")


#: The longest timeout: ZeroMQ takes a socket's in milliseconds, as a C int.
MAX_TIMEOUT_S = (2**31 - 1) // 1000


def timeout_seconds(value: object, name: str) -> float:
    """A client's timeout, refused at once (InvalidArgument) unless a finite number of
    seconds from 0 to MAX_TIMEOUT_S (nan or inf would fail deep in the socket's setup)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{name} must be a number of seconds", repr(value))
    if not (math.isfinite(value) and 0 <= value <= MAX_TIMEOUT_S):
        raise InvalidArgument(f"{name} must be from 0 to {MAX_TIMEOUT_S:,} seconds", repr(value))
    return float(value)
