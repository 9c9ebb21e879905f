"""Bring your own code (issue 12): a loop shipped with `runtimeEnv.workingDir`, the data as written,
the common hyperparameters at the top level of the loop config, a saved model that serves, a user's
own Hugging Face Trainer loop, and an honest local mode (print output, append across resumes, a
finished run needs --restart, a deterministic error said once and not retried)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rayship import api
from rayship_workloads import local, models, train
from tests.conftest import ROOT, SAMPLES

pytestmark = pytest.mark.workloads

EXAMPLE = ROOT / "examples" / "byo-loop"


def own_loop_job(tmp_path: Path, entrypoint: str, **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    del doc["spec"]["checkpoint"]
    doc["metadata"]["name"] = "own"
    doc["spec"]["trainer"] = {
        "entrypoint": entrypoint,
        "epochs": 2,
        "batchSizePerWorker": 8,
        "learningRate": 0.005,
        "config": {"echo": 7},
    }
    doc["spec"]["workers"].update(replicas=2, gpusPerWorker=0)
    doc["spec"].update(spec)
    return doc


def test_byo_loop_ships_with_working_dir_through_rayship_run(tmp_path: Path) -> None:
    """The example as a user runs it: `rayship run -f` from another folder, no PYTHONPATH; its
    print() lines show; validation metrics in metrics.json; the saved model serves; a second run
    of the finished job is refused until --restart."""
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project)
    doc = yaml.safe_load((project / "trainingjob.yaml").read_text())
    doc["spec"]["trainer"]["epochs"] = 3
    (project / "trainingjob.yaml").write_text(yaml.safe_dump(doc))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    runs = tmp_path / "runs"
    command = [
        sys.executable,
        "-m",
        "rayship.cli",
        "run",
        "-f",
        "project/trainingjob.yaml",
        "--runs-dir",
        str(runs),
    ]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "my loop: LOG_LEVEL=info" in proc.stdout  # runtimeEnv.envVars reached the loop
    assert "my loop: epoch 3 train mse" in proc.stdout, proc.stdout  # the loop's print()
    assert "epoch 3/3" in proc.stdout and "evalLoss" in proc.stdout
    out = runs / "houses"
    history = json.loads((out / "metrics.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert all("evalLoss" in h["metrics"] for h in history)
    assert (out / "loss.png").is_file()
    result = json.loads((out / "result.json").read_text())
    model, manifest = models.load_model(result["model"])
    assert manifest["recipe"] == "torchscript" and manifest["features"] == ["rooms", "area_m2", "age_years"]
    with torch.no_grad():
        assert model(torch.tensor([[3.0, 80.0, 20.0]])).shape == (1, 1)

    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1
    assert "houses already finished" in again.stderr and "--restart" in again.stderr
    assert "Traceback" not in again.stderr


def test_own_loop_gets_hyperparameters_data_as_written_and_env_vars(ray_session, tmp_path: Path) -> None:
    (tmp_path / "notes.csv").write_text("text,score\n" + "".join(f"note {i},{i % 5}\n" for i in range(64)))
    doc = own_loop_job(
        tmp_path,
        "tests.workloads.loops:as_written",
        data={"source": "uri", "uri": "notes.csv"},  # relative to the YAML file's folder
        runtimeEnv={"envVars": {"TEST_RUNTIME_VAR": "from-runtime-env"}},
    )
    result = local.run(doc, runs_dir=tmp_path / "runs", base_dir=tmp_path)
    last = json.loads((tmp_path / "runs" / "own" / "metrics.json").read_text())[-1]  # averaged over ranks
    assert last["epoch"] == 2
    assert last["metrics"] == {
        "lr": 0.005,
        "learningRate": 0.005,
        "batch_size": 8.0,
        "epochs": 2.0,
        "echo": 7.0,
        "columns_as_written": 1.0,
        "row_has_text": 1.0,
        "env_seen": 1.0,
    }
    assert result["model"] is None  # the loop saved no model


def test_deterministic_error_is_said_once_and_not_retried(ray_session, tmp_path: Path) -> None:
    doc = own_loop_job(tmp_path, "tests.workloads.loops:fails_deterministically")
    doc["spec"]["failurePolicy"] = {"maxWorkerFailures": 3}
    said: list[str] = []
    tj = api.TrainingJob.model_validate(doc, context={"local": True})
    with pytest.raises(train.TrainingFailed) as failed:
        train.train(tj, storage_root=str(tmp_path / "store"), say=said.append)
    message = str(failed.value)
    assert message.startswith("attempt 1/4 failed: IndexError: index out of range in self (File "), message
    assert "loops.py" in message and "not retried" in message and "\n" not in message
    assert said == []  # nothing else was said: one attempt, one line


def test_deterministic_error_in_a_tuning_trial_is_said_once_and_not_retried(
    ray_session, tmp_path: Path
) -> None:
    """A trial runs as a plain run does: the same error in the loop's code fails the trial at its
    first attempt, said in one line, instead of Ray Train's silent retries."""
    from rayship_workloads import tune

    doc = own_loop_job(tmp_path, "tests.workloads.loops:fails_deterministically")
    doc["spec"]["failurePolicy"] = {"maxWorkerFailures": 3}
    doc["spec"]["workers"]["replicas"] = 1
    doc["spec"]["tuning"] = {
        "numSamples": 1,
        "scheduler": "fifo",
        "searchSpace": {"learningRate": {"distribution": "grid", "values": [0.01]}},
    }
    tj = api.TrainingJob.model_validate(doc, context={"local": True})
    with pytest.raises(RuntimeError, match="every tuning trial failed") as failed:
        tune.search(tj, storage_root=str(tmp_path / "store"), say=lambda _: None)
    message = str(failed.value)
    assert "attempt 1/4 failed: IndexError: index out of range in self (File " in message, message
    assert "not retried" in message and "attempt 2/4" not in message, message


def test_rayship_run_appends_across_resumes_and_a_finished_job_needs_restart(
    ray_session, tmp_path: Path, capsys
) -> None:
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    del doc["spec"]["checkpoint"]
    doc["spec"]["workers"].update(replicas=1, gpusPerWorker=0)
    doc["spec"]["trainer"].update(epochs=2)
    doc["spec"]["data"]["samples"] = 256
    runs = tmp_path / "runs"
    local.run(doc, runs_dir=runs)
    with pytest.raises(local.RunRefused, match="mlp-ddp already finished .*; run with --restart"):
        local.run(doc, runs_dir=runs)
    # a run that stopped after epoch 2 (no result.json) and is asked for 3: it resumes and appends
    (runs / "mlp-ddp" / "result.json").unlink()
    doc["spec"]["trainer"]["epochs"] = 3
    capsys.readouterr()
    result = local.run(doc, runs_dir=runs)
    out = capsys.readouterr().out
    history = json.loads((runs / "mlp-ddp" / "metrics.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert result["metrics"]["resumed_from_epoch"] == 2
    assert "epoch 3/3" in out and "epoch 1/3" not in out  # only the new epoch is printed
    local.run(doc, runs_dir=runs, restart=True)
    assert [h["epoch"] for h in json.loads((runs / "mlp-ddp" / "metrics.json").read_text())] == [1, 2, 3]
    assert "restart: removed" in capsys.readouterr().out


def test_local_mode_says_it_trains_fp16_in_fp32_on_cpu() -> None:
    doc = yaml.safe_load((SAMPLES / "trainingjob-deepspeed-zero3.yaml").read_text())
    doc["spec"]["trainer"]["deepspeed"]["precision"] = "fp16"
    tj = local.as_trainingjob(doc)
    changed, notice = local.localize(tj, cores=2, has_gpu=False)
    assert changed.spec.trainer.deepspeed is not None and changed.spec.trainer.deepspeed.precision == "fp32"
    assert "precision fp16 -> fp32: CPUs do not train in fp16" in notice and "\n" not in notice
    kept, notice = local.localize(tj, cores=2, has_gpu=True)
    assert kept.spec.trainer.deepspeed is not None and kept.spec.trainer.deepspeed.precision == "fp16"
    assert "fp16" not in notice
    doc["spec"]["trainer"].update(strategy="fsdp", fsdp={"precision": "fp16"})
    del doc["spec"]["trainer"]["deepspeed"]
    changed, notice = local.localize(local.as_trainingjob(doc), cores=2, has_gpu=False)
    assert changed.spec.trainer.fsdp is not None and changed.spec.trainer.fsdp.precision == "fp32"
    assert "precision fp16 -> fp32: CPUs do not train in fp16" in notice


def test_a_users_own_hugging_face_trainer_loop(ray_session, tmp_path: Path) -> None:
    """accelerate is installed; RayTrainReportCallback reports HF's logs and checkpoints to Ray Train."""
    (tmp_path / "text.jsonl").write_text(
        "".join(json.dumps({"text": f"the ray cluster trains model {i}", "id": i}) + "\n" for i in range(128))
    )
    doc = own_loop_job(
        tmp_path,
        "tests.workloads.loops:hf_trainer",
        data={"source": "uri", "uri": str(tmp_path / "text.jsonl")},
    )
    doc["spec"]["trainer"]["config"] = {"max_length": 32, "max_steps": 8}
    tj = api.TrainingJob.model_validate(doc, context={"local": True})
    metrics = tmp_path / "metrics.json"
    from rayship_workloads import progress

    callback = progress.ProgressCallback(
        epochs=2, storage_root=str(tmp_path / "store"), metrics_path=str(metrics), echo=False
    )
    outcome = train.train(tj, storage_root=str(tmp_path / "store"), callbacks=[callback])
    history = json.loads(metrics.read_text())
    assert len(history) == 2 and all("loss" in h["metrics"] for h in history), history
    assert outcome.latest is not None and "checkpoint" in Path(outcome.latest).name
