"""The registry: every built-in recipe by name, and own loops (`trainer.entrypoint: module:function`)."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any, cast

import ray.data
import ray.train
import ray.train.torch

from rayship import api
from rayship_workloads import data
from rayship_workloads.recipes.base import ModelSetup, Recipe, TrainLoop
from rayship_workloads.recipes.causal_lm import (
    causal_lm_loop,
    causal_lm_setup,
    export_causal_lm,
    load_causal_lm,
)
from rayship_workloads.recipes.mlp import export_mlp, load_mlp, mlp_loop, mlp_setup

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe("mlp", "tabular", mlp_setup, mlp_loop, export_mlp, load_mlp),
        Recipe("causal-lm", "text", causal_lm_setup, causal_lm_loop, export_causal_lm, load_causal_lm),
    )
}


def own_loop_setup(dataset: ray.data.Dataset, config: Mapping[str, Any]) -> ModelSetup:
    """What own loops (`trainer.entrypoint`) get in config["rayship"]: the data's `columns` as
    written; and, when the data has the label column (`trainer.config.label`, default `y`), the mlp
    recipe's `features` and `model_config`, for loops that build on `mlp_loop`."""
    columns = list(dataset.schema().names)
    if data.label(config) not in columns:
        return ModelSetup({}, {"columns": columns})
    setup = mlp_setup(dataset, config)
    return ModelSetup(setup.config, {**setup.extra, "columns": columns})


def get(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}") from None


def names(data_kind: data.DataKind) -> list[str]:
    """The recipes that train on `data_kind` data."""
    return [name for name, recipe in RECIPES.items() if recipe.data_kind == data_kind]


def for_trainer(trainer: api.TrainerSpec) -> Recipe | None:
    """`trainer.recipe`'s record; None for an own loop (`trainer.entrypoint`)."""
    return get(trainer.recipe) if trainer.recipe is not None else None


def setup(trainer: api.TrainerSpec, dataset: ray.data.Dataset) -> ModelSetup:
    """The model setup of `trainer.recipe` for `dataset`, or `own_loop_setup` for own loops."""
    recipe = for_trainer(trainer)
    if recipe is None:
        return own_loop_setup(dataset, trainer.config)
    return recipe.model_setup(dataset, trainer.config)


def data_kind(trainer: api.TrainerSpec) -> data.DataKind:
    """The data a run reads: its recipe's kind; own loops read files as written (synthetic: tabular)."""
    recipe = for_trainer(trainer)
    return recipe.data_kind if recipe is not None else "tabular"


def run_own_loop(entrypoint: str, config: dict[str, Any]) -> None:
    """An own loop, imported on the worker: its module may come with `runtimeEnv.workingDir`, which
    Ray unpacks for the workers (and the driver), not for the Ray Train controller."""
    resolve_entrypoint(entrypoint)(config)


def train_loop(trainer: api.TrainerSpec) -> TrainLoop:
    """The train loop for `trainer.recipe`, or the user's `trainer.entrypoint` (module:function),
    checked now and imported again on each worker (`run_own_loop`)."""
    recipe = for_trainer(trainer)
    if recipe is not None:
        return recipe.loop
    if trainer.entrypoint is None:  # the API requires exactly one of recipe and entrypoint
        raise ValueError("trainer: set recipe or entrypoint")
    resolve_entrypoint(trainer.entrypoint)
    return functools.partial(run_own_loop, trainer.entrypoint)


def resolve_entrypoint(entrypoint: str) -> TrainLoop:
    """The function `module:function` names; a ValueError saying why it cannot be had."""
    module_name, _, attr = entrypoint.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"trainer.entrypoint {entrypoint!r}: cannot import {module_name!r}: {err} (ship your code "
            "with runtimeEnv.workingDir, or install it in the image)"
        ) from None
    loop = getattr(module, attr, None)
    if not callable(loop):
        raise ValueError(f"trainer.entrypoint {entrypoint!r}: {module_name} has no function {attr!r}")
    return cast(TrainLoop, loop)  # a user's function: called with the loop config, as Ray Train does
