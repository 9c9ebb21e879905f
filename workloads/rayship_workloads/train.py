"""Training library: one Ray Train run of a TrainingJob, and the export of its model.

`build_trainer` makes a Ray Train `TorchTrainer` (DDP or DeepSpeed) for the job's recipe or own loop,
with checkpoints under `<storage root>/<run name>/` (a new driver with the same run name resumes from
the latest one); `train` fits it and exports the final (and the best) model in the serving layout
(`models`) to `<storage root>/<run name>/model`. Checkpoints and models are signed and verified
before they are loaded (`integrity`: the trust boundary of shared checkpoint storage). The driver (`job`) decides the storage root and
where progress goes (the `callbacks`); `tune` builds one trainer per trial.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray.data

# Ray Train V2 is the default in Ray 2.60 and what `ray.train.*` is at run time; its classes come from
# their own modules so that type checkers see the V2 signatures (`Result` is what `fit()` is typed as).
from ray.train import Checkpoint, Result
from ray.train.v2.api.callback import UserCallback
from ray.train.v2.api.config import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.v2.torch.torch_trainer import TorchTrainer

from rayship import api
from rayship_workloads import data, integrity, models, progress, recipes, redact, storage, strategies


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

    `recipe` is None for an own loop (rayship cannot export its checkpoints); `setup` is then the one
    of `recipes.OWN_LOOP_DATA`."""

    dataset: ray.data.Dataset
    recipe: recipes.Recipe | None
    setup: recipes.ModelSetup
    storage_root: str
    run_name: str

    def loop_config(self, tj: api.TrainingJob) -> dict[str, Any]:
        """`train_loop_config`: `trainer.config` plus the `rayship` key every loop reads."""
        context = {
            "spec": redact.redacted(tj.spec.wire()),  # env values are in the process environment
            "model_config": self.setup.config,
            **self.setup.extra,
            "storage_root": self.storage_root,
            "run_name": self.run_name,
        }
        return {**tj.spec.trainer.config, "rayship": context}


def run_name(tj: api.TrainingJob) -> str:
    """Stable per TrainingJob: a retry (new process, same storage) finds its checkpoints again."""
    meta = tj.metadata
    return f"{meta.namespace}.{meta.name}" if meta.namespace else meta.name


def prepare(tj: api.TrainingJob, *, storage_root: str, name: str | None = None) -> Prepared:
    """The training data and the model setup of `tj`'s recipe; `name` overrides the run name."""
    trainer = tj.spec.trainer
    setup_recipe = recipes.data_recipe(trainer)
    dataset = data.load(tj.spec.data, kind=setup_recipe.data_kind, config=trainer.config)
    return Prepared(
        dataset=dataset,
        recipe=recipes.for_trainer(trainer),
        setup=setup_recipe.model_setup(dataset, trainer.config),
        storage_root=storage_root,
        run_name=name or run_name(tj),
    )


def build_trainer(
    tj: api.TrainingJob,
    *,
    storage_root: str,
    name: str | None = None,
    callbacks: Sequence[UserCallback] = (),
    quiet: bool = False,
) -> tuple[TorchTrainer, Prepared]:
    """The TorchTrainer for a TrainingJob, and what the export step needs. `quiet`: Ray Train logs
    warnings only."""
    spec = tj.spec
    workers = spec.workers
    prepared = prepare(tj, storage_root=storage_root, name=name)
    integrity.ensure_key(storage_root, prepared.run_name)  # at the first attempt; the loops sign with it
    gpus = workers.gpus_per_worker
    resources: dict[str, float] = {"CPU": 1, "GPU": gpus} if gpus else {"CPU": 1}  # spare CPUs feed Ray Data
    trainer = TorchTrainer(
        recipes.train_loop(spec.trainer),
        train_loop_config=prepared.loop_config(tj),
        scaling_config=ScalingConfig(
            num_workers=workers.replicas, use_gpu=gpus > 0, resources_per_worker=resources
        ),
        run_config=RunConfig(
            name=prepared.run_name,
            storage_path=storage_root,
            checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint.keep),
            failure_config=FailureConfig(max_failures=spec.failure_policy.max_worker_failures),
            logging_config=LoggingConfig(log_level="WARNING") if quiet else None,
            callbacks=list(callbacks),
        ),
        datasets={"train": prepared.dataset},
    )
    return trainer, prepared


def export(
    checkpoint: Checkpoint | None, tj: api.TrainingJob, prepared: Prepared, name: str = "model"
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
        state = strategies.full_state_dict(Path(directory), tj.spec.trainer.strategy)
        models.export(Path(tmp), prepared.recipe.name, prepared.setup, state)
        integrity.sign(Path(tmp), key, run=prepared.run_name, name=name, model=True)
        storage.upload_dir(Path(tmp), target)
    return target


def best_checkpoint(result: Result) -> Checkpoint | None:
    """The kept checkpoint with the lowest reported loss."""
    scored = [
        (m["loss"], c) for c, m in result.best_checkpoints or [] if isinstance(m.get("loss"), int | float)
    ]
    return min(scored, key=lambda s: s[0])[1] if scored else None


def train(
    tj: api.TrainingJob,
    *,
    storage_root: str,
    callbacks: Sequence[UserCallback] = (),
    quiet: bool = False,
) -> Outcome:
    """Fit one run of `tj` (resuming its latest checkpoint, if any); export the final and best models."""
    trainer, prepared = build_trainer(tj, storage_root=storage_root, callbacks=callbacks, quiet=quiet)
    result = trainer.fit()
    latest = progress.checkpoint_uri(result.checkpoint, storage_root) if result.checkpoint else None
    best = best_checkpoint(result)
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
