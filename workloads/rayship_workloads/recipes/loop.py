"""The steps every train loop shares: the spec and run it gets, resume from the latest checkpoint,
evaluate on the validation shard, early stopping, and report every epoch (checkpointing on schedule)."""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import ray.data
import ray.train
import ray.train.torch
import torch

from rayship import api
from rayship_workloads import integrity, podlog, progress, storage
from rayship_workloads.recipes.base import STATE, EpochHook
from rayship_workloads.strategies import Strategy


def loop_spec(config: Mapping[str, Any]) -> api.TrainingJobSpec:
    """The TrainingJob spec a loop was handed (`config["rayship"]["spec"]`, wire form), typed. The
    driver has validated it for where it runs; here the rules only a cluster needs are left out."""
    return api.TrainingJobSpec.model_validate(config["rayship"]["spec"], context={"local": True})


def checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch:05d}"


@dataclass(frozen=True)
class Run:
    """Where a loop's checkpoints live (`config["rayship"]`): what it may load, and its key (`integrity`).
    `handoff`: under PBT, the checkpoint another trial of the same job hands this one (`{"path",
    "job_run", "results"}`: Tune's copy, the job's run name, its Tune results directory)."""

    storage_root: str
    run_name: str
    handoff: Mapping[str, str] | None = None
    learning_rate: float | None = None  # this run's (`lr`): a handed-over optimizer state gets it

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Run:
        rayship = config["rayship"]
        return cls(rayship["storage_root"], rayship["run_name"], rayship.get("handoff"), config.get("lr"))

    def key(self) -> bytes:
        return integrity.load_key(self.storage_root, self.run_name)


@dataclass(frozen=True)
class Start:
    """Where a loop starts: the epoch and step of the checkpoint it resumed (0, 0 when fresh), and,
    for a checkpoint handed over by another trial (PBT), what it was signed as (`<run>/<checkpoint>`)."""

    epoch: int = 0
    step: int = 0
    handed_from: str | None = None
    early_stopping: Mapping[str, Any] | None = None  # `EarlyStopping.state()` as the checkpoint saved it


class Checkpointer(Protocol):
    """What `resume` and `report` need of a strategy (or of the Hugging Face Trainer engine)."""

    name: str

    def save(self, directory: Path) -> None: ...
    def load(self, directory: Path) -> None: ...
    def set_learning_rate(self, lr: float) -> None: ...


def _load(strategy: Checkpointer, directory: Path) -> Start:
    strategy.load(directory)
    state = json.loads((directory / STATE).read_text())
    return Start(int(state["epoch"]), int(state["step"]), early_stopping=state.get(EARLY_STOPPING))


def resume(strategy: Checkpointer, run: Run) -> Start:
    """The latest checkpoint of this run, after verifying (`integrity`: under this run's storage,
    every file as this run signed it) and loading it; else the checkpoint another trial handed this
    one (`integrity.verify_handoff`); else a fresh start."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        integrity.check_inside(checkpoint.path, run.storage_root, run.run_name)
        with checkpoint.as_directory() as directory:
            name = Path(checkpoint.path).name
            integrity.verify(Path(directory), run.key(), run=run.run_name, name=name)
            return _load(strategy, Path(directory))
    if run.handoff is None:
        return Start()
    path = run.handoff["path"]
    fs, fs_path = storage.filesystem(path)
    with ray.train.Checkpoint(fs_path, filesystem=fs).as_directory() as directory:
        signer = integrity.verify_handoff(
            Path(directory),
            path,
            storage_root=run.storage_root,
            job_run=run.handoff["job_run"],
            results=run.handoff["results"],
        )
        loaded = _load(strategy, Path(directory))
    if run.learning_rate is not None:
        strategy.set_learning_rate(float(run.learning_rate))
    return Start(
        loaded.epoch, loaded.step, handed_from=signer
    )  # the trial's own early stopping starts afresh


def report(
    strategy: Checkpointer,
    run: Run,
    *,
    epoch: int,
    step: int,
    metrics: dict[str, Any],
    save: bool,
    early_stopping: EarlyStopping | None = None,
) -> None:
    """Report this epoch's metrics from every rank, with a checkpoint when `save` (each rank's files
    and, last, its signed digest; its state says where early stopping stood)."""
    context = ray.train.get_context()
    rank = context.get_world_rank()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if save:
            strategy.save(Path(tmp))
            if rank == 0:
                state: dict[str, Any] = {"epoch": epoch, "step": step, "strategy": strategy.name}
                if early_stopping is not None:
                    state[EARLY_STOPPING] = early_stopping.state()
                (Path(tmp) / STATE).write_text(json.dumps(state))
            integrity.sign(
                Path(tmp),
                run.key(),
                run=run.run_name,
                name=checkpoint_name(epoch),
                rank=rank,
                world_size=context.get_world_size(),
            )
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(
            {"epoch": epoch, "step": step, **metrics},
            checkpoint=checkpoint,
            checkpoint_dir_name=checkpoint_name(epoch) if save else None,
        )


EVAL_LOSS = "evalLoss"
Evaluation = Callable[[], dict[str, float]]


def validation_shard(spec: api.TrainingJobSpec) -> Any:
    """This worker's shard of the `validation` dataset (with `data.validation`), else None."""
    return ray.train.get_dataset_shard("validation") if spec.data.validation is not None else None


def global_mean(total: float, count: int) -> float | None:
    """total/count summed over every rank (the same value on each); None if no rank had a row."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        both = torch.tensor([total, float(count)], dtype=torch.float64)
        dist.all_reduce(both)
        total, count = float(both[0]), int(both[1])
    return total / count if count else None


def evaluation(
    strategy: Strategy, batch_losses: Callable[[], Iterator[tuple[torch.Tensor, int]]], *, perplexity: bool
) -> Evaluation:
    """Evaluate the model on the validation shard: `evalLoss` (mean over every rank's rows), and
    `perplexity` = exp(evalLoss) for language models. `batch_losses` yields (mean loss, rows)."""

    def evaluate() -> dict[str, float]:
        strategy.model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for loss, rows in batch_losses():
                total, count = total + float(loss) * rows, count + rows
        strategy.model.train()
        mean = global_mean(total, count)
        if mean is None:
            return {}
        return (
            {EVAL_LOSS: mean, "perplexity": math.exp(min(mean, 700.0))} if perplexity else {EVAL_LOSS: mean}
        )

    return evaluate


def job_metric(spec: api.TrainingJobSpec) -> tuple[str, str]:
    """(metric, mode) by which the job judges its epochs (the best checkpoint, early stopping):
    checkpoint.metric/mode, by default evalLoss with data.validation, else loss; min."""
    default = EVAL_LOSS if spec.data.validation is not None else "loss"
    return spec.checkpoint.metric or default, spec.checkpoint.mode or "min"


EARLY_STOPPING = "earlyStopping"  # its state in a checkpoint's rayship-state.json
STOPPED_EARLY = progress.STOPPED_EARLY


@dataclass
class EarlyStopping:
    """`trainer.earlyStopping` over the job's metric (`job_metric`): stop once it has not improved
    on its best by more than `min_delta` for `patience` epochs. Every rank decides alike: the metric
    is averaged over the ranks first. Its state travels in the checkpoints, so a resumed run goes on
    counting (and one that had stopped trains no further)."""

    metric: str
    mode: str
    patience: int
    min_delta: float
    best: float | None = None
    wait: int = 0
    stopped: bool = False

    @classmethod
    def of(cls, spec: api.TrainingJobSpec, start: Start) -> EarlyStopping | None:
        rule = spec.trainer.early_stopping
        if rule is None:
            return None
        metric, mode = job_metric(spec)
        saved = start.early_stopping or {}
        best = saved.get("best")
        return cls(
            metric,
            mode,
            rule.patience,
            rule.min_delta,
            best=None if best is None else float(best),
            wait=int(saved.get("wait", 0)),
            stopped=bool(saved.get("stopped", False)),
        )

    def update(self, metrics: Mapping[str, Any]) -> bool:
        """Take this epoch's metrics; whether training stops after it."""
        value = metrics.get(self.metric)
        if isinstance(value, bool) or not isinstance(value, int | float):
            reported = ", ".join(sorted(k for k, v in metrics.items() if isinstance(v, float)))
            raise ValueError(
                f"checkpoint.metric: {self.metric!r} is not reported by this job (it reports {reported}); "
                "trainer.earlyStopping watches it: set checkpoint.metric to one of those"
            )
        mean = global_mean(float(value), 1)
        current = math.nan if mean is None else mean
        if self.best is None:
            improved = not math.isnan(current)
        elif self.mode == "min":
            improved = current < self.best - self.min_delta
        else:
            improved = current > self.best + self.min_delta
        if improved:
            self.best, self.wait = current, 0
        else:
            self.wait += 1
        self.stopped = self.wait >= self.patience
        return self.stopped

    def state(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "stopped": self.stopped}


def preempted(rank: int, epoch: int) -> bool:
    """Whether a node of this worker group is being drained (a pod deleted with a grace period, a spot
    reclaim): Ray Train restarts the group at the drain's deadline, so the epoch just trained is saved
    now rather than lost. Every rank calls it after every epoch: Ray Train agrees one answer on all."""
    info = ray.train.get_preemption_info()
    if info is None:
        return False
    left = (
        ""
        if info.deadline_ms is None
        else f", {info.deadline_ms / 1000 - time.time():.0f}s before its deadline"
    )
    podlog.say(
        f"rank {rank}: ranks {info.preempted_ranks} are being preempted{left}: checkpoint after epoch {epoch}"
    )
    return True


def run_epochs(
    strategy: Strategy,
    spec: api.TrainingJobSpec,
    run: Run,
    *,
    start: Start,
    losses: Callable[[], Iterator[torch.Tensor]],
    on_epoch_end: EpochHook | None,
    evaluate: Evaluation | None = None,
) -> None:
    """The epochs after `start.epoch`: a step per batch loss, then (with `evaluate`) the validation
    metrics, then a report (mean loss over the epoch; `resumed_from_epoch`, and `handed_from` for a
    checkpoint another trial handed over), with a checkpoint every `checkpoint.everyEpochs` epochs
    and after the last one."""
    epochs, every, step = spec.trainer.epochs, spec.checkpoint.every_epochs, start.step
    context = ray.train.get_context()
    rank = context.get_world_rank()
    podlog.worker_started(rank, context.get_world_size(), start.epoch)
    stopping = EarlyStopping.of(spec, start)
    if stopping is not None and stopping.stopped:
        return  # this run had stopped early before it was resumed: nothing is left to train
    for epoch in range(start.epoch + 1, epochs + 1):
        total, batches = 0.0, 0
        for loss in losses():
            strategy.step(loss)
            total, batches, step = total + loss.item(), batches + 1, step + 1
        metrics: dict[str, Any] = {"loss": total / max(batches, 1), "resumed_from_epoch": start.epoch}
        if start.handed_from is not None:
            metrics["handed_from"] = start.handed_from
        if evaluate is not None:
            metrics.update(evaluate())
        stop = stopping is not None and stopping.update(metrics) and epoch < epochs
        if stop:
            metrics[STOPPED_EARLY] = True
        # every rank asks (it is a barrier): a preemption seen saves this epoch, whatever everyEpochs
        save = preempted(rank, epoch) or epoch % every == 0 or epoch == epochs or stop
        report(strategy, run, epoch=epoch, step=step, metrics=metrics, save=save, early_stopping=stopping)
        podlog.say(f"rank {rank} epoch {epoch}/{epochs} loss {metrics['loss']:.6g}")
        if on_epoch_end is not None:
            on_epoch_end(epoch)
        if stop:
            return


def train_epochs(
    strategy: Strategy,
    config: dict[str, Any],
    shard: Any,
    batch_losses: Callable[[Any], Iterator[tuple[torch.Tensor, int]]],
    *,
    on_epoch_end: EpochHook | None,
    perplexity: bool,
) -> None:
    """Steps [3] and [4] of every recipe's loop: resume from the latest checkpoint, if this run has one;
    then train on `shard`, evaluate on the validation shard (with data.validation) and report every
    epoch. `batch_losses(source)` yields each batch's mean loss and its token or row count."""
    spec, run = loop_spec(config), Run.of(config)
    start = resume(strategy, run)
    validation = validation_shard(spec)
    run_epochs(
        strategy,
        spec,
        run,
        start=start,
        losses=lambda: (loss for loss, _ in batch_losses(shard)),
        on_epoch_end=on_epoch_end,
        evaluate=None
        if validation is None
        else evaluation(strategy, lambda: batch_losses(validation), perplexity=perplexity),
    )
