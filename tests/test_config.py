"""Configuration: defaults < TOML file < PHPMQ_* environment < command-line flags."""

from __future__ import annotations

import pytest

from phpmq.broker.config import BrokerConfig, ConfigError, load_config


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
