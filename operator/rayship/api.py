"""The `rayship.dev/v1alpha1` API: the single source of truth.

The pydantic models below define the custom resources. From them come:
- the CRDs (`rayship.generate`: structural OpenAPI schema with descriptions, defaults, CEL rules,
  printer columns), the chart's CRDs and `manifests/`;
- validation in `rayship render` and in the operator (the same CEL rules, evaluated with cel-python,
  so an error at `kubectl apply` and an error from the CLI say the same thing).

Field names are camelCase on the wire (aliases); Python code uses snake_case attributes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel

GROUP = "rayship.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# (group, version, plural) of every resource the operator reads or writes: each plural spelled once.
Resource = tuple[str, str, str]
KUBERAY_GROUP = "ray.io"
KUBERAY_VERSION = "v1"
RAYJOBS: Resource = (KUBERAY_GROUP, KUBERAY_VERSION, "rayjobs")
RAYSERVICES: Resource = (KUBERAY_GROUP, KUBERAY_VERSION, "rayservices")

# --- shared patterns ---------------------------------------------------------------------------

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# A label key / taint key: an optional DNS subdomain prefix and '/', then a name (Kubernetes'
# IsQualifiedName).
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
IMAGE_PATTERN = r"^\S+$"  # no whitespace anywhere: the kubelet cannot pull such a reference
# Memory: whole bytes (no milli-units such as 1m); bounds (>= 64Mi, < 8Ei) are CEL rules below.
MEMORY_PATTERN = r"^[0-9]+(\.[0-9]+)?(k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
MIN_MEMORY = "64Mi"
ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
# Ray >= 2.52.0: KubeRay v1.7 rejects token auth (which rayship always enables) on older Ray.
RAY_VERSION_PATTERN = r"^(2\.(5[2-9]|[6-9][0-9]|[1-9][0-9]{2,})|([3-9]|[1-9][0-9]+)\.[0-9]+)\.[0-9]+$"
INT32_MAX = 2**31 - 1  # KubeRay's int32 fields (activeDeadlineSeconds, ttlSecondsAfterFinished)
MAX_SPEC_BYTES = 64 * 1024  # the resolved spec travels in the RayJob's entrypoint and an annotation
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
# Environment variable names that say they hold a secret (RE2 and Python re alike): their values
# belong in a Secret (`env[].valueFrom.secretKeyRef`), never in the spec.
SECRET_NAME_PATTERN = r"(?i)(pass(word)?|secret|token|api_?key|access_?key|private_?key|credential)"
# runtimeEnv.workingDir in a cluster: a zip archive Ray downloads (a local folder only for `rayship run`).
WORKING_DIR_URI_PATTERN = r"^(s3|gs|https?)://.+[.]zip$"
# data.uri / data.validation.uri in a cluster: an absolute path (a mounted volume) or a URI (a
# relative path is read from runtimeEnv.workingDir, as `rayship run` reads it beside the YAML file).
DATA_URI_IN_CLUSTER_PATTERN = r"^(/|[a-z][a-z0-9+.-]*://)"


# --- CEL rules: written once, enforced by the API server and by pydantic -----------------------


@dataclass(frozen=True)
class CelRule:
    """A Kubernetes `x-kubernetes-validations` rule on the object it is attached to."""

    rule: str
    message: str
    # In the CRD (the cluster needs it) but not checked for local runs (`rayship run`), which
    # validate with `parse(doc, local=True)`.
    cluster_only: bool = False
    # False for the rare rule the API server's CEL cannot type-check (checked by rayship only).
    in_crd: bool = True

    def as_schema(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message}


def data_uri_rule(field: str) -> CelRule:
    """In a cluster, data is read from an absolute path (a mounted volume) or a URI; a relative path
    only from the job's own runtimeEnv.workingDir (as `rayship run` reads it beside the YAML file)."""
    parts = field.split(".")
    present = " && ".join(f"has(self.{'.'.join(parts[:i])})" for i in range(1, len(parts) + 1))
    return CelRule(
        "(has(self.runtimeEnv) && has(self.runtimeEnv.workingDir)) || "
        f"!({present}) || self.{field}.matches('{DATA_URI_IN_CLUSTER_PATTERN}')",
        f"{field}: in a cluster a relative path is read from runtimeEnv.workingDir, and there is none: "
        "use an absolute path (e.g. on the checkpoint volume) or a URI (s3://...)",
        cluster_only=True,
    )


def cel_holds(rule: str, value: Any) -> bool:
    """Evaluate a CEL rule with `self` bound to `value` (a JSON-like structure) as the API server
    does: a rule whose evaluation fails (e.g. a missing field) does not hold. cel-python is imported
    on the first rule evaluated (`rayship.cel`)."""
    from rayship import cel

    return cel.holds(rule, value)


class ApiModel(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields rejected, CEL rules checked."""

    # strict: like the API server, "yes" is not a boolean and "5" is not an integer
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", validate_default=True, strict=True)
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self, info: ValidationInfo) -> ApiModel:
        context = info.context or {}
        local, admitted = bool(context.get("local")), bool(context.get("admitted"))
        # `admitted`: read from the API server, which enforced the CRD's rules when it was written.
        rules = [r for r in self.cel_rules if not (local and r.cluster_only) and not (admitted and r.in_crd)]
        if rules:
            wire = self.model_dump(mode="json", by_alias=True, exclude_none=True)
            failed = [r.message for r in rules if not cel_holds(r.rule, wire)]
            if failed:
                raise ValueError("; ".join(failed))
        return self

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, defaults applied, no nulls."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def sub(model: type[BaseModel], description: str) -> Any:
    """A nested object field that defaults to the object of its own defaults: the API server checks
    a default against the object's CEL rules as it stands, so `{}` would fail rules on its fields."""

    def default(schema: dict[str, Any]) -> None:
        schema["default"] = model().model_dump(mode="json", by_alias=True, exclude_none=True)

    def factory() -> BaseModel:
        # The defaults' CEL rules are not evaluated: the API server checks the CRD's defaults
        # against them (and tests/unit/test_cel.py does too).
        return model.model_validate({}, context={"admitted": True})

    return Field(default_factory=factory, description=description, json_schema_extra=default)


# --- core-style building blocks ----------------------------------------------------------------


class Toleration(ApiModel):
    """A Kubernetes toleration (core/v1 Toleration) added to the worker pods."""

    cel_rules: ClassVar = (
        CelRule(
            "self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "operator Exists matches any value: remove value (or use operator Equal)",
        ),
        CelRule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds applies only to effect NoExecute",
        ),
        CelRule(
            "(has(self.key) && self.key != '') || self.operator == 'Exists'",
            "an empty key matches every taint only with operator Exists",
        ),
    )
    key: str | None = Field(
        None,
        pattern=QUALIFIED_NAME_PATTERN,
        max_length=316,
        description="Taint key the toleration applies to; empty matches all keys.",
    )
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(
        None,
        pattern=LABEL_VALUE_PATTERN,
        max_length=63,
        description="Taint value to match when operator is Equal.",
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None,
        ge=0,
        description="For NoExecute: how long the pod stays bound after the taint appears.",
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the TrainingJob's namespace."""

    name: str = Field(
        ..., pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=253, description="Name of the Secret."
    )
    key: str = Field(..., pattern=SECRET_KEY_PATTERN, max_length=253, description="Key within the Secret.")
    optional: bool | None = Field(None, description="Start even if the Secret or key is missing.")


class EnvValueFrom(ApiModel):
    """Where an environment value comes from. Only Secret references are allowed: no inline secrets."""

    secret_key_ref: SecretKeyRef = Field(..., description="Read the value from a Secret key.")


class EnvVar(ApiModel):
    """An environment variable for every Ray container: a plain value, or a Secret reference."""

    cel_rules: ClassVar = (
        CelRule("has(self.value) != has(self.valueFrom)", "set exactly one of value or valueFrom"),
    )
    name: str = Field(..., pattern=ENV_NAME_PATTERN, max_length=128, description="Variable name.")
    value: str | None = Field(None, description="Plain value (never a secret: use valueFrom).")
    value_from: EnvValueFrom | None = Field(None, description="Value from a Secret key.")


# Where GPU worker pods go: shared by TrainingJob workers and ModelService replicas.
GpuProduct = Annotated[
    str | None,
    Field(
        pattern=LABEL_VALUE_PATTERN,
        max_length=63,
        description="Required GPU model (value of the node label nvidia.com/gpu.product).",
    ),
]
NodeSelector = Annotated[
    dict[str, Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]],
    Field(default_factory=dict, max_length=64, description="Extra node labels the worker pods must match."),
]
# On every object with a nodeSelector: its keys must be label keys (values are checked by pattern).
NODE_SELECTOR_KEYS = CelRule(
    "!has(self.nodeSelector) || self.nodeSelector.all(k, k.size() <= 316 && k.matches('"
    + QUALIFIED_NAME_PATTERN.replace("\\", "\\\\")  # a CEL string literal: backslashes escaped
    + "'))",
    "nodeSelector keys must be label keys: [prefix/]name, name at most 63 letters, digits, '-', '_', '.'",
)


def cpu_rule(field: str) -> CelRule:
    """CPU of at least 1m, as CEL: the API server checks `minimum: 0.001` against an integer 0 as
    the integer minimum 0 (kube-openapi truncates it) and lets 0 through; CEL sees the double."""
    return CelRule(f"self.{field} >= 0.001", f"{field} must be at least 0.001 (1m): a pod needs some CPU")


def memory_rule(field: str) -> CelRule:
    return CelRule(
        f"quantity(self.{field}).compareTo(quantity('{MIN_MEMORY}')) >= 0 "
        f"&& quantity(self.{field}).isLessThan(quantity('8Ei'))",
        f"{field} must be at least {MIN_MEMORY} (Ray needs more) and below 8Ei",
    )


Tolerations = Annotated[
    list[Toleration],
    Field(default_factory=list, max_length=32, description="Extra tolerations for the worker pods."),
]


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


DATA_FORMATS = Literal["parquet", "csv", "jsonl"]


class ValidationDataSpec(ApiModel):
    """Held-out data evaluated after every epoch (`evalLoss`, and `perplexity` for causal-lm)."""

    cel_rules: ClassVar = (
        CelRule(
            "has(self.fraction) != has(self.uri)",
            "set exactly one of data.validation.fraction (a share of the training data) or data.validation.uri",
        ),
        CelRule("!has(self.format) || has(self.uri)", "data.validation.format applies only with uri"),
        CelRule(
            "!has(self.uri) || has(self.format) || self.uri.matches('[.](parquet|csv|jsonl)$')",
            "set data.validation.format (parquet, csv or jsonl): it cannot be inferred from the uri's extension",
        ),
    )
    fraction: float | None = Field(
        None,
        gt=0,
        le=0.5,
        allow_inf_nan=False,
        description="Hold out this share of the training data (seeded split), e.g. 0.1.",
    )
    uri: str | None = Field(
        None, min_length=1, description="Local/PVC path or s3:// URI of separate validation data."
    )
    format: DATA_FORMATS | None = Field(
        None, description="File format of uri; inferred from its extension when omitted."
    )


class DataSpec(ApiModel):
    """Training data, read through Ray Data and sharded across workers."""

    cel_rules: ClassVar = (
        CelRule(
            "(self.source == 'uri') == has(self.uri)",
            "data.uri is required when source is uri, and only then",
        ),
        CelRule(
            "!has(self.format) || self.source == 'uri'",
            "data.format applies only to source: uri",
        ),
        CelRule(
            "self.source != 'uri' || has(self.format) || !has(self.uri) || self.uri.matches('[.](parquet|csv|jsonl)$')",
            "set data.format (parquet, csv or jsonl): it cannot be inferred from the uri's extension",
        ),
    )
    source: Literal["synthetic", "uri"] = Field(
        "synthetic", description="synthetic (seeded, generated in the cluster) or uri."
    )
    uri: str | None = Field(
        None,
        min_length=1,
        description="Local/PVC path or s3:// URI of the training data (source: uri).",
    )
    format: DATA_FORMATS | None = Field(
        None, description="File format; inferred from the uri's extension when omitted."
    )
    samples: int = Field(4096, ge=1, le=100_000_000, description="Rows to generate (synthetic only).")
    validation: ValidationDataSpec | None = Field(
        None, description="Validation data, evaluated after every epoch: {fraction} or {uri, format}."
    )


class WorkersSpec(ApiModel):
    """The GPU worker group: one Ray Train worker per pod."""

    cel_rules: ClassVar = (NODE_SELECTOR_KEYS, cpu_rule("cpusPerWorker"), memory_rule("memoryPerWorker"))

    replicas: int = Field(1, ge=1, le=1024, description="Number of training workers (pods).")
    gpus_per_worker: int = Field(1, ge=0, le=16, description="GPUs per worker pod (0 trains on CPU).")
    cpus_per_worker: float = Field(
        4, ge=0.001, le=1024, description="CPU cores per worker pod (at least 1m)."
    )
    memory_per_worker: str = Field(
        "16Gi", pattern=MEMORY_PATTERN, description="Memory per worker pod (Kubernetes quantity)."
    )
    gpu_product: GpuProduct = None
    node_selector: NodeSelector
    tolerations: Tolerations


class HeadSpec(ApiModel):
    """The Ray head pod: coordinates the cluster and runs no training or Serve replicas (num-cpus 0,
    no GPU). A TrainingJob's and a ModelService's `spec.head`."""

    cel_rules: ClassVar = (cpu_rule("cpus"), memory_rule("memory"))
    cpus: float = Field(2, ge=0.001, le=1024, description="CPU cores for the head pod (at least 1m).")
    memory: str = Field("8Gi", pattern=MEMORY_PATTERN, description="Memory for the head pod.")


class PvcStorage(ApiModel):
    """A PersistentVolumeClaim mounted on every pod (ReadWriteMany for more than one node)."""

    cel_rules: ClassVar = (
        CelRule(
            "self.mountPath != '/' && self.mountPath != '/dev/shm' && !self.mountPath.startsWith('/dev/shm/')",
            "mountPath / and /dev/shm are taken (/dev/shm is the pods' shared memory): choose another path",
        ),
    )
    claim_name: str = Field(..., pattern=DNS1123_LABEL_PATTERN, max_length=253, description="PVC name.")
    mount_path: str = Field(
        "/mnt/checkpoints", pattern=r"^/.*", description="Where the PVC is mounted in every pod."
    )


class CheckpointStorage(ApiModel):
    """Where checkpoints live: a PVC or an object-store URI."""

    cel_rules: ClassVar = (
        CelRule("has(self.pvc) != has(self.uri)", "set exactly one of checkpoint.storage.pvc or .uri"),
    )
    pvc: PvcStorage | None = Field(None, description="A PersistentVolumeClaim mounted on every pod.")
    uri: str | None = Field(
        None,
        pattern=r"^(s3|gs|abfs|hdfs)://.+",
        description="Object-store URI (s3://, gs://, abfs://, hdfs://); credentials via env.",
    )


class CheckpointSpec(ApiModel):
    """Checkpointing: a retry or worker failure resumes from the latest checkpoint."""

    storage: CheckpointStorage | None = Field(
        None,
        description="Where checkpoints are written (required in a cluster; `rayship run` writes under "
        "./rayship-runs without it).",
    )
    keep: int = Field(3, ge=1, le=1000, description="How many checkpoints to keep.")
    every_epochs: int = Field(1, ge=1, le=100_000, description="Checkpoint every N epochs.")
    metric: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="Reported metric that picks the best checkpoint (status.checkpoint.best, bestModel); "
        "default evalLoss with data.validation, else loss.",
    )
    mode: Literal["min", "max"] | None = Field(
        None, description="min (the default) or max: whether a lower or a higher metric is better."
    )


class FailurePolicy(ApiModel):
    """How failures are retried."""

    max_worker_failures: int = Field(
        3, ge=0, le=1000, description="Worker failures Ray Train recovers from (restoring the checkpoint)."
    )
    retries: int = Field(
        2, ge=0, le=100, description="Whole-job retries on a new Ray cluster (RayJob backoffLimit)."
    )
    active_deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=INT32_MAX,
        description="Fail an attempt that runs longer than this, whatever its state (KubeRay counts it "
        "per attempt, from the attempt's start; an exceeded deadline is not retried).",
    )


class SchedulingSpec(ApiModel):
    """Queueing and priority."""

    queue: str | None = Field(
        None,
        pattern=LABEL_VALUE_PATTERN,
        max_length=63,
        description="Kueue LocalQueue name (label kueue.x-k8s.io/queue-name); the job waits for admission.",
    )
    priority_class_name: str | None = Field(
        None, pattern=DNS1123_LABEL_PATTERN, max_length=253, description="PriorityClass of every pod."
    )


TUNABLE_FIELDS = ("learningRate", "batchSizePerWorker", "epochs")


class SearchDimension(ApiModel):
    """One dimension of the search space."""

    cel_rules: ClassVar = (
        CelRule(
            "self.distribution in ['choice', 'grid'] || (has(self.low) && has(self.high) && self.low < self.high)",
            "loguniform, uniform and randint need low < high",
        ),
        # The API server's CEL cannot see `values` (its items are any JSON, so it has no CEL type):
        # this rule is checked by rayship (CLI and operator), and the CRD keeps minItems: 1.
        CelRule(
            "!(self.distribution in ['choice', 'grid']) || (has(self.values) && size(self.values) > 0)",
            "choice and grid need a non-empty values list",
            in_crd=False,
        ),
        CelRule(
            "self.distribution != 'loguniform' || (has(self.low) && self.low > 0.0)",
            "loguniform needs low > 0",
        ),
        CelRule(
            "self.distribution != 'randint' || (has(self.low) && has(self.high) "
            "&& double(int(self.low)) == self.low && double(int(self.high)) == self.high)",
            "randint needs whole-number low and high",
        ),
    )
    distribution: Literal["loguniform", "uniform", "choice", "randint", "grid"] = Field(
        ...,
        description="loguniform/uniform (floats in [low, high)), randint (integers in [low, high)), "
        "choice (one of values at random), grid (every one of values: numSamples repeats the whole grid).",
    )
    low: float | None = Field(
        None, allow_inf_nan=False, description="Lower bound (loguniform, uniform, randint)."
    )
    high: float | None = Field(
        None, allow_inf_nan=False, description="Upper bound, exclusive (loguniform, uniform, randint)."
    )
    values: list[Any] | None = Field(
        None, min_length=1, max_length=256, description="Candidates (choice, grid)."
    )


class AshaSpec(ApiModel):
    """ASHA's knobs (scheduler: asha), in epochs."""

    max_t: int | None = Field(
        None, ge=1, le=100_000, description="Longest a trial runs (default trainer.epochs)."
    )
    grace_period: int = Field(
        1, ge=1, le=100_000, description="Epochs every trial runs before it can be stopped."
    )
    reduction_factor: float = Field(
        2,
        gt=1,
        le=100,
        allow_inf_nan=False,
        description="1/reductionFactor of the trials go on at each rung.",
    )


class PbtSpec(ApiModel):
    """Population Based Training's knobs (scheduler: pbt), in epochs."""

    perturbation_interval: int = Field(
        1,
        ge=1,
        le=100_000,
        description="Epochs between perturbations: a trial in the bottom quantile then resumes from a "
        "top trial's checkpoint with mutated hyperparameters (a multiple of checkpoint.everyEpochs).",
    )
    quantile_fraction: float = Field(
        0.25,
        ge=0,
        le=0.5,
        allow_inf_nan=False,
        description="Share of the trials in the top (and the bottom) quantile.",
    )
    resample_probability: float = Field(
        0.25,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Chance that a mutation draws a new value from the search space instead of "
        "perturbing the copied one (x0.8 or x1.2, or a neighbouring choice/grid value).",
    )
    synchronous: bool = Field(
        False,
        description="Every trial waits for the others at each perturbation (Tune's synchronous PBT): "
        "reproducible hand-offs, but every trial restarts from a checkpoint each time.",
    )


class TuningSpec(ApiModel):
    """Hyperparameter search with Ray Tune: each trial is a full Ray Train run."""

    cel_rules: ClassVar = (
        CelRule(
            "self.searchSpace.all(k, k in "
            + str(list(TUNABLE_FIELDS))
            + " || (k.startsWith('config.') && k.size() > 7))",
            "searchSpace keys must be learningRate, batchSizePerWorker, epochs or config.<key>",
        ),
        CelRule(
            "['epochs', 'batchSizePerWorker'].all(k, !(k in self.searchSpace) "
            "|| !has(self.searchSpace[k].low) || self.searchSpace[k].low >= 1.0)",
            "epochs and batchSizePerWorker ranges start at 1 or more",
        ),
        CelRule(
            "!('learningRate' in self.searchSpace) || !has(self.searchSpace.learningRate.low) "
            "|| self.searchSpace.learningRate.low > 0.0",
            "a learningRate range starts above 0",
        ),
        CelRule(
            "!has(self.asha) || self.scheduler == 'asha'",
            "tuning.asha settings need scheduler: asha (or remove tuning.asha)",
        ),
        CelRule(
            "!has(self.asha) || !has(self.asha.maxT) || self.asha.gracePeriod <= self.asha.maxT",
            "tuning.asha.gracePeriod must not exceed maxT",
        ),
        CelRule(
            "!has(self.pbt) || self.scheduler == 'pbt'",
            "tuning.pbt settings need scheduler: pbt (or remove tuning.pbt)",
        ),
        CelRule(
            "self.scheduler != 'pbt' || !('epochs' in self.searchSpace)",
            "tuning.searchSpace.epochs: with scheduler pbt every trial trains trainer.epochs (a mutation "
            "cannot change a run's length); remove it from the searchSpace",
        ),
    )
    num_samples: int = Field(4, ge=1, le=1000, description="Number of trials.")
    metric: str = Field("loss", min_length=1, description="Reported metric to optimize.")
    mode: Literal["min", "max"] = Field("min", description="Minimize or maximize the metric.")
    scheduler: Literal["fifo", "asha", "pbt"] = Field(
        "asha",
        description="asha stops poor trials early (by epoch); fifo runs every trial to the end; pbt "
        "(Population Based Training) lets poor trials resume from good trials' checkpoints with "
        "hyperparameters mutated within the searchSpace.",
    )
    asha: AshaSpec | None = Field(None, description="ASHA's knobs (scheduler: asha).")
    pbt: PbtSpec | None = Field(None, description="Population Based Training's knobs (scheduler: pbt).")
    max_concurrent_trials: int = Field(
        1, ge=1, le=256, description="Trials running at once (each takes the worker group)."
    )
    search_space: dict[str, SearchDimension] = Field(
        ..., min_length=1, max_length=32, description="Trainer fields or config.<key> to search over."
    )

    @model_validator(mode="after")
    def _choices_fit_their_field(self) -> TuningSpec:
        """A choice's values must be values its field takes (the API server's CEL cannot type the
        values list: this is checked by rayship, in the CLI and the operator)."""
        wants = {
            "learningRate": ("a number above 0", lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < float("inf")),
            "epochs": ("a whole number of at least 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
            "batchSizePerWorker": ("a whole number of at least 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
        }  # fmt: skip
        for key, (what, ok) in wants.items():
            dim = self.search_space.get(key)
            bad = [v for v in (dim.values or []) if not ok(v)] if dim else []
            if bad:
                raise ValueError(f"searchSpace.{key}.values must each be {what} (got {bad[:3]!r})")
        if self.scheduler == "pbt" and self.max_concurrent_trials < self.trials():
            raise ValueError(
                f"maxConcurrentTrials: with scheduler pbt the whole population of {self.trials()} trials "
                "(numSamples x grid values) runs at once (PBT compares them and hands checkpoints between "
                f"them); set maxConcurrentTrials to {self.trials()} or more"
            )
        return self

    def trials(self) -> int:
        """How many trials the search runs: numSamples times the grid's combinations."""
        grid = 1
        for dim in self.search_space.values():
            if dim.distribution == "grid":
                grid *= len(dim.values or [])
        return self.num_samples * grid


class RuntimeEnvSpec(ApiModel):
    """Code and packages shipped with the job (Ray's runtime environment) instead of baked into an image."""

    cel_rules: ClassVar = (
        CelRule(
            "!has(self.workingDir) || self.workingDir.matches('"
            + WORKING_DIR_URI_PATTERN.replace("\\", "\\\\")
            + "')",
            "runtimeEnv.workingDir: in a cluster it must be a zip archive's URI (s3://, gs:// or "
            "https://..., ending in .zip); a local folder works only with `rayship run`",
            cluster_only=True,
        ),
        CelRule(
            "!has(self.envVars) || self.envVars.all(k, k.matches('"
            + ENV_NAME_PATTERN
            + "') && k.size() <= 128 && !k.startsWith('RAYSHIP_') && k != 'NVIDIA_VISIBLE_DEVICES')",
            "runtimeEnv.envVars names must be letters, digits and '_' (not starting with a digit), not "
            "RAYSHIP_* or NVIDIA_VISIBLE_DEVICES",
        ),
        CelRule(
            "!has(self.envVars) || self.envVars.all(k, !k.matches('" + SECRET_NAME_PATTERN + "'))",
            "runtimeEnv.envVars: a name that looks like a secret (password, token, key, credential): its "
            "value would be shown in the RayJob and Ray's dashboard; put it in a Secret and use "
            "spec.env[].valueFrom.secretKeyRef",
        ),
    )
    working_dir: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        description="Your code: a local folder for `rayship run` (relative to the YAML file), a zip "
        "archive's URI in a cluster (s3://, gs://, https://). The driver and every worker run in it, "
        "so trainer.entrypoint's module is importable.",
    )
    pip: list[Annotated[str, Field(min_length=1, max_length=512)]] = Field(
        default_factory=list,
        max_length=128,
        description="Python packages installed for the job's workers (pip requirement specifiers).",
    )
    env_vars: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Plain environment variables for the job (never secrets: use spec.env with valueFrom).",
    )

    def as_ray(self, working_dir: str | None = None) -> dict[str, Any]:
        """Ray's runtime_env for it (only what is set); `working_dir` replaces workingDir (local mode
        resolves a relative folder)."""
        ray_env: dict[str, Any] = {}
        if working_dir or self.working_dir:
            ray_env["working_dir"] = working_dir or self.working_dir
        if self.pip:
            ray_env["pip"] = list(self.pip)
        if self.env_vars:
            ray_env["env_vars"] = dict(sorted(self.env_vars.items()))
        return ray_env


class TrainingJobSpec(ApiModel):
    """Desired state of a distributed training job on a Ray cluster."""

    cel_rules: ClassVar = (
        CelRule(
            "!has(self.env) || self.env.all(e, self.env.exists_one(f, f.name == e.name))",
            "env variable names must be unique",
        ),
        CelRule(
            "!has(self.env) || self.env.all(e, !e.name.startsWith('RAYSHIP_') && e.name != 'NVIDIA_VISIBLE_DEVICES')",
            "env names starting with RAYSHIP_ and NVIDIA_VISIBLE_DEVICES are set by rayship; rename the variable",
        ),
        CelRule(
            "!has(self.tuning) || self.tuning.scheduler != 'pbt' || "
            "(has(self.tuning.pbt) ? self.tuning.pbt.perturbationInterval : 1) % self.checkpoint.everyEpochs == 0",
            "tuning.pbt.perturbationInterval must be a multiple of checkpoint.everyEpochs (a trial hands on "
            "the checkpoint of the epoch it is compared at)",
        ),
        CelRule(
            "!has(self.tuning) || self.tuning.scheduler != 'pbt' || has(self.trainer.recipe)",
            "tuning.scheduler: pbt needs a built-in trainer.recipe (rayship hands a recipe's signed "
            "checkpoints between trials; an own loop's checkpoints it cannot verify): use asha or fifo",
        ),
        CelRule(
            "has(self.checkpoint.storage)",
            "checkpoint.storage is required in a cluster: set checkpoint.storage.pvc.claimName or "
            "checkpoint.storage.uri (only `rayship run` works without it, writing under ./rayship-runs)",
            cluster_only=True,
        ),
        data_uri_rule("data.uri"),
        data_uri_rule("data.validation.uri"),
    )
    image: str | None = Field(
        None,
        pattern=IMAGE_PATTERN,
        max_length=512,
        description="Workload image (rayship_workloads); default from the operator config.",
    )
    ray_version: str | None = Field(
        None, pattern=RAY_VERSION_PATTERN, description="Ray version in the image; default from the operator."
    )
    trainer: TrainerSpec = Field(..., description="What to train and how.")
    data: DataSpec = sub(DataSpec, "Training data.")
    workers: WorkersSpec = sub(WorkersSpec, "GPU worker group.")
    head: HeadSpec = sub(HeadSpec, "Ray head pod.")
    checkpoint: CheckpointSpec = sub(CheckpointSpec, "Checkpoint storage and retention.")
    failure_policy: FailurePolicy = sub(FailurePolicy, "Retries and deadlines.")
    ttl_seconds_after_finished: int = Field(
        600, ge=0, le=INT32_MAX, description="Seconds the finished Ray cluster lingers before it is deleted."
    )
    suspend: bool = Field(False, description="Suspend: delete the Ray cluster (can be resumed).")
    scheduling: SchedulingSpec = sub(SchedulingSpec, "Queue and priority.")
    tuning: TuningSpec | None = Field(
        None, description="Hyperparameter search (Ray Tune) instead of one run."
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Environment for every Ray container."
    )
    runtime_env: RuntimeEnvSpec | None = Field(
        None, description="Ship your code and packages with the job (Ray runtime environment)."
    )
    tracking: TrackingSpec | None = Field(None, description="Experiment tracking (MLflow).")

    @model_validator(mode="after")
    def _fits_in_the_rayjob(self) -> TrainingJobSpec:
        """The resolved spec is handed to the workload in the RayJob (entrypoint and annotation):
        Kubernetes caps annotations at 256 KiB and a shell argument at 128 KiB. No CEL function
        measures an object, so this rule is the operator's and the CLI's only."""
        size = len(json.dumps(self.wire(), separators=(",", ":")))
        if size > MAX_SPEC_BYTES:
            raise ValueError(
                f"the spec is {size} bytes serialized, over the {MAX_SPEC_BYTES} the RayJob can carry: "
                "move large values (e.g. trainer.config) into a file in the image or the checkpoint storage"
            )
        return self


# --- TrainingJob status ------------------------------------------------------------------------

Phase = Literal["Pending", "Running", "Succeeded", "Failed", "Suspended", "Invalid"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})


class Condition(ApiModel):
    """A metav1.Condition."""

    type: str = Field(..., max_length=316, description="Condition type, e.g. Running, Complete.")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str = Field(
        ..., pattern=CONDITION_REASON_PATTERN, max_length=1024, description="CamelCase reason."
    )
    message: str = Field("", max_length=32768, description="Human-readable details.")
    last_transition_time: str = Field(..., description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, ge=0, description="metadata.generation it reflects.")


class ProgressStatus(ApiModel):
    """Training progress reported by the workload."""

    epoch: int | None = Field(None, ge=0, description="Last completed epoch.")
    step: int | None = Field(None, ge=0, description="Last optimizer step.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Latest metrics, e.g. loss.")
    last_checkpoint: str | None = Field(None, description="URI of the latest checkpoint.")
    resumed_from_epoch: int | None = Field(
        None,
        ge=1,
        description="This attempt resumed from the checkpoint of this epoch (after a retry, a restarted "
        "Ray head or a resubmitted job); absent when it started from scratch.",
    )
    stopped_early: bool | None = Field(
        None,
        description="Training stopped at `epoch`, before trainer.epochs: the metric had not improved for "
        "trainer.earlyStopping.patience epochs.",
    )


class CheckpointStatus(ApiModel):
    """Checkpoints and the exported model."""

    latest: str | None = Field(None, description="URI of the latest checkpoint.")
    best: str | None = Field(None, description="URI of the best checkpoint by the job's metric.")
    model: str | None = Field(None, description="URI of the exported final model (serving layout).")
    best_model: str | None = Field(None, description="URI of the exported model of the best checkpoint.")


class TuningStatus(ApiModel):
    """The result of a hyperparameter search."""

    trials: int | None = Field(None, ge=0, description="Trials run.")
    best_trial: str | None = Field(None, description="Id of the best trial.")
    best_metric: float | None = Field(None, description="Its metric value.")
    best_config: dict[str, Any] = Field(default_factory=dict, description="Its hyperparameters.")


class TrainingJobStatus(ApiModel):
    """Observed state, mirrored from the RayJob by the operator."""

    phase: Phase | None = Field(
        None, description="Pending, Running, Succeeded, Failed, Suspended or Invalid."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Latest observations.")
    ray_job_name: str | None = Field(None, description="Name of the owned RayJob.")
    ray_job_uid: str | None = Field(
        None, alias="rayJobUID", description="UID of the RayJob launched for it (a missing one is lost)."
    )
    ray_cluster_name: str | None = Field(None, description="Name of the Ray cluster KubeRay created.")
    workload_account: str | None = Field(
        None,
        description="ServiceAccount the Ray pods run as: besides the operator, the only workload "
        "account that may write this status (rayship's admission policy; never changed by it).",
    )
    job_id: str | None = Field(None, description="Ray job submission id.")
    dashboard_url: str | None = Field(None, alias="dashboardURL", description="Ray dashboard address.")
    start_time: str | None = Field(None, description="When the Ray job started (RFC 3339).")
    completion_time: str | None = Field(None, description="When the Ray job finished (RFC 3339).")
    gpus: int | None = Field(None, ge=0, description="GPUs requested by the worker group.")
    gpu_seconds: float | None = Field(
        None, ge=0, description="GPU-seconds held by the Ray job so far, summed over its attempts."
    )
    gpu_seconds_earlier_attempts: float | None = Field(
        None, ge=0, description="The part of gpuSeconds from attempts before the current one."
    )
    attempt: int | None = Field(None, ge=1, description="Current attempt (KubeRay retries: backoffLimit).")
    progress: ProgressStatus | None = Field(None, description="Training progress.")
    checkpoint: CheckpointStatus | None = Field(None, description="Checkpoints and exported model.")
    tuning: TuningStatus | None = Field(None, description="Hyperparameter search result.")
    observed_generation: int | None = Field(None, ge=0, description="Generation the status reflects.")


# --- the resource ------------------------------------------------------------------------------


class ObjectMeta(BaseModel):
    """The part of metadata that rayship reads; the rest is kept as-is."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(..., min_length=1)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class TrainingJob(ApiModel):
    """Distributed training (PyTorch DDP or DeepSpeed ZeRO) on a KubeRay RayJob with GPU workers."""

    cel_rules: ClassVar = (
        CelRule(
            f"self.metadata.name.size() <= 63 && self.metadata.name.matches('{DNS1123_LABEL_PATTERN}')",
            "metadata.name must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit",
        ),
    )
    api_version: Literal["rayship.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["TrainingJob"]
    metadata: ObjectMeta
    spec: TrainingJobSpec
    status: dict[str, Any] | None = None  # written by the operator; not validated on input


# --- ModelService ------------------------------------------------------------------------------

ROUTE_PREFIX_PATTERN = r"^/([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*)?$"


class FromTrainingJob(ApiModel):
    """Serve the model a TrainingJob in the same namespace exported."""

    name: str = Field(..., pattern=DNS1123_LABEL_PATTERN, max_length=63, description="TrainingJob name.")
    checkpoint: Literal["latest", "best"] = Field(
        "latest", description="latest: the final model; best: the model of the best checkpoint by loss."
    )


class ModelSource(ApiModel):
    """Where the model comes from: a TrainingJob, or an exported model's URI."""

    cel_rules: ClassVar = (
        CelRule(
            "has(self.fromTrainingJob) != has(self.uri)",
            "set exactly one of fromTrainingJob or uri (in spec.model, or in each entry of spec.models)",
        ),
    )
    from_training_job: FromTrainingJob | None = Field(None, description="A TrainingJob's exported model.")
    uri: str | None = Field(
        None,
        min_length=1,
        description="An exported model (rayship serving layout): a path, PVC path or s3:// prefix.",
    )


class ServeReplicas(ApiModel):
    """Ray Serve autoscaling: replicas of the model, one per GPU worker pod."""

    cel_rules: ClassVar = (
        CelRule("self.min <= self.max", "replicas.min must not exceed replicas.max"),
        CelRule(
            "!has(self.initial) || (self.min <= self.initial && self.initial <= self.max)",
            "replicas.initial must be within replicas.min..replicas.max",
        ),
    )
    min: int = Field(1, ge=0, le=1000, description="Fewest replicas (0 scales to zero when idle).")
    max: int = Field(1, ge=1, le=1000, description="Most replicas.")
    initial: int | None = Field(
        None, ge=0, le=1000, description="Replicas (and worker pods) at start, in [min, max]; default min."
    )
    target_ongoing_requests: float = Field(
        5, gt=0, le=10_000, description="Requests per replica autoscaling aims for."
    )


class ServeResources(ApiModel):
    """Resources of one replica (and of the worker pod that hosts it)."""

    cel_rules: ClassVar = (NODE_SELECTOR_KEYS, cpu_rule("cpus"), memory_rule("memory"))
    gpus: int = Field(1, ge=0, le=16, description="GPUs per replica (0 serves on CPU).")
    cpus: float = Field(4, ge=0.001, le=1024, description="CPU cores per replica (at least 1m).")
    memory: str = Field(
        "16Gi", pattern=MEMORY_PATTERN, description="Memory per replica (Kubernetes quantity)."
    )
    gpu_product: GpuProduct = None
    node_selector: NodeSelector
    tolerations: Tolerations


class Batching(ApiModel):
    """Request batching: concurrent requests are combined into one forward pass."""

    max_batch_size: int = Field(32, ge=1, le=1024, description="Most requests in one batch.")
    batch_wait_timeout_ms: int = Field(10, ge=0, le=10_000, description="How long a batch waits to fill up.")


DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_ROWS_PER_REQUEST = 4096


class RequestLimits(ApiModel):
    """Limits on one request to the built-in server: over them it answers HTTP 413 naming the limit."""

    max_request_bytes: int = Field(
        DEFAULT_MAX_REQUEST_BYTES,
        ge=1,
        le=1024**3,
        description="Largest request body in bytes (checked from Content-Length before it is read, and while "
        "reading).",
    )
    max_rows_per_request: int = Field(
        DEFAULT_MAX_ROWS_PER_REQUEST,
        ge=1,
        le=1_000_000,
        description="Most rows (instances) in one /predict request.",
    )


class UpgradeOptions(ApiModel):
    """Traffic shifting for upgradeStrategy NewClusterWithIncrementalUpgrade (needs Gateway API)."""

    gateway_class_name: str = Field(..., min_length=1, description="GatewayClass that routes the traffic.")
    step_size_percent: int = Field(10, ge=1, le=100, description="Traffic moved per step.")
    interval_seconds: int = Field(30, ge=1, description="Seconds between steps.")
    max_surge_percent: int = Field(100, ge=0, le=100, description="Extra capacity the new cluster may add.")


SERVE_DEPLOYMENT_NAME_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,62}$"
IMPORT_PATH_PATTERN = (
    r"^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*$"
)
APPLICATION_MODEL_ARG = "modelUri"  # the arg rayship hands an own application: the resolved model
APPLICATION_MODELS_ARG = "models"  # ... and with spec.models: {name: resolved URI}
# Names of spec.models entries: what a request puts in the serve_multiplexed_model_id header (and an
# OpenAI request's "model"), a key of the application's args.models, and status.models[].name.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$"
MAX_MODELS = 32
DEFAULT_MODEL_CACHE_SIZE = 3  # models a replica keeps loaded when spec.modelCacheSize is not set


class DeploymentAutoscaling(ApiModel):
    """Serve autoscaling of one deployment (Ray's `autoscaling_config`)."""

    cel_rules: ClassVar = (
        CelRule(
            "self.minReplicas <= self.maxReplicas", "autoscaling.minReplicas must not exceed maxReplicas"
        ),
        CelRule(
            "!has(self.initialReplicas) || (self.minReplicas <= self.initialReplicas && "
            "self.initialReplicas <= self.maxReplicas)",
            "autoscaling.initialReplicas must be within minReplicas..maxReplicas",
        ),
    )
    min_replicas: int = Field(1, ge=0, le=1000, description="Fewest replicas (0 scales to zero when idle).")
    max_replicas: int = Field(1, ge=1, le=1000, description="Most replicas.")
    initial_replicas: int | None = Field(None, ge=0, le=1000, description="Replicas at start.")
    target_ongoing_requests: float = Field(
        5, gt=0, le=10_000, allow_inf_nan=False, description="Requests per replica autoscaling aims for."
    )


class RayActorOptions(ApiModel):
    """Resources each replica of a deployment reserves (Ray's `ray_actor_options`)."""

    num_cpus: float | None = Field(None, ge=0, le=1024, allow_inf_nan=False, description="CPUs per replica.")
    num_gpus: float | None = Field(None, ge=0, le=16, allow_inf_nan=False, description="GPUs per replica.")


class DeploymentSettings(ApiModel):
    """Settings of one Serve deployment of the application (serveConfigV2 `deployments[]`); they
    override what the application's code says."""

    cel_rules: ClassVar = (
        CelRule(
            "!(has(self.replicas) && has(self.autoscaling))",
            "set replicas (a fixed count) or autoscaling, not both",
        ),
    )
    replicas: int | None = Field(None, ge=0, le=1000, description="A fixed number of replicas.")
    autoscaling: DeploymentAutoscaling | None = Field(None, description="Autoscaled replicas.")
    ray_actor_options: RayActorOptions | None = Field(None, description="Resources per replica.")
    max_ongoing_requests: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Most requests a replica handles at once (more wait in the proxy).",
    )


class ServeApplication(ApiModel):
    """Your own Ray Serve application instead of rayship's model server: an application builder
    (`def app_builder(args) -> Application`, which may return a graph of bound deployments), by import
    path. rayship resolves the model (model.uri or model.fromTrainingJob) and hands its URI to the
    builder as `args.modelUri` (with spec.models: `args.models`, name -> URI), so a new model rolls out
    in place as with the built-in server. A module-level bound application takes no args (Ray refuses
    them), so it cannot be handed the model: wrap it in a builder."""

    import_path: str = Field(
        ...,
        pattern=IMPORT_PATH_PATTERN,
        max_length=512,
        description="module:attribute of the application builder app_builder(args), e.g. pipeline:app_builder.",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments for an application builder (serveConfigV2 `args`), with modelUri added by rayship.",
    )
    runtime_env: RuntimeEnvSpec | None = Field(
        None, description="The application's code and packages (Ray's runtime_env): workingDir, pip, envVars."
    )

    @field_validator("args")
    @classmethod
    def _model_args_are_ours(cls, args: dict[str, Any]) -> dict[str, Any]:
        # Both names are reserved, whichever of spec.model / spec.models the service uses, so that
        # switching between them never collides with the application's own args.
        for arg, source in ((APPLICATION_MODEL_ARG, "spec.model"), (APPLICATION_MODELS_ARG, "spec.models")):
            if arg in args:
                raise ValueError(
                    f"{arg}: set by rayship from {source} (the resolved model URIs); remove it from "
                    "application.args"
                )
        return args


VLLM_SET_BY_FIELDS = {
    "model": "model.uri / model.fromTrainingJob",
    "tensor_parallel_size": "vllm.tensorParallelSize",
    "max_model_len": "vllm.maxModelLen",
    "gpu_memory_utilization": "vllm.gpuMemoryUtilization",
    "dtype": "vllm.dtype",
}


class VllmSpec(ApiModel):
    """The vLLM engine of `engine: vllm`: rendered into Ray Serve LLM's `LLMConfig` (its `engine_kwargs`
    are vLLM's engine arguments)."""

    model_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$",
        description="The model name clients send as `model` (default: the ModelService's name).",
    )
    max_model_len: int | None = Field(
        None, ge=1, le=10_000_000, description="Longest sequence (prompt + output) in tokens."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, allow_inf_nan=False, description="Share of each GPU's memory vLLM may use."
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] | None = Field(
        None, description="Weights and activations type (vLLM's default: auto)."
    )
    tensor_parallel_size: int | None = Field(
        None, ge=1, le=16, description="GPUs one replica spreads the model over (default: resources.gpus)."
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More vLLM engine arguments (snake_case, as vLLM names them), passed through.",
    )

    @field_validator("engine_args")
    @classmethod
    def _not_set_twice(cls, args: dict[str, Any]) -> dict[str, Any]:
        for key in args:
            if key in VLLM_SET_BY_FIELDS:
                raise ValueError(f"{key}: set by {VLLM_SET_BY_FIELDS[key]}; remove it from engineArgs")
        return args


class ModelStorage(ApiModel):
    """Where the model files live for the serving pods."""

    pvc: PvcStorage = Field(..., description="A PersistentVolumeClaim, mounted read-only.")


class ModelServiceSpec(ApiModel):
    """Desired state of a model served with Ray Serve on a KubeRay RayService."""

    cel_rules: ClassVar = (
        CelRule(
            "self.upgradeStrategy != 'NewClusterWithIncrementalUpgrade' || has(self.upgradeOptions)",
            "upgradeStrategy NewClusterWithIncrementalUpgrade needs upgradeOptions (gatewayClassName)",
        ),
        CelRule(
            "!has(self.env) || self.env.all(e, self.env.exists_one(f, f.name == e.name))",
            "env variable names must be unique",
        ),
        CelRule(
            "!has(self.deployments) || self.deployments.all(k, k.matches('"
            + SERVE_DEPLOYMENT_NAME_PATTERN
            + "'))",
            "deployments: names are Serve deployment names (letters, digits, '_', '.', '-'; at most 63)",
        ),
        CelRule(
            "has(self.application) || !has(self.deployments) || self.deployments.all(k, k == 'RayshipModel')",
            "deployments: the built-in model server has one deployment, RayshipModel (other names need "
            "spec.application)",
        ),
        CelRule(
            "has(self.model) != has(self.models)",
            "set exactly one of spec.model (one model) or spec.models (several, served with Serve model "
            "multiplexing)",
        ),
        CelRule(
            "!has(self.models) || self.models.all(k, k.matches('" + MODEL_NAME_PATTERN + "'))",
            "models: names are letters, digits, '_', '.' and '-', starting and ending with a letter or "
            "digit, at most 63 characters (a request names its model by it)",
        ),
        CelRule(
            "!has(self.modelCacheSize) || (has(self.models) && !has(self.application))",
            "modelCacheSize: for the built-in model server with spec.models (an own application sizes "
            "its own serve.multiplexed cache); remove it or use spec.models",
        ),
        CelRule(
            "!has(self.vllm) || self.engine == 'vllm'",
            "vllm: settings of engine vllm; set engine: vllm or remove them",
        ),
        CelRule(
            "self.engine != 'vllm' || !has(self.application)",
            "engine vllm serves Ray Serve LLM's OpenAI application; remove application (or the engine)",
        ),
        CelRule(
            "self.engine != 'vllm' || !has(self.models)",
            "models: engine vllm serves one model per ModelService; set spec.model (one ModelService per "
            "language model), or use engine: rayship for several",
        ),
        CelRule(
            "self.engine != 'vllm' || has(self.image)",
            "engine vllm needs an image with vLLM in spec.image, e.g. rayproject/ray-llm:2.60.0-py311-cu128",
        ),
        CelRule(
            "self.engine != 'vllm' || !has(self.deployments) || size(self.deployments) == 0",
            "deployments: engine vllm names its own deployments; size them with replicas, resources and vllm",
        ),
        CelRule(
            "self.engine != 'vllm' || !has(self.resources) || !has(self.resources.gpus) || "
            "self.resources.gpus >= 1",
            "engine vllm runs on GPUs: set resources.gpus to at least 1",
        ),
        CelRule(
            "self.engine != 'vllm' || !has(self.vllm) || !has(self.vllm.tensorParallelSize) || "
            "self.vllm.tensorParallelSize <= (has(self.resources) && has(self.resources.gpus) ? "
            "self.resources.gpus : 1)",
            "vllm.tensorParallelSize must not exceed resources.gpus (the GPUs of one replica's pod)",
        ),
        CelRule(
            "has(self.application) || !has(self.deployments) || !has(self.deployments.RayshipModel) || "
            "(!has(self.deployments.RayshipModel.replicas) && !has(self.deployments.RayshipModel.autoscaling))",
            "deployments.RayshipModel: its replicas come from spec.replicas; set those instead",
        ),
    )
    image: str | None = Field(
        None,
        pattern=IMAGE_PATTERN,
        max_length=512,
        description="Workload image; default from the operator config.",
    )
    ray_version: str | None = Field(
        None, pattern=RAY_VERSION_PATTERN, description="Ray version in the image."
    )
    model: ModelSource | None = Field(None, description="The model to serve (or spec.models for several).")
    models: dict[str, ModelSource] | None = Field(
        None,
        min_length=1,
        max_length=MAX_MODELS,
        description="Several models by name, served with Serve model multiplexing: a request picks one "
        "with the serve_multiplexed_model_id header (or an OpenAI request's model). Instead of model.",
    )
    model_cache_size: int | None = Field(
        None,
        ge=1,
        le=MAX_MODELS,
        description=f"With models: how many models each replica keeps loaded (the least recently used "
        f"is evicted; Serve's max_num_models_per_replica). Default {DEFAULT_MODEL_CACHE_SIZE}.",
    )
    replicas: ServeReplicas = sub(ServeReplicas, "Replica autoscaling.")
    resources: ServeResources = sub(ServeResources, "Resources per replica.")
    head: HeadSpec = sub(HeadSpec, "Ray head pod (runs the Serve controller, no replicas).")
    batching: Batching = sub(Batching, "Request batching.")
    request_limits: RequestLimits = sub(
        RequestLimits, "Limits on one request (the built-in server: HTTP 413)."
    )
    route_prefix: str = Field(
        "/",
        pattern=ROUTE_PREFIX_PATTERN,
        max_length=256,
        description="HTTP path prefix of the service, e.g. /mnist.",
    )
    upgrade_strategy: Literal["NewCluster", "NewClusterWithIncrementalUpgrade", "None"] = Field(
        "NewCluster",
        description="How changes that need a new Ray cluster are rolled out (model changes never do).",
    )
    upgrade_options: UpgradeOptions | None = Field(None, description="For NewClusterWithIncrementalUpgrade.")
    storage: ModelStorage | None = Field(
        None,
        description="A PersistentVolumeClaim holding a model.uri path, mounted read-only on every Ray pod "
        "(a fromTrainingJob service mounts its TrainingJob's checkpoint PVC by itself).",
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Environment for every Ray container."
    )
    application: ServeApplication | None = Field(
        None,
        description="Your own Serve application (instead of the built-in model server), given the resolved "
        "model as args.modelUri (with spec.models: args.models, name -> URI).",
    )
    deployments: dict[str, DeploymentSettings] = Field(
        default_factory=dict,
        max_length=64,
        description="Per-deployment settings by deployment name (the built-in server's is RayshipModel).",
    )
    engine: Literal["rayship", "vllm"] = Field(
        "rayship",
        description="rayship: the built-in model server (any rayship model, CPU or GPU). vllm: Ray Serve "
        "LLM's OpenAI-compatible app on vLLM (ray.serve.llm:build_openai_app) for causal language models "
        "on GPUs; needs an image with vLLM.",
    )
    vllm: VllmSpec | None = Field(None, description="vLLM engine settings (engine: vllm).")


class ServedModelStatus(ApiModel):
    """One model of spec.models as served."""

    name: str = Field(..., description="The model's name in spec.models (the serve_multiplexed_model_id).")
    uri: str | None = Field(
        None, description="The model URI Serve was confirmed to serve under this name (unset: not yet)."
    )
    target_uri: str | None = Field(
        None, alias="targetURI", description="The URI being rolled out under this name, until Serve runs it."
    )
    volume: PvcStorage | None = Field(
        None, description="The PVC the model is read from (kept when its TrainingJob is deleted)."
    )


ServicePhase = Literal["WaitingForModel", "Deploying", "Ready", "Degraded", "Failed", "Invalid"]


class ModelServiceStatus(ApiModel):
    """Observed state, mirrored from the RayService by the operator."""

    phase: ServicePhase | None = Field(
        None, description="WaitingForModel, Deploying, Ready, Degraded, Failed or Invalid."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Latest observations.")
    url: str | None = Field(None, description="In-cluster URL of the service.")
    model_uri: str | None = Field(None, alias="modelURI", description="The model being served.")
    model_volume: PvcStorage | None = Field(
        None, description="The PVC the served model is read from (kept when its TrainingJob is deleted)."
    )
    target_model_uri: str | None = Field(
        None, alias="targetModelURI", description="The model being rolled out, until it is ready."
    )
    models: list[ServedModelStatus] | None = Field(
        None,
        description="With spec.models: each model (by name) with the URI Serve serves and the one rolling "
        "out; a list (sorted by name), so a removed model leaves it whole.",
    )
    model_count: int | None = Field(
        None, ge=0, description="With spec.models: how many models Serve was confirmed to serve."
    )
    serve_endpoints: int | None = Field(
        None,
        ge=0,
        description="Ray pods whose Serve proxy is ready (KubeRay's numServeEndpoints; KubeRay reports "
        "no count of Serve replicas).",
    )
    ray_service_name: str | None = Field(None, description="Name of the owned RayService.")
    observed_generation: int | None = Field(None, ge=0, description="Generation the status reflects.")


class ModelService(ApiModel):
    """A model served with Ray Serve (batched HTTP inference) on a KubeRay RayService."""

    cel_rules: ClassVar = TrainingJob.cel_rules
    api_version: Literal["rayship.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["ModelService"]
    metadata: ObjectMeta
    spec: ModelServiceSpec
    status: dict[str, Any] | None = None


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    type: str
    json_path: str
    description: str

    def as_crd(self) -> dict[str, str]:
        return {
            "name": self.name,
            "type": self.type,
            "jsonPath": self.json_path,
            "description": self.description,
        }


@dataclass(frozen=True)
class Kind:
    """Everything the CRD generator needs to know about a kind besides its schema."""

    model: type[ApiModel]
    spec_model: type[ApiModel]
    status_model: type[ApiModel]
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    columns: tuple[PrinterColumn, ...]

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def resource(self) -> Resource:
        return (GROUP, VERSION, self.plural)

    @property
    def root_rules(self) -> tuple[CelRule, ...]:
        return self.model.cel_rules


TRAINING_JOB = Kind(
    model=TrainingJob,
    spec_model=TrainingJobSpec,
    status_model=TrainingJobStatus,
    kind="TrainingJob",
    plural="trainingjobs",
    singular="trainingjob",
    short_names=("tj",),
    columns=(
        PrinterColumn("Phase", "string", ".status.phase", "Lifecycle phase."),
        PrinterColumn("Workers", "integer", ".spec.workers.replicas", "Training workers."),
        PrinterColumn("GPUs", "integer", ".status.gpus", "GPUs requested by the worker group."),
        PrinterColumn("Epoch", "integer", ".status.progress.epoch", "Last completed epoch."),
        PrinterColumn("Loss", "number", ".status.progress.metrics.loss", "Latest training loss."),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation."),
    ),
)

MODEL_SERVICE = Kind(
    model=ModelService,
    spec_model=ModelServiceSpec,
    status_model=ModelServiceStatus,
    kind="ModelService",
    plural="modelservices",
    singular="modelservice",
    short_names=("ms",),
    columns=(
        PrinterColumn("Phase", "string", ".status.phase", "Lifecycle phase."),
        PrinterColumn("Model", "string", ".status.modelURI", "The model being served (spec.model)."),
        PrinterColumn("Models", "integer", ".status.modelCount", "Models being served (spec.models)."),
        PrinterColumn("Endpoints", "integer", ".status.serveEndpoints", "Ray pods serving (Serve proxies)."),
        PrinterColumn("URL", "string", ".status.url", "In-cluster URL."),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation."),
    ),
)

TRAININGJOBS: Resource = TRAINING_JOB.resource
MODELSERVICES: Resource = MODEL_SERVICE.resource

KINDS: tuple[Kind, ...] = (TRAINING_JOB, MODEL_SERVICE)
KIND_BY_NAME: dict[str, Kind] = {k.kind: k for k in KINDS}
