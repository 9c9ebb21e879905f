"""A Ray Train loop of your own, shipped with the job (`runtimeEnv.workingDir: .`): no image to build,
no PYTHONPATH to set. `rayship run -f examples/byo-loop/trainingjob.yaml` trains it on local Ray;
`rayship serve --model rayship-runs/houses/checkpoints/default.houses/model` serves what it saved.

What the loop gets in `config`: `trainer.config` (here `features`, `target`, `hidden`), the common
hyperparameters `lr` (= `learningRate`), `batch_size` and `epochs`, and `config["rayship"]` (the
resolved spec, the data's `columns`, where checkpoints go). The data arrive as written: the columns
of houses.csv, in the `train` shard, and with `data.validation` a `validation` shard.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from rayship_workloads import models


def batches(shard: Any, config: dict[str, Any]) -> Any:
    for batch in shard.iter_torch_batches(batch_size=config["batch_size"], dtypes=torch.float32):
        x = torch.stack([batch[c] for c in config["features"]], dim=1)
        yield x, batch[config["target"]].unsqueeze(1)


def train_loop(config: dict[str, Any]) -> None:
    print(f"my loop: LOG_LEVEL={os.environ.get('LOG_LEVEL')}")  # from runtimeEnv.envVars
    # [1] prepare data: this worker's shards, columns as written in houses.csv
    train_shard = ray.train.get_dataset_shard("train")
    validation_shard = ray.train.get_dataset_shard("validation")

    # [2] prepare the model (DDP across the workers)
    torch.manual_seed(0)
    inputs = len(config["features"])
    model = nn.Sequential(nn.Linear(inputs, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 1))
    model = ray.train.torch.prepare_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])

    # [3] resume from the latest checkpoint, if the run has one
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / "state.pt", weights_only=True)
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]

    for epoch in range(start + 1, config["epochs"] + 1):
        # [4] train one epoch
        total, rows = 0.0, 0
        for x, y in batches(train_shard, config):
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, rows = total + loss.item() * len(y), rows + len(y)

        # [5] evaluate on the validation shard
        model.eval()
        with torch.no_grad():
            pairs = [
                (F.mse_loss(model(x), y).item() * len(y), len(y))
                for x, y in batches(validation_shard, config)
            ]
        model.train()
        eval_loss = sum(p[0] for p in pairs) / max(sum(p[1] for p in pairs), 1)
        print(f"my loop: epoch {epoch} train mse {total / max(rows, 1):.4f} validation mse {eval_loss:.4f}")

        # [6] report metrics and a checkpoint (rank 0 writes it)
        with tempfile.TemporaryDirectory() as tmp:
            saved = None
            if ray.train.get_context().get_world_rank() == 0:
                state = {
                    "model": getattr(model, "module", model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                }
                torch.save({**state, "epoch": epoch}, Path(tmp) / "state.pt")
                saved = ray.train.Checkpoint.from_directory(tmp)
            metrics = {"epoch": epoch, "loss": total / max(rows, 1), "evalLoss": eval_loss}
            ray.train.report(metrics, checkpoint=saved, checkpoint_dir_name=f"epoch-{epoch:05d}")

    # the model in the serving layout, so `rayship serve` and a ModelService can serve it
    models.save_model(config, model, inputs=inputs, features=config["features"])
