"""`rayship.config.from_environment`: the `RAYSHIP_*` variables the chart sets, read as the operator
and `rayship render` read them; a bad one is named in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import SecretStr

from rayship.config import ConfigError, OperatorConfig, from_environment


def test_defaults_without_variables(monkeypatch) -> None:
    for name in OperatorConfig.model_fields:
        monkeypatch.delenv(f"RAYSHIP_{name.upper()}", raising=False)
    monkeypatch.setenv("RAYSHIP_UPDATE_GOLDEN", "")  # not a setting: ignored
    assert from_environment() == OperatorConfig()


def test_variables_are_read_with_json_for_lists_and_objects(monkeypatch) -> None:
    monkeypatch.setenv("RAYSHIP_DEFAULT_IMAGE", "registry.example/ray:1")
    monkeypatch.setenv("rayship_resync_seconds", "7")  # case-insensitive, as pydantic-settings reads
    monkeypatch.setenv("RAYSHIP_GPU_NODE_SELECTOR", '{"pool": "a100"}')
    monkeypatch.setenv("RAYSHIP_RAY_TOKEN_KEY", "k")
    monkeypatch.setenv("RAYSHIP_CPU_LIMITS", "false")  # as the chart's template quotes a bool
    monkeypatch.setenv("RAYSHIP_WORKLOAD_ROLE", "team-b-rayship-workload")  # the chart release's
    config = from_environment()
    assert type(config) is OperatorConfig
    assert config == OperatorConfig(
        default_image="registry.example/ray:1",
        resync_seconds=7,
        gpu_node_selector={"pool": "a100"},
        ray_token_key=SecretStr("k"),
        cpu_limits=False,
        workload_role="team-b-rayship-workload",
    )


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("RAYSHIP_GPU_TOLERATIONS", "not json", "RAYSHIP_GPU_TOLERATIONS: not valid JSON"),
        ("RAYSHIP_WORKERS", "0", "RAYSHIP_WORKERS: input should be greater than or equal to 1 (got '0')"),
        ("RAYSHIP_RUN_AS_USER", "abc", "RAYSHIP_RUN_AS_USER: input should be a valid integer"),
    ],
)
def test_a_bad_variable_is_named(monkeypatch, name: str, value: str, words: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as raised:
        from_environment()
    assert len(raised.value.problems) == 1 and raised.value.problems[0].startswith(words)


def test_pydantic_settings_is_imported_only_when_a_variable_is_set() -> None:
    """Its import is ~50 ms of `rayship render` (bench/render.py)."""
    probe = "import sys; from rayship import config; config.from_environment(); print('pydantic_settings' in sys.modules)"
    env = {"PATH": "/usr/bin:/bin"}
    plain = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert plain.stdout.strip() == "False", plain.stderr
    env["RAYSHIP_WORKERS"] = "4"
    read = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert read.stdout.strip() == "True", read.stderr
