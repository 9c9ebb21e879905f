"""Parallel strategies behind one small interface: PyTorch DDP and DeepSpeed ZeRO.

A strategy wraps the model and optimizer, takes a step from a loss, and saves/loads a checkpoint
directory that resumes training exactly (model + optimizer state). DDP checkpoints are written by
rank 0; DeepSpeed checkpoints by every rank (each writes its ZeRO shard).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from rayship import api

DDP_STATE = "state.pt"
DS_TAG = "ds"


class Strategy(Protocol):
    name: str
    model: nn.Module
    dtype: torch.dtype

    def step(self, loss: torch.Tensor) -> None: ...
    def save(self, directory: Path) -> None: ...
    def load(self, directory: Path) -> None: ...
    def set_learning_rate(self, lr: float) -> None: ...


def set_learning_rate(optimizer: Any, lr: float) -> None:
    """Every parameter group at `lr` (a loaded optimizer state brings the learning rate it was saved
    with: a PBT trial handed another's checkpoint trains on with its own)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def deepspeed_config(trainer: api.TrainerSpec, use_gpu: bool) -> dict[str, Any]:
    """The DeepSpeed config for `trainer.deepspeed` (the API's defaults when it is not set): ZeRO
    stage, CPU offload, precision; micro batch `trainer.batchSizePerWorker`."""
    ds = trainer.deepspeed or api.DeepSpeedSpec()
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": use_gpu}
    if ds.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": use_gpu}
    return {
        "train_micro_batch_size_per_gpu": trainer.batch_size_per_worker,
        "gradient_accumulation_steps": 1,
        # torch's AdamW: DeepSpeed's fused/CPU Adam would JIT-compile C++ ops on first use
        "optimizer": {"type": "AdamW", "params": {"lr": trainer.learning_rate, "torch_adam": True}},
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": zero,
        "bf16": {"enabled": ds.precision == "bf16"},
        "fp16": {"enabled": ds.precision == "fp16"},
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }


PRECISION = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class DDPStrategy:
    name = "ddp"
    dtype = torch.float32

    def __init__(self, model: nn.Module, learning_rate: float):
        import ray.train.torch

        self.model = ray.train.torch.prepare_model(model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=learning_rate)

    @property
    def module(self) -> nn.Module:
        return getattr(self.model, "module", self.model)

    def step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def save(self, directory: Path) -> None:
        import ray.train

        if ray.train.get_context().get_world_rank() == 0:
            torch.save(
                {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()},
                directory / DDP_STATE,
            )

    def load(self, directory: Path) -> None:
        state = torch.load(directory / DDP_STATE, map_location="cpu", weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def set_learning_rate(self, lr: float) -> None:
        set_learning_rate(self.optimizer, lr)


class DeepSpeedStrategy:
    name = "deepspeed"

    def __init__(self, model: nn.Module, trainer: api.TrainerSpec):
        import deepspeed

        config = deepspeed_config(trainer, use_gpu=torch.cuda.is_available())
        self.model, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config
        )
        self.dtype = PRECISION[(trainer.deepspeed or api.DeepSpeedSpec()).precision]

    def step(self, loss: torch.Tensor) -> None:
        self.model.backward(loss)
        self.model.step()

    def save(self, directory: Path) -> None:
        self.model.save_checkpoint(str(directory), tag=DS_TAG)  # collective: every rank writes its shard

    def load(self, directory: Path) -> None:
        path, _ = self.model.load_checkpoint(str(directory), tag=DS_TAG)
        if path is None:
            raise FileNotFoundError(f"{directory}: no DeepSpeed checkpoint with tag {DS_TAG!r}")

    def set_learning_rate(self, lr: float) -> None:
        set_learning_rate(self.optimizer, lr)


def create(trainer: api.TrainerSpec, model: nn.Module) -> Strategy:
    """`trainer.strategy` around `model`."""
    if trainer.strategy == "deepspeed":
        return DeepSpeedStrategy(model, trainer)
    return DDPStrategy(model, trainer.learning_rate)


def full_state_dict(checkpoint_dir: Path, strategy: str) -> dict[str, torch.Tensor]:
    """The whole model's fp32 weights from a checkpoint directory (run on one process, CPU only)."""
    if strategy == "deepspeed":
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state: dict[str, torch.Tensor] = get_fp32_state_dict_from_zero_checkpoint(
            str(checkpoint_dir), tag=DS_TAG
        )
        return state
    saved: dict[str, dict[str, torch.Tensor]] = torch.load(
        checkpoint_dir / DDP_STATE, map_location="cpu", weights_only=True
    )
    return saved["model"]
