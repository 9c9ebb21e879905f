"""`rayship operator` as users (and the Helm chart) start it: a real process, its liveness endpoint,
a TrainingJob reconciled, and a clean exit on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
import yaml
from conftest import RESOURCES

from tests.conftest import SAMPLES

pytestmark = pytest.mark.operator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def test_rayship_operator_process(emulator, tmp_path) -> None:
    port = free_port()
    liveness = f"http://127.0.0.1:{port}/healthz"
    env = {**os.environ, "KUBECONFIG": str(emulator.kubeconfig_path), "HOME": str(tmp_path)}
    log = (tmp_path / "operator.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayship.cli", "operator", "--liveness", liveness],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        emulator.wait_for(lambda: healthy(liveness), timeout=30)
        doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
        emulator.create(RESOURCES["trainingjobs"], doc)
        rayjob = emulator.wait_for(lambda: emulator.get(RESOURCES["rayjobs"], "default", "mlp-ddp"))
        assert rayjob["metadata"]["ownerReferences"][0]["name"] == "mlp-ddp"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.seek(0)
        output = log.read()
    assert code == 0, output
    assert "Traceback" not in output, output
