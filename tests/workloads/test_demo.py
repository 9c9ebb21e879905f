"""`rayship demo` (what `make demo` runs) as a user runs it: train -> serve -> predict -> shut down."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import SAMPLES

pytestmark = pytest.mark.workloads


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_trains_serves_and_predicts(tmp_path: Path) -> None:
    port = free_port()
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

    # The ModelService sample serves that local run: its fromTrainingJob resolves against --runs-dir to
    # the model the demo served (`rayship serve -f` serving a model is test_serve_app's).
    from rayship_workloads.local import resolve_model

    sample = yaml.safe_load((SAMPLES / "modelservice-from-trainingjob.yaml").read_text())
    result = json.loads((run_dir / "result.json").read_text())
    assert resolve_model(sample, runs_dir=tmp_path / "runs") == result["model"]


def test_a_demo_refused_before_training_says_why_in_one_line(tmp_path: Path) -> None:
    """A job `rayship run` would refuse (here a workingDir that is no folder beside the YAML) is refused
    by `rayship demo` the same way: one line naming the field, exit 1, no traceback, nothing to shut down."""
    spec = (SAMPLES / "trainingjob-ddp.yaml").read_text()
    job = tmp_path / "job.yaml"
    job.write_text(spec.replace("spec:\n", "spec:\n  runtimeEnv:\n    workingDir: ./no-such-folder\n", 1))
    proc = subprocess.run(
        [sys.executable, "-m", "rayship.cli", "demo", "-f", str(job), "--runs-dir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: {job}: spec.runtimeEnv.workingDir: {tmp_path / 'no-such-folder'} is not a folder"
    ], proc.stderr
    assert "shut down" not in proc.stdout and "Traceback" not in proc.stderr
