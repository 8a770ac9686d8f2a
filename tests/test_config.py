"""Configuration: defaults < TOML file < PHPMQ_* environment < command-line flags."""

from __future__ import annotations

import pytest

from phpmq.broker.config import ENVIRONMENT_VARIABLES, BrokerConfig, ConfigError, load_config
from phpmq.broker.shell.security import Security, SecurityError


def test_defaults_are_safe_for_a_lan() -> None:
    config = load_config(environ={})
    assert config.bind == "tcp://127.0.0.1:5555"  # loopback until an operator opens it
    assert config.dialect == "ttl"
    assert config == BrokerConfig()


def test_later_sources_win(tmp_path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('bind = "tcp://127.0.0.1:7000"\nmax_window = 50\ngrace_seconds = 1.5\n')
    environ = {"PHPMQ_MAX_WINDOW": "60", "PHPMQ_DIALECT": "pre-ttl", "UNRELATED": "x"}
    config = load_config(path, {"max_window": 70, "bind": None}, environ)
    assert config.bind == "tcp://127.0.0.1:7000"  # a None flag does not override
    assert config.max_window == 70
    assert config.dialect == "pre-ttl"
    assert config.grace_seconds == 1.5


@pytest.mark.parametrize(
    ("toml", "environ", "message"),
    [
        ("nope = 1\n", {}, "nope"),
        ("max_window = -1\n", {}, "max_window must be positive"),
        ("reclaim_silent_seconds = inf\n", {}, "reclaim_silent_seconds must be a positive number"),
        ("idle_peer_seconds = nan\n", {}, "idle_peer_seconds must be a positive number"),
        ('dialect = "php"\n', {}, "dialect must be one of"),
        ("", {"PHPMQ_MAX_WINDOW": "lots"}, "invalid PHPMQ_MAX_WINDOW='lots'"),
        ("bind = [\n", {}, "cannot read config file"),
    ],
)
def test_bad_values_raise_config_error(tmp_path, toml: str, environ: dict, message: str) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        load_config(path, environ=environ)


def test_missing_file_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml", environ={})


def test_the_brokers_key_and_admin_secret_have_variables_apart_from_the_clients() -> None:
    """Issue 33, item 6: PHPMQ_CURVE_SECRET and PHPMQ_ADMIN_SECRET are what clients read
    (docs/security.md); a shell exporting them can still start a broker, which reads its own
    under PHPMQ_BROKER_*."""
    clients = {"PHPMQ_CURVE_SECRET": "client.key_secret", "PHPMQ_ADMIN_SECRET": "offered"}
    assert load_config(environ=clients) == BrokerConfig()
    brokers = {"PHPMQ_BROKER_CURVE_SECRET": "broker.key_secret", "PHPMQ_BROKER_ADMIN_SECRET": "s"}
    config = load_config(environ={**clients, **brokers})
    assert (config.curve_secret, config.admin_secret) == ("broker.key_secret", "s")
    assert ENVIRONMENT_VARIABLES.isdisjoint({"PHPMQ_CURVE_SECRET", "PHPMQ_ADMIN_SECRET"})
    assert {"PHPMQ_BIND", "PHPMQ_MAX_WINDOW", "PHPMQ_BROKER_CURVE_SECRET"} <= ENVIRONMENT_VARIABLES
    assert "PHPMQ_QUEUES" not in ENVIRONMENT_VARIABLES  # a table: only the TOML file sets it


def test_half_a_curve_setting_names_the_brokers_variables() -> None:
    config = load_config(environ={"PHPMQ_BROKER_CURVE_SECRET": "only.key_secret"})
    with pytest.raises(SecurityError, match=r"PHPMQ_BROKER_CURVE_SECRET .* PHPMQ_CURVE_CLIENTS"):
        Security(config)
