"""The recipe registry: one `Recipe` record per built-in `trainer.recipe`, and bring-your-own train
loops (`trainer.entrypoint: module:function`).

A recipe is everything rayship knows about one kind of model:
- `data_kind`: the data it trains on (`data.load`: tabular rows, or a text column);
- `model_setup`: its model config, worked out from the data and `trainer.config`;
- `loop`: its Ray Train `train_loop_per_worker`;
- `export`: its weights in the serving layout (`models.export` adds the manifest);
- `load`: that model back, ready to serve (`models.load`, used by `serve`).

Adding a recipe: write those here, add its `Recipe` to `RECIPES`, and add its name to
`TrainerSpec.recipe` in `operator/rayship/api/trainer.py`. Nothing else names a recipe.

Every loop receives `config` = the TrainingJob's `trainer.config`, the common hyperparameters from
the trainer fields (`lr` and `learningRate`, `batch_size`, `epochs`), and a `rayship` key: the resolved
spec in its camelCase wire form (`spec`; its `env[].value`s read `***`: they are in the process
environment, and the spec is not a place for secrets), the model config (`model_config`) and the setup's extras
(e.g. the feature columns), `storage_root` and `run_name`. Own loops get the same, with the data as
written (`own_loop_setup`: its `columns`). The dataset shards are `train` and, with `data.validation`,
`validation`. The loops mark their Ray steps `# [1] prepare data ... # [4] report`.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import ray.data
import ray.train
import ray.train.torch
import torch
import torch.nn.functional as F  # noqa: N812
from ray.data.collate_fn import NumpyBatchCollateFn
from torch import nn

from rayship import api
from rayship_workloads import data, integrity, podlog, progress, storage, strategies
from rayship_workloads.strategies import Strategy

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


# --- what every loop shares ---------------------------------------------------------------------


def loop_spec(config: Mapping[str, Any]) -> api.TrainingJobSpec:
    """The TrainingJob spec a loop was handed (`config["rayship"]["spec"]`, wire form), typed. The
    driver has validated it for where it runs; here the rules only a cluster needs are left out."""
    return api.TrainingJobSpec.model_validate(config["rayship"]["spec"], context={"local": True})


def checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch:05d}"


@dataclass(frozen=True)
class Run:
    """Where a loop's checkpoints live (`config["rayship"]`): what it may load, and its key (`integrity`).
    `handoff`: under PBT, the checkpoint another trial of the same job hands this one (`{"path",
    "job_run", "results"}`: Tune's copy, the job's run name, its Tune results directory)."""

    storage_root: str
    run_name: str
    handoff: Mapping[str, str] | None = None
    learning_rate: float | None = None  # this run's (`lr`): a handed-over optimizer state gets it

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Run:
        rayship = config["rayship"]
        return cls(rayship["storage_root"], rayship["run_name"], rayship.get("handoff"), config.get("lr"))

    def key(self) -> bytes:
        return integrity.load_key(self.storage_root, self.run_name)


@dataclass(frozen=True)
class Start:
    """Where a loop starts: the epoch and step of the checkpoint it resumed (0, 0 when fresh), and,
    for a checkpoint handed over by another trial (PBT), what it was signed as (`<run>/<checkpoint>`)."""

    epoch: int = 0
    step: int = 0
    handed_from: str | None = None
    early_stopping: Mapping[str, Any] | None = None  # `EarlyStopping.state()` as the checkpoint saved it


class Checkpointer(Protocol):
    """What `resume` and `report` need of a strategy (or of the Hugging Face Trainer engine)."""

    name: str

    def save(self, directory: Path) -> None: ...
    def load(self, directory: Path) -> None: ...
    def set_learning_rate(self, lr: float) -> None: ...


def _load(strategy: Checkpointer, directory: Path) -> Start:
    strategy.load(directory)
    state = json.loads((directory / STATE).read_text())
    return Start(int(state["epoch"]), int(state["step"]), early_stopping=state.get(EARLY_STOPPING))


def resume(strategy: Checkpointer, run: Run) -> Start:
    """The latest checkpoint of this run, after verifying (`integrity`: under this run's storage,
    every file as this run signed it) and loading it; else the checkpoint another trial handed this
    one (`integrity.verify_handoff`); else a fresh start."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        integrity.check_inside(checkpoint.path, run.storage_root, run.run_name)
        with checkpoint.as_directory() as directory:
            name = Path(checkpoint.path).name
            integrity.verify(Path(directory), run.key(), run=run.run_name, name=name)
            return _load(strategy, Path(directory))
    if run.handoff is None:
        return Start()
    path = run.handoff["path"]
    fs, fs_path = storage.filesystem(path)
    with ray.train.Checkpoint(fs_path, filesystem=fs).as_directory() as directory:
        signer = integrity.verify_handoff(
            Path(directory),
            path,
            storage_root=run.storage_root,
            job_run=run.handoff["job_run"],
            results=run.handoff["results"],
        )
        loaded = _load(strategy, Path(directory))
    if run.learning_rate is not None:
        strategy.set_learning_rate(float(run.learning_rate))
    return Start(
        loaded.epoch, loaded.step, handed_from=signer
    )  # the trial's own early stopping starts afresh


def report(
    strategy: Checkpointer,
    run: Run,
    *,
    epoch: int,
    step: int,
    metrics: dict[str, Any],
    save: bool,
    early_stopping: EarlyStopping | None = None,
) -> None:
    """Report this epoch's metrics from every rank, with a checkpoint when `save` (each rank's files
    and, last, its signed digest; its state says where early stopping stood)."""
    context = ray.train.get_context()
    rank = context.get_world_rank()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if save:
            strategy.save(Path(tmp))
            if rank == 0:
                state: dict[str, Any] = {"epoch": epoch, "step": step, "strategy": strategy.name}
                if early_stopping is not None:
                    state[EARLY_STOPPING] = early_stopping.state()
                (Path(tmp) / STATE).write_text(json.dumps(state))
            integrity.sign(
                Path(tmp),
                run.key(),
                run=run.run_name,
                name=checkpoint_name(epoch),
                rank=rank,
                world_size=context.get_world_size(),
            )
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(
            {"epoch": epoch, "step": step, **metrics},
            checkpoint=checkpoint,
            checkpoint_dir_name=checkpoint_name(epoch) if save else None,
        )


EVAL_LOSS = "evalLoss"
Evaluation = Callable[[], dict[str, float]]


def validation_shard(spec: api.TrainingJobSpec) -> Any:
    """This worker's shard of the `validation` dataset (with `data.validation`), else None."""
    return ray.train.get_dataset_shard("validation") if spec.data.validation is not None else None


def global_mean(total: float, count: int) -> float | None:
    """total/count summed over every rank (the same value on each); None if no rank had a row."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        both = torch.tensor([total, float(count)], dtype=torch.float64)
        dist.all_reduce(both)
        total, count = float(both[0]), int(both[1])
    return total / count if count else None


def evaluation(
    strategy: Strategy, batch_losses: Callable[[], Iterator[tuple[torch.Tensor, int]]], *, perplexity: bool
) -> Evaluation:
    """Evaluate the model on the validation shard: `evalLoss` (mean over every rank's rows), and
    `perplexity` = exp(evalLoss) for language models. `batch_losses` yields (mean loss, rows)."""

    def evaluate() -> dict[str, float]:
        strategy.model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for loss, rows in batch_losses():
                total, count = total + float(loss) * rows, count + rows
        strategy.model.train()
        mean = global_mean(total, count)
        if mean is None:
            return {}
        return (
            {EVAL_LOSS: mean, "perplexity": math.exp(min(mean, 700.0))} if perplexity else {EVAL_LOSS: mean}
        )

    return evaluate


def job_metric(spec: api.TrainingJobSpec) -> tuple[str, str]:
    """(metric, mode) by which the job judges its epochs (the best checkpoint, early stopping):
    checkpoint.metric/mode, by default evalLoss with data.validation, else loss; min."""
    default = EVAL_LOSS if spec.data.validation is not None else "loss"
    return spec.checkpoint.metric or default, spec.checkpoint.mode or "min"


EARLY_STOPPING = "earlyStopping"  # its state in a checkpoint's rayship-state.json
STOPPED_EARLY = progress.STOPPED_EARLY


@dataclass
class EarlyStopping:
    """`trainer.earlyStopping` over the job's metric (`job_metric`): stop once it has not improved
    on its best by more than `min_delta` for `patience` epochs. Every rank decides alike: the metric
    is averaged over the ranks first. Its state travels in the checkpoints, so a resumed run goes on
    counting (and one that had stopped trains no further)."""

    metric: str
    mode: str
    patience: int
    min_delta: float
    best: float | None = None
    wait: int = 0
    stopped: bool = False

    @classmethod
    def of(cls, spec: api.TrainingJobSpec, start: Start) -> EarlyStopping | None:
        rule = spec.trainer.early_stopping
        if rule is None:
            return None
        metric, mode = job_metric(spec)
        saved = start.early_stopping or {}
        best = saved.get("best")
        return cls(
            metric,
            mode,
            rule.patience,
            rule.min_delta,
            best=None if best is None else float(best),
            wait=int(saved.get("wait", 0)),
            stopped=bool(saved.get("stopped", False)),
        )

    def update(self, metrics: Mapping[str, Any]) -> bool:
        """Take this epoch's metrics; whether training stops after it."""
        value = metrics.get(self.metric)
        if isinstance(value, bool) or not isinstance(value, int | float):
            reported = ", ".join(sorted(k for k, v in metrics.items() if isinstance(v, float)))
            raise ValueError(
                f"checkpoint.metric: {self.metric!r} is not reported by this job (it reports {reported}); "
                "trainer.earlyStopping watches it: set checkpoint.metric to one of those"
            )
        mean = global_mean(float(value), 1)
        current = math.nan if mean is None else mean
        if self.best is None:
            improved = not math.isnan(current)
        elif self.mode == "min":
            improved = current < self.best - self.min_delta
        else:
            improved = current > self.best + self.min_delta
        if improved:
            self.best, self.wait = current, 0
        else:
            self.wait += 1
        self.stopped = self.wait >= self.patience
        return self.stopped

    def state(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "stopped": self.stopped}


def run_epochs(
    strategy: Strategy,
    spec: api.TrainingJobSpec,
    run: Run,
    *,
    start: Start,
    losses: Callable[[], Iterator[torch.Tensor]],
    on_epoch_end: EpochHook | None,
    evaluate: Evaluation | None = None,
) -> None:
    """The epochs after `start.epoch`: a step per batch loss, then (with `evaluate`) the validation
    metrics, then a report (mean loss over the epoch; `resumed_from_epoch`, and `handed_from` for a
    checkpoint another trial handed over), with a checkpoint every `checkpoint.everyEpochs` epochs
    and after the last one."""
    epochs, every, step = spec.trainer.epochs, spec.checkpoint.every_epochs, start.step
    context = ray.train.get_context()
    rank = context.get_world_rank()
    podlog.worker_started(rank, context.get_world_size(), start.epoch)
    stopping = EarlyStopping.of(spec, start)
    if stopping is not None and stopping.stopped:
        return  # this run had stopped early before it was resumed: nothing is left to train
    for epoch in range(start.epoch + 1, epochs + 1):
        total, batches = 0.0, 0
        for loss in losses():
            strategy.step(loss)
            total, batches, step = total + loss.item(), batches + 1, step + 1
        metrics: dict[str, Any] = {"loss": total / max(batches, 1), "resumed_from_epoch": start.epoch}
        if start.handed_from is not None:
            metrics["handed_from"] = start.handed_from
        if evaluate is not None:
            metrics.update(evaluate())
        stop = stopping is not None and stopping.update(metrics) and epoch < epochs
        if stop:
            metrics[STOPPED_EARLY] = True
        save = epoch % every == 0 or epoch == epochs or stop
        report(strategy, run, epoch=epoch, step=step, metrics=metrics, save=save, early_stopping=stopping)
        podlog.say(f"rank {rank} epoch {epoch}/{epochs} loss {metrics['loss']:.6g}")
        if on_epoch_end is not None:
            on_epoch_end(epoch)
        if stop:
            return


# --- mlp: tabular regression ---------------------------------------------------------------------

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

    # [3] resume from the latest checkpoint, if this run has one
    start = resume(strategy, Run.of(config))

    # [4] train, evaluate on the validation shard (with data.validation), and report every epoch
    # (checkpointing every `everyEpochs` and at the end)
    def batch_losses(source: Any) -> Iterator[tuple[torch.Tensor, int]]:
        collate = FeaturesAndLabel(features, label)
        for x, y in source.iter_torch_batches(batch_size=batch_size, collate_fn=collate):
            x, y = x.to(device, strategy.dtype), y.to(device)
            yield F.mse_loss(strategy.model(x).float(), y), len(y)

    validation = validation_shard(spec)
    run_epochs(
        strategy,
        spec,
        Run.of(config),
        start=start,
        losses=lambda: (loss for loss, _ in batch_losses(shard)),
        on_epoch_end=on_epoch_end,
        evaluate=None
        if validation is None
        else evaluation(strategy, lambda: batch_losses(validation), perplexity=False),
    )


def export_mlp(directory: Path, setup: ModelSetup, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    torch.save({k: v.detach().cpu() for k, v in state.items()}, directory / MLP_WEIGHTS)
    return dict(setup.extra)  # the feature columns, in the order the model takes them


def load_mlp(directory: Path, manifest: dict[str, Any]) -> Servable:
    model = build_mlp(manifest["config"])
    model.load_state_dict(torch.load(directory / MLP_WEIGHTS, map_location="cpu", weights_only=True))
    return Servable(model, inputs=int(manifest["config"]["in_features"]))


# --- causal-lm: a Hugging Face AutoModelForCausalLM ----------------------------------------------
# On a cluster, `config.model_path` names a local/PVC directory (from_pretrained, its own tokenizer);
# otherwise `config.model_config` updates `api.CAUSAL_LM_MODEL_CONFIG`, a model built from a config
# (from_config) on byte tokens: UTF-8 bytes, 256 = end of text, 257 = padding (`byte_tokenizer` is
# that scheme as a Hugging Face tokenizer). Exported as a save_pretrained() directory with its
# tokenizer, loaded with from_pretrained (and AutoTokenizer).


def causal_lm_config(config: Mapping[str, Any]) -> dict[str, Any]:
    if config.get("model_path"):
        return {"model_path": str(config["model_path"])}
    return {"model_config": {**api.CAUSAL_LM_MODEL_CONFIG, **(config.get("model_config") or {})}}


def byte_tokenizer() -> Any:
    """The byte tokens as a Hugging Face fast tokenizer (`transformers.PreTrainedTokenizerFast`): a
    byte-level BPE without merges whose vocabulary maps each byte's GPT-2 symbol to the byte's value,
    plus the end-of-text (also beginning) and padding tokens; `encode` adds no special tokens, so
    `encode(text)` is `list(text.encode("utf-8"))` and `decode` is its inverse."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = bytes_to_unicode()
    eos, pad = "<|endoftext|>", "<|pad|>"
    vocab = {symbols[b]: b for b in range(256)} | {eos: api.BYTE_EOS, pad: api.BYTE_PAD}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=eos,
        eos_token=eos,
        pad_token=pad,
        clean_up_tokenization_spaces=False,
    )


def causal_lm_setup(dataset: ray.data.Dataset, config: Mapping[str, Any]) -> ModelSetup:
    return ModelSetup(causal_lm_config(config))


def build_causal_lm(model_config: Mapping[str, Any]) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    if "model_path" in model_config:
        return AutoModelForCausalLM.from_pretrained(model_config["model_path"], local_files_only=True)
    settings = dict(model_config["model_config"])
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(settings.pop("model_type"), **settings))


def max_length(config: Mapping[str, Any]) -> int:
    """`trainer.config.max_length`: tokens per training sequence (the API checked it)."""
    return int(config.get("max_length", api.CAUSAL_LM_MAX_LENGTH))


def check_positions(model: Any, max_length: int) -> None:
    """A sequence of `max_length` tokens fits the model's position embedding (the API checks what a
    config says; a `model_path` model is known only here)."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(positions, int) and max_length > positions:
        raise ValueError(
            f"trainer.config.max_length: {max_length} tokens do not fit the model's {positions} positions "
            f"(its max_position_embeddings); set max_length <= {positions}"
        )


class Tokens:
    """Batches of text -> (input_ids, attention_mask, labels): bytes, or the model's own tokenizer."""

    def __init__(self, model_config: Mapping[str, Any], max_length: int):
        self.max_length = max_length
        self.tokenizer: Any = None
        if "model_path" in model_config:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model_config["model_path"], local_files_only=True)
            if self.tokenizer.pad_token is None:
                self.tokenizer.pad_token = self.tokenizer.eos_token

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        if self.tokenizer is not None:
            enc = self.tokenizer(
                texts, max_length=self.max_length, truncation=True, padding="max_length", return_tensors="pt"
            )
            ids, mask = enc["input_ids"], enc["attention_mask"]
        else:
            rows = [list(t.encode("utf-8"))[: self.max_length - 1] + [api.BYTE_EOS] for t in texts]
            ids = torch.full((len(rows), self.max_length), api.BYTE_PAD, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, row in enumerate(rows):
                ids[i, : len(row)] = torch.tensor(row)
                mask[i, : len(row)] = 1
        labels = ids.masked_fill(mask == 0, -100)  # no loss on padding
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def causal_lm_loop(config: dict[str, Any], on_epoch_end: EpochHook | None = None) -> None:
    """Next-token prediction on a `text` column (`config.engine: hf-trainer` runs `hf_trainer.loop`
    instead: `train.loop_for` picks it)."""
    rayship = config["rayship"]
    spec = loop_spec(config)
    batch_size = spec.trainer.batch_size_per_worker
    device = ray.train.torch.get_device()
    tokens = Tokens(rayship["model_config"], max_length(config))

    # [1] prepare data: this worker's shard of the text dataset
    shard = ray.train.get_dataset_shard("train")

    # [2] prepare the model: DDP, DeepSpeed or FSDP
    torch.manual_seed(data.seed(config))
    model = build_causal_lm(rayship["model_config"])
    check_positions(model, tokens.max_length)
    strategy = strategies.create(spec.trainer, model)

    # [3] resume from the latest checkpoint, if this run has one
    start = resume(strategy, Run.of(config))

    # [4] train, evaluate on the validation shard (with data.validation), and report every epoch
    def batch_losses(source: Any) -> Iterator[tuple[torch.Tensor, int]]:
        for batch in source.iter_batches(batch_size=batch_size, batch_format="numpy"):
            inputs = {k: v.to(device) for k, v in tokens([str(t) for t in batch[data.TEXT]]).items()}
            yield strategy.model(**inputs).loss, int((inputs["labels"] != -100).sum())

    validation = validation_shard(spec)
    run_epochs(
        strategy,
        spec,
        Run.of(config),
        start=start,
        losses=lambda: (loss for loss, _ in batch_losses(shard)),
        on_epoch_end=on_epoch_end,
        evaluate=None
        if validation is None
        else evaluation(strategy, lambda: batch_losses(validation), perplexity=True),
    )


def export_causal_lm(directory: Path, setup: ModelSetup, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A Hugging Face save_pretrained() directory (and the tokenizer, for `model_path`)."""
    model = build_causal_lm(setup.config)
    loaded = model.load_state_dict(state, strict=False)  # tied weights (lm_head = embeddings) are stored once
    missing = [k for k in loaded.missing_keys if not k.startswith("lm_head.")]
    if missing or loaded.unexpected_keys:
        raise ValueError(
            f"checkpoint does not match the model: missing {missing}, unexpected {loaded.unexpected_keys}"
        )
    model.save_pretrained(str(directory))
    if "model_path" in setup.config:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(setup.config["model_path"], local_files_only=True)
    else:
        tokenizer = byte_tokenizer()
    tokenizer.save_pretrained(str(directory))  # AutoTokenizer.from_pretrained(<the model>) works
    return {"tokenizer": "pretrained"}


class ByteTokenizer:
    """`"tokenizer": "bytes"` (a model saved without a tokenizer, e.g. by `models.save_model`): UTF-8
    bytes are the token ids; ids >= 256 are special and decode to nothing."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class PretrainedTokenizer:
    """`"tokenizer": "pretrained"`: the Hugging Face tokenizer saved in the model directory."""

    def __init__(self, directory: Path) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))


class CausalLMGenerator:
    """Greedy decoding with a Hugging Face causal LM and its tokenizer (on the model's device)."""

    def __init__(self, model: Any, tokenizer: ByteTokenizer | PretrainedTokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_positions: int | None = getattr(model.config, "max_position_embeddings", None)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """The ids greedy decoding appends to `ids`."""
        input_ids = torch.tensor([ids], device=next(self.model.parameters()).device)
        config = self.model.config
        pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
        with torch.no_grad():
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        return list(output[0, len(ids) :].tolist())


def load_causal_lm(directory: Path, manifest: dict[str, Any]) -> Servable:
    from transformers import AutoModelForCausalLM

    kind = manifest.get("tokenizer", "pretrained")
    tokenizer: ByteTokenizer | PretrainedTokenizer
    if kind == "bytes":
        tokenizer = ByteTokenizer()
    elif kind == "pretrained":
        tokenizer = PretrainedTokenizer(directory)
    else:
        raise ValueError(
            f"{directory}: unknown tokenizer {kind!r} in the manifest; expected 'bytes' or 'pretrained'"
        )
    model = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True)
    return Servable(model, generator=CausalLMGenerator(model, tokenizer))


# --- the registry ----------------------------------------------------------------------------------

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
