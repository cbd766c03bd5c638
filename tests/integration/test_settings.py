"""A pod's settings: read once from the environment, flags over them, refused at
start-up in one line when unusable, and documented in docs/settings.md from the class."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from actors.config.settings import Settings, SettingsInvalid, markdown_table
from actors.wire.messages import Limits
from streams.layout import Layout

pytestmark = [pytest.mark.timeout(60)]
ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_table_is_the_class_and_names_every_field() -> None:
    page = (ROOT / "docs" / "settings.md").read_text()
    found = re.search(r"<!-- settings table[^\n]*-->\n(.*?)\n<!-- end of settings table -->", page, re.S)
    assert found, "docs/settings.md has no settings table"
    assert found.group(1) == markdown_table(), "docs/settings.md is stale: paste `python -m actors.config.settings`"
    documented = set(re.findall(r"^\| `([A-Z_]+(?:<NAME>)?)` \|", found.group(1), re.M))
    assert documented == {f.metadata["env"] for f in dataclasses.fields(Settings)}
    for f in dataclasses.fields(Settings):
        assert f.metadata["meaning"] and f.name in (Settings.__doc__ or "")


def test_an_empty_environment_gives_the_defaults_of_layout_and_limits() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.layout == Layout() and settings.limits == Limits() and settings.nats_url is None


def test_variables_are_read_and_flags_given_win() -> None:
    env = {
        "NATS_URL": " nats://a:4222,nats://b:4222 ",
        "ACTORS_PARTITIONS": "16",
        "ACTORS_ACK_WAIT": "2.5",
        "ACTORS_MAX_STEPS": "25",
        "ACTORS_MAX_VALUE_BYTES": "1000000",
        "ACTORS_PYTHON_WORKERS": "3",
        "ACTORS_HTTP_PORT": "9090",
        "ACTORS_REPLICAS": "",
        "ACTORS_POD_NAME": "pod-1",
    }
    settings = Settings.from_env(env)
    assert settings.nats_url == "nats://a:4222,nats://b:4222"
    assert settings.layout == Layout(partitions=16, ack_wait=2.5, max_value_bytes=1_000_000)  # "" is unset
    assert settings.limits == Limits(max_activations=25)
    assert (settings.python_workers, settings.http_port, settings.pod_name) == (3, 9090, "pod-1")
    flagged = settings.with_flags(nats_url="nats://c:4222", http_port=0, drain_timeout=None)
    assert (flagged.nats_url, flagged.http_port, flagged.drain_timeout) == ("nats://c:4222", 0, 10.0)


@pytest.mark.parametrize(
    ("var", "raw", "says"),
    [
        ("ACTORS_PARTITIONS", "eight", "not a whole number"),
        ("ACTORS_PARTITIONS", "4.0", "not a whole number"),
        ("ACTORS_TEMPLATE_OPS", "0", "must be at least 1"),
        ("ACTORS_MAX_VALUE_BYTES", "-5", "must be at least 1"),
        ("ACTORS_PYTHON_WORKERS", "many", "not a whole number"),
        ("ACTORS_ACK_WAIT", "nan", "must be at least"),
        ("ACTORS_LEASE_TTL", "soon", "not a number"),
        ("ACTORS_HTTP_PORT", "-1", "must be at least 0"),
        ("ACTORS_POD_NAME", "a.b", "only letters"),
    ],
)
def test_an_unusable_value_is_refused_in_one_line_naming_the_variable(var: str, raw: str, says: str) -> None:
    with pytest.raises(SettingsInvalid) as caught:
        Settings.from_env({var: raw})
    text = str(caught.value)
    assert text.startswith(f"{var}={raw!r}: ") and says in text and "\n" not in text


def test_the_deploy_config_map_sets_only_known_settings_that_parse() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "k8s" / "config.yaml").read_text())["data"]
    known = {f.metadata["env"] for f in dataclasses.fields(Settings)}
    assert set(config) <= known, set(config) - known
    settings = Settings.from_env(config)
    assert settings.replicas == 3 and settings.nats_url == config["NATS_URL"]


@pytest.mark.asyncio
async def test_the_cli_stops_at_start_up_on_an_unusable_setting_exit_3_no_traceback() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        "run",
        "examples/hello.yaml",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NATS_URL": "", "ACTORS_MAX_STEPS": "lots"},
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 3
    assert err.decode().strip() == "actors-cli: ACTORS_MAX_STEPS='lots': not a whole number"
