"""Render a TrainingJob: a validated TrainingJob in, the KubeRay `ray.io/v1` RayJob (and the workload's
RBAC) out, golden-tested, built on the shared pod builders in `rayship.controller.pods`. Everything
cluster-specific comes in via `OperatorConfig`."""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import Any

import yaml

from rayship import api
from rayship.api import names
from rayship.api.yamlio import canonical_json
from rayship.config import OperatorConfig
from rayship.controller import pods
from rayship.controller.conditions import (
    STUCK_WAITING_REASONS,
)

STUCK_REASONS = frozenset({"Unschedulable", "OOMKilled"}) | STUCK_WAITING_REASONS
JOB_MODULE = "rayship_workloads.job"  # the workload driver: `python -m rayship_workloads.job --spec`


def resolved_spec(wired: dict[str, Any], config: OperatorConfig) -> dict[str, Any]:
    """The spec as the workload sees it (a copy of `wired`, the spec's wire form): defaults applied,
    image and rayVersion resolved."""
    spec = dict(wired)
    spec.setdefault("image", config.default_image)
    spec.setdefault("rayVersion", config.default_ray_version)
    return spec


def workload_document(tj: api.TrainingJob, resolved: dict[str, Any]) -> dict[str, Any]:
    """The TrainingJob handed to `python -m rayship_workloads.job --spec` (same YAML, resolved),
    without `env`: the pods already have it, and the entrypoint is shown in Ray's job list and
    dashboard, so no env value (a token pasted as a plain value) travels in it."""
    meta = {"name": tj.metadata.name}
    if tj.metadata.namespace:
        meta["namespace"] = tj.metadata.namespace
    uid = (tj.metadata.model_extra or {}).get("uid")
    if uid:
        meta["uid"] = str(uid)  # the job's identity where it is tracked (spec.tracking)
    spec = dict(resolved)
    spec.pop("env", None)
    return {"apiVersion": api.API_VERSION, "kind": "TrainingJob", "metadata": meta, "spec": spec}


def applied_record(spec: dict[str, Any]) -> str:
    """The launched spec as recorded on the RayJob (to tell later edits apart), env values replaced
    by a digest: an edit is still seen, a value is never stored in an annotation."""
    record = dict(spec)
    record["env"] = [
        {**e, "value": "sha256:" + hashlib.sha256(e["value"].encode()).hexdigest()[:16]}
        if "value" in e
        else e
        for e in spec.get("env") or []
    ]
    return canonical_json(record)


SECRET_NAME = re.compile(api.SECRET_NAME_PATTERN)


def secret_looking_env(tj: api.TrainingJob) -> list[str]:
    """Plain `env[].value`s whose names say they hold a secret: they belong in a Secret."""
    return [
        f"spec.env[{i}] {e.name}: a plain value that looks like a secret; use valueFrom.secretKeyRef"
        for i, e in enumerate(tj.spec.env)
        if e.value is not None and SECRET_NAME.search(e.name)
    ]


def train_entrypoint(tj: api.TrainingJob, resolved: dict[str, Any]) -> str:
    document = workload_document(tj, resolved)
    return f"python -m {JOB_MODULE} --spec {shlex.quote(canonical_json(document))}"


def _checkpoint_volumes(tj: api.TrainingJob) -> pods.Volumes:
    storage = tj.spec.checkpoint.storage
    pvc = storage.pvc if storage is not None else None
    return pods.pvc_volume(names.CHECKPOINT_VOLUME, pvc) if pvc is not None else ([], [])


def _pod_templates(
    tj: api.TrainingJob, config: OperatorConfig, image: str, labels: dict[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The head's pod template (CPU only) and the workers' (their GPUs placed)."""
    spec, workers = tj.spec, tj.spec.workers

    def template(container: str, cpus: float, memory: str, gpus: int, **placement: Any) -> dict[str, Any]:
        return pods.pod_template(
            config,
            image=image,
            container=container,
            cpus=cpus,
            memory=memory,
            gpus=gpus,
            labels=labels,
            env=pods.container_env(pods.object_ref(tj.metadata), gpus, spec.env, names.ENV_TRAININGJOB),
            volumes=_checkpoint_volumes(tj),
            priority_class=spec.scheduling.priority_class_name,
            service_account=names.workload_account(tj.metadata.name),  # reports progress
            **placement,
        )

    selector, tolerations = pods.gpu_placement(
        config, workers.gpus_per_worker, workers.gpu_product, workers.node_selector, workers.tolerations
    )
    head = template(
        names.HEAD_CONTAINER, spec.head.cpus, spec.head.memory, 0, node_selector={}, tolerations=[]
    )
    worker = template(
        names.WORKER_CONTAINER, workers.cpus_per_worker, workers.memory_per_worker, workers.gpus_per_worker,
        node_selector=selector, tolerations=tolerations,
    )  # fmt: skip
    return head, worker


def _rayjob_metadata(tj: api.TrainingJob, labels: dict[str, str], wired: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": names.rayjob_name(tj.metadata.name)}
    if tj.metadata.namespace:
        metadata["namespace"] = tj.metadata.namespace
    metadata["labels"] = dict(labels)
    if tj.spec.scheduling.queue:
        metadata["labels"][names.LABEL_KUEUE_QUEUE] = tj.spec.scheduling.queue
    metadata["annotations"] = {names.ANNOTATION_SPEC: applied_record(wired)}
    return metadata


def build_rayjob(tj: api.TrainingJob, config: OperatorConfig) -> dict[str, Any]:
    """The RayJob for a TrainingJob: a fixed-size GPU worker group, a CPU-only head, and a cluster
    that is always torn down after the job (no zombie GPU clusters)."""
    spec = tj.spec
    labels = names.labels("TrainingJob", tj.metadata.name, "training")
    wired = spec.wire()  # once per render: the resolved spec, the entrypoint and the annotation read it
    resolved = resolved_spec(wired, config)
    head_template, worker_template = _pod_templates(tj, config, resolved["image"], labels)
    replicas = spec.workers.replicas
    rayjob_spec: dict[str, Any] = {
        "entrypoint": train_entrypoint(tj, resolved),
        # HTTPMode: KubeRay itself submits the job to the Ray dashboard (through the API server's
        # service proxy with --use-kubernetes-proxy) once the cluster is ready: no submitter pod to
        # schedule, to leak or to account for in a queue (K8sJobMode's `ray job submit` pod).
        "submissionMode": "HTTPMode",
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
        "backoffLimit": spec.failure_policy.retries,
        "suspend": spec.suspend,
        "rayClusterSpec": {
            "rayVersion": resolved["rayVersion"],
            "enableInTreeAutoscaling": False,
            "authOptions": {"mode": "token"},
            "headGroupSpec": {
                # The head coordinates; training happens on the GPU workers only.
                "rayStartParams": {"num-cpus": "0"},
                "template": head_template,
            },
            "workerGroupSpecs": [
                {
                    "groupName": names.TRAINING_WORKER_GROUP,
                    "replicas": replicas,
                    "minReplicas": replicas,
                    "maxReplicas": replicas,
                    "rayStartParams": {},
                    "template": worker_template,
                }
            ],
        },
    }
    if spec.runtime_env is not None and (runtime_env := spec.runtime_env.as_ray()):
        # The job's runtime environment: KubeRay hands it to Ray with the submission, so the driver
        # and every worker run in workingDir (downloaded by Ray) with the pip packages and envVars.
        rayjob_spec["runtimeEnvYAML"] = yaml.safe_dump(runtime_env, sort_keys=True)
    if spec.failure_policy.active_deadline_seconds is not None:
        rayjob_spec["activeDeadlineSeconds"] = spec.failure_policy.active_deadline_seconds
    metadata = _rayjob_metadata(tj, labels, wired)
    return {"apiVersion": pods.RAY_API_VERSION, "kind": "RayJob", "metadata": metadata, "spec": rayjob_spec}


def build_workload_rbac(tj: api.TrainingJob) -> list[dict[str, Any]]:
    """ServiceAccount and RoleBinding for the Ray pods: bound to the chart's ClusterRole
    (names.WORKLOAD_ROLE: patch TrainingJob status), narrowed by the chart's admission policy
    (rbac.workload_policy) to the status of their own TrainingJob, which names this ServiceAccount
    in status.workloadAccount. Nothing else."""
    name = names.workload_account(tj.metadata.name)
    metadata: dict[str, Any] = {"name": name}
    if tj.metadata.namespace:
        metadata["namespace"] = tj.metadata.namespace
    metadata["labels"] = names.labels("TrainingJob", tj.metadata.name, "workload-rbac")
    subject: dict[str, Any] = {"kind": "ServiceAccount", "name": name}
    if tj.metadata.namespace:
        subject["namespace"] = tj.metadata.namespace
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(metadata)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(metadata),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": names.WORKLOAD_ROLE,
            },
            "subjects": [subject],
        },
    ]


def render_trainingjob(tj: api.TrainingJob, config: OperatorConfig) -> list[dict[str, Any]]:
    """Every object the operator creates for a TrainingJob, in creation order."""
    return [*build_workload_rbac(tj), build_rayjob(tj, config)]


def total_gpus(tj: api.TrainingJob) -> int:
    return tj.spec.workers.replicas * tj.spec.workers.gpus_per_worker
