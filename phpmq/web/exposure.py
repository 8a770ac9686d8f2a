"""Where the console may listen and with what: on loopback, anything goes (with no users it
opens without a login, as nsqadmin does); anywhere else it needs users to log in and TLS, or
`--insecure`, said in so many words."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`; 0.0.0.0 and :: listen everywhere."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def refusal_to_start(host: str, has_users: bool, has_tls: bool, insecure: bool) -> str | None:
    """Why the console must not listen on `host` as configured (None: it may)."""
    if insecure or is_loopback(host):
        return None
    missing = []
    if not has_users:
        missing.append("no users to log in (--users FILE)")
    if not has_tls:
        missing.append("no TLS (--certfile and --keyfile)")
    if not missing:
        return None
    return (
        f"refusing to serve the console on {host}, off loopback, with {' and '.join(missing)}:"
        " whoever reaches it could read and change the broker (bind 127.0.0.1 behind a"
        " reverse proxy, add what is missing, or pass --insecure)"
    )
