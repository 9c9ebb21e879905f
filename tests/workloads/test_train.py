"""Ray Train on local Ray (CPU): DDP, DeepSpeed ZeRO, resume after failures, Ray Data, own loops,
and Ray Tune through local mode (`rayship run`).

Each test is a real multi-worker TorchTrainer run (~20-30 s each on 2 cores).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rayship import api
from rayship.api import validation
from rayship_workloads import data, job, models, progress, recipes, strategies, tracking, train
from tests.conftest import ROOT, SAMPLES

pytestmark = pytest.mark.workloads

LM_EXAMPLE = ROOT / "examples" / "lm-finetune" / "trainingjob.yaml"


def spec(tmp_path: Path, **changes: Any) -> api.TrainingJob:
    """The DDP sample on CPU with fast settings; `changes` are dotted spec paths."""
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    s = doc["spec"]
    s["workers"].update(gpusPerWorker=0, replicas=2)
    s["trainer"].update(epochs=3, batchSizePerWorker=64, learningRate=0.01)
    s["data"]["samples"] = 1024
    for path, value in changes.items():
        node = s
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return job.load_trainingjob(json.dumps(doc))


def fit(tj: api.TrainingJob, tmp_path: Path, storage_root: str | None = None) -> tuple[train.Outcome, Path]:
    """Train under tmp_path/store (or `storage_root`); the outcome and the metrics.json the progress
    callback wrote."""
    metrics, root = tmp_path / "metrics.json", storage_root or str(tmp_path / "store")
    callback = progress.ProgressCallback(
        epochs=tj.spec.trainer.epochs, storage_root=root, metrics_path=str(metrics), echo=False
    )
    return train.train(tj, storage_root=root, callbacks=[callback]), metrics


class Recorder:
    """A `job.Reporter` that keeps what it is given."""

    quiet = True
    prefix = ""

    def __init__(self, metrics_path: Path) -> None:
        self.metrics_path = metrics_path
        self.results: list[job.JobResult] = []

    def progress(self, *, epochs: int, storage_root: str) -> progress.ProgressCallback:
        return progress.ProgressCallback(
            epochs=epochs, storage_root=storage_root, metrics_path=str(self.metrics_path), echo=False
        )

    def finished(self, tj: api.TrainingJob, result: job.JobResult) -> None:
        self.results.append(result)


def checkpoints(outcome: train.Outcome) -> list[str]:
    run_dir = Path(outcome.storage_root, outcome.run_name)
    return sorted(p.name for p in run_dir.iterdir() if p.name.startswith("epoch-"))


def losses(metrics_path: Path) -> list[float]:
    return [r["metrics"]["loss"] for r in json.loads(metrics_path.read_text())]


def assert_model_predicts(model_uri: str | None, in_features: int) -> None:
    assert model_uri is not None
    model, manifest = models.load_model(model_uri)
    assert manifest["recipe"] == "mlp" and manifest["config"]["in_features"] == in_features
    with torch.no_grad():
        out = model(torch.zeros(3, in_features))
    assert out.shape == (3, 1) and torch.isfinite(out).all()


def ray_actors(class_name: str, *, state: str | None = None) -> set[str]:
    """The ids of this Ray's actors of `class_name` (in `state`; by default: ever made, dead ones too)."""
    from ray.util.state import list_actors

    filters: list[tuple[str, str, str]] = [("class_name", "=", class_name)]
    if state:
        filters.append(("state", "=", state))
    return {actor.actor_id for actor in list_actors(filters=filters, limit=10_000)}


def test_ddp_two_workers_learns_and_keeps_checkpoints(ray_session, tmp_path: Path) -> None:
    """Through the driver (`job.run`), as the cluster and `rayship run` call it."""
    tj = spec(tmp_path, **{"trainer.epochs": 4, "checkpoint.keep": 2})
    reporter = Recorder(tmp_path / "metrics.json")
    controllers, ctrl_c = ray_actors("TrainController", state="ALIVE"), signal.getsignal(signal.SIGINT)
    result = job.run(tj, storage_root=str(tmp_path / "store"), reporter=reporter)
    # The finished run leaves nothing running: Ctrl-C is this process's own again (Ray Train's handler
    # held the run's controller actor, ~680 MB, alive until the next run), and the controller exits
    # (held, it never would: the bound only has to outlast a slow exit on a loaded machine).
    assert signal.getsignal(signal.SIGINT) is ctrl_c
    deadline = time.monotonic() + 60
    while (
        left := ray_actors("TrainController", state="ALIVE") - controllers
    ) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"the finished run's Train controller is still alive: {left}"
    assert reporter.results == [result]
    history = losses(reporter.metrics_path)
    assert len(history) == 4 and history[-1] < 0.5 * history[0], history
    run_dir = tmp_path / "store" / "default.mlp-ddp"
    assert sorted(p.name for p in run_dir.glob("epoch-*")) == ["epoch-00003", "epoch-00004"]  # keep: 2
    status = api.TrainingJobStatus.model_validate(result.status())  # what the cluster reporter patches
    assert status.checkpoint is not None and status.tuning is None
    assert status.checkpoint.latest and status.checkpoint.latest.endswith("epoch-00004")
    assert status.checkpoint.best == status.checkpoint.latest
    assert status.checkpoint.model == status.checkpoint.best_model == str(run_dir / "model")
    assert result.metrics["epoch"] == 4
    assert_model_predicts(status.checkpoint.model, in_features=8)


def test_worker_failure_resumes_from_latest_checkpoint(ray_session, tmp_path: Path) -> None:
    doc = spec(
        tmp_path,
        **{
            "trainer.recipe": None,
            "trainer.entrypoint": "tests.workloads.loops:crash_once",
            "trainer.epochs": 4,
            "trainer.config": {"crash_marker": str(tmp_path / "crashed"), "crash_after_epoch": 2},
            "failurePolicy.maxWorkerFailures": 1,
        },
    )
    outcome, _ = fit(doc, tmp_path)
    assert (tmp_path / "crashed").exists(), "the failure was not injected"
    assert outcome.metrics["epoch"] == 4
    assert outcome.metrics["resumed_from_epoch"] == 2  # restarted from epoch 2's checkpoint, not from scratch


def test_a_report_lost_with_its_controller_is_read_back_by_the_next_attempt(
    ray_session, tmp_path: Path, monkeypatch
) -> None:
    """Issue 59 §2, the lost report found: Ray Train registers a report's checkpoint before it calls
    rayship's callback, so a controller killed between the two (a driver SIGKILLed takes its controller
    with it) leaves a checkpoint of epoch 2 whose report never reached the history or the status. The
    next attempt (a new fit on the same storage, as a RayJob retry's driver) reads Ray Train's record
    of it back before it trains: the history gets the epoch-2 record it lacked, and the status patch
    names it (`progress.recovered`, with this attempt's Ray cluster) for the operator; training resumes
    from epoch 2 and the history has every epoch once."""
    from tests.workloads.loops import KillTheControllerAtEpoch, StatusPatchesToFile

    monkeypatch.setenv("RAY_CLUSTER_NAME", "c2")  # KubeRay sets it in every Ray container
    tj = spec(tmp_path, **{"trainer.epochs": 3, "failurePolicy.maxWorkerFailures": 0})
    root, metrics, patches = str(tmp_path / "store"), tmp_path / "metrics.json", tmp_path / "patches.jsonl"
    run = train.run_name(tj)

    def callback() -> progress.ProgressCallback:
        made = progress.ProgressCallback(epochs=3, storage_root=root, metrics_path=str(metrics),
                                         trainingjob="default/mlp-ddp", echo=False)  # fmt: skip
        assert made.status is not None
        made.status.make_api = functools.partial(StatusPatchesToFile, str(patches))  # in each process
        return made

    killer = KillTheControllerAtEpoch(2, str(tmp_path / "killed"))
    with pytest.raises(Exception) as died:  # noqa: PT011 (Ray's error for an actor that died)
        train.train(tj, storage_root=root, callbacks=[killer, callback()])
    assert (tmp_path / "killed").exists(), f"the controller was not killed: {died.value!r}"
    # found: the checkpoint of epoch 2 is registered, its report is nowhere
    assert progress.registered_report(root, run)["epoch"] == 2  # type: ignore[index]
    assert [r["epoch"] for r in json.loads(metrics.read_text())] == [1]
    said = [json.loads(line)["status"]["progress"] for line in patches.read_text().splitlines()]
    assert [p.get("epoch") for p in said] == [1] and said[0]["rayCluster"] == "c2", said

    patches.unlink()
    outcome = train.train(tj, storage_root=root, callbacks=[killer, callback()])
    history = json.loads(metrics.read_text())
    assert [(r["epoch"], r.get("recovered")) for r in history] == [(1, None), (2, True), (3, None)], history
    assert history[1]["checkpoint"].endswith("epoch-00002") and history[1]["metrics"]["loss"] > 0
    first = json.loads(patches.read_text().splitlines()[0])["status"]["progress"]
    assert first["recovered"]["epoch"] == 2 and first["recovered"]["rayCluster"] == "c2", first
    assert first["recovered"]["metrics"] == history[1]["metrics"], (first, history[1])
    assert outcome.metrics["resumed_from_epoch"] == 2 and outcome.metrics["epoch"] == 3


def test_second_process_with_same_run_name_resumes_and_tracks_to_the_same_mlflow_run(
    ray_session, tmp_path: Path
) -> None:
    """A RayJob retry: a new driver process, the same storage and run name, resumes (epochs 1-2 not
    redone). spec.tracking.mlflow (a SQLite store here, a server's URI in a cluster): one MLflow run
    tagged with the job, the trainer's params, each epoch's loss at step = epoch, the model's URI,
    FINISHED; the retry logs on to the same MLflow run."""
    import ray
    from mlflow.tracking import MlflowClient

    store = tmp_path / "store"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    client = MlflowClient(tracking_uri=uri)
    runs, outputs = [], []
    for epochs in (2, 3):
        doc = spec(
            tmp_path,
            **{
                "trainer.epochs": epochs,
                "checkpoint.storage": {"pvc": {"claimName": "c", "mountPath": str(store)}},
                "tracking": {"mlflow": {"trackingUri": uri, "experiment": "rayship-tests"}},
            },
        )
        spec_file = tmp_path / f"spec-{epochs}.yaml"
        spec_file.write_text(yaml.safe_dump(doc.wire()))
        proc = subprocess.run(
            [sys.executable, "-m", "rayship_workloads.job", "--spec", str(spec_file)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(proc.stdout)
        experiment = client.get_experiment_by_name("rayship-tests")
        assert experiment is not None
        runs.extend(client.search_runs([experiment.experiment_id]))
    done = json.loads(outputs[1].split("[rayship] done: ", 1)[1].splitlines()[0])
    assert done["latest"].endswith("default.mlp-ddp/epoch-00003")
    assert "epoch 3/3" in outputs[1] and "epoch 1/3" not in outputs[1]  # resumed: epochs 1-2 not redone

    first, again = runs
    assert again.info.run_id == first.info.run_id and again.info.status == first.info.status == "FINISHED"
    assert again.info.run_name == "mlp-ddp"
    assert again.data.tags[tracking.UID_TAG] == "default.mlp-ddp"  # no uid outside a cluster: the run name
    assert again.data.tags["rayship.model"] == done["model"]
    assert again.data.params["learningRate"] == "0.01" and again.data.params["strategy"] == "ddp"
    logged = client.get_metric_history(first.info.run_id, "loss")
    assert [m.step for m in logged] == [1, 2, 3]
    printed = [float(line.split("  loss ")[1].split()[0]) for out in outputs for line in out.splitlines()
               if " rank" not in line and "  loss " in line and "epoch " in line]  # fmt: skip
    assert [m.value for m in logged] == pytest.approx(printed, abs=1e-5), (logged, printed)


def test_parquet_data_through_ray_data(ray_session, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = torch.Generator().manual_seed(0)
    x = torch.randn(512, 4, generator=rng)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    table = pa.table(
        {
            "a": x[:, 0].numpy(),
            "b": x[:, 1].numpy(),
            "c": x[:, 2].numpy(),
            "d": x[:, 3].numpy(),
            "target": y.numpy(),
        }
    )
    pq.write_table(table, tmp_path / "train.parquet")
    pq.write_table(table.slice(0, 128), tmp_path / "val.parquet")
    doc = spec(
        tmp_path,
        **{
            "data": {
                "source": "uri",
                "uri": str(tmp_path / "train.parquet"),
                "validation": {"uri": str(tmp_path / "val.parquet")},
            },
            "trainer.config": {"label": "target"},
            "trainer.epochs": 3,
            "workers.replicas": 1,
            # the "best" checkpoint by the highest training loss: epoch 1's, deterministically
            "checkpoint.metric": "loss",
            "checkpoint.mode": "max",
            "checkpoint.keep": 3,
        },
    )
    footer_readers = ray_actors("FooterReader")
    outcome, metrics = fit(doc, tmp_path)
    # The files' metadata was read once: no pool of footer-reading actors per epoch and per validation
    # pass (Ray Data's parquet V2 default: 32 new actors each time, 4-7 s a pass here)
    assert ray_actors("FooterReader") == footer_readers
    assert losses(metrics)[-1] < losses(metrics)[0]
    eval_losses = [r["metrics"]["evalLoss"] for r in json.loads(metrics.read_text())]
    assert len(eval_losses) == 3 and eval_losses[-1] < eval_losses[0], eval_losses
    assert outcome.best is not None and outcome.best.endswith("epoch-00001")
    assert outcome.best_model_uri is not None and outcome.best_model_uri.endswith("model-best")
    assert outcome.model_uri is not None
    _, manifest = models.load_model(outcome.model_uri)
    assert manifest["features"] == ["a", "b", "c", "d"]
    assert_model_predicts(outcome.model_uri, in_features=4)


def test_missing_label_column_is_explained(ray_session, tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text("a,b\n1,2\n3,4\n")
    doc = spec(tmp_path, **{"data": {"source": "uri", "uri": str(tmp_path / "train.csv")}})
    with pytest.raises(
        ValueError, match="label column 'y' not in the data .columns: a, b.; set trainer.config.label"
    ):
        train.build_trainer(doc, storage_root=str(tmp_path / "store"))


def test_bring_your_own_entrypoint_gets_the_config(ray_session, tmp_path: Path) -> None:
    doc = spec(
        tmp_path,
        **{
            "trainer.recipe": None,
            "trainer.entrypoint": "tests.workloads.loops:echo_config",
            "trainer.config": {"echo": 7},
        },
    )
    outcome, metrics = fit(doc, tmp_path)
    last = json.loads(metrics.read_text())[-1]  # what the progress callback saw (averaged over ranks)
    assert last["epoch"] == 2
    assert last["metrics"] == {"echo": 7.0, "world_size": 2.0, "spec_in_wire_form": 1.0}
    assert (
        outcome.latest is None and outcome.model_uri is None
    )  # rayship does not guess the format of a custom loop's checkpoints


def test_unknown_entrypoint_is_explained(tmp_path: Path) -> None:
    def own(entrypoint: str) -> api.TrainerSpec:
        return api.TrainerSpec.model_validate({"entrypoint": entrypoint})

    with pytest.raises(ValueError, match="cannot import 'no_such_module'"):
        recipes.train_loop(own("no_such_module:loop"))
    with pytest.raises(ValueError, match="has no function 'nope'"):
        recipes.train_loop(own("tests.workloads.loops:nope"))
    assert recipes.resolve_entrypoint("tests.workloads.loops:echo_config").__name__ == "echo_config"
    # imported again on each worker (its module may come with runtimeEnv.workingDir)
    loop = recipes.train_loop(own("tests.workloads.loops:echo_config"))
    assert getattr(loop, "func", None) is recipes.run_own_loop and loop.args == (
        "tests.workloads.loops:echo_config",
    )


@pytest.mark.parametrize(
    ("deepspeed", "precision"),
    # ZeRO-2 in fp32: test_causal_lm_recipe_on_a_tiny_config[deepspeed] (its checkpoint and export too)
    [({"zeroStage": 3, "offloadOptimizer": True, "offloadParams": True}, "bf16")],
    ids=["zero3-offload-bf16"],
)
def test_deepspeed_zero(ray_session, tmp_path: Path, deepspeed: dict[str, Any], precision: str) -> None:
    doc = spec(
        tmp_path,
        **{"trainer.strategy": "deepspeed", "trainer.deepspeed": {**deepspeed, "precision": precision}},
    )
    outcome, metrics = fit(doc, tmp_path)
    assert losses(metrics)[-1] < losses(metrics)[0]
    assert outcome.latest is not None
    latest = Path(outcome.latest)
    assert (latest / "ds" / "mp_rank_00_model_states.pt").is_file() or any(latest.glob("ds/*model_states.pt"))
    assert_model_predicts(outcome.model_uri, in_features=8)  # consolidated from the ZeRO shards


def test_fsdp_shards_checkpoints_resumes_and_exports(ray_session, tmp_path: Path) -> None:
    """strategy fsdp (FSDP2 on CPU, bf16 compute): each rank writes its shard of the checkpoint, a
    second run of the same job resumes from it, and the exported model is the gathered weights."""
    doc = spec(tmp_path, **{"trainer.strategy": "fsdp", "trainer.epochs": 2, "trainer.fsdp": {}})
    outcome, metrics = fit(doc, tmp_path)
    assert losses(metrics)[-1] < losses(metrics)[0], losses(metrics)
    assert outcome.latest is not None
    shards = Path(outcome.latest) / strategies.FSDP_DIR
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    gathered = strategies.full_state_dict(Path(outcome.latest), "fsdp")
    model, _ = models.load_model(outcome.model_uri)
    assert set(gathered) == set(model.state_dict())
    assert all(torch.equal(gathered[k], v) for k, v in model.state_dict().items())
    assert_model_predicts(outcome.model_uri, in_features=8)
    again, _ = fit(spec(tmp_path, **{"trainer.strategy": "fsdp", "trainer.epochs": 3}), tmp_path)
    assert again.metrics["epoch"] == 3 and again.metrics["resumed_from_epoch"] == 2, again.metrics


def test_fsdp_shards_a_hugging_face_model_by_its_blocks() -> None:
    model = recipes.build_causal_lm(recipes.causal_lm_config({"model_config": {"n_layer": 3}}))
    units = strategies.fsdp_units(model)
    assert [type(u).__name__ for u in units] == ["GPT2Block"] * 3
    assert strategies.fsdp_units(recipes.MLP(8, [16])) == []  # one unit: the whole model


def test_synthetic_data_is_seeded(ray_session) -> None:
    a = data.synthetic_tabular(16, 3, seed=1).take_all()
    b = data.synthetic_tabular(16, 3, seed=1).take_all()
    c = data.synthetic_tabular(16, 3, seed=2).take_all()
    assert a == b and a != c and set(a[0]) == {"x0", "x1", "x2", "y"}


def test_local_scale_down_is_said_in_one_line(tmp_path: Path) -> None:
    from rayship_workloads.local import localize

    tj = spec(tmp_path, **{"workers.replicas": 8, "workers.gpusPerWorker": 2})
    local, notice = localize(tj, cores=2, has_gpu=False)
    assert (local.spec.workers.replicas, local.spec.workers.gpus_per_worker) == (2, 0)
    assert (tj.spec.workers.replicas, tj.spec.workers.gpus_per_worker) == (8, 2)  # a copy
    assert (
        notice
        == "local run: 8 workers x 2 GPU requested -> 2 CPU workers (no GPU here: training on CPU; capped to 2 workers (local cores))"
    )
    assert "\n" not in notice


def test_rayship_run_of_a_tuning_spec_runs_the_trials_and_reports_the_best(
    ray_session, tmp_path: Path, capsys
) -> None:
    """`rayship run` of examples/tune-asha runs the search, as the cluster does, and says what it found
    (the test adds MLflow tracking: each trial an MLflow run, SQLite locally)."""
    from rayship import cli

    doc = yaml.safe_load((ROOT / "examples" / "tune-asha" / "trainingjob.yaml").read_text())
    doc["spec"]["tracking"] = {"mlflow": {}}  # each trial an MLflow run (Ray Tune's MLflow logger)
    path, runs = tmp_path / "tuning.yaml", tmp_path / "runs"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["run", "-f", str(path), "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    run_dir = runs / "mlp-tuning"
    result = json.loads((run_dir / "result.json").read_text())
    tuning = result["tuning"]
    assert tuning["trials"] == 2
    best = tuning["bestConfig"]
    assert 1e-4 <= best["learningRate"] < 3e-2 and best["config.hidden"] in ([16], [32, 32])
    assert tuning["bestMetric"] > 0 and result["metrics"]["loss"] == tuning["bestMetric"]
    assert set(result["metrics"]) == {"epoch", "step", "loss", "resumed_from_epoch"}  # the loop's, not Tune's
    epoch_lines = [line for line in out.splitlines() if line.startswith("trial ") and "  epoch " in line]
    assert len(epoch_lines) >= 2 and "Trial status" not in out, out  # a line per trial epoch, no tables
    trial_lines = [
        line
        for line in out.splitlines()
        if line.startswith("trial ") and "learningRate=" in line and line not in epoch_lines
    ]
    assert len(trial_lines) == 2 and any(tuning["bestTrial"] in line for line in trial_lines), out
    # every grid value, numSamples times
    assert sum("config.hidden=[16] " in line + " " for line in trial_lines) == 1, trial_lines
    assert sum("config.hidden=[32, 32]" in line for line in trial_lines) == 1, trial_lines
    assert f"best trial {tuning['bestTrial']}: loss " in out
    assert f"config {json.dumps(best, sort_keys=True)}" in out
    assert result["best"] and result["model"] == result["bestModel"]
    assert Path(result["model"]).is_relative_to((run_dir / "checkpoints").resolve())
    _, manifest = models.load_model(result["model"])
    assert manifest["config"]["hidden"] == best["config.hidden"]  # the best trial's model

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'checkpoints').resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("rayship-default")
    assert experiment is not None
    tracked = client.search_runs([experiment.experiment_id])
    assert len(tracked) == 2 and {r.data.tags[tracking.TRAININGJOB_TAG] for r in tracked} == {"mlp-tuning"}
    assert all(client.get_metric_history(r.info.run_id, "loss") for r in tracked)


@pytest.mark.parametrize("strategy", ["ddp", "deepspeed", "fsdp"])
def test_causal_lm_recipe_on_a_tiny_config(ray_session, tmp_path: Path, strategy: str) -> None:
    """A Hugging Face causal LM built from a tiny config (nothing downloaded), byte-level tokens."""
    changes: dict[str, Any] = {
        "trainer.recipe": "causal-lm",
        "trainer.strategy": strategy,
        "trainer.epochs": 3,
        "trainer.batchSizePerWorker": 16,
        "trainer.learningRate": 0.003,
        "trainer.config": {"max_length": 32},
        "data.samples": 256,
        "data.validation": {"fraction": 0.25},
    }
    if strategy == "deepspeed":
        changes["trainer.deepspeed"] = {"zeroStage": 2, "precision": "fp32"}
    doc = spec(tmp_path, **changes)
    outcome, metrics = fit(doc, tmp_path)
    history = losses(metrics)
    assert history[-1] < history[0], history
    last = json.loads(metrics.read_text())[-1]["metrics"]
    assert last["perplexity"] == pytest.approx(math.exp(last["evalLoss"]))  # the same on every rank
    assert outcome.model_uri is not None and outcome.latest is not None
    if strategy == "deepspeed":  # DeepSpeed's own checkpoint; the model is consolidated from its shards
        assert any(Path(outcome.latest).glob("ds/*model_states.pt")), sorted(Path(outcome.latest).rglob("*"))
    model, manifest = models.load_model(outcome.model_uri)
    assert manifest["recipe"] == "causal-lm" and manifest["tokenizer"] == "pretrained"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(outcome.model_uri, local_files_only=True)
    assert tokenizer.decode(tokenizer.encode("the ray ")) == "the ray "
    prompt = torch.tensor([list(b"the ray ")])
    with torch.no_grad():
        logits = model(input_ids=prompt).logits
    assert logits.shape == (1, prompt.shape[1], 260) and torch.isfinite(logits).all()


def test_the_byte_tokenizer_is_a_hugging_face_tokenizer_of_the_training_tokens(tmp_path: Path) -> None:
    """The exported causal-lm carries its byte tokens as a tokenizer AutoTokenizer loads: the ids
    training used (UTF-8 bytes, then end of text), text back from them, special ids in the vocabulary
    and in the model's config."""
    from transformers import AutoTokenizer

    recipes.byte_tokenizer().save_pretrained(str(tmp_path))
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    text = "héllo, ray 🚀\n  two  spaces"
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8")) and tokenizer.decode(ids) == text
    trained = recipes.Tokens(recipes.causal_lm_config({})["model_config"], 64)([text])["input_ids"][0]
    assert trained[: len(ids)].tolist() == ids and int(trained[len(ids)]) == tokenizer.eos_token_id
    config = api.CAUSAL_LM_MODEL_CONFIG
    assert (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) == (
        config["eos_token_id"],
        config["bos_token_id"],
        config["pad_token_id"],
    )
    assert len(tokenizer) <= config["vocab_size"]
    batch = tokenizer(["a", "abc"], padding=True)  # pads with its own pad token
    assert batch["input_ids"] == [[97, config["pad_token_id"], config["pad_token_id"]], [97, 98, 99]]


def test_a_sequence_longer_than_the_models_positions_is_refused_before_training() -> None:
    model = recipes.build_causal_lm({"model_config": {**api.CAUSAL_LM_MODEL_CONFIG, "n_positions": 16}})
    recipes.check_positions(model, 16)
    with pytest.raises(ValueError, match=r"max_length: 17 tokens do not fit the model's 16 positions"):
        recipes.check_positions(model, 17)


def test_early_stopping_ends_training_when_the_metric_stalls(ray_session, tmp_path: Path) -> None:
    """earlyStopping {patience: 1} with a minDelta no epoch can beat: the first epoch sets the best
    evalLoss, the second does not improve on it, training stops there (of 5) with a checkpoint, the
    model, and its early-stopping state (stopped), which a longer run of the same job resumes (next test)."""
    changes: dict[str, Any] = {
        "trainer.epochs": 5,
        "trainer.earlyStopping": {"patience": 1, "minDelta": 1.0e6},
        "checkpoint.everyEpochs": 3,
        "data.validation": {"fraction": 0.25},
    }
    outcome, metrics = fit(spec(tmp_path, **changes), tmp_path)
    history = json.loads(metrics.read_text())
    assert [h["epoch"] for h in history] == [1, 2], history
    assert history[-1].get("stoppedEarly") is True and "stoppedEarly" not in history[0]
    assert checkpoints(outcome) == ["epoch-00002"]  # saved where it stopped, though everyEpochs is 3
    state = json.loads(Path(outcome.storage_root, outcome.run_name, "epoch-00002", recipes.STATE).read_text())
    assert state[recipes.EARLY_STOPPING]["stopped"] is True and state[recipes.EARLY_STOPPING]["wait"] == 1
    assert state[recipes.EARLY_STOPPING]["best"] == pytest.approx(history[0]["metrics"]["evalLoss"])
    assert_model_predicts(outcome.model_uri, in_features=8)


def test_a_run_that_stopped_early_trains_no_further_when_resumed_longer(tmp_path: Path, monkeypatch) -> None:
    """The same job run again with more epochs resumes a checkpoint whose early-stopping state says
    stopped (as the test above saved it): the loop returns before any epoch."""
    from rayship_workloads.recipes import loop

    class Context:
        def get_world_rank(self) -> int:
            return 0

        def get_world_size(self) -> int:
            return 1

    monkeypatch.setattr(loop.ray.train, "get_context", Context)
    doc = spec(tmp_path, **{"trainer.epochs": 8, "trainer.earlyStopping": {"patience": 1, "minDelta": 1.0e6}})

    def no_epoch() -> Any:
        raise AssertionError("a run that had stopped early trained another epoch")

    saved = {"best": 0.3, "wait": 1, "stopped": True}
    loop.run_epochs(
        None,
        doc.spec,
        None,
        start=loop.Start(2, 12, early_stopping=saved),
        losses=no_epoch,
        on_epoch_end=None,
    )  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="trained another epoch"):  # not stopped: it trains on
        loop.run_epochs(
            None,
            doc.spec,
            None,
            start=loop.Start(2, 12, early_stopping={**saved, "stopped": False}),
            losses=no_epoch,
            on_epoch_end=None,
        )  # type: ignore[arg-type]


def test_an_epoch_that_ends_while_a_node_is_drained_is_saved_whatever_every_epochs(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """No Ray run: when Ray Train says a node of the group is being drained (a preemption), every rank
    saves the epoch that just ended, though checkpoint.everyEpochs would skip it."""
    import torch
    from ray.train import PreemptionInfo

    from rayship_workloads.recipes import loop

    class Context:
        def get_world_rank(self) -> int:
            return 0

        def get_world_size(self) -> int:
            return 2

    drained = {3, 4}  # epochs after which a drain is seen
    epoch = iter(range(1, 100))
    info = PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"node-b": [1]})
    monkeypatch.setattr(loop.ray.train, "get_context", Context)
    monkeypatch.setattr(
        loop.ray.train, "get_preemption_info", lambda: info if next(epoch) in drained else None
    )
    saved: list[tuple[int, bool]] = []
    monkeypatch.setattr(loop, "report", lambda *_, epoch, save, **__: saved.append((epoch, save)))

    class Step:
        def step(self, loss: torch.Tensor) -> None:
            pass

    doc = spec(tmp_path, **{"trainer.epochs": 6, "checkpoint.everyEpochs": 5})
    loop.run_epochs(
        Step(),
        doc.spec,
        None,
        start=loop.Start(0, 0),
        losses=lambda: iter([torch.tensor(1.0)]),
        on_epoch_end=None,
    )  # type: ignore[arg-type]
    assert saved == [(1, False), (2, False), (3, True), (4, True), (5, True), (6, True)]
    assert "rank 0: ranks [1] are being preempted: checkpoint after epoch 3" in capsys.readouterr().out


def test_the_hf_trainer_engine_saves_an_epoch_that_ends_while_a_node_is_drained(
    tmp_path: Path, monkeypatch
) -> None:
    """No Ray run: the Hugging Face Trainer's callback (trainer.config.engine: hf-trainer) saves the
    epoch that ends during a drain as the built-in loop does, whatever checkpoint.everyEpochs says."""
    from types import SimpleNamespace

    from ray.train import PreemptionInfo

    from rayship_workloads import hf_trainer
    from rayship_workloads.recipes import loop

    drained = {2}  # epochs after which a drain is seen
    epoch = iter(range(1, 100))
    info = PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"node-b": [1]})
    monkeypatch.setattr(
        loop.ray.train, "get_preemption_info", lambda: info if next(epoch) in drained else None
    )
    monkeypatch.setattr(
        hf_trainer.ray.train, "get_context", lambda: SimpleNamespace(get_world_rank=lambda: 0)
    )
    saved: list[tuple[int, bool]] = []
    monkeypatch.setattr(
        hf_trainer.recipes, "report", lambda *_, epoch, save, **__: saved.append((epoch, save))
    )

    doc = spec(tmp_path, **{"trainer.epochs": 4, "checkpoint.everyEpochs": 3})
    callback = hf_trainer.RayshipReportCallback(doc.spec, None, recipes.Start(0, 0), None)  # type: ignore[arg-type]
    state, control = (
        SimpleNamespace(log_history=[], global_step=0),
        SimpleNamespace(should_training_stop=False),
    )
    for _ in range(4):
        callback.on_epoch_end(None, state, control)
        callback.on_save(None, state, control)
    assert saved == [(1, False), (2, True), (3, True), (4, True)]


def test_rayship_run_tracks_to_a_sqlite_store_beside_the_run_and_a_cluster_needs_a_server(
    tmp_path: Path,
) -> None:
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    doc["spec"]["tracking"] = {"mlflow": {}}
    local = validation.parse(doc, local=True)
    assert isinstance(local, api.TrainingJob)
    assert tracking.settings(local, str(tmp_path)) == (
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        "rayship-default",
    )
    with pytest.raises(validation.SpecError, match="trackingUri is required in a cluster"):
        validation.parse(doc)


@pytest.mark.timeout(600)
def test_lm_finetune_example_on_the_hugging_face_trainer_with_deepspeed_resumes_and_exports(
    ray_session, tmp_path: Path, capsys
) -> None:
    """examples/lm-finetune through `rayship run -f`, with the one change the README names for a
    2-core machine (`workers.replicas: 1`): transformers.Trainer with the job's DeepSpeed ZeRO-2
    settings as its `deepspeed=` config (fp16 said to become fp32 on CPUs), the example's own corpus,
    reporting each epoch (validation too) with signed `epoch-N` checkpoints that hold the Trainer's
    checkpoint; the model exports as the built-in loop's does, its tokenizer round-trips text; the
    same job run longer resumes the last checkpoint. (~2-3 min on 2 cores.)"""
    from transformers import AutoTokenizer

    from rayship import cli
    from rayship_workloads import local

    example = tmp_path / "lm-finetune"
    shutil.copytree(LM_EXAMPLE.parent, example)  # its data.uri is relative to the YAML file
    doc = yaml.safe_load(LM_EXAMPLE.read_text())
    doc["spec"]["workers"]["replicas"] = 1
    # Its workingDir (the folder, shipped to a cluster) is a local folder that only the Ray `rayship run`
    # starts can ship; this process already runs the tier's Ray. data.uri resolves beside the file either way.
    assert doc["spec"].pop("runtimeEnv") == {"workingDir": "."}
    (example / "trainingjob.yaml").write_text(yaml.safe_dump(doc))
    runs = tmp_path / "runs"
    assert cli.main(["run", "-f", str(example / "trainingjob.yaml"), "--runs-dir", str(runs)]) == 0
    assert "precision fp16 -> fp32: CPUs do not train in fp16" in capsys.readouterr().out
    out = runs / "lm-finetune"
    history = json.loads((out / "metrics.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2], history
    last = history[-1]["metrics"]
    assert last["perplexity"] == pytest.approx(math.exp(last["evalLoss"])) and last["loss"] > 0
    run_dir = out / "checkpoints" / "lm-finetune"
    assert sorted(p.name for p in run_dir.glob("epoch-*")) == ["epoch-00001", "epoch-00002"]
    saved = run_dir / "epoch-00002"
    assert json.loads((saved / recipes.STATE).read_text())["strategy"] == "hf-trainer/deepspeed"
    assert list((saved / "checkpoint").glob("global_step*/*optim_states.pt")), sorted(
        saved.rglob("*")
    )  # ZeRO
    model_uri = json.loads((out / "result.json").read_text())["model"]
    model, manifest = models.load_model(model_uri)
    assert manifest["recipe"] == "causal-lm" and manifest["tokenizer"] == "pretrained"
    tokenizer = AutoTokenizer.from_pretrained(model_uri)
    ids = tokenizer("the ray ")["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the ray "
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=torch.tensor([ids])).logits).all()

    doc["spec"]["trainer"]["epochs"] = 3  # the same run, longer: resumes after epoch 2
    tj = validation.parse(doc, local=True)
    assert isinstance(tj, api.TrainingJob)
    local.resolve_paths(tj, example)
    tj, _ = local.localize(tj, cores=2, has_gpu=False)
    outcome, metrics = fit(tj, tmp_path, storage_root=str(out / "checkpoints"))
    history = json.loads(metrics.read_text())
    assert [h["epoch"] for h in history] == [3] and history[-1]["resumedFromEpoch"] == 2, history
    assert checkpoints(outcome)[-1] == "epoch-00003" and outcome.model_uri is not None


def test_run_with_missing_data_names_the_field(ray_session, tmp_path: Path, capsys) -> None:
    from rayship import cli

    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    doc["spec"]["data"] = {"source": "uri", "uri": str(tmp_path / "missing.parquet")}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["run", "-f", str(path), "--runs-dir", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert f"spec.data.uri: {tmp_path / 'missing.parquet'} does not exist" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("workers", "preemptions", "num_workers", "max_preemption_failures"),
    [
        ({"replicas": 3, "minReplicas": 2, "resizeIntervalSeconds": 15}, None, (2, 3), -1),
        ({"replicas": 3}, 5, 3, 5),
        ({"replicas": 2, "minReplicas": 2}, 0, 2, 0),  # min == max: a fixed size
    ],
    ids=["elastic-unlimited-preemptions", "fixed-five-preemptions", "min-equals-replicas"],
)
def test_elastic_workers_and_preemptions_reach_ray_train(
    tmp_path: Path, workers: dict, preemptions: int | None, num_workers, max_preemption_failures: int
) -> None:
    """No Ray run: the TorchTrainer as built (the cluster path makes the same one)."""
    changes: dict[str, Any] = {"workers": {"gpusPerWorker": 0, **workers}}
    if preemptions is not None:
        changes["failurePolicy.maxPreemptions"] = preemptions
    trainer, _ = train.build_trainer(spec(tmp_path, **changes), storage_root=str(tmp_path / "store"))
    assert trainer.scaling_config.num_workers == num_workers
    assert trainer.scaling_config.elastic_resize_monitor_interval_s == workers.get(
        "resizeIntervalSeconds", 60
    )
    failure = trainer.run_config.failure_config
    assert failure.max_preemption_failures == max_preemption_failures
    assert failure.max_failures == 3  # failurePolicy.maxWorkerFailures, counted apart
