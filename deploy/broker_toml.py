"""Writes deploy/broker.toml from the broker's configuration Struct (broker/config.py), so that
the example shows every setting with its real default and the Struct's own comments:

    python deploy/broker_toml.py > deploy/broker.toml

tests/test_deploy.py fails when the file differs from what this prints.
"""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from collections.abc import Iterator

import msgspec

from phpmq.broker.config import BrokerConfig

HEADER = """\
# phpmq broker configuration: /etc/phpmq/broker.toml, read by `phpmq broker --config ...`.
# Every setting is shown with its default, except those marked "deploy example".
# Precedence (later wins): defaults, this file, PHPMQ_<NAME> environment variables (e.g.
# PHPMQ_MAX_WINDOW), command-line flags. An unknown key or a bad value stops the broker at
# start with one line of explanation. Details: docs/protocol.md §8 (settings and limits),
# docs/security.md, docs/durability.md.
# Written by deploy/broker_toml.py from broker/config.py: edit those, not this file.
"""

#: Values of this example that are not the defaults, and why.
DEPLOY_EXAMPLES = {
    "bind": (
        "tcp://10.0.0.5:5555",
        "the LAN interface's address; then use CURVE, or at least admin_secret (docs/security.md)",
    ),
    "data_dir": (
        "/var/lib/phpmq",
        "the unit's StateDirectory=phpmq, made and owned for the phpmq user by systemd",
    ),
}

#: What only the deployment needs to know about a setting.
DEPLOY_NOTES = {
    "grace_seconds": "Keep the unit's TimeoutStopSec (30 s in phpmq-broker.service) well above.",
    "admin_secret": (
        "Better in the unit's environment (PHPMQ_BROKER_ADMIN_SECRET) than here; operators on"
        " other hosts export the same secret as PHPMQ_ADMIN_SECRET for `phpmq queue purge` and"
        " the like."
    ),
    "log_level": "Logs go to stderr: the journal under systemd.",
}

#: Comment lines of the file are at most this long.
WIDTH = 96
#: Set by the shard supervisor for each shard it starts, never by hand.
INTERNAL = frozenset(
    {
        "cluster",
        "shard",
        "raft_bind",
        "raft_peers",
        "replica_endpoints",
        "raft_preferred",
        "replica_nodes",
        "raft_role",
        "raft_candidates",
    }
)

QUEUES_EXAMPLE = """\

# --- Per-queue overrides, fixed when the queue is created. Keys left out keep the values above.
# Only this file can set them (there is no environment variable for `queues`).
[queues.emails]
max_deliveries = 5          # 0 = no limit
max_length = 10000          # ready messages (this queue's max_queue_length); 0 = no limit
overflow = "drop-oldest"    # or "reject"
"""


def toml_value(value: object) -> str:
    """A scalar default as TOML (a JSON string is a TOML basic string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)


def field_comments() -> dict[str, tuple[list[str], list[str]]]:
    """Per field of BrokerConfig: (the section comment above it, its `#:` comment), as lines
    without the comment marks."""
    lines, _ = inspect.getsourcelines(BrokerConfig)
    body = ast.parse("".join(lines)).body[0]
    assert isinstance(body, ast.ClassDef)
    comments = {}
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = _comment_lines_above(lines, node.lineno - 1)
            section = [line[1:].strip() for line in above if not line.startswith("#:")]
            doc = [line[2:].strip() for line in above if line.startswith("#:")]
            comments[node.target.id] = (section, doc)
    return comments


def _comment_lines_above(lines: list[str], index: int) -> list[str]:
    found = []
    while index > 0 and lines[index - 1].strip().startswith("#"):
        index -= 1
        found.append(lines[index].strip())
    return found[::-1]


def broker_toml() -> str:
    """The whole example file."""
    return HEADER + "".join(_settings()) + QUEUES_EXAMPLE


def _settings() -> Iterator[str]:
    comments = field_comments()
    for field in msgspec.structs.fields(BrokerConfig):
        if field.name in INTERNAL or field.name == "queues":
            continue
        section, doc = comments[field.name]
        if section:
            yield "\n# --- " + "\n# ".join(section) + "\n"
        notes = list(doc)
        if field.name in DEPLOY_NOTES:
            notes += _wrapped(DEPLOY_NOTES[field.name])
        value = field.default
        if field.name in DEPLOY_EXAMPLES:
            value, why = DEPLOY_EXAMPLES[field.name]
            notes += _wrapped(f"Deploy example: {why}. Default: {toml_value(field.default)}.")
        if notes:
            yield "\n" + "".join(f"# {line}\n" for line in notes)
        yield f"{field.name} = {toml_value(value)}\n"


def _wrapped(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - 2)


if __name__ == "__main__":
    print(broker_toml(), end="")
