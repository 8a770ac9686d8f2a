"""Why no broker answered: a fresh connection's handshake, as libzmq tells it to a socket
monitor (it tells the socket itself nothing: a refused CURVE handshake looks like silence).

The CLI asks this when a broker gave no answer within `--timeout`, to say what is likely
wrong: nothing listening, a client without a CURVE key at a CURVE broker (or the other way
round), a key the broker does not allow, the wrong public key for the broker.
"""

from __future__ import annotations

import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from .curve import SECRET_VARIABLE, SERVER_VARIABLE, Curve

#: The monitor events that tell how a connection and its handshake went.
EVENTS = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)

#: Reconnect this often, so that an unclear first failure is followed by a clearer one.
RETRY_MS = 20

NOTHING_LISTENS = "nothing accepts connections there: is the broker running, at this address?"
NO_KEY = (
    f"the broker requires CURVE and this client has no key: set {SECRET_VARIABLE} (this"
    f" client's .key_secret file) and {SERVER_VARIABLE} (the broker's .key file), see"
    " docs/security.md"
)
UNWANTED_KEY = (
    f"this client uses CURVE ({SECRET_VARIABLE}, {SERVER_VARIABLE}) and the broker does not:"
    " unset them, or start the broker with --curve-secret"
)
KEY_REFUSED = (
    "the broker refused this client's CURVE key: it is not among the broker's --curve-clients"
    " (or it was removed: SIGHUP re-reads them)"
)
#: When the broker only closed the connection (it does so for a key it cannot decrypt with,
#: and sometimes before the client saw why): the likely causes.
HANDSHAKE_CLOSED_WITH_KEY = (
    f"the CURVE handshake failed: is {SERVER_VARIABLE} this broker's public key (its .key file)?"
)
HANDSHAKE_CLOSED_WITHOUT_KEY = (
    "the ZeroMQ handshake failed: not a broker, or one that requires CURVE"
    f" ({SECRET_VARIABLE}, {SERVER_VARIABLE})?"
)
SILENT = "the connection and its handshake succeed, but the broker did not answer: overloaded?"


def handshake_problem(address: str, curve: Curve | None, wait: float = 1.0) -> str | None:
    """What new connections to `address` learn within `wait` seconds: a hint for the user,
    or None if nothing was learnt (no event: a host that drops packets, say)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.reconnect_ivl = RETRY_MS
    if curve is not None:
        curve.apply(sock)
    monitor = sock.get_monitor_socket(EVENTS)
    unclear: str | None = None
    connected = False
    try:
        sock.connect(address)
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0 and monitor.poll(left * 1000):
            event = recv_monitor_message(monitor)
            kind, value = event["event"], event["value"]
            connected = connected or kind == zmq.EVENT_CONNECTED
            hint = _clear_meaning(kind, value, curve is not None, connected)
            if hint is not None:
                return hint
            if kind & (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                unclear = HANDSHAKE_CLOSED_WITH_KEY if curve else HANDSHAKE_CLOSED_WITHOUT_KEY
        return unclear
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def _clear_meaning(kind: int, value: int, has_key: bool, connected: bool) -> str | None:
    """The hint an event gives for sure (None: none, or not yet clear)."""
    if kind == zmq.EVENT_CONNECT_RETRIED and not connected:
        return NOTHING_LISTENS
    if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
        return SILENT
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return KEY_REFUSED
    mismatch = value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
    if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and mismatch:
        return UNWANTED_KEY if has_key else NO_KEY
    return None
