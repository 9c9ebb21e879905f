"""The TrainingJob kind: its spec (data, workers, head, checkpoints, failure policy, scheduling, runtime
environment), its status, and its CRD entry (`TRAINING_JOB`: printer columns)."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from rayship.api.attempts import AttemptStatus
from rayship.api.common import (
    DNS1123_LABEL_PATTERN,
    ENV_NAME_PATTERN,
    IMAGE_PATTERN,
    INT32_MAX,
    LABEL_VALUE_PATTERN,
    MAX_SPEC_BYTES,
    MEMORY_PATTERN,
    NODE_SELECTOR_KEYS,
    RAY_VERSION_PATTERN,
    SECRET_NAME_PATTERN,
    WORKING_DIR_URI_PATTERN,
    ApiModel,
    CelRule,
    Condition,
    EnvVar,
    GpuProduct,
    Kind,
    NodeSelector,
    ObjectMeta,
    PrinterColumn,
    Tolerations,
    cpu_rule,
    data_uri_rule,
    memory_rule,
    name_rule,
    pip_rules,
    reserved_env_rule,
    said_with_values,
    sub,
    uri_rules,
)
from rayship.api.progress import ProgressStatus
from rayship.api.trainer import TrackingSpec, TrainerSpec
from rayship.api.tuning import TuningSpec

DATA_FORMATS = Literal["parquet", "csv", "jsonl"]


class ValidationDataSpec(ApiModel):
    """Held-out data evaluated after every epoch (`evalLoss`, and `perplexity` for causal-lm)."""

    cel_rules: ClassVar = (
        *uri_rules("uri", "data.validation.uri"),
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
        None,
        min_length=1,
        max_length=2048,
        description="Local/PVC path or s3:// URI of separate validation data.",
    )
    format: DATA_FORMATS | None = Field(
        None, description="File format of uri; inferred from its extension when omitted."
    )


class DataSpec(ApiModel):
    """Training data, read through Ray Data and sharded across workers."""

    cel_rules: ClassVar = (
        *uri_rules("uri", "data.uri"),
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
        max_length=2048,
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

    cel_rules: ClassVar = (
        NODE_SELECTOR_KEYS,
        cpu_rule("cpusPerWorker"),
        memory_rule("memoryPerWorker"),
        CelRule(
            "!has(self.minReplicas) || self.minReplicas <= self.replicas",
            "workers.minReplicas must not exceed workers.replicas (the most workers the job trains on)",
            message_expression=said_with_values(
                "workers.minReplicas (",
                "self.minReplicas",
                ") is more than workers.replicas (",
                "self.replicas",
                "), the most workers the job trains on",
            ),  # fmt: skip
        ),
    )

    replicas: int = Field(1, ge=1, le=1024, description="Number of training workers (pods).")
    min_replicas: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Elastic training: the fewest workers the job goes on with when worker pods are taken "
        "away (a spot reclaim, a drain); it grows back to replicas as pods return (Ray Train's "
        "num_workers=(minReplicas, replicas)). Unset: a fixed size of replicas.",
    )
    resize_interval_seconds: float = Field(
        60, ge=1, le=86_400, description="Elastic training: how often a job short of replicas workers "
        "looks for returned pods to grow back to, restarting from the latest checkpoint (Ray Train's "
        "elastic_resize_monitor_interval_s).",
    )  # fmt: skip
    gpus_per_worker: int = Field(1, ge=0, le=16, description="GPUs per worker pod (0 trains on CPU).")
    termination_grace_period_seconds: int = Field(
        30, ge=0, le=86_400, description="A worker pod's time from SIGTERM (a drain, a spot reclaim) to "
        "its kill. Ray drains the node until 5 s before it (half of it under 10 s): ranks checkpoint the "
        "epoch in which they learn of it; Ray Train restarts from the latest checkpoint at the deadline.",
    )  # fmt: skip
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
        *uri_rules("uri", "checkpoint.storage.uri"),
        CelRule("has(self.pvc) != has(self.uri)", "set exactly one of checkpoint.storage.pvc or .uri"),
    )
    pvc: PvcStorage | None = Field(None, description="A PersistentVolumeClaim mounted on every pod.")
    uri: str | None = Field(
        None,
        max_length=2048,
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
    max_preemptions: int | None = Field(
        None,
        ge=0,
        le=100000,
        description="Worker preemptions (a node drained or reclaimed) Ray Train recovers from, counted apart "
        "from maxWorkerFailures and never as a failed attempt. Unset: unlimited.",
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


class RuntimeEnvSpec(ApiModel):
    """Code and packages shipped with the job (Ray's runtime environment) instead of baked into an image."""

    cel_rules: ClassVar = (
        *uri_rules("workingDir", "runtimeEnv.workingDir"),
        *pip_rules("pip", "runtimeEnv.pip"),
        CelRule(
            "!has(self.workingDir) || self.workingDir.matches('"
            + WORKING_DIR_URI_PATTERN.replace("\\", "\\\\")
            + "')",
            "runtimeEnv.workingDir: in a cluster it must be a zip archive's URI (s3://, gs://, https:// or "
            "file:// on a mounted claim, ending in .zip): `rayship apply -f` packs and uploads a local folder "
            "(kubectl apply cannot)",
            cluster_only=True,
        ),
        CelRule(
            "!has(self.envVars) || self.envVars.all(k, k.matches('"
            + ENV_NAME_PATTERN
            + "') && k.size() <= 128)",
            "runtimeEnv.envVars names must be letters, digits and '_' (not starting with a digit)",
        ),
        reserved_env_rule("self.envVars", "runtimeEnv.envVars"),
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
        description="Your code: a local folder (relative to the YAML file) for `rayship run` and "
        "`rayship apply`, which packs it into a zip named by its content hash on the claim the Ray pods "
        "mount; in a cluster, a zip archive's URI (s3://, gs://, https://, or file:// on a mounted claim). "
        "The driver and every worker run in it, so trainer.entrypoint's module is importable.",
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
    startup_deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=INT32_MAX,
        description="Fail an attempt whose Ray cluster is not running this many seconds after the attempt "
        "started (KubeRay's preRunningDeadlineSeconds): the status says what it was stuck on and its Ray "
        "cluster is deleted at once, whatever ttlSecondsAfterFinished says, so a stuck job holds no GPUs. "
        "KubeRay retries it on a new cluster up to failurePolicy.retries times.",
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

    @model_validator(mode="after")
    def _code_on_the_claim(self) -> TrainingJobSpec:
        """A file:// workingDir is read in the Ray pods: it must lie on the claim they mount. Not a CEL
        rule: the concatenation with mountPath (no maxLength) is beyond the API server's cost budget."""
        working_dir = self.runtime_env.working_dir if self.runtime_env else None
        if not working_dir or not working_dir.startswith("file://"):
            return self
        pvc = self.checkpoint.storage.pvc if self.checkpoint.storage else None
        mount = pvc.mount_path.rstrip("/") + "/" if pvc else None
        if mount is None or not working_dir[len("file://") :].startswith(mount):
            where = (
                f"under file://{mount}" if mount else "on checkpoint.storage.pvc, which this job has none of"
            )
            raise ValueError(
                f"runtimeEnv.workingDir: {working_dir} is read in the Ray pods, so it must lie {where} "
                "(`rayship apply -f` puts a local folder there)"
            )
        return self


# --- TrainingJob status ------------------------------------------------------------------------

Phase = Literal["Pending", "Running", "Succeeded", "Failed", "Suspended", "Invalid"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})
# The condition types of a TrainingJob's status: the operator writes each, users and tools read them.
# `Running`, `Complete`, `Failed` and `Suspended` follow the phase (one True at a time).
TrainingJobConditionType = Literal["Valid", "Running", "Complete", "Failed", "Suspended", "SpecApplied"]


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


class LastError(ApiModel):
    """The job's last error, kept until a later one replaces it (across attempts)."""

    message: str = Field(
        ...,
        description="Its last line: the exception, OOM kill or timeout; from a pod, the pod and container "
        "are named in it.",
    )
    source: Literal["pod", "driver"] = Field(
        ...,
        description="pod: a Ray container's (its state, its log's tail); driver: the Ray job's, as KubeRay reported it.",
    )
    attempt: int | None = Field(None, ge=1, description="The attempt it ended or held up.")
    time: str | None = Field(None, description="When the operator saw it (RFC 3339).")


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
    ready_workers: int | None = Field(
        None,
        ge=0,
        description="Worker pods ready while the job runs (an elastic job goes on with as few as "
        "spec.workers.minReplicas).",
    )
    gpu_seconds: float | None = Field(
        None, ge=0, description="GPU-seconds held by the Ray job so far, summed over its attempts."
    )
    gpu_seconds_earlier_attempts: float | None = Field(
        None, ge=0, description="The part of gpuSeconds from attempts whose pods are all gone."
    )
    gpu_hours: float | None = Field(None, ge=0, description="gpuSeconds in hours.")
    cpu_seconds: float | None = Field(
        None,
        ge=0,
        description="CPU-seconds held by the Ray pods (head and workers) so far, over its attempts.",
    )
    cpu_seconds_earlier_attempts: float | None = Field(
        None, ge=0, description="The part of cpuSeconds from attempts whose pods are all gone."
    )
    cpu_hours: float | None = Field(None, ge=0, description="cpuSeconds in hours.")
    attempt: int | None = Field(None, ge=1, description="Current attempt (KubeRay retries: backoffLimit).")
    attempts: list[AttemptStatus] | None = Field(
        None,
        max_length=20,
        description="Every attempt on record, oldest first (the last 20; the totals cover all of them).",
    )
    last_error: LastError | None = Field(None, description="The last error of the job's Ray pods or driver.")
    progress: ProgressStatus | None = Field(None, description="Training progress.")
    checkpoint: CheckpointStatus | None = Field(None, description="Checkpoints and exported model.")
    tuning: TuningStatus | None = Field(None, description="Hyperparameter search result.")
    observed_generation: int | None = Field(None, ge=0, description="Generation the status reflects.")


class TrainingJob(ApiModel):
    """Distributed training (PyTorch DDP, FSDP2 or DeepSpeed ZeRO; Ray Tune searches) on a KubeRay RayJob with GPU
    workers."""

    cel_rules: ClassVar = (name_rule(),)
    api_version: Literal["rayship.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["TrainingJob"]
    metadata: ObjectMeta
    spec: TrainingJobSpec
    status: dict[str, Any] | None = None  # written by the operator; not validated on input


# The kind's CRD entry (an intended parallel of MODEL_SERVICE in api/modelservice.py: one Kind each).
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
        PrinterColumn("Ready", "integer", ".status.readyWorkers", "Worker pods ready while it runs."),
        PrinterColumn("GPUs", "integer", ".status.gpus", "GPUs requested by the worker group."),
        PrinterColumn("Epoch", "integer", ".status.progress.epoch", "Last completed epoch."),
        PrinterColumn("Loss", "number", ".status.progress.metrics.loss", "Latest training loss."),
        PrinterColumn("GPU-Hours", "number", ".status.gpuHours", "GPU-hours held over every attempt."),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation."),
        PrinterColumn(
            "Last Error", "string", ".status.lastError.message", "The job's last error.", priority=1
        ),
    ),
)
