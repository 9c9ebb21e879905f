"""Bring-your-own train loops used by the tests (resolved from `trainer.entrypoint`)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import ray.train
from ray.train.v2.api.callback import UserCallback

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
            wait_registered(f"epoch-{epoch:05d}")
            marker.write_text("crashed")
            raise RuntimeError("injected worker failure")

    recipes.mlp_loop(config, on_epoch_end=maybe_crash)


def wait_registered(checkpoint: str, timeout: float = 60.0) -> None:
    """Until Ray Train's controller has registered `checkpoint` (its run snapshot names it). A worker
    that dies right after `report()` can beat the other ranks' reports to the controller: that
    checkpoint is then never registered, and the retry rightly resumes from the one before. The test
    wants the crash after the registration, so its expected epoch is exact."""
    snapshot = Path(ray.train.get_context().get_storage().checkpoint_manager_snapshot_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if snapshot.exists() and checkpoint in snapshot.read_text():
            return
        time.sleep(0.1)


def as_written(config: dict[str, Any]) -> None:
    """Reports what an own loop gets: the hyperparameters at the top level of its config, and the
    data's own columns (here text, no label column)."""
    shard = ray.train.get_dataset_shard("train")
    rows = shard.iter_rows()
    first = next(iter(rows))
    for epoch in range(1, config["epochs"] + 1):
        ray.train.report(
            {
                "epoch": epoch,
                "lr": config["lr"],
                "learningRate": config["learningRate"],
                "batch_size": config["batch_size"],
                "epochs": config["epochs"],
                "echo": config["echo"],
                "columns_as_written": config["rayship"]["columns"] == ["text", "score"],
                "row_has_text": isinstance(first["text"], str),
                "env_seen": os.environ.get("TEST_RUNTIME_VAR") == "from-runtime-env",
            }
        )


def fails_deterministically(config: dict[str, Any]) -> None:
    """A bug in the loop's own code: the same error at the same place every time."""
    print("about to fail", flush=True)
    raise IndexError("index out of range in self")


def hf_trainer(config: dict[str, Any]) -> None:
    """A user's own Hugging Face Trainer loop, as in Ray's tutorial: a tiny causal LM from a config
    (nothing downloaded), Ray Data batches, RayTrainReportCallback + prepare_trainer."""
    import tempfile

    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    tokens = recipes.Tokens({}, max_length=config["max_length"])  # byte-level tokens
    shard = ray.train.get_dataset_shard("train")
    batches = shard.iter_torch_batches(
        batch_size=config["batch_size"], collate_fn=lambda b: tokens([str(t) for t in b["text"]])
    )
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("gpt2", n_layer=1, n_head=2, n_embd=32, n_positions=64, vocab_size=260)
    )
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=config["batch_size"],
        learning_rate=config["lr"],
        max_steps=config["max_steps"],
        logging_steps=config["max_steps"] // 2,
        save_strategy="steps",
        save_steps=config["max_steps"] // 2,
        report_to="none",
        use_cpu=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=batches)
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    trainer.train()


class KillTheControllerAtEpoch(UserCallback):
    """A Ray Train callback, given before rayship's own: at the report of `epoch` that carries a
    checkpoint (Ray Train has registered it by then), it SIGKILLs the process it runs in, the run's
    controller, as a driver killed at that moment takes its controller with it. Once (`marker`)."""

    def __init__(self, epoch: int, marker: str) -> None:
        self.epoch, self.marker = epoch, marker

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if (
            checkpoint is not None
            and metrics[0].get("epoch") == self.epoch
            and not Path(self.marker).exists()
        ):
            Path(self.marker).write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)


class StatusPatchesToFile:
    """Stands in for `kubernetes.client.CustomObjectsApi` in any process (the driver, a controller
    actor): each status patch's body, one JSON line in `path`."""

    def __init__(self, path: str) -> None:
        self.path = path

    def patch_namespaced_custom_object_status(self, *args: Any, body: Any = None, **_: Any) -> None:
        body = body if body is not None else args[5]
        with open(self.path, "a") as out:
            out.write(json.dumps(body, allow_nan=False) + "\n")
