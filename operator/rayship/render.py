"""Pure renderers: a validated TrainingJob in, the KubeRay `ray.io/v1` objects out.

No I/O, no globals, no clock: the same input always gives the same dicts (golden-tested), so the
operator's reconciles never flap. Everything cluster-specific comes in through `OperatorConfig`.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from rayship import api, names
from rayship.config import OperatorConfig

RAY_API_VERSION = "ray.io/v1"
TRAIN_MODULE = "rayship_workloads.train"
WORKER_GROUP = "gpu-workers"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
SUBMITTER_CONTAINER = "ray-job-submitter"  # KubeRay fills in `ray job submit` when command is empty
CHECKPOINT_VOLUME = "checkpoints"
SHM_VOLUME = "dshm"


def cpu_quantity(cores: float) -> str:
    """4.0 -> "4", 0.5 -> "500m": the canonical Kubernetes form."""
    millis = round(cores * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def resolved_spec(tj: api.TrainingJob, config: OperatorConfig) -> dict[str, Any]:
    """The spec as the workload sees it: defaults applied, image and rayVersion resolved."""
    spec = tj.spec.wire()
    spec.setdefault("image", config.default_image)
    spec.setdefault("rayVersion", config.default_ray_version)
    return spec


def workload_document(tj: api.TrainingJob, config: OperatorConfig) -> dict[str, Any]:
    """The TrainingJob handed to `python -m rayship_workloads.train --spec` (same YAML, resolved)."""
    meta = {"name": tj.metadata.name}
    if tj.metadata.namespace:
        meta["namespace"] = tj.metadata.namespace
    return {
        "apiVersion": api.API_VERSION,
        "kind": "TrainingJob",
        "metadata": meta,
        "spec": resolved_spec(tj, config),
    }


def train_entrypoint(tj: api.TrainingJob, config: OperatorConfig) -> str:
    return f"python -m {TRAIN_MODULE} --spec {shlex.quote(canonical_json(workload_document(tj, config)))}"


def _security_context(config: OperatorConfig) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
    }


def _pod_security_context(config: OperatorConfig) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
        "fsGroup": 100,  # the ray image's `users` group: lets the ray user write to mounted PVCs
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_env(ref: str, gpus: int, user_env: list[api.EnvVar], ref_var: str) -> list[dict[str, Any]]:
    """`ref_var=<namespace>/<name>` of the owning resource, GPU hiding, then the user's env."""
    env: list[dict[str, Any]] = [{"name": ref_var, "value": ref}]
    if gpus == 0:
        # Without this, the NVIDIA runtime exposes every GPU of the node to a pod that asked for none.
        env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"})
    env.extend(e.wire() for e in user_env)
    return env


def object_ref(meta: api.ObjectMeta) -> str:
    return f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name


def _checkpoint_volumes(tj: api.TrainingJob) -> tuple[list[dict], list[dict]]:
    pvc = tj.spec.checkpoint.storage.pvc
    if pvc is None:
        return [], []
    return (
        [{"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": pvc.claim_name}}],
        [{"name": CHECKPOINT_VOLUME, "mountPath": pvc.mount_path}],
    )


def pod_template(
    config: OperatorConfig,
    *,
    image: str,
    container: str,
    cpus: float,
    memory: str,
    gpus: int,
    labels: dict[str, str],
    env: list[dict[str, Any]],
    volumes: tuple[list[dict], list[dict]] = ([], []),
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    priority_class: str | None = None,
    service_account: str | None = None,
) -> dict[str, Any]:
    """A Ray pod: limits == requests (GPUs included), a memory-backed /dev/shm, non-root."""
    resources: dict[str, str] = {"cpu": cpu_quantity(cpus), "memory": memory}
    if gpus:
        resources[config.gpu_resource] = str(gpus)
    pod: dict[str, Any] = {
        "securityContext": _pod_security_context(config),
        "containers": [
            {
                "name": container,
                "image": image,
                # limits == requests: Guaranteed QoS, and GPUs must be requested as limits anyway
                "resources": {"limits": dict(resources), "requests": dict(resources)},
                "env": env,
                # /dev/shm in memory: NCCL and DataLoader workers need more than Docker's 64 MB
                "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}, *volumes[1]],
                "securityContext": _security_context(config),
            }
        ],
        "volumes": [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": memory}}, *volumes[0]],
    }
    if node_selector:
        pod["nodeSelector"] = dict(sorted(node_selector.items()))
    if tolerations:
        pod["tolerations"] = tolerations
    if priority_class:
        pod["priorityClassName"] = priority_class
    if service_account:
        pod["serviceAccountName"] = service_account
    return {"metadata": {"labels": dict(labels)}, "spec": pod}


def _tj_pod(
    tj: api.TrainingJob,
    config: OperatorConfig,
    *,
    container: str,
    cpus: float,
    memory: str,
    gpus: int,
    labels: dict[str, str],
    node_selector: dict[str, str],
    tolerations: list[dict[str, Any]],
) -> dict[str, Any]:
    return pod_template(
        config,
        image=resolved_spec(tj, config)["image"],
        container=container,
        cpus=cpus,
        memory=memory,
        gpus=gpus,
        labels=labels,
        env=container_env(object_ref(tj.metadata), gpus, tj.spec.env, names.ENV_TRAININGJOB),
        volumes=_checkpoint_volumes(tj),
        node_selector=node_selector,
        tolerations=tolerations,
        priority_class=tj.spec.scheduling.priority_class_name,
        service_account=names.workload_account(tj.metadata.name),  # reports progress
    )


def gpu_placement(
    config: OperatorConfig,
    gpus: int,
    gpu_product: str | None,
    node_selector: dict[str, str],
    tolerations: list,
) -> tuple[dict[str, str], list[dict]]:
    """Node selector and tolerations of a worker group: the GPU conventions, then the user's own."""
    selector: dict[str, str] = {}
    tols: list[dict[str, Any]] = []
    if gpus:
        selector.update(config.gpu_node_selector)
        tols.extend(config.gpu_tolerations)
        if gpu_product:
            selector[config.gpu_product_label] = gpu_product
    selector.update(node_selector)
    tols.extend(t.wire() for t in tolerations)
    return selector, tols


def build_rayjob(tj: api.TrainingJob, config: OperatorConfig) -> dict[str, Any]:
    """The RayJob for a TrainingJob: a fixed-size GPU worker group, a CPU-only head, and a cluster
    that is always torn down after the job (no zombie GPU clusters)."""
    spec = tj.spec
    name = names.rayjob_name(tj.metadata.name)
    labels = names.labels("TrainingJob", tj.metadata.name, "training")
    resolved = resolved_spec(tj, config)
    head_template = _tj_pod(
        tj,
        config,
        container=HEAD_CONTAINER,
        cpus=spec.head.cpus,
        memory=spec.head.memory,
        gpus=0,
        labels=labels,
        node_selector={},
        tolerations=[],
    )
    workers = spec.workers
    selector, tolerations = gpu_placement(
        config, workers.gpus_per_worker, workers.gpu_product, workers.node_selector, workers.tolerations
    )
    worker_template = _tj_pod(
        tj,
        config,
        container=WORKER_CONTAINER,
        cpus=spec.workers.cpus_per_worker,
        memory=spec.workers.memory_per_worker,
        gpus=spec.workers.gpus_per_worker,
        labels=labels,
        node_selector=selector,
        tolerations=tolerations,
    )
    replicas = spec.workers.replicas
    rayjob_spec: dict[str, Any] = {
        "entrypoint": train_entrypoint(tj, config),
        "submissionMode": "K8sJobMode",
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
        "backoffLimit": spec.failure_policy.retries,
        "suspend": spec.suspend,
        "submitterPodTemplate": _submitter_template(tj, config, labels),
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
                    "groupName": WORKER_GROUP,
                    "replicas": replicas,
                    "minReplicas": replicas,
                    "maxReplicas": replicas,
                    "rayStartParams": {},
                    "template": worker_template,
                }
            ],
        },
    }
    if spec.failure_policy.active_deadline_seconds is not None:
        rayjob_spec["activeDeadlineSeconds"] = spec.failure_policy.active_deadline_seconds
    metadata: dict[str, Any] = {"name": name}
    if tj.metadata.namespace:
        metadata["namespace"] = tj.metadata.namespace
    metadata["labels"] = dict(labels)
    if spec.scheduling.queue:
        metadata["labels"][names.LABEL_KUEUE_QUEUE] = spec.scheduling.queue
    metadata["annotations"] = {names.ANNOTATION_SPEC: canonical_json(tj.spec.wire())}
    return {"apiVersion": RAY_API_VERSION, "kind": "RayJob", "metadata": metadata, "spec": rayjob_spec}


def _submitter_template(tj: api.TrainingJob, config: OperatorConfig, labels: dict[str, str]) -> dict:
    """The pod that runs `ray job submit`: KubeRay's default, hardened (non-root, no escalation)."""
    resources = {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m", "memory": "200Mi"}}
    pod = {
        "restartPolicy": "Never",
        "securityContext": _pod_security_context(config),
        "containers": [
            {
                "name": SUBMITTER_CONTAINER,
                "image": resolved_spec(tj, config)["image"],
                "resources": resources,
                "securityContext": _security_context(config),
            }
        ],
    }
    if tj.spec.scheduling.priority_class_name:
        pod["priorityClassName"] = tj.spec.scheduling.priority_class_name
    return {"metadata": {"labels": dict(labels)}, "spec": pod}


def build_workload_rbac(tj: api.TrainingJob) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding for the Ray pods: they may read and patch the status of
    their own TrainingJob (progress reporting) and nothing else."""
    name = names.workload_account(tj.metadata.name)
    metadata: dict[str, Any] = {"name": name}
    if tj.metadata.namespace:
        metadata["namespace"] = tj.metadata.namespace
    metadata["labels"] = names.labels("TrainingJob", tj.metadata.name, "workload-rbac")
    subject: dict[str, Any] = {"kind": "ServiceAccount", "name": name}
    if tj.metadata.namespace:
        subject["namespace"] = tj.metadata.namespace
    rule = {
        "apiGroups": [api.GROUP],
        "resources": ["trainingjobs/status"],
        "resourceNames": [tj.metadata.name],
        "verbs": ["get", "patch"],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(metadata)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(metadata),
            "rules": [rule],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(metadata),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [subject],
        },
    ]


def render_trainingjob(tj: api.TrainingJob, config: OperatorConfig) -> list[dict[str, Any]]:
    """Every object the operator creates for a TrainingJob, in creation order."""
    return [*build_workload_rbac(tj), build_rayjob(tj, config)]


def total_gpus(tj: api.TrainingJob) -> int:
    return tj.spec.workers.replicas * tj.spec.workers.gpus_per_worker
