"""`python -m rayship_workloads.train --spec <file|json>`: run a TrainingJob on the Ray cluster.

The same TrainingJob YAML the operator renders from: validated with the rayship API models, then
a Ray Train `TorchTrainer` (DDP or DeepSpeed), checkpoints under `<storage>/<run name>/`, resumed
from the latest one on retry, and the final model exported in the serving layout
(`rayship_workloads.models`) to `<storage>/<run name>/model`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray.train
from ray.train.torch import TorchTrainer

from rayship.validation import SpecError, parse_trainingjob
from rayship_workloads import data, models, progress, recipes, storage, strategies

ENV_TRAININGJOB = "RAYSHIP_TRAININGJOB"


@dataclass
class Outcome:
    run_name: str
    storage_root: str
    latest: str | None
    best: str | None
    model_uri: str | None
    best_model_uri: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def load_spec(value: str) -> dict[str, Any]:
    """A TrainingJob from a JSON string (the RayJob entrypoint) or a YAML/JSON file, validated; the
    resolved wire dict."""
    from rayship import yamlio

    doc = json.loads(value) if value.lstrip().startswith("{") else yamlio.load(Path(value).read_text())
    tj = parse_trainingjob(doc)
    resolved = tj.model_dump(mode="json", by_alias=True, exclude_none=True)
    resolved.pop("status", None)
    return resolved


def run_name(doc: dict[str, Any]) -> str:
    """Stable per TrainingJob: a retry (new process, same storage) finds its checkpoints again."""
    meta = doc["metadata"]
    return f"{meta['namespace']}.{meta['name']}" if meta.get("namespace") else meta["name"]


def storage_root(spec: dict[str, Any]) -> str:
    store = spec["checkpoint"]["storage"]
    return store["pvc"]["mountPath"] if "pvc" in store else store["uri"]


def build_trainer(
    doc: dict[str, Any],
    *,
    storage_override: str | None = None,
    metrics_path: str | None = None,
    trainingjob: str | None = None,
    echo: bool = True,
    quiet: bool = False,
    name: str | None = None,
    extra_callbacks: Sequence[ray.train.UserCallback] = (),
) -> tuple[TorchTrainer, dict[str, Any]]:
    """The TorchTrainer for a resolved TrainingJob, and the context the export step needs."""
    spec = doc["spec"]
    trainer_spec, workers = spec["trainer"], spec["workers"]
    user_config = dict(trainer_spec.get("config") or {})
    dataset, context = prepare(doc, storage_override=storage_override, name=name)
    root = context["storage_root"]
    gpus = workers["gpusPerWorker"]
    resources = {"CPU": 1, "GPU": gpus} if gpus else {"CPU": 1}  # CPUs left over feed Ray Data
    trainer = TorchTrainer(
        recipes.resolve(trainer_spec),
        train_loop_config={**user_config, "rayship": context},
        scaling_config=ray.train.ScalingConfig(
            num_workers=workers["replicas"], use_gpu=gpus > 0, resources_per_worker=resources
        ),
        run_config=ray.train.RunConfig(
            name=name or run_name(doc),
            storage_path=root,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=spec["checkpoint"]["keep"]),
            failure_config=ray.train.FailureConfig(max_failures=spec["failurePolicy"]["maxWorkerFailures"]),
            logging_config=ray.train.LoggingConfig(log_level="WARNING") if quiet else None,
            callbacks=[
                progress.ProgressCallback(
                    epochs=trainer_spec["epochs"],
                    storage_root=root,
                    metrics_path=metrics_path,
                    trainingjob=trainingjob,
                    echo=echo,
                ),
                *extra_callbacks,
            ],
        ),
        datasets={"train": dataset},
    )
    return trainer, context


def prepare(
    doc: dict[str, Any], *, storage_override: str | None = None, name: str | None = None
) -> tuple[ray.data.Dataset, dict[str, Any]]:
    """The training data and what the loops and the export need: feature columns, model config,
    storage root and run name."""
    spec = doc["spec"]
    user_config = dict(spec["trainer"].get("config") or {})
    kind = recipes.DATA_KIND.get(spec["trainer"].get("recipe") or "", "tabular")
    dataset = data.load(spec["data"], kind=kind, config=user_config)
    context: dict[str, Any] = {"spec": spec}
    if kind == "tabular":
        context["features"] = data.feature_columns(dataset, user_config)
        context["model_config"] = recipes.mlp_config(len(context["features"]), user_config)
    else:
        context["model_config"] = recipes.causal_lm_config(user_config)
    context["storage_root"] = storage_override or storage_root(spec)
    context["run_name"] = name or run_name(doc)
    return dataset, context


def export(
    checkpoint: ray.train.Checkpoint | None, doc: dict[str, Any], context: dict[str, Any], name: str = "model"
) -> str | None:
    """Write the model of `checkpoint` in the serving layout next to the checkpoints; its URI (None
    for bring-your-own loops, whose checkpoint format rayship does not know)."""
    spec = doc["spec"]
    recipe = spec["trainer"].get("recipe")
    if checkpoint is None or recipe is None:
        return None
    target = storage.join(context["storage_root"], context["run_name"], name)
    with checkpoint.as_directory() as directory, tempfile.TemporaryDirectory() as tmp:
        state = strategies.full_state_dict(Path(directory), spec["trainer"]["strategy"])
        if recipe == "mlp":
            models.export_mlp(Path(tmp), context["model_config"], state, features=context["features"])
        else:
            export_causal_lm(Path(tmp), context["model_config"], state)
        storage.upload_dir(Path(tmp), target)
    return target


def export_causal_lm(directory: Path, model_config: dict[str, Any], state: dict[str, Any]) -> None:
    """A Hugging Face save_pretrained() directory plus the rayship manifest (and tokenizer, if any)."""
    model = recipes.build_causal_lm(model_config)
    loaded = model.load_state_dict(state, strict=False)  # tied weights (lm_head = embeddings) are stored once
    missing = [k for k in loaded.missing_keys if not k.startswith("lm_head.")]
    if missing or loaded.unexpected_keys:
        raise ValueError(
            f"checkpoint does not match the model: missing {missing}, unexpected {loaded.unexpected_keys}"
        )
    model.save_pretrained(str(directory))
    if "model_path" in model_config:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(model_config["model_path"], local_files_only=True).save_pretrained(
            str(directory)
        )
        models.write_manifest(directory, "causal-lm", model_config, tokenizer="pretrained")
    else:
        models.write_manifest(directory, "causal-lm", model_config, tokenizer="bytes")


def best_checkpoint(result: ray.train.Result) -> ray.train.Checkpoint | None:
    """The kept checkpoint with the lowest reported loss."""
    scored = [
        (m["loss"], c) for c, m in result.best_checkpoints or [] if isinstance(m.get("loss"), int | float)
    ]
    return min(scored, key=lambda s: s[0])[1] if scored else None


def train(doc: dict[str, Any], **options: Any) -> Outcome:
    trainer, context = build_trainer(doc, **options)
    result = trainer.fit()
    root = context["storage_root"]
    latest = progress.checkpoint_uri(result.checkpoint, root) if result.checkpoint else None
    best = best_checkpoint(result)
    model_uri = export(result.checkpoint, doc, context)
    if best is None or result.checkpoint is None or best.path == result.checkpoint.path:
        best_model_uri = model_uri
    else:
        best_model_uri = export(best, doc, context, name="model-best")
    return Outcome(
        run_name=run_name(doc),
        storage_root=root,
        latest=latest,
        best=progress.checkpoint_uri(best, root) if best else None,
        model_uri=model_uri,
        best_model_uri=best_model_uri,
        metrics=dict(result.metrics or {}),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rayship_workloads.train", description=__doc__)
    parser.add_argument("--spec", required=True, help="TrainingJob as JSON, or a YAML/JSON file")
    args = parser.parse_args(argv)
    try:
        doc = load_spec(args.spec)
    except (SpecError, OSError, ValueError) as err:
        print(f"error: invalid TrainingJob: {err}", file=sys.stderr)
        return 1
    try:
        return run(doc, os.environ.get(ENV_TRAININGJOB))
    except data.DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def run(doc: dict[str, Any], trainingjob: str | None) -> int:
    """Train (or tune) a resolved TrainingJob; report the outcome to its status in the cluster."""
    status: dict[str, Any] = {}
    if doc["spec"].get("tuning"):
        from rayship_workloads import tune

        found = tune.search(doc)
        summary = {"best": found.best_checkpoint, "model": found.model_uri, "bestModel": found.model_uri}
        status["tuning"] = {
            "trials": found.trials,
            "bestTrial": found.best_trial,
            "bestMetric": found.best_metric,
            "bestConfig": found.best_config,
        }
    else:
        outcome = train(doc, trainingjob=trainingjob)
        summary = {
            "latest": outcome.latest,
            "best": outcome.best,
            "model": outcome.model_uri,
            "bestModel": outcome.best_model_uri,
        }
    print(f"[rayship] done: {json.dumps({**summary, **status})}", flush=True)
    if trainingjob:
        status["checkpoint"] = {k: v for k, v in summary.items() if v}
        progress.TrainingJobStatus(trainingjob).patch(status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
