"""Every option of every `phpmq` command says its default in --help, and the broker's
stated defaults are the ones broker/config.py uses."""

from __future__ import annotations

import re
from collections.abc import Iterator

import click

from harness import phpmq
from phpmq.broker.config import BrokerConfig
from phpmq.cli import broker as broker_command
from phpmq.cli import main

STATED_DEFAULT = re.compile(r"\[default: ([^\]]+)\]")


def commands(group: click.Group, path: tuple[str, ...]) -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def test_every_option_shows_its_default() -> None:
    silent = [
        f"{name} {option.opts[0]}"
        for name, command in commands(main, ("phpmq",))
        for option in command.params
        if isinstance(option, click.Option)
        and not option.required
        and not (option.is_flag and not option.secondary_opts)
        and not option.show_default
        and not STATED_DEFAULT.search(option.help or "")
    ]
    assert not silent, f"options whose --help hides their default: {silent}"


def test_the_broker_states_the_defaults_it_uses() -> None:
    defaults = BrokerConfig()
    checked = 0
    for option in broker_command.broker.params:
        stated = STATED_DEFAULT.search(getattr(option, "help", None) or "")
        if stated is None or not getattr(defaults, option.name or "", None):
            continue  # not a setting, or one that is off by default ("in memory", "off")
        value = getattr(defaults, option.name or "")
        said = stated.group(1)
        same = float(said) == value if isinstance(value, int | float) else said == str(value)
        assert same, (option.name, said, value)
        checked += 1
    assert checked >= 10  # the parsing above found them


def test_help_shows_the_timeout_default_for_commands_that_talk_to_a_broker() -> None:
    for command in (["send"], ["consume"], ["stats"], ["dlq", "list"], ["queue", "purge"]):
        shown = phpmq(*command, "--help").stdout
        assert "--timeout" in shown and "[default: 5.0;" in shown, command


def test_workers_help_names_the_public_imports_and_what_prefetch_counts() -> None:
    """Issue 33, item 6: the help named `workers.Retry` where the docs import `phpmq.Retry`,
    and said --prefetch counts messages ahead of the running one (the window includes it)."""
    text = " ".join(phpmq("workers", "--help").stdout.split())
    assert "from phpmq import Retry" in text and "from phpmq import Reject" in text
    assert "workers.Retry" not in text and "workers.Reject" not in text
    assert "Messages each worker holds at a time, the one it runs included" in text
