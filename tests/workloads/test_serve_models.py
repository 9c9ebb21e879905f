"""`rayship serve -f` with `spec.models`: two models in one service over HTTP on local Ray, from the
same serveConfigV2 a cluster gets (args.models, Serve model multiplexing); the
serve_multiplexed_model_id header picks the model, an unknown one is a 404 that names the models."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from rayship_workloads import models, recipes
from tests.workloads.serve_http import call, free_port

pytestmark = pytest.mark.workloads

FEATURES = 4
HEADER = "serve_multiplexed_model_id"


def exported_mlp(directory: Path, seed: int) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(seed)
    model = recipes.MLP(FEATURES, [8], 1).eval()
    setup = recipes.ModelSetup({"in_features": FEATURES, "hidden": [8], "out_features": 1})
    return model, models.export(directory, "mlp", setup, model.state_dict())


def test_two_models_by_header_and_an_unknown_one_is_404(tmp_path: Path) -> None:
    first, first_uri = exported_mlp(tmp_path / "first", seed=1)
    second, second_uri = exported_mlp(tmp_path / "second", seed=2)
    # `second` comes from a TrainingJob: its local run's result (what `rayship run` writes) names the export
    run = tmp_path / "rayship-runs" / "mlp-second"
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps({"model": str(second_uri)}))
    doc = {
        "apiVersion": "rayship.dev/v1alpha1",
        "kind": "ModelService",
        "metadata": {"name": "fleet"},
        "spec": {
            "models": {
                "first": {"uri": str(first_uri)},
                "second": {"fromTrainingJob": {"name": "mlp-second"}},
            },
            "modelCacheSize": 1,
            "resources": {"gpus": 0, "cpus": 1, "memory": "2Gi"},
            "routePrefix": "/fleet",
        },
    }
    spec = tmp_path / "fleet.yaml"
    spec.write_text(yaml.safe_dump(doc))
    port = free_port()
    command = [sys.executable, "-m", "rayship.cli", "serve", "-f", str(spec), "--port", str(port)]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not any(line.startswith("serving ") for line in lines):
            line = proc.stdout.readline()
            assert line, f"rayship serve ended: {''.join(lines)}"
            lines.append(line)
        url = f"http://127.0.0.1:{port}/fleet"
        (started,) = [line for line in lines if line.startswith("serving ")]
        assert f"serving models first={first_uri}, second={second_uri} at {url}" in started, started
        assert f"POST {url}/predict" in started and HEADER in started, started

        rows = [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]]
        with torch.no_grad():
            want = {"first": first(torch.tensor(rows)), "second": second(torch.tensor(rows))}
        assert not torch.allclose(want["first"], want["second"])  # the two answers can be told apart
        for name in ("first", "second", "first"):  # back to `first`: evicted (cache of 1) and loaded again
            status, body = call("POST", f"{url}/predict", {"instances": rows}, headers={HEADER: name})
            assert status == 200, body
            torch.testing.assert_close(torch.tensor(body["predictions"]), want[name], rtol=0, atol=1e-5)

        status, body = call("POST", f"{url}/predict", {"instances": rows}, headers={HEADER: "third"})
        assert status == 404 and body == {"error": "model 'third' is not served here; models: first, second"}
        status, body = call("POST", f"{url}/predict", {"instances": rows})
        assert status == 400 and HEADER in body["error"], body
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
