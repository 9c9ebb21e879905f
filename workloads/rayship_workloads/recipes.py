"""Train loops (`train_loop_per_worker`): the built-in recipes and bring-your-own `module:function`.

Every loop receives `config` = the TrainingJob's `trainer.config` plus a `rayship` key holding the
resolved spec and what the driver worked out (feature columns, model config). The loops mark their
Ray steps `# [1] prepare data ... # [4] report`.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.nn.functional as F  # noqa: N812

from rayship_workloads import data, models, strategies
from rayship_workloads.strategies import Strategy

STATE = "rayship-state.json"
EpochHook = Callable[[int], None]


def checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch:05d}"


def resume(strategy: Strategy) -> tuple[int, int]:
    """(epoch, step) of the latest checkpoint, after loading it; (0, 0) when starting fresh."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0, 0
    with checkpoint.as_directory() as directory:
        strategy.load(Path(directory))
        state = json.loads((Path(directory) / STATE).read_text())
    return int(state["epoch"]), int(state["step"])


def report(strategy: Strategy, *, epoch: int, step: int, metrics: dict[str, float], save: bool) -> None:
    """Report this epoch's metrics from every rank, with a checkpoint when `save`."""
    rank = ray.train.get_context().get_world_rank()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if save:
            strategy.save(Path(tmp))
            if rank == 0:
                (Path(tmp) / STATE).write_text(
                    json.dumps({"epoch": epoch, "step": step, "strategy": strategy.name})
                )
            if any(Path(tmp).iterdir()):
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(
            {"epoch": epoch, "step": step, **metrics},
            checkpoint=checkpoint,
            checkpoint_dir_name=checkpoint_name(epoch) if save else None,
        )


def run_epochs(
    strategy: Strategy,
    spec: dict[str, Any],
    *,
    start_epoch: int,
    step: int,
    losses: Callable[[], Iterator[torch.Tensor]],
    on_epoch_end: EpochHook | None,
) -> None:
    """The epochs after `start_epoch`: a step per batch loss, then a report (mean loss over the
    epoch), with a checkpoint every `checkpoint.everyEpochs` epochs and after the last one."""
    epochs, every = spec["trainer"]["epochs"], spec["checkpoint"]["everyEpochs"]
    for epoch in range(start_epoch + 1, epochs + 1):
        total, batches = 0.0, 0
        for loss in losses():
            strategy.step(loss)
            total, batches, step = total + loss.item(), batches + 1, step + 1
        metrics = {"loss": total / max(batches, 1), "resumed_from_epoch": start_epoch}
        report(strategy, epoch=epoch, step=step, metrics=metrics, save=epoch % every == 0 or epoch == epochs)
        if on_epoch_end is not None:
            on_epoch_end(epoch)


def mlp_config(n_features: int, config: dict[str, Any]) -> dict[str, Any]:
    return {"in_features": n_features, "hidden": list(config.get("hidden", [64, 64])), "out_features": 1}


def mlp_loop(config: dict[str, Any], on_epoch_end: EpochHook | None = None) -> None:
    """Tabular regression with an MLP (mean squared error)."""
    rayship = config["rayship"]
    spec, features = rayship["spec"], rayship["features"]
    trainer = spec["trainer"]
    label = config.get("label", data.LABEL)
    device = ray.train.torch.get_device()

    # [1] prepare data: this worker's shard of the Ray Dataset
    shard = ray.train.get_dataset_shard("train")

    # [2] prepare the model: DDP or DeepSpeed, placed on this worker's device
    torch.manual_seed(int(config.get("seed", 0)))
    model = models.build_mlp(rayship["model_config"])
    strategy = strategies.create(spec, model, trainer["batchSizePerWorker"])

    # [3] resume from the latest checkpoint, if this run has one
    start_epoch, step = resume(strategy)

    # [4] train, and report every epoch (checkpointing every `everyEpochs` and at the end)
    def losses() -> Iterator[torch.Tensor]:
        for batch in shard.iter_torch_batches(batch_size=trainer["batchSizePerWorker"], dtypes=torch.float32):
            x = torch.stack([batch[c] for c in features], dim=1).to(device, strategy.dtype)
            y = batch[label].to(device).unsqueeze(1)
            yield F.mse_loss(strategy.model(x).float(), y)

    run_epochs(strategy, spec, start_epoch=start_epoch, step=step, losses=losses, on_epoch_end=on_epoch_end)


# causal-lm: a Hugging Face AutoModelForCausalLM. On a cluster, `config.model_path` names a local/PVC
# directory (from_pretrained, its own tokenizer); otherwise `config.model_config` builds a model from
# a config (from_config) with byte-level tokens: UTF-8 bytes, 256 = end of text, 257 = padding.
BYTE_EOS, BYTE_PAD, BYTE_VOCAB = 256, 257, 260
TINY_MODEL = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 32,
    "n_positions": 128,
    "vocab_size": BYTE_VOCAB,
}


def causal_lm_config(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("model_path"):
        return {"model_path": str(config["model_path"])}
    return {"model_config": {**TINY_MODEL, **(config.get("model_config") or {})}}


def build_causal_lm(model_config: dict[str, Any]) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    if "model_path" in model_config:
        return AutoModelForCausalLM.from_pretrained(model_config["model_path"], local_files_only=True)
    settings = dict(model_config["model_config"])
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(settings.pop("model_type"), **settings))


class Tokens:
    """Batches of text -> (input_ids, attention_mask, labels): bytes, or the model's own tokenizer."""

    def __init__(self, model_config: dict[str, Any], max_length: int):
        self.max_length = max_length
        self.tokenizer = None
        if "model_path" in model_config:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model_config["model_path"], local_files_only=True)
            if self.tokenizer.pad_token is None:
                self.tokenizer.pad_token = self.tokenizer.eos_token

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        if self.tokenizer is not None:
            enc = self.tokenizer(
                texts, max_length=self.max_length, truncation=True, padding="max_length", return_tensors="pt"
            )
            ids, mask = enc["input_ids"], enc["attention_mask"]
        else:
            rows = [list(t.encode("utf-8"))[: self.max_length - 1] + [BYTE_EOS] for t in texts]
            ids = torch.full((len(rows), self.max_length), BYTE_PAD, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, row in enumerate(rows):
                ids[i, : len(row)] = torch.tensor(row)
                mask[i, : len(row)] = 1
        labels = ids.masked_fill(mask == 0, -100)  # no loss on padding
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def causal_lm_loop(config: dict[str, Any], on_epoch_end: EpochHook | None = None) -> None:
    """Next-token prediction on a `text` column."""
    rayship = config["rayship"]
    spec = rayship["spec"]
    trainer = spec["trainer"]
    device = ray.train.torch.get_device()
    tokens = Tokens(rayship["model_config"], int(config.get("max_length", 64)))

    # [1] prepare data: this worker's shard of the text dataset
    shard = ray.train.get_dataset_shard("train")

    # [2] prepare the model: DDP or DeepSpeed
    torch.manual_seed(int(config.get("seed", 0)))
    strategy = strategies.create(
        spec, build_causal_lm(rayship["model_config"]), trainer["batchSizePerWorker"]
    )

    # [3] resume from the latest checkpoint, if this run has one
    start_epoch, step = resume(strategy)

    # [4] train, and report every epoch
    def losses() -> Iterator[torch.Tensor]:
        for batch in shard.iter_batches(batch_size=trainer["batchSizePerWorker"], batch_format="numpy"):
            inputs = {k: v.to(device) for k, v in tokens([str(t) for t in batch[data.TEXT]]).items()}
            yield strategy.model(**inputs).loss

    run_epochs(strategy, spec, start_epoch=start_epoch, step=step, losses=losses, on_epoch_end=on_epoch_end)


RECIPES: dict[str, Callable[[dict[str, Any]], None]] = {"mlp": mlp_loop, "causal-lm": causal_lm_loop}
DATA_KIND = {"mlp": "tabular", "causal-lm": "text"}


def resolve(trainer: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """The train loop for `trainer.recipe`, or the user's `trainer.entrypoint` (module:function)."""
    if trainer.get("recipe"):
        return RECIPES[trainer["recipe"]]
    module_name, _, attr = trainer["entrypoint"].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"trainer.entrypoint {trainer['entrypoint']!r}: cannot import {module_name!r}: {err}"
        ) from None
    loop = getattr(module, attr, None)
    if not callable(loop):
        raise ValueError(
            f"trainer.entrypoint {trainer['entrypoint']!r}: {module_name} has no function {attr!r}"
        )
    return loop
