"""Parallel strategies behind one small interface: PyTorch DDP, DeepSpeed ZeRO and PyTorch FSDP2.

A strategy wraps the model and optimizer, takes a step from a loss, and saves/loads a checkpoint
directory that resumes training exactly (model + optimizer state). DDP checkpoints are written by
rank 0; DeepSpeed and FSDP checkpoints by every rank (each writes its shard: ZeRO's files, or
`torch.distributed.checkpoint`'s `__<rank>_0.distcp` beside rank 0's `.metadata`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from rayship import api

DDP_STATE = "state.pt"
DS_TAG = "ds"
FSDP_DIR = "fsdp"  # torch.distributed.checkpoint's sharded model + optimizer state


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


def fp32_on_cpu(tj: api.TrainingJob) -> str | None:
    """fp16 asked of workers without a GPU trains in fp32 (changed in place); returns the line that
    says so, or None. CPUs do not train in fp16: DeepSpeed refuses it on a CPU that lacks fp16 ("Type
    fp16 is not supported on your device", an AMD EPYC here), FSDP's mixed precision gains nothing."""
    trainer = tj.spec.trainer
    precision = trainer.deepspeed if trainer.strategy == "deepspeed" else trainer.fsdp
    if precision is None or precision.precision != "fp16" or tj.spec.workers.gpus_per_worker:
        return None
    precision.precision = "fp32"
    return "precision fp16 -> fp32: CPUs do not train in fp16"


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


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The submodules FSDP shards as units of their own before the root (each gathers its parameters
    only while it runs): a Hugging Face model's `_no_split_modules` (its transformer blocks); none for
    other models (one unit: the whole model)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if m is not model and type(m).__name__ in names]


class FSDPStrategy:
    """PyTorch FSDP2 (`fully_shard` on a 1-D device mesh of all workers): parameters, gradients and
    optimizer state sharded; sharded checkpoints with `torch.distributed.checkpoint`. (Ray Train's
    `prepare_model(parallel_strategy="fsdp")` is FSDP1, which needs a GPU.)"""

    name = "fsdp"
    dtype = torch.float32  # inputs: FSDP casts them to the compute precision itself

    def __init__(self, model: nn.Module, trainer: api.TrainerSpec):
        import ray.train.torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        settings = trainer.fsdp or api.FsdpSpec()
        device = ray.train.torch.get_device()
        mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
        options: dict[str, Any] = {
            "mesh": mesh,
            "reshard_after_forward": settings.reshard_after_forward,
            "mp_policy": MixedPrecisionPolicy(
                param_dtype=PRECISION[settings.precision], reduce_dtype=torch.float32
            ),
        }
        if settings.offload_params:
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
        else:
            model.to(device)
        for unit in fsdp_units(model):
            fully_shard(unit, **options)
        fully_shard(model, **options)  # in place: the model's class becomes its FSDP subclass
        self.model: nn.Module = model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=trainer.learning_rate)

    @property
    def module(self) -> nn.Module:
        return self.model

    def step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def save(self, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), checkpoint_id=str(directory / FSDP_DIR))  # collective: each rank its shard

    def load(self, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        dcp.load(state, checkpoint_id=str(directory / FSDP_DIR))  # into the shards this rank holds
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )

    def set_learning_rate(self, lr: float) -> None:
        set_learning_rate(self.optimizer, lr)


def create(trainer: api.TrainerSpec, model: nn.Module) -> Strategy:
    """`trainer.strategy` around `model`."""
    if trainer.strategy == "deepspeed":
        return DeepSpeedStrategy(model, trainer)
    if trainer.strategy == "fsdp":
        return FSDPStrategy(model, trainer)
    return DDPStrategy(model, trainer.learning_rate)


def full_state_dict(checkpoint_dir: Path, strategy: str) -> dict[str, torch.Tensor]:
    """The whole model's fp32 weights from a checkpoint directory (run on one process, CPU only)."""
    if strategy == "deepspeed":
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state: dict[str, torch.Tensor] = get_fp32_state_dict_from_zero_checkpoint(
            str(checkpoint_dir), tag=DS_TAG
        )
        return state
    if strategy == "fsdp":
        return fsdp_full_state_dict(checkpoint_dir / FSDP_DIR)
    saved: dict[str, dict[str, torch.Tensor]] = torch.load(
        checkpoint_dir / DDP_STATE, map_location="cpu", weights_only=True
    )
    return saved["model"]


def fsdp_full_state_dict(sharded: Path) -> dict[str, torch.Tensor]:
    """The model's weights gathered from an FSDP sharded checkpoint, in one process without a process
    group (`torch.distributed.checkpoint`'s no-distributed load), as fp32 tensors."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = dcp.FileSystemReader(str(sharded)).read_metadata()
    prefix = "model."
    state: dict[str, Any] = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # no_dist is the point here, not a misconfiguration
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(sharded), no_dist=True)
    return {key.removeprefix(prefix): tensor.float() for key, tensor in state.items()}
