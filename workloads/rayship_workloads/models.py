"""The serving layout shared by training (export) and serving (load).

An exported model is a directory (a path, PVC path or s3:// prefix) holding

    rayship-model.json   {"format": "rayship-model/v1", "recipe": <name>, "config": <model config>, ...}

plus what the recipe's `export` writes beside it (`recipes.py`: the mlp's `model.pt` state_dict, a
causal-lm's Hugging Face save_pretrained() directory). The manifest's `recipe` names the registry
record that loads it back. An exported model also holds `rayship-digest.json` (`integrity`), checked
before the model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rayship_workloads import integrity, recipes, storage

FORMAT = "rayship-model/v1"
MANIFEST = "rayship-model.json"


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
    return dict(manifest)


def export(directory: Path, recipe: str, setup: recipes.ModelSetup, state: dict[str, torch.Tensor]) -> Path:
    """Write a model of `recipe` (its config and weights) to the local `directory` in the serving layout."""
    directory.mkdir(parents=True, exist_ok=True)
    extra = recipes.get(recipe).export(directory, setup, state)
    write_manifest(directory, recipe, setup.config, **extra)
    return directory


def load(uri: str) -> tuple[recipes.Servable, dict[str, Any]]:
    """An exported model (local, PVC or s3://) ready to serve, in eval mode on the CPU; and its manifest."""
    directory = storage.fetch_dir(uri)
    integrity.verify_model(uri, directory)
    manifest = read_manifest(directory)
    servable = recipes.get(manifest["recipe"]).load(directory, manifest)
    servable.model.eval()
    return servable, manifest


def load_model(uri: str) -> tuple[nn.Module, dict[str, Any]]:
    """An exported model for inference: (model in eval mode, manifest)."""
    servable, manifest = load(uri)
    return servable.model, manifest
