"""The causal-lm recipe on the Hugging Face Trainer (`trainer.config.engine: hf-trainer`), as in Ray's
tutorial: `transformers.Trainer` + `RayTrainReportCallback` + `prepare_trainer` over the Ray Data shard.

Same contract as the built-in loop (`recipes.causal_lm_loop`): the same model and byte tokens, one
report per epoch (`epoch`, `step`, `loss`, with data.validation `evalLoss` and `perplexity`), a
checkpoint every `checkpoint.everyEpochs` named `epoch-NNNNN` with `rayship-state.json` and each
rank's signed digest (`recipes.report`), resume after verifying it (`recipes.resume`), and the same
export (`state_dict` -> `recipes.export_causal_lm`). The Hugging Face checkpoint sits under
`checkpoint/` (as `RayTrainReportCallback` lays it out); with strategy deepspeed the job's DeepSpeed
settings (`strategies.deepspeed_config`) are the Trainer's `deepspeed=` config.

Epochs are counted here: the Ray Data shard is an iterable without a length, so the Trainer needs
`max_steps` (it then treats one epoch as up to `max_steps` steps and moves on when the shard runs
out): this worker's batches per epoch (counted in one pass over the shard) times `trainer.epochs`;
no data skipping on resume, a constant learning rate (as the built-in loop's AdamW), and
`on_epoch_end` stops it after `trainer.epochs`.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import ray.train
import torch
from ray.data.collate_fn import NumpyBatchCollateFn
from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

from rayship import api
from rayship_workloads import data, recipes, strategies

ENGINE = "hf-trainer"
HF_CHECKPOINT = RayTrainReportCallback.CHECKPOINT_NAME  # the Hugging Face checkpoint in ours


class TrainerCheckpoints:
    """`recipes.Checkpointer` for the Trainer's checkpoints: `save` copies the Trainer's latest
    checkpoint (this rank's files) to `checkpoint/`; `load` puts a verified one where
    `trainer.train(resume_from_checkpoint=...)` reads it."""

    def __init__(self, trainer_spec: api.TrainerSpec, output_dir: Path) -> None:
        self.name = f"{ENGINE}/{trainer_spec.strategy}"
        self.output_dir = output_dir
        self.resume_from: Path | None = None
        self.learning_rate: float | None = None  # set on a hand-off (PBT): the Trainer applies it

    def save(self, directory: Path) -> None:
        from transformers.trainer_utils import get_last_checkpoint

        source = get_last_checkpoint(str(self.output_dir)) if self.output_dir.is_dir() else None
        if source is not None:
            shutil.copytree(source, directory / HF_CHECKPOINT)

    def load(self, directory: Path) -> None:
        target = self.output_dir / "checkpoint-resumed"
        shutil.copytree(directory / HF_CHECKPOINT, target)
        self.resume_from = target

    def set_learning_rate(self, lr: float) -> None:
        self.learning_rate = lr


class TokenizedText(NumpyBatchCollateFn):
    """`iter_torch_batches`' collate_fn: a batch's text column -> the tokenizer's padded tensors."""

    def __init__(self, tokens: recipes.Tokens):
        self.tokens = tokens

    def __call__(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:  # type: ignore[override]  # Ray types it as a bare TypeVar
        return self.tokens([str(t) for t in batch[data.TEXT]])


class RayshipReportCallback(RayTrainReportCallback):
    """`RayTrainReportCallback` with rayship's reports and checkpoints: the Trainer saves after every
    epoch; each save is reported as that epoch (metrics logged since the last one), with our signed
    checkpoint every `checkpoint.everyEpochs` epochs, at the last, and at any epoch that ends while a
    node of the group is being drained (`recipes.preempted`)."""

    def __init__(
        self, spec: api.TrainingJobSpec, run: recipes.Run, start: recipes.Start, saver: TrainerCheckpoints
    ) -> None:
        super().__init__()
        self.epochs, self.every = spec.trainer.epochs, spec.checkpoint.every_epochs
        self.run, self.start, self.saver = run, start, saver
        self.epoch, self.seen_logs = start.epoch, 0
        self.stopping = recipes.EarlyStopping.of(spec, start)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        lr = self.saver.learning_rate
        optimizer, scheduler = kwargs.get("optimizer"), kwargs.get("lr_scheduler")
        if lr is not None and optimizer is not None:  # a handed-over optimizer state: this trial's lr
            strategies.set_learning_rate(optimizer, lr)
            if scheduler is not None and hasattr(scheduler, "base_lrs"):
                scheduler.base_lrs = [lr for _ in scheduler.base_lrs]

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.epoch += 1
        if self.epoch >= self.epochs:
            control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        logged: dict[str, Any] = {}
        for log in state.log_history[self.seen_logs :]:
            logged.update(log)
        self.seen_logs = len(state.log_history)
        metrics: dict[str, Any] = {
            "loss": float(logged.get("loss", math.nan)),
            "resumed_from_epoch": self.start.epoch,
        }
        if "eval_loss" in logged:
            eval_loss = float(logged["eval_loss"])
            metrics.update({recipes.EVAL_LOSS: eval_loss, "perplexity": math.exp(min(eval_loss, 700.0))})
        if self.start.handed_from is not None:
            metrics["handed_from"] = self.start.handed_from
        stop = self.stopping is not None and self.stopping.update(metrics) and self.epoch < self.epochs
        if stop:
            metrics[recipes.STOPPED_EARLY] = True
            control.should_training_stop = True
        # a drain in the group (a pod deleted with its grace period): save this epoch now, as the
        # built-in loop does; asked every epoch, as every rank must ask (a barrier)
        drained = recipes.preempted(ray.train.get_context().get_world_rank(), self.epoch)
        save = drained or stop or self.epoch % self.every == 0 or self.epoch >= self.epochs
        recipes.report(
            self.saver,
            self.run,
            epoch=self.epoch,
            step=state.global_step,
            metrics=metrics,
            save=save,
            early_stopping=self.stopping,
        )


def loop(config: dict[str, Any]) -> None:
    """Next-token prediction on a `text` column with `transformers.Trainer`."""
    from transformers import Trainer, TrainingArguments

    rayship = config["rayship"]
    spec = recipes.loop_spec(config)
    trainer_spec = spec.trainer
    batch_size = trainer_spec.batch_size_per_worker
    tokens = recipes.Tokens(rayship["model_config"], recipes.max_length(config))
    output_dir = Path(tempfile.mkdtemp(prefix="rayship-hf-"))

    collate = TokenizedText(tokens)

    # [1] prepare data: this worker's shards, as Ray Data iterables of tokenized batches
    shard = ray.train.get_dataset_shard("train")
    batches_per_epoch = sum(1 for _ in shard.iter_batches(batch_size=batch_size, batch_format="numpy"))
    train_batches = shard.iter_torch_batches(batch_size=batch_size, collate_fn=collate)
    validation = recipes.validation_shard(spec)
    eval_batches = (
        validation.iter_torch_batches(batch_size=batch_size, collate_fn=collate)
        if validation is not None
        else None
    )

    # [2] prepare the model (the Trainer wraps it for DDP, or DeepSpeed with the job's config)
    torch.manual_seed(data.seed(config))
    model = recipes.build_causal_lm(rayship["model_config"])
    recipes.check_positions(model, tokens.max_length)
    use_gpu = torch.cuda.is_available()
    deepspeed = (
        strategies.deepspeed_config(trainer_spec, use_gpu) if trainer_spec.strategy == "deepspeed" else None
    )
    precision = (trainer_spec.deepspeed or api.DeepSpeedSpec()).precision if deepspeed else "fp32"

    # [3] resume from the latest checkpoint (or one another trial handed over), verified
    saver = TrainerCheckpoints(trainer_spec, output_dir)
    run = recipes.Run.of(config)
    start = recipes.resume(saver, run)

    # [4] train with the Trainer; report and checkpoint every epoch through the callback
    args = _training_arguments(
        TrainingArguments, trainer_spec, output_dir, batches_per_epoch, eval_batches is not None,
        deepspeed, precision, data.seed(config),
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=train_batches, eval_dataset=eval_batches)
    callback = RayshipReportCallback(spec, run, start, saver)
    trainer.add_callback(callback)
    trainer = prepare_trainer(trainer)
    stopped = callback.stopping is not None and callback.stopping.stopped  # before it was resumed
    if start.epoch < trainer_spec.epochs and not stopped:
        trainer.train(resume_from_checkpoint=str(saver.resume_from) if saver.resume_from else None)
    shutil.rmtree(output_dir, ignore_errors=True)


def _training_arguments(
    arguments: Any,
    trainer_spec: api.TrainerSpec,
    output_dir: Path,
    batches_per_epoch: int,
    evaluates: bool,
    deepspeed: dict[str, Any] | None,
    precision: str,
    seed: int,
) -> Any:
    """The Trainer's arguments: a constant learning rate, the job's epochs as steps, an evaluation,
    a log line and a checkpoint every epoch (the callback reports them); `arguments` is
    transformers' TrainingArguments (imported where the loop runs)."""
    use_gpu = torch.cuda.is_available()
    return arguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=trainer_spec.batch_size_per_worker,
        per_device_eval_batch_size=trainer_spec.batch_size_per_worker,
        learning_rate=trainer_spec.learning_rate,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_steps=max(batches_per_epoch, 1) * trainer_spec.epochs,
        ignore_data_skip=True,  # epochs are counted by the callback, not by skipping batches
        logging_strategy="epoch",
        eval_strategy="epoch" if evaluates else "no",
        save_strategy="epoch",
        save_total_limit=1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=not use_gpu,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        deepspeed=deepspeed,
        seed=seed,
    )


def state_dict(directory: Path, strategy: str) -> dict[str, torch.Tensor]:
    """The whole model's fp32 weights from one of this engine's checkpoints (one process, CPU)."""
    checkpoint = directory / HF_CHECKPOINT
    if strategy == "deepspeed":
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state: dict[str, torch.Tensor] = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
        return state
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "model.safetensors"))
