"""The `mlp` recipe: tabular regression with a small MLP (mean squared error)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import ray.data
import ray.train
import ray.train.torch
import torch
import torch.nn.functional as F  # noqa: N812
from ray.data.collate_fn import NumpyBatchCollateFn
from torch import nn

from rayship_workloads import data, strategies
from rayship_workloads.recipes.base import EpochHook, ModelSetup, Servable
from rayship_workloads.recipes.loop import loop_spec, train_epochs

MLP_WEIGHTS = "model.pt"  # the state_dict, loaded with torch.load(weights_only=True)


class MLP(nn.Module):
    """A plain multi-layer perceptron for tabular regression (out_features=1) or classification."""

    def __init__(self, in_features: int, hidden: list[int], out_features: int = 1):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def mlp_config(n_features: int, config: Mapping[str, Any]) -> dict[str, Any]:
    """The MLP for `n_features` inputs: `trainer.config.hidden` layer sizes (default [64, 64])."""
    return {"in_features": n_features, "hidden": list(config.get("hidden", [64, 64])), "out_features": 1}


def build_mlp(model_config: Mapping[str, Any]) -> MLP:
    return MLP(model_config["in_features"], list(model_config["hidden"]), model_config.get("out_features", 1))


def mlp_setup(dataset: ray.data.Dataset, config: Mapping[str, Any]) -> ModelSetup:
    features = data.feature_columns(dataset, config)
    return ModelSetup(mlp_config(len(features), config), {"features": features})


class FeaturesAndLabel(NumpyBatchCollateFn):
    """`iter_torch_batches`' collate_fn: a batch of numpy columns -> (x [rows, features], y [rows, 1]),
    float32, the feature columns stacked once in numpy (in Ray Data's prefetch thread), not a tensor
    per column per batch. Both arrays are new (writable) memory, not views of Ray Data's read-only
    buffers, which torch would warn about."""

    def __init__(self, features: list[str], label: str):
        self.features, self.label = features, label

    def __call__(self, batch: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]  # Ray types it as a bare TypeVar
        x = np.stack([np.asarray(batch[c], dtype=np.float32) for c in self.features], axis=1)
        y = np.array(batch[self.label], dtype=np.float32).reshape(-1, 1)
        return torch.from_numpy(x), torch.from_numpy(y)


def mlp_loop(config: dict[str, Any], on_epoch_end: EpochHook | None = None) -> None:
    """Tabular regression with an MLP (mean squared error)."""
    rayship = config["rayship"]
    spec, features = loop_spec(config), rayship["features"]
    batch_size = spec.trainer.batch_size_per_worker
    label = data.label(config)
    device = ray.train.torch.get_device()

    # [1] prepare data: this worker's shard of the Ray Dataset
    shard = ray.train.get_dataset_shard("train")

    # [2] prepare the model: DDP or DeepSpeed, placed on this worker's device
    torch.manual_seed(data.seed(config))
    strategy = strategies.create(spec.trainer, build_mlp(rayship["model_config"]))

    def batch_losses(source: Any) -> Iterator[tuple[torch.Tensor, int]]:
        collate = FeaturesAndLabel(features, label)
        for x, y in source.iter_torch_batches(batch_size=batch_size, collate_fn=collate):
            x, y = x.to(device, strategy.dtype), y.to(device)
            yield F.mse_loss(strategy.model(x).float(), y), len(y)

    # [3] resume from the latest checkpoint, if this run has one; [4] train, evaluate on the validation
    # shard (with data.validation), and report every epoch (checkpointing every `everyEpochs` and at the end)
    train_epochs(strategy, config, shard, batch_losses, on_epoch_end=on_epoch_end, perplexity=False)


def export_mlp(directory: Path, setup: ModelSetup, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    torch.save({k: v.detach().cpu() for k, v in state.items()}, directory / MLP_WEIGHTS)
    return dict(setup.extra)  # the feature columns, in the order the model takes them


def load_mlp(directory: Path, manifest: dict[str, Any]) -> Servable:
    model = build_mlp(manifest["config"])
    model.load_state_dict(torch.load(directory / MLP_WEIGHTS, map_location="cpu", weights_only=True))
    return Servable(model, inputs=int(manifest["config"]["in_features"]))
