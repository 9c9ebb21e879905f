"""`rayship demo` (what `make demo` runs) as a user runs it: train -> serve -> predict -> shut down."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES

pytestmark = pytest.mark.workloads


def test_demo_trains_serves_and_predicts(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayship.cli",
            "demo",
            "-f",
            str(SAMPLES / "trainingjob-ddp.yaml"),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--port",
            str(port),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "local run: 2 workers x 1 GPU requested -> 2 CPU workers" in out
    assert "epoch 5/5" in out and "shut down: Serve and local Ray stopped" in out
    found = re.search(r"prediction (-?[\d.]+)  \(true value (-?[\d.]+)\)", out)
    assert found, out
    prediction, target = map(float, found.groups())
    assert abs(prediction - target) < 1.0, (prediction, target)  # a trained model, not noise (|y| ~ 3)
    run_dir = tmp_path / "runs" / "mlp-ddp"
    for artifact in ("metrics.json", "loss.png", "result.json"):
        assert (run_dir / artifact).stat().st_size > 0, artifact
