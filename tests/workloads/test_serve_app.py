"""`rayship serve -f`: a ModelService with its own two-stage Serve application (the shipped
examples/pipeline: Preprocess -> Model) served over HTTP on local Ray by the CLI, from the same
serveConfigV2 a cluster gets; and the startup line names the routes the model kind really has."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from rayship import api, serve_local
from rayship.api import ServeArgs
from rayship.controller import modelservice
from rayship_workloads import models, recipes
from tests.workloads.serve_http import call, free_port

pytestmark = pytest.mark.workloads

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "pipeline"
FEATURES = 8


def exported_mlp(directory: Path) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(3)
    model = recipes.MLP(FEATURES, [8], 1).eval()
    setup = recipes.ModelSetup({"in_features": FEATURES, "hidden": [8], "out_features": 1})
    return model, models.export(directory, "mlp", setup, model.state_dict())


def test_pipeline_example_over_http(tmp_path: Path) -> None:
    model, uri = exported_mlp(tmp_path / "model")
    doc = yaml.safe_load((EXAMPLE / "modelservice.yaml").read_text())
    doc["spec"]["model"] = {"uri": str(uri)}
    doc["spec"]["application"]["args"] = {"mean": [1.0] * FEATURES, "scale": [2.0] * FEATURES}
    doc["spec"]["application"]["runtimeEnv"]["workingDir"] = str(EXAMPLE)  # the YAML is not beside it here
    spec = tmp_path / "pipeline.yaml"
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
        url = f"http://127.0.0.1:{port}/pipeline"
        assert f"serving pipeline:app_builder (model {uri}) at {url}\n" in lines, lines
        rows = [[float(i + j) for j in range(FEATURES)] for i in range(3)]
        status, body = call("POST", url, {"instances": rows})
        assert status == 200, body
        with torch.no_grad():
            want = model((torch.tensor(rows) - 1.0) / 2.0)
        torch.testing.assert_close(torch.tensor(body["predictions"]), want, rtol=0, atol=1e-5)
        assert call("POST", url, {"instances": [[1.0]]})[0] == 400
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_startup_line_names_the_model_kinds_routes(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, GPT2Config

    lm_dir = tmp_path / "lm"
    AutoModelForCausalLM.from_config(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=260)
    ).save_pretrained(lm_dir)
    models.write_manifest(lm_dir, "causal-lm", {"n_layer": 1}, tokenizer="bytes")
    _, mlp_dir = exported_mlp(tmp_path / "mlp")

    def service(uri: Path) -> api.ModelService:
        doc = {
            "apiVersion": api.API_VERSION,
            "kind": "ModelService",
            "metadata": {"name": "m"},
            "spec": {"model": {"uri": str(uri)}},
        }
        return api.ModelService.model_validate(doc)

    url = "http://127.0.0.1:8000/x"
    lm = serve_local.hint(service(lm_dir), url, str(lm_dir))
    assert (
        f"POST {url}/v1/chat/completions" in lm and f"POST {url}/generate" in lm and "/predict" not in lm
    ), lm
    mlp = serve_local.hint(service(mlp_dir), url, str(mlp_dir))
    assert f"POST {url}/predict" in mlp and "/generate" not in mlp and "/v1/" not in mlp, mlp
    assert os.sep in mlp  # the model's path is said


def test_local_serve_deploys_the_modelservice_batching() -> None:
    """`rayship serve -f` deploys the ModelService's own batching and concurrency settings (the config
    `serve_local.serve` builds: the cluster's serveConfigV2, scaled to this machine), and the model
    server accepts them as they are."""
    doc = {
        "apiVersion": api.API_VERSION,
        "kind": "ModelService",
        "metadata": {"name": "m"},
        "spec": {
            "model": {"uri": "/models/m"},
            "batching": {"maxBatchSize": 12, "batchWaitTimeoutMs": 3},
            "resources": {"gpus": 1, "cpus": 4},
        },
    }
    config = modelservice.serve_config(api.ModelService.model_validate(doc), "/models/m")
    changes = serve_local.localize(config, has_gpu=False)
    assert changes == ["at most 1 CPU a replica", "no GPU here: replicas on CPU"]
    (app,) = config["applications"]
    args = ServeArgs.model_validate(app["args"])
    assert (args.max_batch_size, args.batch_wait_timeout_s) == (12, 0.003)
    (deployment,) = app["deployments"]
    assert deployment["max_ongoing_requests"] == args.max_ongoing_requests == 24
    assert deployment["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0}
