"""TrainingJob `spec.trainer`: the recipe or your own loop, its strategy (DDP, DeepSpeed ZeRO, FSDP),
early stopping and experiment tracking."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from rayship.api.common import ENTRYPOINT_PATTERN, ApiModel, CelRule, uri_rules

# --- TrainingJob spec --------------------------------------------------------------------------


class DeepSpeedSpec(ApiModel):
    """DeepSpeed ZeRO settings (only with strategy: deepspeed)."""

    cel_rules: ClassVar = (
        CelRule(
            "!self.offloadParams || self.zeroStage == 3",
            "offloadParams needs zeroStage 3 (only ZeRO-3 partitions parameters): "
            "set zeroStage: 3 or offloadParams: false",
        ),
    )
    zero_stage: Literal[1, 2, 3] = Field(
        2, description="ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters."
    )
    offload_optimizer: bool = Field(False, description="Keep optimizer state in CPU memory.")
    offload_params: bool = Field(False, description="Keep parameters in CPU memory (ZeRO-3 only).")
    precision: Literal["fp32", "fp16", "bf16"] = Field("bf16", description="Training precision.")


class FsdpSpec(ApiModel):
    """PyTorch FSDP2 settings (only with strategy: fsdp): parameters, gradients and optimizer state
    sharded across the workers (`torch.distributed.fsdp.fully_shard`)."""

    precision: Literal["fp32", "fp16", "bf16"] = Field(
        "bf16",
        description="Compute precision of parameters in forward and backward (gradients are reduced and "
        "the optimizer steps in fp32; `rayship run` on CPUs trains fp16 as fp32).",
    )
    reshard_after_forward: bool = Field(
        True,
        description="Free the gathered parameters after forward and gather them again for backward (less "
        "memory, like ZeRO-3); false keeps them until backward (like ZeRO-2).",
    )
    offload_params: bool = Field(
        False, description="Keep the sharded parameters, gradients and optimizer state in CPU memory."
    )


class EarlyStoppingSpec(ApiModel):
    """Stop training when the job's metric (checkpoint.metric/mode: by default evalLoss with
    data.validation, else loss) has not improved for `patience` epochs."""

    patience: int = Field(
        ..., ge=1, le=100_000, description="Epochs in a row without an improvement before training stops."
    )
    min_delta: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="How much the metric must improve on its best so far to count as an improvement.",
    )


class MlflowTracking(ApiModel):
    """MLflow experiment tracking: one MLflow run per TrainingJob (found again by its `rayship.uid`
    tag, so a retried or resumed job goes on logging to it; one run per trial with spec.tuning), with
    the trainer's settings as params, every epoch's metrics, and the checkpoint and model URIs."""

    cel_rules: ClassVar = (
        *uri_rules("trackingUri", "tracking.mlflow.trackingUri"),
        CelRule(
            "has(self.trackingUri)",
            "tracking.mlflow.trackingUri is required in a cluster (http(s)://your-mlflow-server); "
            "`rayship run` without it keeps a SQLite store beside the run",
            cluster_only=True,
        ),
    )
    tracking_uri: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        pattern=r"^(https?|file|sqlite|databricks)://.*",
        description="The MLflow tracking server (http(s)://...). Credentials by reference: spec.env from a "
        "Secret (MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD). "
        "`rayship run` without it: a SQLite store under ./rayship-runs (mlflow.db).",
    )
    experiment: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="MLflow experiment (created if missing); default: rayship-<namespace>.",
    )


class TrackingSpec(ApiModel):
    """Experiment tracking."""

    mlflow: MlflowTracking | None = Field(None, description="Log params, metrics and the model to MLflow.")


# Keys of every loop's config that come from the trainer's fields (loop key -> trainer field).
LOOP_HYPERPARAMETERS = {
    "lr": "learningRate",
    "learningRate": "learningRate",
    "batch_size": "batchSizePerWorker",
    "epochs": "epochs",
}


# trainer.config.engine of the causal-lm recipe: its own loop, or the Hugging Face Trainer.
CAUSAL_LM_ENGINES = ("loop", "hf-trainer")

# The causal-lm recipe's model without `trainer.config.model_path`: this Hugging Face config, updated
# by `trainer.config.model_config`, on byte tokens (UTF-8 bytes 0-255, 256 = beginning and end of
# text, 257 = padding; the exported model carries them as a Hugging Face tokenizer).
BYTE_EOS, BYTE_PAD, BYTE_VOCAB = 256, 257, 260
CAUSAL_LM_MODEL_CONFIG: dict[str, Any] = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 32,
    "n_positions": 128,
    "vocab_size": BYTE_VOCAB,
    "bos_token_id": BYTE_EOS,
    "eos_token_id": BYTE_EOS,
    "pad_token_id": BYTE_PAD,
}
CAUSAL_LM_MAX_LENGTH = 64  # trainer.config.max_length's default: tokens per training sequence


def causal_lm_positions(config: dict[str, Any]) -> tuple[int, str] | None:
    """(positions, the trainer.config key that sets them) of the causal-lm model a `trainer.config`
    builds from a config; None for `model_path` (known when it loads) or a size the config leaves to
    Hugging Face's defaults."""
    if config.get("model_path"):
        return None
    own = config.get("model_config")
    own = own if isinstance(own, dict) else {}
    merged = {**CAUSAL_LM_MODEL_CONFIG, **own}
    keys = ("n_positions", "max_position_embeddings", "n_ctx")
    if merged.get("model_type") != "gpt2":
        merged = own  # another architecture: only what the config says
    for key in keys:
        value = merged.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value, f"config.model_config.{key}"
    return None


class TrainerSpec(ApiModel):
    """What to train and how: a built-in recipe or your own train loop, and the parallel strategy."""

    cel_rules: ClassVar = (
        CelRule(
            "has(self.recipe) != has(self.entrypoint)",
            "set exactly one of recipe (built-in) or entrypoint (module:function)",
        ),
        CelRule(
            "!has(self.deepspeed) || self.strategy == 'deepspeed'",
            "deepspeed settings need strategy: deepspeed (or remove trainer.deepspeed)",
        ),
        CelRule(
            "!has(self.fsdp) || self.strategy == 'fsdp'",
            "fsdp settings need strategy: fsdp (or remove trainer.fsdp)",
        ),
        CelRule(
            "!has(self.earlyStopping) || has(self.recipe)",
            "earlyStopping applies to the built-in recipes; an own loop (entrypoint) stops when it returns: "
            "remove trainer.earlyStopping",
        ),
    )
    recipe: Literal["mlp", "causal-lm"] | None = Field(
        None, description="Built-in recipe: mlp (tabular) or causal-lm (Hugging Face causal LM)."
    )
    entrypoint: str | None = Field(
        None,
        pattern=ENTRYPOINT_PATTERN,
        description="Bring-your-own train_loop_per_worker as module:function, importable in the image.",
    )
    strategy: Literal["ddp", "deepspeed", "fsdp"] = Field(
        "ddp",
        description="ddp (PyTorch DistributedDataParallel), deepspeed (ZeRO) or fsdp (PyTorch FSDP2, "
        "sharded checkpoints).",
    )
    deepspeed: DeepSpeedSpec | None = Field(None, description="DeepSpeed ZeRO settings.")
    fsdp: FsdpSpec | None = Field(None, description="PyTorch FSDP2 settings.")
    early_stopping: EarlyStoppingSpec | None = Field(
        None,
        description="Stop before `epochs` when the job's metric stops improving (built-in recipes; the "
        "last epoch's checkpoint and model are kept as usual).",
    )
    epochs: int = Field(10, ge=1, le=100_000, description="Number of passes over the training data.")
    batch_size_per_worker: int = Field(64, ge=1, le=1_000_000, description="Batch size on each worker.")
    learning_rate: float = Field(1e-3, gt=0, le=10, description="Optimizer learning rate.")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Free-form settings handed to the train loop as-is, at the top level of its config "
        "(beside lr, learningRate, batch_size and epochs, which rayship sets from the fields above).",
    )

    @model_validator(mode="after")
    def _config_leaves_hyperparameters_to_their_fields(self) -> TrainerSpec:
        """The loop config's `lr`/`learningRate`/`batch_size`/`epochs` come from the trainer fields
        (so a search over learningRate reaches the loop): trainer.config may not set them too."""
        engine = self.config.get("engine")
        if engine is not None and (self.recipe != "causal-lm" or engine not in CAUSAL_LM_ENGINES):
            raise ValueError(
                f"config.engine: {engine!r} is not an engine of "
                f"{'recipe ' + self.recipe if self.recipe else 'an own loop'}; causal-lm runs on "
                f"{' or '.join(CAUSAL_LM_ENGINES)} (or remove config.engine)"
            )
        if engine == "hf-trainer" and self.strategy == "fsdp":
            raise ValueError(
                "strategy: fsdp runs on the causal-lm recipe's own loop, not on config.engine hf-trainer; "
                "remove config.engine (or use strategy ddp or deepspeed)"
            )
        if self.recipe == "causal-lm":
            self._check_max_length()
        taken = [k for k in LOOP_HYPERPARAMETERS if k in self.config]
        if taken:
            field = LOOP_HYPERPARAMETERS[taken[0]]
            raise ValueError(
                f"config.{taken[0]}: set by rayship from trainer.{field} (every loop gets lr, learningRate, "
                f"batch_size and epochs in its config); set trainer.{field} instead"
            )
        return self

    def _check_max_length(self) -> None:
        """causal-lm's `config.max_length` (tokens per sequence) fits the model's positions: a longer
        sequence fails in the model's position embedding, after the cluster has started."""
        max_length = self.config.get("max_length", CAUSAL_LM_MAX_LENGTH)
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"config.max_length: {max_length!r} is not a whole number of tokens >= 2")
        known = causal_lm_positions(self.config)
        if known is not None and max_length > known[0]:
            positions, key = known
            raise ValueError(
                f"config.max_length: {max_length} tokens do not fit the model's {positions} positions "
                f"({key}); set max_length <= {positions} (or raise {key.removeprefix('config.')})"
            )
