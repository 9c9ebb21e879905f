"""Bring-your-own train loops used by the tests (resolved from `trainer.entrypoint`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray.train

from rayship_workloads import recipes


def echo_config(config: dict[str, Any]) -> None:
    """Reports what it was given: proves the spec's config reaches a user loop unchanged."""
    context = ray.train.get_context()
    for epoch in (1, 2):
        ray.train.report(
            {
                "epoch": epoch,
                "step": epoch,
                "echo": config["echo"],
                "world_size": context.get_world_size(),
                # the resolved spec, as a dict in its camelCase wire form (as own loops always got it)
                "spec_in_wire_form": "batchSizePerWorker" in config["rayship"]["spec"]["trainer"],
            }
        )


def crash_once(config: dict[str, Any]) -> None:
    """The MLP recipe, with rank 1 raising once after `crash_after_epoch` (a marker file makes it once)."""
    marker = Path(config["crash_marker"])

    def maybe_crash(epoch: int) -> None:
        if (
            epoch == config["crash_after_epoch"]
            and ray.train.get_context().get_world_rank() == 1
            and not marker.exists()
        ):
            marker.write_text("crashed")
            raise RuntimeError("injected worker failure")

    recipes.mlp_loop(config, on_epoch_end=maybe_crash)
