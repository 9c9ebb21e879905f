"""Training library: one Ray Train run of a TrainingJob, and the export of its model.

`build_trainer` makes a Ray Train `TorchTrainer` (DDP or DeepSpeed) for the job's recipe or own loop,
with checkpoints under `<storage root>/<run name>/` (a new driver with the same run name resumes from
the latest one); `train` fits it and exports the final (and the best) model in the serving layout
(`models`) to `<storage root>/<run name>/model`. Checkpoints and models are signed and verified
before they are loaded (`integrity`: the trust boundary of shared checkpoint storage). The driver (`job`) decides the storage root and
where progress goes (the `callbacks`); `tune` builds one trainer per trial.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray.data
import ray.exceptions
import ray.train

# Ray Train V2 is the default in Ray 2.60 and what `ray.train.*` is at run time; its classes come from
# their own modules so that type checkers see the V2 signatures (`Result` is what `fit()` is typed as).
from ray.train import Checkpoint, Result
from ray.train.v2._internal.exceptions import RayTrainError
from ray.train.v2.api.callback import UserCallback
from ray.train.v2.api.config import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.v2.api.exceptions import TrainingFailedError
from ray.train.v2.torch.torch_trainer import TorchTrainer

from rayship import api
from rayship.api import names
from rayship_workloads import (
    data,
    integrity,
    joblog,
    models,
    progress,
    recipes,
    redact,
    storage,
    strategies,
)


@dataclass(frozen=True)
class Outcome:
    run_name: str
    storage_root: str
    latest: str | None
    best: str | None
    model_uri: str | None
    best_model_uri: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Prepared:
    """What a run needs before its trainer: the data, the model setup, where it writes.

    `recipe` is None for an own loop (rayship cannot export its checkpoints: the loop saves its model
    with `models.save_model`); `setup` is then `recipes.own_loop_setup`'s."""

    dataset: ray.data.Dataset
    recipe: recipes.Recipe | None
    setup: recipes.ModelSetup
    storage_root: str
    run_name: str
    validation: ray.data.Dataset | None = None

    def datasets(self) -> dict[str, ray.data.Dataset | Callable[[], ray.data.Dataset]]:
        """The loop's dataset shards: `train`, and `validation` with data.validation."""
        found: dict[str, ray.data.Dataset | Callable[[], ray.data.Dataset]] = {"train": self.dataset}
        if self.validation is not None:
            found["validation"] = self.validation
        return found

    def loop_config(self, tj: api.TrainingJob, handoff: Mapping[str, str] | None = None) -> dict[str, Any]:
        """`train_loop_config`: `trainer.config`, the common hyperparameters, and the `rayship` key
        every loop reads (with `handoff`, the checkpoint another trial hands this run: `recipes.Run`)."""
        trainer = tj.spec.trainer
        context = {
            "spec": redact.redacted(tj.spec.wire()),  # env values are in the process environment
            "model_config": self.setup.config,
            **self.setup.extra,
            "storage_root": self.storage_root,
            "run_name": self.run_name,
        }
        if handoff is not None:
            context["handoff"] = dict(handoff)
        hyperparameters = {
            "lr": trainer.learning_rate,
            "learningRate": trainer.learning_rate,
            "batch_size": trainer.batch_size_per_worker,
            "epochs": trainer.epochs,
        }
        return {**trainer.config, **hyperparameters, "rayship": context}


def run_name(tj: api.TrainingJob) -> str:
    """Stable per TrainingJob: a retry (new process, same storage) finds its checkpoints again."""
    return names.run_name(tj.metadata.namespace, tj.metadata.name)


def prepare(tj: api.TrainingJob, *, storage_root: str, name: str | None = None) -> Prepared:
    """The training data and the model setup of `tj`'s recipe; `name` overrides the run name."""
    trainer = tj.spec.trainer
    dataset = data.load(tj.spec.data, kind=recipes.data_kind(trainer), config=trainer.config)
    dataset, validation = data.split(dataset, tj.spec.data, trainer.config)
    return Prepared(
        dataset=dataset,
        recipe=recipes.for_trainer(trainer),
        setup=recipes.setup(trainer, dataset),
        storage_root=storage_root,
        run_name=name or run_name(tj),
        validation=validation,
    )


def loop_for(trainer: api.TrainerSpec) -> recipes.TrainLoop:
    """The train loop: the recipe's or the user's (`recipes.train_loop`), or the Hugging Face Trainer's
    for `config.engine: hf-trainer` (imported only then: it brings transformers' Trainer)."""
    if trainer.recipe == "causal-lm" and trainer.config.get("engine") == "hf-trainer":
        from rayship_workloads import hf_trainer

        return hf_trainer.loop
    return recipes.train_loop(trainer)


def _logged(loop: recipes.TrainLoop, config: dict[str, Any]) -> Any:
    """On each training worker: its output also goes to `rank-<R>.log` next to the checkpoints (the
    attempt the driver started), then the loop runs."""
    context = config["rayship"]
    rank = ray.train.get_context().get_world_rank()
    joblog.capture(context["storage_root"], context["run_name"], names.rank_log(rank), new_attempt=False)
    return loop(config)


# Ray Train restarts a preempted group this long before the drain's deadline. At the deadline itself
# Ray's node stops its raylet, whose death is recorded as "received SIGTERM", not as the drain: when
# Ray Train saw that death (and the other ranks' collective errors) before its own deadline check, it
# counted a worker failure. Seen on real pods with a 10 s grace period (a 5 s drain).
PREEMPTION_LEAD_S = 3.0


def worker_range(workers: api.WorkersSpec) -> int | tuple[int, int]:
    """Ray Train's num_workers: (minReplicas, replicas) for an elastic job (it goes on with fewer
    workers when pods are taken away, and grows back), else the fixed replicas."""
    low = workers.min_replicas
    return (low, workers.replicas) if low is not None and low < workers.replicas else workers.replicas


def build_trainer(
    tj: api.TrainingJob,
    *,
    storage_root: str,
    name: str | None = None,
    callbacks: Sequence[UserCallback] = (),
    quiet: bool = False,
    runtime_env: dict[str, Any] | None = None,
    max_failures: int | None = None,
    handoff: Mapping[str, str] | None = None,
) -> tuple[TorchTrainer, Prepared]:
    """The TorchTrainer for a TrainingJob, and what the export step needs. `quiet`: Ray Train logs
    warnings only; `runtime_env`: Ray's runtime env for the workers (local mode's `runtimeEnv`; in a
    cluster it is the job's own); `max_failures`: instead of failurePolicy.maxWorkerFailures;
    `handoff`: a checkpoint of another trial to start from (`tune`, PBT)."""
    spec = tj.spec
    workers = spec.workers
    prepared = prepare(tj, storage_root=storage_root, name=name)
    integrity.ensure_key(storage_root, prepared.run_name)  # at the first attempt; the loops sign with it
    gpus = workers.gpus_per_worker
    resources: dict[str, float] = {"CPU": 1, "GPU": gpus} if gpus else {"CPU": 1}  # spare CPUs feed Ray Data
    failures = spec.failure_policy.max_worker_failures if max_failures is None else max_failures
    preemptions = spec.failure_policy.max_preemptions
    trainer = TorchTrainer(
        functools.partial(_logged, loop_for(spec.trainer)),
        train_loop_config=prepared.loop_config(tj, handoff),
        scaling_config=ScalingConfig(
            num_workers=worker_range(workers),
            use_gpu=gpus > 0,
            resources_per_worker=resources,
            elastic_resize_monitor_interval_s=workers.resize_interval_seconds,
        ),
        run_config=RunConfig(
            name=prepared.run_name,
            storage_path=storage_root,
            checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint.keep),
            failure_config=FailureConfig(
                max_failures=failures,
                max_preemption_failures=-1 if preemptions is None else preemptions,
                preemption_grace_s=-PREEMPTION_LEAD_S,
            ),
            logging_config=LoggingConfig(log_level="WARNING") if quiet else None,
            callbacks=list(callbacks),
            worker_runtime_env=runtime_env or None,
        ),
        datasets=prepared.datasets(),
    )
    return trainer, prepared


def export(
    checkpoint: Checkpoint | None, tj: api.TrainingJob, prepared: Prepared, name: str = models.MODEL_DIR
) -> str | None:
    """Write the model of `checkpoint` in the serving layout next to the checkpoints; its URI (None
    for own loops, whose checkpoint format rayship does not know)."""
    if checkpoint is None or prepared.recipe is None:
        return None
    target = storage.join(prepared.storage_root, prepared.run_name, name)
    integrity.check_inside(checkpoint.path, prepared.storage_root, prepared.run_name)
    key = integrity.load_key(prepared.storage_root, prepared.run_name)
    with checkpoint.as_directory() as directory, tempfile.TemporaryDirectory() as tmp:
        integrity.verify(Path(directory), key, run=prepared.run_name, name=Path(checkpoint.path).name)
        if tj.spec.trainer.config.get("engine") == "hf-trainer":  # imports transformers: only then
            from rayship_workloads import hf_trainer

            state = hf_trainer.state_dict(Path(directory), tj.spec.trainer.strategy)
        else:
            state = strategies.full_state_dict(Path(directory), tj.spec.trainer.strategy)
        models.export(Path(tmp), prepared.recipe.name, prepared.setup, state)
        integrity.sign(Path(tmp), key, run=prepared.run_name, name=name, model=True)
        storage.upload_dir(Path(tmp), target)
    return target


def best_checkpoint(result: Result, metric: str = "loss", mode: str = "min") -> Checkpoint | None:
    """The kept checkpoint with the lowest (mode min) or highest (max) reported `metric`."""
    scored = [
        (float(m[metric]), c)
        for c, m in result.best_checkpoints or []
        if isinstance(m.get(metric), int | float) and not isinstance(m.get(metric), bool)
    ]
    if not scored:
        return None
    pick = min if mode == "min" else max
    return pick(scored, key=lambda s: s[0])[1]


class TrainingFailed(RuntimeError):
    """The run failed for good: one line that says which attempt, the error and why it stopped."""


# Failures of the machinery rather than of the loop's code: a retry may well succeed.
_SYSTEM_FAILURES = (
    ray.exceptions.ActorDiedError,
    ray.exceptions.ActorUnavailableError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.OutOfMemoryError,
    ray.exceptions.RaySystemError,
    ray.exceptions.RayActorError,
)


def describe_failure(err: BaseException) -> tuple[str, bool]:
    """(one line: the error and where it was raised, whether a retry may help): only when a worker
    died or stopped answering; not for an error raised by the code (the loop's or Ray Train's)."""
    failures = getattr(err, "worker_failures", None) or {}
    if not failures:
        cause = getattr(err, "controller_failure", None) or err
        text = str(cause).strip()
        return f"{type(cause).__name__}: {text.splitlines()[-1] if text else ''}", False
    rank, failure = min(failures.items())
    # Ray Train hands the loop's own exception over as it was raised (its traceback is in the message)
    failure = getattr(failure, "_base_exc", failure)
    if isinstance(failure, (*_SYSTEM_FAILURES, RayTrainError)):  # a worker died or stopped answering
        text = str(failure).strip()
        return f"worker {rank}: {type(failure).__name__}: {text.splitlines()[0] if text else ''}", True
    frames = [line.strip() for line in str(err).splitlines() if line.strip().startswith('File "')]
    where = f" ({frames[-1]})" if frames else ""
    message = " ".join(str(failure).split())
    return f"{type(failure).__name__}: {message}{where} on worker {rank}", False


class CheckpointStorageError(TrainingFailed):
    """The run's checkpoint storage stayed unreadable: the attempt fails, naming the path and the
    error, rather than starting over from epoch 0 beside checkpoints it could not see."""


# A storage hiccup (an NFS server restarting, an object store's 503) is waited out, ~7.5 s in all. A
# storage that stays unreadable fails the attempt: answering "no checkpoint" would restart training
# from epoch 0, and with checkpoint.keep its new checkpoints would rotate the good ones out.
LIST_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)


def latest_checkpoint(
    storage_root: str, name: str, *, sleep: Callable[[float], None] = time.sleep
) -> str | None:
    """The name of the run's newest checkpoint directory (epoch-NNNNN), None when the run has none
    (its folder absent or empty); `CheckpointStorageError` when the storage cannot be listed."""
    fs, path = storage.filesystem(storage.join(storage_root, name))
    for delay in (*LIST_RETRY_DELAYS, None):
        try:
            infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
            break
        except OSError as err:
            if delay is None:
                raise CheckpointStorageError(
                    f"checkpoint storage {path} cannot be listed ({len(LIST_RETRY_DELAYS) + 1} tries over "
                    f"{sum(LIST_RETRY_DELAYS):g} s): {type(err).__name__}: {err}; training does not start "
                    "over beside checkpoints it cannot see (fix the storage and run again)"
                ) from None
            sleep(delay)
    found = sorted(Path(i.path).name for i in infos if Path(i.path).name.startswith("epoch-"))
    return found[-1] if found else None


def own_model(prepared: Prepared) -> str | None:
    """The model an own loop saved with `models.save_model`, if it did."""
    target = storage.join(prepared.storage_root, prepared.run_name, models.MODEL_DIR)
    fs, path = storage.filesystem(storage.join(target, models.MANIFEST))
    return target if fs.get_file_info(path).type != pafs.FileType.NotFound else None


@contextlib.contextmanager
def sigint_kept() -> Iterator[None]:
    """The process's SIGINT handler as it was, after a `fit()` in the main thread. Ray Train's `fit()`
    installs its own (a Ctrl-C aborts the run) and leaves it installed: it holds the run's controller
    actor, so the finished run's controller process (hundreds of MB) would live on until the next run
    or the process's end, and a Ctrl-C after training (the demo's serving, an export) would only
    "abort" that finished run: the first two would be swallowed."""
    if threading.current_thread() is not threading.main_thread():  # Tune's trials: Ray installs none
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if before is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGINT, before)


def fit(
    tj: api.TrainingJob,
    *,
    storage_root: str,
    callbacks: Sequence[UserCallback],
    quiet: bool,
    runtime_env: dict[str, Any] | None,
    say: Callable[[str], None],
    name: str | None = None,
) -> tuple[Result, Prepared]:
    """Fit `tj` (as run `name`, default its own), retrying failed attempts
    (failurePolicy.maxWorkerFailures) from the latest checkpoint, each said with `say` as "attempt k/N
    failed: ...". An error raised by the code (not a worker that died) before a new checkpoint is not
    retried: the retry would run the same code from the same state."""
    attempts = tj.spec.failure_policy.max_worker_failures + 1
    for attempt in range(1, attempts + 1):
        trainer, prepared = build_trainer(
            tj,
            storage_root=storage_root,
            name=name,
            callbacks=callbacks,
            quiet=quiet,
            runtime_env=runtime_env,
            max_failures=0,  # the retries are here, where the failure can be judged and said
        )
        before = latest_checkpoint(storage_root, prepared.run_name)
        for callback in callbacks:  # a report the last attempt lost as it ended, back on record
            if isinstance(callback, progress.ProgressCallback):
                callback.recover(prepared.run_name)
        try:
            with sigint_kept():
                return trainer.fit(), prepared
        except TrainingFailedError as err:
            cause, transient = describe_failure(err)
            line = f"attempt {attempt}/{attempts} failed: {cause}"
            after = latest_checkpoint(storage_root, prepared.run_name)
            if attempt == attempts:
                raise TrainingFailed(f"{line}; no attempts left (failurePolicy.maxWorkerFailures)") from None
            if not transient and after == before:
                raise TrainingFailed(
                    f"{line}; not retried: it was raised before a new checkpoint was written, so a retry "
                    "would run the same code from the same state (fix it and run again)"
                ) from None
            # Not `after` by name: a checkpoint some ranks wrote just before another died is on the
            # storage but never registered; the retry resumes from the latest one Ray Train did
            # register, and its workers say which epoch that is.
            say(f"{line}; retrying from {'the latest complete checkpoint' if after else 'the start'}")
    raise AssertionError("unreachable: the last attempt returns or raises")


def train(
    tj: api.TrainingJob,
    *,
    storage_root: str,
    callbacks: Sequence[UserCallback] = (),
    quiet: bool = False,
    runtime_env: dict[str, Any] | None = None,
    say: Callable[[str], None] | None = None,
) -> Outcome:
    """Fit one run of `tj` (resuming its latest checkpoint, if any); export the final and best models
    (an own loop's: the model it saved with `models.save_model`)."""
    result, prepared = fit(
        tj,
        storage_root=storage_root,
        callbacks=callbacks,
        quiet=quiet,
        runtime_env=runtime_env,
        say=say or functools.partial(print, flush=True),
    )
    latest = progress.checkpoint_uri(result.checkpoint, storage_root) if result.checkpoint else None
    best = best_checkpoint(result, *recipes.job_metric(tj.spec))
    if prepared.recipe is None:
        model_uri = best_model_uri = own_model(prepared)
    else:
        model_uri = export(result.checkpoint, tj, prepared)
        if best is None or result.checkpoint is None or best.path == result.checkpoint.path:
            best_model_uri = model_uri
        else:
            best_model_uri = export(best, tj, prepared, name="model-best")
    return Outcome(
        run_name=prepared.run_name,
        storage_root=storage_root,
        latest=latest,
        best=progress.checkpoint_uri(best, storage_root) if best else None,
        model_uri=model_uri,
        best_model_uri=best_model_uri,
        metrics=dict(result.metrics or {}),
    )
