"""deploy/ as tests: systemd accepts the units, broker.toml is what deploy/broker_toml.py
writes from the configuration Struct (so it shows every setting with its real default), and
the broker unit lets the broker write the data directory broker.toml names."""

from __future__ import annotations

import configparser
import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from harness import REPO
from phpmq.broker.config import FIELDS, BrokerConfig, load_config

DEPLOY = REPO / "deploy"
BROKER_TOML = DEPLOY / "broker.toml"
#: Where the units expect the installed command (deploy/README.md, "Install").
INSTALLED_PHPMQ = "/opt/phpmq/bin/phpmq"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("broker_toml", DEPLOY / "broker_toml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    parser.read_string((DEPLOY / name).read_text())
    return parser


def test_broker_toml_is_what_the_script_writes_from_the_config_struct() -> None:
    assert BROKER_TOML.read_text() == _script().broker_toml(), (
        "deploy/broker.toml is out of date: python deploy/broker_toml.py > deploy/broker.toml"
    )


def test_broker_toml_shows_every_setting_and_only_its_examples_differ_from_the_defaults() -> None:
    script = _script()
    shown = tomllib.loads(BROKER_TOML.read_text())
    assert set(FIELDS) - set(shown) == script.INTERNAL
    config = load_config(BROKER_TOML, environ={})
    defaults = BrokerConfig()
    differing = {name for name in FIELDS if getattr(config, name) != getattr(defaults, name)}
    assert differing == {*script.DEPLOY_EXAMPLES, "queues"}
    assert config.queues["emails"].max_deliveries == 5


def test_the_broker_unit_can_write_the_data_dir_broker_toml_names() -> None:
    service = _unit("phpmq-broker.service")["Service"]
    data_dir = Path(tomllib.loads(BROKER_TOML.read_text())["data_dir"])
    writable = [Path("/var/lib", name) for name in service.get("StateDirectory", "").split()]
    writable += [Path(path) for path in service.get("ReadWritePaths", "").split()]
    assert service["ProtectSystem"] == "strict"  # the rest of the file is read-only
    assert any(data_dir.is_relative_to(path) for path in writable), writable


@pytest.mark.parametrize("unit", ["phpmq-broker.service", "phpmq-workers@.service"])
def test_systemd_analyze_verifies_the_unit(unit: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        reason = "systemd-analyze is not installed (apt-get install systemd)"
        if os.environ.get("CI"):
            pytest.fail(f"the units must be verified in CI: {reason}", pytrace=False)
        pytest.skip(reason)
    # verify checks that ExecStart's program exists: this test's phpmq stands in for /opt's.
    phpmq = Path(sys.executable).parent / "phpmq"
    installed = tmp_path / unit.replace("@.", "@emails.")  # a template is verified as an instance
    installed.write_text((DEPLOY / unit).read_text().replace(INSTALLED_PHPMQ, str(phpmq)))
    result = subprocess.run(
        [analyze, "verify", str(installed)], capture_output=True, text=True, timeout=60
    )
    # Unknown keys and bad values are warnings with exit status 0: any output is a failure.
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
