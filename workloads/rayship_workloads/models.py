"""Model definitions and the serving layout shared by training (export) and serving (load).

Serving layout of an exported model directory (a path, PVC path or s3:// prefix):

    rayship-model.json   {"format": "rayship-model/v1", "recipe": "mlp", "config": {...}, ...}
    model.pt             mlp: the state_dict (loaded with torch.load(weights_only=True))
    config.json, model.safetensors
                         causal-lm: a Hugging Face save_pretrained() directory
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rayship_workloads import storage

FORMAT = "rayship-model/v1"
MANIFEST = "rayship-model.json"
WEIGHTS = "model.pt"


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
        return self.net(x)


def build_mlp(config: dict[str, Any]) -> MLP:
    return MLP(config["in_features"], list(config["hidden"]), config.get("out_features", 1))


def export_mlp(
    directory: Path, config: dict[str, Any], state_dict: dict[str, torch.Tensor], **extra: Any
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, directory / WEIGHTS)
    write_manifest(directory, "mlp", config, **extra)
    return directory


def write_manifest(directory: Path, recipe: str, config: dict[str, Any], **extra: Any) -> None:
    manifest = {"format": FORMAT, "recipe": recipe, "config": config, **extra}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: not a rayship model (no {MANIFEST})")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: unsupported format {manifest.get('format')!r}; expected {FORMAT}")
    return manifest


def load_model(uri: str) -> tuple[nn.Module, dict[str, Any]]:
    """Load an exported model (local, PVC or s3://) for inference: (model in eval mode, manifest)."""
    directory = storage.fetch_dir(uri)
    manifest = read_manifest(directory)
    if manifest["recipe"] == "causal-lm":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True)
    else:
        model = build_mlp(manifest["config"])
        model.load_state_dict(torch.load(directory / WEIGHTS, map_location="cpu", weights_only=True))
    model.eval()
    return model, manifest
