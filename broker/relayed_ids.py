"""Relayed peers' ids (broker/relayed.py): each says where its peer lives (prefix, length
of the link's id, the link's id, the link's reference for the peer), so nothing maps ids to
links. Apart from relayed.py so that modules below it (peers.py) can tell such a peer."""

from __future__ import annotations

#: Relayed peer ids start so, and are longer than libzmq's own ids (5 bytes) and than no
#: chosen routing id may start with a zero byte: no ZeroMQ or TCP peer can take one.
_PREFIX = b"\x00F"
_ZMQ_ID_BYTES = 5


def relayed_id(link_id: bytes, reference: bytes) -> bytes:
    return _PREFIX + bytes((len(link_id),)) + link_id + reference


def is_relayed(peer_id: bytes) -> bool:
    return len(peer_id) > _ZMQ_ID_BYTES and peer_id[:2] == _PREFIX


def route_of(peer_id: bytes) -> tuple[bytes, bytes]:
    """(link id, the link's reference) of a relayed peer id."""
    length = peer_id[2]
    return peer_id[3 : 3 + length], peer_id[3 + length :]
