"""The ADMIN command names live in protocol/admin_commands.py: the broker runs exactly those,
and the guard's sets of commands name only those."""

from __future__ import annotations

from phpmq.broker import guard
from phpmq.broker.clock import FakeClock
from phpmq.broker.config import BrokerConfig
from phpmq.broker.core import Core
from phpmq.protocol import admin_commands as cmd


def test_the_broker_runs_exactly_the_commands_protocol_names() -> None:
    """...but those a replica's shell registers (the core knows none of them)."""
    core = Core(BrokerConfig(), FakeClock())
    assert {*core.admin._commands, cmd.REPORT} == set(cmd.ALL) - set(cmd.REPLICA)


def test_the_guards_command_sets_name_only_known_commands() -> None:
    for name in ("OPEN", "DELETE", "SUBSCRIBING", "CONSUME", "BIND"):
        assert getattr(guard, f"{name}_COMMANDS") <= set(cmd.ALL), name
