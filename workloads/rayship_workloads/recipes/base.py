"""What a recipe is (`Recipe`: data kind, model setup, loop, export, load) and what it hands on: the
model setup, and a loaded model as Serve talks to it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ray.data
import ray.train
import ray.train.torch
import torch
from torch import nn

from rayship_workloads import data

TrainLoop = Callable[[dict[str, Any]], None]
EpochHook = Callable[[int], None]
STATE = "rayship-state.json"


@dataclass(frozen=True)
class ModelSetup:
    """What a recipe works out before training: the model config (it builds the model, and is the
    exported manifest's `config`) and extras handed to the loops and written to the manifest."""

    config: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


class TextGenerator(Protocol):
    """A text model as Serve's `/generate` uses it."""

    max_positions: int | None  # prompt + completion tokens the model takes (None: no limit known)

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def greedy(self, ids: list[int], max_new_tokens: int) -> list[int]: ...


@dataclass(frozen=True)
class Servable:
    """A loaded model (in eval mode, on the CPU) and how Serve talks to it: `/predict` takes rows of
    `inputs` numbers, `/generate` goes through `generator`; a model has one or the other."""

    model: nn.Module
    inputs: int | None = None
    generator: TextGenerator | None = None


@dataclass(frozen=True)
class Recipe:
    """One built-in recipe (see the module docstring)."""

    name: str
    data_kind: data.DataKind
    model_setup: Callable[[ray.data.Dataset, Mapping[str, Any]], ModelSetup]
    loop: TrainLoop
    export: Callable[[Path, ModelSetup, dict[str, torch.Tensor]], dict[str, Any]]  # -> manifest extras
    load: Callable[[Path, dict[str, Any]], Servable]  # (model directory, its manifest)
