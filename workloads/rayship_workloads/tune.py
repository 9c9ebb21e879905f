"""`spec.tuning`: a Ray Tune search where every trial is a full Ray Train run of the TrainingJob.

Ray 2.60 (Train V2) runs Train inside Tune as a function trainable that builds and fits a
TorchTrainer (`train.build_trainer`); `TuneReportCallback` relays the rank-0 metrics (and the
checkpoint path) to Tune, whose scheduler (ASHA) stops poor trials early by `epoch`. The best trial's
last checkpoint is exported like a training run's model (`train.export`).

PBT (`scheduler: pbt`) needs Tune to hold each trial's checkpoints: `_Relay` hands every report and
its checkpoint from the Train controller to the trial, which reports both to Tune (`tune.report`
copies the checkpoint into the trial's Tune directory). A trial Tune restarts from a checkpoint (the
better trial's after an exploit, or its own after a pause) starts a new Train run,
`<run name>-<trial id>-<8 hex digits of the checkpoint's path>`, that resumes from it
(`recipes.resume`, verified by `integrity.verify_handoff`). Mutations come from the search space and
stay inside it (`clip`).

Progress: Tune's status tables are off (`verbose=0`); `TrialLines` prints one line per trial epoch
and one per PBT exploit.
"""

from __future__ import annotations

import functools
import hashlib
import posixpath
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.data
from ray import tune
from ray.train import Checkpoint
from ray.train.v2.api.callback import UserCallback
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback
from ray.tune.result import AUTO_RESULT_KEYS
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining, TrialScheduler
from ray.util.queue import Queue

from rayship import api
from rayship.api import names
from rayship.api.validation import parse_trainingjob
from rayship_workloads import integrity, progress, storage, tracking, train

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


def _domain(key: str, dim: api.SearchDimension) -> Any:
    """One dimension as Tune samples it."""
    if dim.distribution in ("grid", "choice"):
        if not dim.values:
            raise ValueError(f"tuning.searchSpace.{key}: {dim.distribution} needs values")
        return tune.grid_search(dim.values) if dim.distribution == "grid" else tune.choice(dim.values)
    if dim.distribution == "randint":
        low, high = _bounds(key, dim)
        return tune.randint(int(low), int(high))
    if dim.distribution == "loguniform":
        return tune.loguniform(*_bounds(key, dim))
    return tune.uniform(*_bounds(key, dim))


def search_space(tuning: api.TuningSpec) -> dict[str, Any]:
    """Tune's param space from `tuning.searchSpace`."""
    return {key: _domain(key, dim) for key, dim in tuning.search_space.items()}


def mutations(tuning: api.TuningSpec) -> dict[str, Any]:
    """PBT's `hyperparam_mutations` from `tuning.searchSpace`: choice and grid values as a list (PBT
    moves to a neighbouring value, or draws one), the distributions as Tune samples them (PBT scales
    the value by 0.8 or 1.2, or draws a new one; `clip` keeps it inside the range)."""
    return {
        key: list(dim.values or []) if dim.distribution in ("grid", "choice") else _domain(key, dim)
        for key, dim in tuning.search_space.items()
    }


def ranges(tuning: api.TuningSpec) -> dict[str, tuple[float, float, bool]]:
    """(low, high, integer) of each ranged dimension (`clip`'s bounds)."""
    return {
        key: (*_bounds(key, dim), dim.distribution == "randint")
        for key, dim in tuning.search_space.items()
        if dim.distribution not in ("grid", "choice")
    }


def clip(bounds: Mapping[str, tuple[float, float, bool]], config: dict[str, Any]) -> dict[str, Any]:
    """A PBT-mutated config with every ranged value back inside its searchSpace range ([low, high]
    for floats, [low, high) for randint): PBT's x0.8/x1.2 would otherwise walk out of it."""
    clipped = dict(config)
    for key, (low, high, integer) in bounds.items():
        if key in clipped:
            value = min(max(float(clipped[key]), low), high)
            clipped[key] = min(int(round(value)), int(high) - 1) if integer else value
    return clipped


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


class _PbtBeforeLastEpoch(PopulationBasedTraining):
    """PBT that leaves a trial's last epoch alone: an exploit there restarts the trial from the
    donor's final checkpoint only to finish at once (no epoch left to train), which costs a restart
    and makes Tune replace the trial's own result log with the donor's."""

    def __init__(self, *, last_epoch: int, **knobs: Any) -> None:
        super().__init__(**knobs)
        self.last_epoch = last_epoch

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        epoch = _number(result.get("epoch"))
        if epoch is not None and epoch >= self.last_epoch:
            return TrialScheduler.CONTINUE
        return super().on_trial_result(tune_controller, trial, result)


def scheduler(tuning: api.TuningSpec, epochs: int) -> TrialScheduler:
    """asha (its knobs from `tuning.asha`, in epochs; maxT defaults to trainer.epochs), pbt (its
    knobs from `tuning.pbt`, mutations from the search space, never at the last epoch) or fifo."""
    if tuning.scheduler == "pbt":
        pbt = tuning.pbt or api.PbtSpec()
        return _PbtBeforeLastEpoch(
            last_epoch=epochs,
            time_attr="epoch",
            perturbation_interval=pbt.perturbation_interval,
            hyperparam_mutations=mutations(tuning),
            quantile_fraction=pbt.quantile_fraction,
            resample_probability=pbt.resample_probability,
            custom_explore_fn=functools.partial(clip, ranges(tuning)),
            synch=pbt.synchronous,
        )
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


class _Relay(UserCallback):
    """On the Train controller: every report's rank-0 metrics, with the path of its checkpoint (if
    it has one), to the trial that runs the training (`queue`)."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None
    ) -> None:
        self.queue.put({**metrics[0], CHECKPOINT_PATH_KEY: checkpoint.path if checkpoint else None})


def segment_name(trial_run: str, handed: str | None) -> str:
    """The Train run of a trial that starts from checkpoint `handed` (a URI): its own name, so Ray
    Train does not resume the trial's earlier run instead; the same checkpoint, the same run."""
    if handed is None:
        return trial_run
    return f"{trial_run}-{hashlib.sha256(handed.encode()).hexdigest()[:8]}"


def _fit_reporting_checkpoints(trainer: Any, queue: Queue, storage_root: str) -> None:
    """Fit `trainer` (in a thread) while reporting each of its reports to Tune with its checkpoint:
    Tune keeps them, and PBT hands them to other trials."""
    fs, _ = storage.filesystem(storage_root)
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as err:  # noqa: BLE001 - raised again in the trial's thread, below
            failure.append(err)
        finally:
            queue.put(None)

    thread = threading.Thread(target=fit, name="rayship-trial-fit", daemon=True)
    thread.start()
    while (item := queue.get()) is not None:
        path = item.get(CHECKPOINT_PATH_KEY)
        tune.report(item, checkpoint=Checkpoint(path, filesystem=fs) if path else None)
    thread.join()
    if failure:
        raise failure[0]


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class TrialLines(tune.Callback):
    """Tune's progress as lines (its status tables are off): one per trial report, `trial <id>
    epoch 2/4  loss 0.12345  learningRate=0.001`, and one when a PBT trial resumes from another's
    checkpoint with new hyperparameters."""

    def __init__(self, *, metric: str, epochs: int, say: Callable[[str], None]) -> None:
        self.metric, self.epochs, self.say = metric, epochs, say
        self._handed: dict[str, str] = {}

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        shown = [k for k in (*progress.SHOWN_METRICS, self.metric) if _number(result.get(k)) is not None]
        metrics = "".join(f"  {k} {float(result[k]):.5f}" for k in dict.fromkeys(shown))
        config = "  ".join(f"{k}={_short(v)}" for k, v in sorted((trial.config or {}).items()))
        handed = result.get("handed_from")
        if handed and self._handed.get(trial.trial_id) != handed:
            self._handed[trial.trial_id] = str(handed)
            if f"-{trial.trial_id}" in str(handed).split("/")[0]:
                self.say(f"trial {trial.trial_id}  resumed from its checkpoint {handed}")
            else:
                self.say(f"trial {trial.trial_id}  exploits {handed} (PBT): now {config}")
        self.say(f"trial {trial.trial_id}  epoch {result.get('epoch')}/{self.epochs}{metrics}  {config}")


def trial_dirname(trial: Any) -> str:
    """A trial's directory in Tune's results: its id (`Trial.trial_id` of each `TuneOutcome.trials`)."""
    return str(trial.trial_id)


def search(
    tj: api.TrainingJob,
    *,
    storage_root: str,
    runtime_env: dict[str, Any] | None = None,
    say: Callable[[str], None] | None = None,
) -> TuneOutcome:
    """Run `tj.spec.tuning`: trials under `storage_root` (`<run name>-<trial id>`), Tune's results in
    `<run name>-tune`; export the best trial's model. `runtime_env`: for the trials' workers; `say`:
    where the progress lines go (default: printed)."""
    tuning = tj.spec.tuning
    if tuning is None:
        raise ValueError("spec.tuning: not set; nothing to search")
    base_name = train.run_name(tj)
    trial = _trial_function(tj, base_name, storage_root, runtime_env)
    results = _tuner(tj, tuning, trial, base_name, storage_root, say).fit()
    trials = _trials(results, tuning)
    failed = [t.error for t in trials if t.error]
    if len(failed) == len(trials):
        raise RuntimeError(f"every tuning trial failed; the first: {failed[0]}")
    return _best(tj, tuning, results, tuple(trials), base_name, storage_root)


def _trial_function(
    tj: api.TrainingJob, base_name: str, storage_root: str, runtime_env: dict[str, Any] | None
) -> Callable[[dict[str, Any]], None]:
    """What Tune runs for a trial: a Train run of `tj` with the trial's parameters (under PBT, one
    segment of it, handed the checkpoint Tune restored)."""
    assert tj.spec.tuning is not None
    results_dir = storage.join(storage_root, f"{base_name}-tune")
    pbt = tj.spec.tuning.scheduler == "pbt"
    progress_bars = ray.data.DataContext.get_current().enable_progress_bars  # the driver's choice

    def trial(params: dict[str, Any]) -> None:
        ray.data.DataContext.get_current().enable_progress_bars = progress_bars  # the trial loads the data
        trial_id = tune.get_context().get_trial_id()
        trial_run = f"{base_name}-{trial_id}"
        if not pbt:
            # Retried as a plain run is: an error in the code is said once and fails the trial, a dead
            # worker is retried from the trial's latest checkpoint (train.fit).
            train.fit(
                apply(tj, params),
                storage_root=storage_root,
                name=trial_run,
                quiet=True,
                callbacks=[TuneReportCallback()],
                runtime_env=runtime_env,
                say=lambda line: print(f"trial {trial_id}  {line}", flush=True),
            )
            return
        restored = tune.get_checkpoint()  # the better trial's (after an exploit), or this trial's own
        handed = progress.checkpoint_uri(restored, storage_root) if restored is not None else None
        queue = Queue(maxsize=1, actor_options={"num_cpus": 0})
        trainer, _ = train.build_trainer(
            apply(tj, params),
            storage_root=storage_root,
            name=segment_name(trial_run, handed),
            quiet=True,
            callbacks=[_Relay(queue)],
            runtime_env=runtime_env,
            handoff=None
            if handed is None
            else {"path": handed, "job_run": base_name, "results": results_dir},
        )
        _fit_reporting_checkpoints(trainer, queue, storage_root)

    return trial


def trial_resources(cluster: Mapping[str, float]) -> dict[str, float]:
    """What a trial's driver holds: it only waits, its Train workers hold the CPUs and GPUs. In a
    cluster, a slot of the head's `names.TRIAL_RESOURCE` (the head has no CPUs for Ray, and a CPU share
    on a worker node would leave too little there for the trial's own worker); locally, where there is
    no such resource, a sliver of a CPU."""
    if cluster.get(names.TRIAL_RESOURCE):
        return {names.TRIAL_RESOURCE: 1}
    return {"CPU": 0.01}


def _cluster_resources() -> dict[str, float]:
    if not ray.is_initialized():  # a job's driver in a cluster: connect as Tune itself would
        ray.init()
    return dict(ray.cluster_resources())


def _tuner(
    tj: api.TrainingJob,
    tuning: api.TuningSpec,
    trial: Callable[[dict[str, Any]], None],
    base_name: str,
    storage_root: str,
    say: Callable[[str], None] | None,
) -> tune.Tuner:
    mlflow = tracking.tune_callback(tj, storage_root, base_name)
    tracked = [mlflow] if mlflow is not None else []  # one MLflow run per trial (spec.tracking)
    return tune.Tuner(
        tune.with_resources(trial, trial_resources(_cluster_resources())),
        param_space=search_space(tuning),
        tune_config=tune.TuneConfig(
            metric=tuning.metric,
            mode=tuning.mode,
            num_samples=tuning.num_samples,
            max_concurrent_trials=tuning.max_concurrent_trials,
            scheduler=scheduler(tuning, tj.spec.trainer.epochs),
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=f"{base_name}-tune",
            storage_path=storage_root,
            verbose=0,  # no status tables: TrialLines says each report in one line
            callbacks=[
                TrialLines(
                    metric=tuning.metric,
                    epochs=tj.spec.trainer.epochs,
                    say=say or functools.partial(print, flush=True),
                ),
                *tracked,
            ],
        ),
    )


def _trials(results: Any, tuning: api.TuningSpec) -> list[Trial]:
    trials = []
    for i in range(len(results)):
        result = results[i]
        metrics = result.metrics or {}
        trials.append(
            Trial(
                # its own id (under PBT, a trial that exploited another at the end has its last result)
                trial_id=posixpath.basename(str(result.path).rstrip("/")),
                config=dict(result.config or {}),
                metric=_number(metrics.get(tuning.metric)),
                epoch=int(metrics["epoch"]) if "epoch" in metrics else None,
                error=str(result.error) if result.error else None,
            )
        )
    return trials


def _best(
    tj: api.TrainingJob,
    tuning: api.TuningSpec,
    results: Any,
    trials: tuple[Trial, ...],
    base_name: str,
    storage_root: str,
) -> TuneOutcome:
    """The outcome: the best trial's model exported (from its last checkpoint, in its Train run)."""
    best = results.get_best_result()
    if best.metrics is None or best.config is None:
        raise RuntimeError("the best tuning trial reported nothing")
    best_tj = apply(tj, best.config)
    path = best.metrics.get(CHECKPOINT_PATH_KEY)  # the best trial's last checkpoint (in its Train run)
    fs, _ = storage.filesystem(storage_root)
    checkpoint = Checkpoint(path, filesystem=fs) if path else None
    best_trial = posixpath.basename(str(best.path).rstrip("/"))
    best_name = f"{base_name}-{best_trial}"
    if path:  # the Train run that wrote it (under PBT, the trial's latest segment)
        best_name = posixpath.basename(posixpath.dirname(str(path).rstrip("/")))
        if not integrity.is_trial_run(best_name, base_name):
            raise integrity.IntegrityError(
                f"the best trial's checkpoint {path} is not a trial run of {base_name}"
            )
    prepared = train.prepare(best_tj, storage_root=storage_root, name=best_name)
    return TuneOutcome(
        trials=trials,
        best_trial=best_trial,
        best_metric=float(best.metrics[tuning.metric]),
        best_config=dict(best.config),
        best_checkpoint=progress.checkpoint_uri(checkpoint, storage_root) if checkpoint else None,
        model_uri=train.export(checkpoint, best_tj, prepared),
        metrics={k: v for k, v in best.metrics.items() if k not in _TUNE_KEYS},
        results=storage.join(storage_root, f"{base_name}-tune"),
    )
