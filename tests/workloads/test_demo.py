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
# A line Ray prints for one of its processes, "(RayTrainWorker pid=123) ...", or one of its loggers'
# ("INFO 2026-12-06 03:58:55,926 serve 11660 -- Started Serve", "... INFO worker.py:12 -- ...")
RAY_LINE = re.compile(r"^\(\w+ pid=|^\(pid=|\b(INFO|DEBUG)\b.* -- ")


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
    found = re.search(r"prediction (-?[\d.]+)  \(true value (-?[\d.]+), error ([-+][\d.]+)\)", out)
    assert found, out
    prediction, target, error = map(float, found.groups())
    assert abs(error - (prediction - target)) < 1e-3, found.group(0)
    assert abs(prediction - target) < 1.0, (prediction, target)  # a trained model, not noise (|y| ~ 3)
    held_out = re.search(
        r"held-out error over 256 rows .*: RMSE ([\d.]+) \(always answering their mean: RMSE ([\d.]+)\)", out
    )
    assert held_out, out
    rmse, baseline = map(float, held_out.groups())
    assert rmse < baseline / 3, (rmse, baseline)  # it learned the function, not the mean
    assert out.rstrip().splitlines()[-1] == "shut down: Serve and local Ray stopped", out
    run_dir = tmp_path / "runs" / "mlp-ddp"
    for artifact in ("metrics.json", "loss.png", "result.json", "ray-output.log"):
        assert (run_dir / artifact).stat().st_size > 0, artifact

    # rayship's own lines only: each epoch once (not once per rank), no line of a Ray process (its
    # prefix) nor of Ray's driver-side loggers; those are in the file the output names once
    terminal = (out + proc.stderr).splitlines()
    assert [line.split("  ")[0] for line in terminal if line.startswith("epoch ")] == [
        f"epoch {e}/5" for e in range(1, 6)
    ]
    assert not [line for line in terminal if RAY_LINE.search(line)], "\n".join(terminal)
    kept = (run_dir / "ray-output.log").read_text()
    assert "(RayTrainWorker pid=" in kept and "(ServeController pid=" in kept, kept[-3000:]
    assert out.count(str(run_dir / "ray-output.log")) == 1, out

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
