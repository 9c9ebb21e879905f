"""The ModelService kind: the model(s) it serves and from where, replicas, resources, batching, request
limits, an own Serve application or vLLM, its status, and its CRD entry (`MODEL_SERVICE`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from rayship.api.common import (
    DNS1123_LABEL_PATTERN,
    IMAGE_PATTERN,
    MEMORY_PATTERN,
    NODE_SELECTOR_KEYS,
    RAY_VERSION_PATTERN,
    ApiModel,
    CelRule,
    Condition,
    EnvVar,
    GpuProduct,
    Kind,
    NetworkPeer,
    NodeSelector,
    ObjectMeta,
    PrinterColumn,
    Tolerations,
    cpu_rule,
    memory_rule,
    said_with_values,
    sub,
    uri_rules,
)
from rayship.api.trainingjob import HeadSpec, PvcStorage, RuntimeEnvSpec, TrainingJob

# --- ModelService ------------------------------------------------------------------------------

ROUTE_PREFIX_PATTERN = r"^/([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*)?$"


class FromTrainingJob(ApiModel):
    """Serve the model a TrainingJob in the same namespace exported."""

    name: str = Field(..., pattern=DNS1123_LABEL_PATTERN, max_length=63, description="TrainingJob name.")
    checkpoint: Literal["latest", "best"] = Field(
        "latest", description="latest: the final model; best: the model of the best checkpoint by loss."
    )


class FromTrainingSchedule(ApiModel):
    """Serve the model of the run a TrainingSchedule (same namespace) promoted last; a newer promoted
    run rolls out as a new model does."""

    name: str = Field(..., pattern=DNS1123_LABEL_PATTERN, max_length=63, description="TrainingSchedule name.")
    checkpoint: Literal["latest", "best"] = Field(
        "latest", description="latest: the run's final model; best: the model of its best checkpoint by loss."
    )


class ModelSource(ApiModel):
    """Where the model comes from: a TrainingJob, a TrainingSchedule's promoted run, or an exported
    model's URI."""

    cel_rules: ClassVar = (
        *uri_rules("uri", "model.uri"),
        CelRule(
            "[has(self.fromTrainingJob), has(self.fromTrainingSchedule), has(self.uri)].filter(x, x).size() == 1",
            "set exactly one of fromTrainingJob, fromTrainingSchedule or uri (in spec.model, or in each entry "
            "of spec.models)",
        ),
    )
    from_training_job: FromTrainingJob | None = Field(None, description="A TrainingJob's exported model.")
    from_training_schedule: FromTrainingSchedule | None = Field(
        None, description="The exported model of the run a TrainingSchedule promoted last."
    )
    uri: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        description="An exported model (rayship serving layout): a path, PVC path or s3:// prefix.",
    )


class ServeReplicas(ApiModel):
    """Ray Serve autoscaling: replicas of the model, one per GPU worker pod."""

    cel_rules: ClassVar = (
        CelRule(
            "self.min <= self.max",
            "replicas.min must not exceed replicas.max",
            message_expression=said_with_values(
                "replicas.min (", "self.min", ") is more than replicas.max (", "self.max", ")"
            ),
        ),
        CelRule(
            "!has(self.initial) || (self.min <= self.initial && self.initial <= self.max)",
            "replicas.initial must be within replicas.min..replicas.max",
            message_expression=said_with_values(
                "replicas.initial (",
                "self.initial",
                ") is not within replicas.min..replicas.max (",
                "self.min",
                "..",
                "self.max",
                ")",
            ),  # fmt: skip
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


class AutoscalerResources(ApiModel):
    """The Ray autoscaler container KubeRay adds to a ModelService's head pod: it adds and removes
    serving worker pods as Serve scales its replicas (KubeRay's own default is 500m CPU, 512Mi)."""

    cel_rules: ClassVar = (cpu_rule("cpus"), memory_rule("memory"))
    cpus: float = Field(
        0.5, ge=0.001, le=64, description="CPU cores for the autoscaler container (at least 1m)."
    )
    memory: str = Field("512Mi", pattern=MEMORY_PATTERN, description="Memory for the autoscaler container.")


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
            "self.minReplicas <= self.maxReplicas",
            "autoscaling.minReplicas must not exceed maxReplicas",
            message_expression=said_with_values(
                "autoscaling.minReplicas (",
                "self.minReplicas",
                ") is more than autoscaling.maxReplicas (",
                "self.maxReplicas",
                ")",
            ),  # fmt: skip
        ),
        CelRule(
            "!has(self.initialReplicas) || (self.minReplicas <= self.initialReplicas && "
            "self.initialReplicas <= self.maxReplicas)",
            "autoscaling.initialReplicas must be within minReplicas..maxReplicas",
            message_expression=said_with_values(
                "autoscaling.initialReplicas (",
                "self.initialReplicas",
                ") is not within autoscaling.minReplicas..autoscaling.maxReplicas (",
                "self.minReplicas",
                "..",
                "self.maxReplicas",
                ")",
            ),  # fmt: skip
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
            message_expression=said_with_values(
                "vllm.tensorParallelSize (",
                "self.vllm.tensorParallelSize",
                ") is more than resources.gpus (",
                "self.resources.gpus",
                "), the GPUs of one replica's pod",
            ),  # fmt: skip
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
    autoscaler: AutoscalerResources = sub(
        AutoscalerResources, "The Ray autoscaler beside the head, which adds and removes replica pods."
    )
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
    serve_from: list[NetworkPeer] = Field(
        default_factory=list,
        max_length=32,
        description="Who may reach Serve's port (8000) on the Ray pods, where the operator renders a "
        "NetworkPolicy per Ray cluster (its default; the Ray pods' other ports are closed to all but "
        "one another): pods, namespaces or addresses (NetworkPolicyPeer). Empty: anyone.",
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
        default_factory=list,
        max_length=64,
        description="Environment for every Ray container. Serve takes requests through HAProxy "
        '(RAY_SERVE_ENABLE_HA_PROXY=1, its binary in ray[serve]); set it to "0" here for Serve\'s Python '
        "proxy (an image without the binary). HAProxy starts through the image's rayship-haproxy "
        "(RAY_SERVE_HAPROXY_BINARY_PATH=/home/ray/anaconda3/bin/rayship-haproxy): a client that has not "
        "sent its request headers within 10 s is answered 408, the stats page listens on loopback; an image "
        "without it: set that variable to its HAProxy. Serve runs with its throughput settings "
        "(RAY_SERVE_THROUGHPUT_OPTIMIZED=1: its request and replica logs go to its log files only, not "
        "to stderr as well; RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE=1: request lines written as they "
        'come, as `rayship logs` reads them); "0" for Serve\'s defaults.',
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
# The condition types of a ModelService's status (written by the operator).
ModelServiceConditionType = Literal["Valid", "ModelAvailable", "Ready", "Upgrading"]


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


# The kind's CRD entry (an intended parallel of TRAINING_JOB in api/trainingjob.py: one Kind each).
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
