"""The serving layout shared by training (export) and serving (load).

An exported model is a directory (a path, PVC path or s3:// prefix) holding

    rayship-model.json   {"format": "rayship-model/v1", "recipe": <name>, "config": <model config>, ...}

plus what the recipe's `export` writes beside it (`recipes.py`: the mlp's `model.pt` state_dict, a
causal-lm's Hugging Face save_pretrained() directory). The manifest's `recipe` names the registry
record that loads it back. An exported model also holds `rayship-digest.json` (`integrity`), checked
before the model is loaded.

Own loops save their model with `save_model(config, model, ...)` (rank 0, at the end of the loop):
a Hugging Face causal LM as a save_pretrained() directory (`recipe: causal-lm`), any other torch
module as TorchScript (`recipe: torchscript`, `model.ts`, served by `/predict` like the mlp).
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rayship_workloads import integrity, recipes, storage

FORMAT = "rayship-model/v1"
MANIFEST = "rayship-model.json"
MODEL_DIR = "model"  # <storage>/<run name>/model: the final model of a run
TORCHSCRIPT = "torchscript"  # an own loop's torch module, traced (no recipe trains it)
TORCHSCRIPT_FILE = "model.ts"


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


def load_torchscript(directory: Path, manifest: dict[str, Any]) -> recipes.Servable:
    model = torch.jit.load(str(directory / TORCHSCRIPT_FILE), map_location="cpu")
    return recipes.Servable(model, inputs=int(manifest["config"]["in_features"]))


def loader(name: str) -> Any:
    """How a manifest's `recipe` is loaded: the recipe's own `load`, or TorchScript."""
    return load_torchscript if name == TORCHSCRIPT else recipes.get(name).load


def _unwrapped(model: Any) -> Any:
    """The module inside DDP (`prepare_model`) or a DeepSpeed engine."""
    while isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def save_model(
    config: dict[str, Any],
    model: Any,
    *,
    inputs: int | None = None,
    features: list[str] | None = None,
    tokenizer: Any = None,
) -> str | None:
    """Save an own loop's trained `model` in the serving layout as its run's model
    (`<storage>/<run name>/model`, signed like a recipe's export), so `rayship serve` and a
    ModelService serve it. Call it on every rank at the end of the loop; rank 0 writes and gets the
    URI, the others get None. `config` is the loop's config.

    - a Hugging Face causal LM (it has `save_pretrained` and `generate`): its save_pretrained()
      directory, with `tokenizer` (a Hugging Face tokenizer) if given, else byte-level tokens;
    - any other torch module: TorchScript traced on a `(1, inputs)` float input (`inputs` required),
      served by `/predict` with rows of `inputs` numbers (`features`: their column names).

    Under DeepSpeed ZeRO-3 rank 0 holds only its shard of the parameters: gather them first."""
    import ray.train

    if ray.train.get_context().get_world_rank() != 0:
        return None
    run = recipes.Run.of(config)
    module = _unwrapped(model)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if hasattr(module, "save_pretrained") and hasattr(module, "generate"):
            module.save_pretrained(str(directory))
            if tokenizer is not None:
                tokenizer.save_pretrained(str(directory))
            kind = "pretrained" if tokenizer is not None else "bytes"
            write_manifest(directory, "causal-lm", {"model_type": module.config.model_type}, tokenizer=kind)
        else:
            if inputs is None:
                raise ValueError(
                    "models.save_model: a torch module needs inputs= (its number of input features)"
                )
            cpu = copy.deepcopy(module).cpu().eval()
            with torch.no_grad():
                traced = torch.jit.trace(cpu, torch.zeros(1, inputs))
            traced.save(str(directory / TORCHSCRIPT_FILE))
            extra = {"features": list(features)} if features else {}
            write_manifest(directory, TORCHSCRIPT, {"in_features": inputs}, **extra)
        integrity.sign(directory, run.key(), run=run.run_name, name=MODEL_DIR, model=True)
        target = storage.join(run.storage_root, run.run_name, MODEL_DIR)
        storage.upload_dir(directory, target)
    return target


def load(uri: str) -> tuple[recipes.Servable, dict[str, Any]]:
    """An exported model (local, PVC or s3://) ready to serve, in eval mode on the CPU; and its manifest."""
    directory = storage.fetch_dir(uri)
    integrity.verify_model(uri, directory)
    manifest = read_manifest(directory)
    servable = loader(manifest["recipe"])(directory, manifest)
    servable.model.eval()
    return servable, manifest


def load_model(uri: str) -> tuple[nn.Module, dict[str, Any]]:
    """An exported model for inference: (model in eval mode, manifest)."""
    servable, manifest = load(uri)
    return servable.model, manifest
