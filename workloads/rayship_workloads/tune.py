"""`spec.tuning`: a Ray Tune search where every trial is a full Ray Train run of the TrainingJob.

Ray 2.60 (Train V2) runs Train inside Tune as a function trainable that builds and fits a
TorchTrainer; `TuneReportCallback` relays the rank-0 metrics (and the checkpoint path) to Tune,
whose scheduler (ASHA) stops poor trials early by `epoch`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import ray.train
from ray import tune
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from rayship_workloads import progress, storage, train


@dataclass
class TuneOutcome:
    trials: int
    best_trial: str
    best_metric: float
    best_config: dict[str, Any]
    best_checkpoint: str | None
    model_uri: str | None


def search_space(tuning: dict[str, Any]) -> dict[str, Any]:
    """Tune's param space from `tuning.searchSpace`."""
    space: dict[str, Any] = {}
    for key, dim in tuning["searchSpace"].items():
        kind = dim["distribution"]
        if kind == "choice":
            space[key] = tune.choice(dim["values"])
        elif kind == "randint":
            space[key] = tune.randint(int(dim["low"]), int(dim["high"]))
        elif kind == "loguniform":
            space[key] = tune.loguniform(dim["low"], dim["high"])
        else:
            space[key] = tune.uniform(dim["low"], dim["high"])
    return space


def apply(doc: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The TrainingJob with one trial's hyperparameters filled in (trainer fields or config.<key>)."""
    doc = copy.deepcopy(doc)
    trainer = doc["spec"]["trainer"]
    for key, value in params.items():
        if key.startswith("config."):
            trainer.setdefault("config", {})[key.removeprefix("config.")] = value
        else:
            trainer[key] = int(value) if key in ("batchSizePerWorker", "epochs") else value
    doc["spec"].pop("tuning", None)
    return doc


def scheduler(tuning: dict[str, Any], epochs: int) -> Any:
    if tuning["scheduler"] == "asha":
        return ASHAScheduler(time_attr="epoch", max_t=epochs, grace_period=1, reduction_factor=2)
    return FIFOScheduler()


def search(doc: dict[str, Any], *, storage_override: str | None = None) -> TuneOutcome:
    tuning = doc["spec"]["tuning"]
    root = storage_override or train.storage_root(doc["spec"])
    base_name = train.run_name(doc)

    def trial(params: dict[str, Any]) -> None:
        trial_doc = apply(doc, params)
        name = f"{base_name}-{tune.get_context().get_trial_id()}"
        trainer, _ = train.build_trainer(
            trial_doc,
            storage_override=root,
            name=name,
            echo=False,
            quiet=True,
            extra_callbacks=[TuneReportCallback()],
        )
        trainer.fit()

    tuner = tune.Tuner(
        tune.with_resources(trial, {"CPU": 0.01}),  # the trial driver only waits; its workers hold CPUs/GPUs
        param_space=search_space(tuning),
        tune_config=tune.TuneConfig(
            metric=tuning["metric"],
            mode=tuning["mode"],
            num_samples=tuning["numSamples"],
            max_concurrent_trials=tuning["maxConcurrentTrials"],
            scheduler=scheduler(tuning, doc["spec"]["trainer"]["epochs"]),
        ),
        run_config=tune.RunConfig(name=f"{base_name}-tune", storage_path=root),
    )
    results = tuner.fit()
    errors = [r.error for r in results if r.error]
    if len(errors) == len(results):
        raise RuntimeError(f"every tuning trial failed; the first: {errors[0]}")
    best = results.get_best_result()
    best_doc = apply(doc, best.config)
    path = best.metrics.get(CHECKPOINT_PATH_KEY)  # the best trial's last checkpoint
    fs, _ = storage.filesystem(root)
    checkpoint = ray.train.Checkpoint(path, filesystem=fs) if path else None
    best_name = f"{base_name}-{best.metrics['trial_id']}"
    _, context = train.prepare(best_doc, storage_override=root, name=best_name)
    model_uri = train.export(checkpoint, best_doc, context)
    return TuneOutcome(
        trials=len(results),
        best_trial=best.metrics["trial_id"],
        best_metric=float(best.metrics[tuning["metric"]]),
        best_config=dict(best.config),
        best_checkpoint=progress.checkpoint_uri(checkpoint, root) if checkpoint else None,
        model_uri=model_uri,
    )
