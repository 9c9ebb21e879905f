"""`spec.tuning`: a Ray Tune search where every trial is a full Ray Train run of the TrainingJob.

Ray 2.60 (Train V2) runs Train inside Tune as a function trainable that builds and fits a
TorchTrainer (`train.build_trainer`); `TuneReportCallback` relays the rank-0 metrics (and the
checkpoint path) to Tune, whose scheduler (ASHA) stops poor trials early by `epoch`. The best trial's
last checkpoint is exported like a training run's model (`train.export`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ray import tune
from ray.train import Checkpoint
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback
from ray.tune.result import AUTO_RESULT_KEYS
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from rayship import api
from rayship.validation import parse_trainingjob
from rayship_workloads import progress, storage, train

# Trainer fields a search may set that the API types as integers (a uniform draw gives floats).
INTEGER_FIELDS = frozenset(
    f.alias or n for n, f in api.TrainerSpec.model_fields.items() if f.annotation is int
)
# What Tune adds to every result besides the loop's own metrics.
_TUNE_KEYS = frozenset({*AUTO_RESULT_KEYS, CHECKPOINT_PATH_KEY, "trial_id", "done", "experiment_tag"})


@dataclass(frozen=True)
class Trial:
    trial_id: str
    config: dict[str, Any]  # its hyperparameters (searchSpace keys)
    metric: float | None  # the last reported value of `tuning.metric`
    epoch: int | None  # the last reported epoch (ASHA stops poor trials early)
    error: str | None = None


@dataclass(frozen=True)
class TuneOutcome:
    trials: tuple[Trial, ...]
    best_trial: str
    best_metric: float
    best_config: dict[str, Any]
    best_checkpoint: str | None
    model_uri: str | None
    metrics: dict[str, Any] = field(default_factory=dict)  # the best trial's last report
    results: str = ""  # Tune's results directory (each trial's progress)


def _bounds(key: str, dim: api.SearchDimension) -> tuple[float, float]:
    if dim.low is None or dim.high is None:  # the API's rules require both for these distributions
        raise ValueError(f"tuning.searchSpace.{key}: {dim.distribution} needs low and high")
    return dim.low, dim.high


def search_space(tuning: api.TuningSpec) -> dict[str, Any]:
    """Tune's param space from `tuning.searchSpace`."""
    space: dict[str, Any] = {}
    for key, dim in tuning.search_space.items():
        if dim.distribution == "grid":
            if not dim.values:
                raise ValueError(f"tuning.searchSpace.{key}: grid needs values")
            space[key] = tune.grid_search(dim.values)
        elif dim.distribution == "choice":
            if not dim.values:
                raise ValueError(f"tuning.searchSpace.{key}: choice needs values")
            space[key] = tune.choice(dim.values)
        elif dim.distribution == "randint":
            low, high = _bounds(key, dim)
            space[key] = tune.randint(int(low), int(high))
        elif dim.distribution == "loguniform":
            space[key] = tune.loguniform(*_bounds(key, dim))
        else:
            space[key] = tune.uniform(*_bounds(key, dim))
    return space


def apply(tj: api.TrainingJob, params: dict[str, Any]) -> api.TrainingJob:
    """The TrainingJob of one trial: its hyperparameters filled in (trainer fields or config.<key>),
    validated (the driver has checked the rules of where it runs), without `tuning`."""
    wire = tj.wire()
    trainer = wire["spec"]["trainer"]
    for key, value in params.items():
        if key.startswith("config."):
            trainer.setdefault("config", {})[key.removeprefix("config.")] = value
        else:
            trainer[key] = int(value) if key in INTEGER_FIELDS else value
    wire["spec"].pop("tuning", None)
    return parse_trainingjob(wire, local=True)


def scheduler(tuning: api.TuningSpec, epochs: int) -> TrialScheduler:
    """asha (its knobs from `tuning.asha`, in epochs; maxT defaults to trainer.epochs) or fifo."""
    if tuning.scheduler == "asha":
        knobs = tuning.asha or api.AshaSpec()
        return ASHAScheduler(
            time_attr="epoch",
            max_t=knobs.max_t or epochs,
            grace_period=knobs.grace_period,
            reduction_factor=knobs.reduction_factor,
        )
    return FIFOScheduler()


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def search(
    tj: api.TrainingJob, *, storage_root: str, runtime_env: dict[str, Any] | None = None
) -> TuneOutcome:
    """Run `tj.spec.tuning`: trials under `storage_root` (`<run name>-<trial id>`), Tune's results in
    `<run name>-tune`; export the best trial's model. `runtime_env`: for the trials' workers."""
    tuning = tj.spec.tuning
    if tuning is None:
        raise ValueError("spec.tuning: not set; nothing to search")
    base_name = train.run_name(tj)

    def trial(params: dict[str, Any]) -> None:
        name = f"{base_name}-{tune.get_context().get_trial_id()}"
        trainer, _ = train.build_trainer(
            apply(tj, params),
            storage_root=storage_root,
            name=name,
            quiet=True,
            callbacks=[TuneReportCallback()],
            runtime_env=runtime_env,
        )
        trainer.fit()

    tuner = tune.Tuner(
        tune.with_resources(trial, {"CPU": 0.01}),  # the trial driver only waits; its workers hold CPUs/GPUs
        param_space=search_space(tuning),
        tune_config=tune.TuneConfig(
            metric=tuning.metric,
            mode=tuning.mode,
            num_samples=tuning.num_samples,
            max_concurrent_trials=tuning.max_concurrent_trials,
            scheduler=scheduler(tuning, tj.spec.trainer.epochs),
        ),
        run_config=tune.RunConfig(name=f"{base_name}-tune", storage_path=storage_root),
    )
    results = tuner.fit()
    trials = []
    for i in range(len(results)):
        result = results[i]
        metrics = result.metrics or {}
        trials.append(
            Trial(
                trial_id=str(metrics.get("trial_id", i)),
                config=dict(result.config or {}),
                metric=_number(metrics.get(tuning.metric)),
                epoch=int(metrics["epoch"]) if "epoch" in metrics else None,
                error=str(result.error) if result.error else None,
            )
        )
    failed = [t.error for t in trials if t.error]
    if len(failed) == len(trials):
        raise RuntimeError(f"every tuning trial failed; the first: {failed[0]}")
    best = results.get_best_result()
    if best.metrics is None or best.config is None:
        raise RuntimeError("the best tuning trial reported nothing")
    best_tj = apply(tj, best.config)
    path = best.metrics.get(CHECKPOINT_PATH_KEY)  # the best trial's last checkpoint
    fs, _ = storage.filesystem(storage_root)
    checkpoint = Checkpoint(path, filesystem=fs) if path else None
    best_name = f"{base_name}-{best.metrics['trial_id']}"
    prepared = train.prepare(best_tj, storage_root=storage_root, name=best_name)
    return TuneOutcome(
        trials=tuple(trials),
        best_trial=str(best.metrics["trial_id"]),
        best_metric=float(best.metrics[tuning.metric]),
        best_config=dict(best.config),
        best_checkpoint=progress.checkpoint_uri(checkpoint, storage_root) if checkpoint else None,
        model_uri=train.export(checkpoint, best_tj, prepared),
        metrics={k: v for k, v in best.metrics.items() if k not in _TUNE_KEYS},
        results=storage.join(storage_root, f"{base_name}-tune"),
    )
