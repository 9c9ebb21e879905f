"""Shared pure builders for the Ray pods of both kinds: pod template, container env, GPU placement,
security contexts, quantities. No I/O, no globals: cluster conventions come in through
`OperatorConfig`, so the same input always gives the same dicts.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from rayship import api
from rayship.api import names
from rayship.config import OperatorConfig

RAY_API_VERSION = f"{api.KUBERAY_GROUP}/{api.KUBERAY_VERSION}"


def cpu_quantity(cores: float) -> str:
    """4.0 -> "4", 0.5 -> "500m": the canonical Kubernetes form."""
    millis = round(cores * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def secret_tag(
    config: OperatorConfig, purpose: str, meta: api.ObjectMeta, *content: str, digits: int = 12
) -> str:
    """12 hex digits (or `digits`) that make the name of a Secret the operator creates (and never reads)
    unguessable: an HMAC, with the operator's key, of `purpose`, the owner's namespace, name and UID,
    and `content`. Nobody can plant a Secret under that name first. Offline (`rayship render`, no
    key) it is derived from an empty key: the operator's differs."""
    key = config.ray_token_key.get_secret_value().encode() if config.ray_token_key else b""
    uid = str((meta.model_extra or {}).get("uid") or "")
    identity = "/".join([purpose, meta.namespace or "default", meta.name, uid, *content])
    return hmac.new(key, identity.encode(), hashlib.sha256).hexdigest()[:digits]


def object_ref(meta: api.ObjectMeta) -> str:
    return f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name


def object_meta(meta: api.ObjectMeta, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """metadata of a child object: its name, the owner's namespace (if any) and labels."""
    out: dict[str, Any] = {"name": name}
    if meta.namespace:
        out["namespace"] = meta.namespace
    out["labels"] = dict(labels)
    return out


def container_security_context(config: OperatorConfig) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
    }


def pod_security_context(config: OperatorConfig) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
        "fsGroup": 100,  # the ray image's `users` group: lets the ray user write to mounted PVCs
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_env(
    ref: str, gpus: int, user_env: list[api.EnvVar], ref_var: str, defaults: Mapping[str, str] = {}
) -> list[dict[str, Any]]:
    """`ref_var=<namespace>/<name>` of the owning resource, GPU hiding, the `defaults` the user's env
    does not name (theirs wins), then the user's env."""
    env: list[dict[str, Any]] = [{"name": ref_var, "value": ref}]
    if gpus == 0:
        # Without this, the NVIDIA runtime exposes every GPU of the node to a pod that asked for none.
        env.append({"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "value": "void"})
    named = {e.name for e in user_env}
    env.extend({"name": k, "value": v} for k, v in defaults.items() if k not in named)
    env.extend(e.wire() for e in user_env)
    return env


Volumes = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # (pod volumes, container volumeMounts)


DRAIN_MARGIN_S = 5  # after Ray's drain deadline: Ray Train tears the group down, the raylet stops


def drain_env(grace_seconds: int) -> dict[str, str]:
    """Ray's drain on SIGTERM ends before the kubelet's kill at the pod's grace period: at its
    deadline Ray Train restarts the group from the latest checkpoint, a preemption. Ray's default
    (30 s) equals Kubernetes' default grace, so the kill raced the restart and a rank's death could
    count as a worker failure."""
    drain = grace_seconds - DRAIN_MARGIN_S if grace_seconds >= 2 * DRAIN_MARGIN_S else grace_seconds / 2
    return {"name": names.ENV_RAY_DRAIN_TIMEOUT, "value": f"{drain:g}"}


def head_drain_env() -> dict[str, str]:
    """No drain on the head's SIGTERM. Ray drains a node on SIGTERM until it is idle (default up to
    30 s), and a head never is: the job's supervisor and Ray Train's controller, or Serve's controller,
    live there to the end. So every finished job's head held its pod, and the node's CPUs and memory,
    for the whole grace period (37 s from Succeeded to the head pod gone on real-0, the workers 1.5 s).
    The head's end is its cluster's end: there is nothing to hand over. (A TrainingJob's head only: in a
    ModelService's cluster config it would start a new cluster for every service at an operator
    upgrade.)"""
    return {"name": names.ENV_RAY_DRAIN_TIMEOUT, "value": "0"}


def preemption_poll_env() -> dict[str, str]:
    """Ray Train looks for drains every second (default 5 s): a short notice is seen within it."""
    return {"name": names.ENV_RAY_TRAIN_PREEMPTION_POLL, "value": "1"}


def pvc_volume(name: str, pvc: api.PvcStorage, *, read_only: bool = False) -> Volumes:
    """A PersistentVolumeClaim mounted at its mountPath (read-only where the pod only reads)."""
    claim: dict[str, Any] = {"claimName": pvc.claim_name}
    mount: dict[str, Any] = {"name": name, "mountPath": pvc.mount_path}
    if read_only:
        claim["readOnly"] = True
        mount["readOnly"] = True
    return [{"name": name, "persistentVolumeClaim": claim}], [mount]


def container_resources(config: OperatorConfig, cpus: float, memory: str, gpus: int = 0) -> dict[str, Any]:
    """limits == requests (GPUs included; CPU unless `config.cpu_limits` is off)."""
    resources: dict[str, str] = {"cpu": cpu_quantity(cpus), "memory": memory}
    if gpus:
        resources[config.gpu_resource] = str(gpus)
    # limits == requests: Guaranteed QoS, and GPUs must be requested as limits anyway. Without a CPU
    # limit KubeRay still gives Ray the request as num-cpus, so Ray schedules the same.
    limits = {key: value for key, value in resources.items() if key != "cpu" or config.cpu_limits}
    return {"limits": limits, "requests": dict(resources)}


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
    volumes: Volumes = ([], []),
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    priority_class: str | None = None,
    service_account: str | None = None,
) -> dict[str, Any]:
    """A Ray pod: container_resources(), a memory-backed /dev/shm, non-root."""
    pod: dict[str, Any] = {
        "securityContext": pod_security_context(config),
        "containers": [
            {
                "name": container,
                "image": image,
                "resources": container_resources(config, cpus, memory, gpus),
                "env": env,
                # /dev/shm in memory: NCCL and DataLoader workers need more than Docker's 64 MB
                "volumeMounts": [{"name": names.SHM_VOLUME, "mountPath": "/dev/shm"}, *volumes[1]],
                "securityContext": container_security_context(config),
                # A container that exits with an error leaves its log's tail as its termination
                # message (kubelet: the last 80 lines, 2 KB at most): the status names a crash loop
                # with its last line, read from the pod, not from logs gone with the cluster.
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
        "volumes": [
            {"name": names.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": memory}},
            *volumes[0],
        ],
    }
    if node_selector:
        pod["nodeSelector"] = dict(sorted(node_selector.items()))
    if tolerations:
        pod["tolerations"] = tolerations
    if priority_class:
        pod["priorityClassName"] = priority_class
    if service_account:
        pod["serviceAccountName"] = service_account
    return {"metadata": {"labels": names.pod_labels(labels)}, "spec": pod}


def gpu_placement(
    config: OperatorConfig,
    gpus: int,
    gpu_product: str | None,
    node_selector: dict[str, str],
    tolerations: list[api.Toleration],
) -> tuple[dict[str, str], list[dict[str, Any]]]:
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
