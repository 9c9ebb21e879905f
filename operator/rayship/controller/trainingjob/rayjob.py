"""Render a TrainingJob: a validated TrainingJob in, the KubeRay `ray.io/v1` RayJob (and the workload's
RBAC) out, golden-tested, built on the shared pod builders in `rayship.controller.pods`. Everything
cluster-specific comes in via `OperatorConfig`."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from rayship import api
from rayship.api import names
from rayship.api.yamlio import canonical_json, files_digest
from rayship.config import OperatorConfig
from rayship.controller import pods
from rayship.controller.conditions import (
    STUCK_WAITING_REASONS,
)
from rayship.controller.network_policy import build_network_policy

# KubeRay could not create or delete a Ray pod (its RayCluster's ReplicaFailure condition, with
# KubeRay v1.6's reasons; `phase.replica_failure`), a ResourceQuota's refusal named as such.
REPLICA_FAILURE_REASONS = frozenset(
    {"ResourceQuotaExceeded", "FailedCreateHeadPod", "FailedCreateWorkerPod", "FailedDeleteHeadPod",
     "FailedDeleteWorkerPod", "FailedDeleteAllPods", "ReplicaFailure"}
)  # fmt: skip
STUCK_REASONS = frozenset({"Unschedulable", "OOMKilled"}) | STUCK_WAITING_REASONS | REPLICA_FAILURE_REASONS
JOB_MODULE = "rayship_workloads.job"  # the workload driver: `python -m rayship_workloads.job --spec`


def head_params(spec: api.TrainingJobSpec) -> dict[str, str]:
    """`ray start` of the head: no CPUs for Ray (nothing trains there); with tuning, the slots the Tune
    trials' drivers take (`names.TRIAL_RESOURCE`): JSON escaped in double quotes, KubeRay's documented
    form (its shell command unquotes it; Ray's KubeRay autoscaler config reads it so)."""
    params = {"num-cpus": "0"}
    if spec.tuning is not None:
        resources = json.dumps({names.TRIAL_RESOURCE: names.TRIAL_SLOTS})
        params["resources"] = '"' + resources.replace('"', '\\"') + '"'
    return params


def resolved_spec(wired: dict[str, Any], config: OperatorConfig) -> dict[str, Any]:
    """The spec as the workload sees it (a copy of `wired`, the spec's wire form): defaults applied,
    image and rayVersion resolved."""
    spec = dict(wired)
    spec.setdefault("image", config.default_image)
    spec.setdefault("rayVersion", config.default_ray_version)
    return spec


def workload_document(tj: api.TrainingJob, resolved: dict[str, Any]) -> dict[str, Any]:
    """The TrainingJob handed to `python -m rayship_workloads.job --spec` (same YAML, resolved) in
    the spec Secret, without `env`: the pods have it (their values by reference to the same Secret)."""
    meta = {"name": tj.metadata.name}
    if tj.metadata.namespace:
        meta["namespace"] = tj.metadata.namespace
    uid = (tj.metadata.model_extra or {}).get("uid")
    if uid:
        meta["uid"] = str(uid)  # the job's identity where it is tracked (spec.tracking)
    spec = dict(resolved)
    spec.pop("env", None)
    return {"apiVersion": api.API_VERSION, "kind": "TrainingJob", "metadata": meta, "spec": spec}


def digested(value: Any) -> Any:
    """`value` with every string replaced by a digest ("sha256:" and 16 hex digits; one already in that
    form is kept, so a record written when only env values were digested reads the same)."""
    if isinstance(value, dict):
        return {key: digested(item) for key, item in value.items()}
    if isinstance(value, list):
        return [digested(item) for item in value]
    if isinstance(value, str) and not DIGEST.fullmatch(value):
        return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]
    return value


DIGEST = re.compile(r"sha256:[0-9a-f]{16}")


def applied_record(spec: dict[str, Any]) -> str:
    """The launched spec as recorded on the RayJob (to tell later edits apart), every string replaced
    by a digest: an edit is still seen (which field), a value (a token in trainer.config, an env
    value) is never stored in an annotation."""
    return canonical_json(digested(spec))


SECRET_NAME = re.compile(api.SECRET_NAME_PATTERN)


def secret_looking_env(tj: api.TrainingJob) -> list[str]:
    """Plain `env[].value`s whose names say they hold a secret: they belong in a Secret."""
    return [
        f"spec.env[{i}] {e.name}: a plain value that looks like a secret; use valueFrom.secretKeyRef"
        for i, e in enumerate(tj.spec.env)
        if e.value is not None and SECRET_NAME.search(e.name)
    ]


def _env_key(name: str) -> str:
    return f"env.{name}"


def _runtime_env_key(name: str) -> str:
    return f"runtime-env.{name}"


def spec_secret(tj: api.TrainingJob, config: OperatorConfig, resolved: dict[str, Any]) -> dict[str, Any]:
    """The Secret the workload's private values travel in: the resolved TrainingJob (the driver's
    `--spec` reads it from the head's mount) and every plain env value (spec.env, runtimeEnv.envVars),
    which the pods' env references. None of them is in the RayJob: anyone who may `get rayjobs` reads
    it, and Ray shows the entrypoint and the runtime env on its dashboard.

    Its name ends in a tag derived from the operator's key, the TrainingJob's UID and the content: the
    operator creates it and never reads it, so a Secret planted under a name it could guess would
    have run the planter's spec; and an edited spec gets a new Secret, not a stale one. Once the name
    shows in the RayJob, one can be planted under it (ours deleted first), and KubeRay mounts whatever
    Secret has the name when it makes a cluster (a suspended job let go, a retry): the driver checks
    the files it finds against `files_digest` of these, given in the entrypoint, and runs nothing
    else. A salt only the operator can make keeps the digest from telling anything of the values."""
    data = {names.SPEC_FILE: canonical_json(workload_document(tj, resolved))}
    data.update({_env_key(e.name): e.value for e in tj.spec.env if e.value is not None})
    runtime = tj.spec.runtime_env
    data.update({_runtime_env_key(k): v for k, v in (runtime.env_vars if runtime else {}).items()})
    data[names.SPEC_SALT] = pods.secret_tag(config, "trainingjob-spec-salt", tj.metadata, digits=64)
    tag = pods.secret_tag(config, "trainingjob-spec", tj.metadata, canonical_json(data))
    metadata: dict[str, Any] = {
        "name": names.trainingjob_spec_secret(names.rayjob_name(tj.metadata.name), tag)
    }
    if tj.metadata.namespace:
        metadata["namespace"] = tj.metadata.namespace
    metadata["labels"] = names.labels("TrainingJob", tj.metadata.name, "training")
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque", "stringData": data}


def workload_env(tj: api.TrainingJob, gpus: int, secret: str) -> list[dict[str, Any]]:
    """The pods' env: rayship's own, then the user's, every plain value by reference to `secret`
    (runtimeEnv.envVars last: as Ray's runtime env, they win over spec.env)."""
    env = pods.container_env(pods.object_ref(tj.metadata), gpus, [], names.ENV_TRAININGJOB)

    def ref(name: str, key: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}

    env += [ref(e.name, _env_key(e.name)) if e.value is not None else e.wire() for e in tj.spec.env]
    runtime = tj.spec.runtime_env
    env += [ref(k, _runtime_env_key(k)) for k in sorted(runtime.env_vars if runtime else {})]
    return env


def train_entrypoint(secret: Mapping[str, Any]) -> str:
    """The driver reads the TrainingJob from the spec Secret's file on the head (never the command
    line), once the files there are those of `secret` (their digest)."""
    spec = shlex.quote(f"{names.SPEC_MOUNT}/{names.SPEC_FILE}")
    return f"python -m {JOB_MODULE} --spec {spec} --spec-digest {files_digest(secret['stringData'])}"


def _checkpoint_volumes(tj: api.TrainingJob) -> pods.Volumes:
    storage = tj.spec.checkpoint.storage
    pvc = storage.pvc if storage is not None else None
    return pods.pvc_volume(names.CHECKPOINT_VOLUME, pvc) if pvc is not None else ([], [])


def _spec_volume(secret: str) -> pods.Volumes:
    """The spec Secret, read-only on the head, readable by the pods' user through its group (fsGroup)."""
    volume = {"name": names.SPEC_VOLUME, "secret": {"secretName": secret, "defaultMode": 0o440}}
    return [volume], [{"name": names.SPEC_VOLUME, "mountPath": names.SPEC_MOUNT, "readOnly": True}]


def _pod_templates(
    tj: api.TrainingJob, config: OperatorConfig, image: str, labels: dict[str, str], secret: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The head's pod template (CPU only, the spec Secret mounted) and the workers' (their GPUs placed)."""
    spec, workers = tj.spec, tj.spec.workers

    def template(
        container: str, cpus: float, memory: str, gpus: int, volumes: pods.Volumes, **placement: Any
    ) -> dict[str, Any]:
        return pods.pod_template(
            config,
            image=image,
            container=container,
            cpus=cpus,
            memory=memory,
            gpus=gpus,
            labels=labels,
            env=workload_env(tj, gpus, secret),
            volumes=volumes,
            priority_class=spec.scheduling.priority_class_name,
            service_account=names.workload_account(tj.metadata.name),  # reports progress
            **placement,
        )

    selector, tolerations = pods.gpu_placement(
        config, workers.gpus_per_worker, workers.gpu_product, workers.node_selector, workers.tolerations
    )
    checkpoints, spec_file = _checkpoint_volumes(tj), _spec_volume(secret)
    head_volumes = (checkpoints[0] + spec_file[0], checkpoints[1] + spec_file[1])
    head = template(
        names.HEAD_CONTAINER,
        spec.head.cpus,
        spec.head.memory,
        0,
        head_volumes,
        node_selector={},
        tolerations=[],
    )
    # The driver runs on the head, and its output is kept as the job's log (`rayship logs`): Ray's dedup
    # of look-alike lines from the workers ("[repeated 3x across cluster]") would keep one rank's line
    # of each epoch and drop the others'.
    head["spec"]["containers"][0]["env"].append({"name": names.ENV_RAY_DEDUP_LOGS, "value": "0"})
    worker = template(
        names.WORKER_CONTAINER, workers.cpus_per_worker, workers.memory_per_worker, workers.gpus_per_worker,
        checkpoints, node_selector=selector, tolerations=tolerations,
    )  # fmt: skip
    # A worker pod taken away with notice (a drain, a spot reclaim) is a preemption Ray Train
    # recovers from: Ray's drain ends before the kill. The head, where Ray Train's controller
    # watches for drains, polls as often.
    grace = workers.termination_grace_period_seconds
    worker["spec"]["terminationGracePeriodSeconds"] = grace
    worker["spec"]["containers"][0]["env"] += [pods.drain_env(grace), pods.preemption_poll_env()]
    head["spec"]["containers"][0]["env"] += [pods.preemption_poll_env(), pods.head_drain_env()]
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
    return _build(tj, config)[1]


def _build(tj: api.TrainingJob, config: OperatorConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the spec Secret, the RayJob that references it)."""
    spec = tj.spec
    labels = names.labels("TrainingJob", tj.metadata.name, "training")
    wired = spec.wire()  # once per render: the resolved spec, the Secret and the annotation read it
    resolved = resolved_spec(wired, config)
    secret = spec_secret(tj, config, resolved)
    head_template, worker_template = _pod_templates(
        tj, config, resolved["image"], labels, secret["metadata"]["name"]
    )
    replicas, at_once = worker_pods(spec), worker_pods(spec) // spec.workers.replicas
    rayjob_spec: dict[str, Any] = {
        "entrypoint": train_entrypoint(secret),
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
                "rayStartParams": head_params(spec),
                "template": head_template,
            },
            "workerGroupSpecs": [
                {
                    "groupName": names.TRAINING_WORKER_GROUP,
                    # elastic: KubeRay re-creates a pod taken away; Ray Train goes on with minReplicas+
                    "replicas": replicas,
                    "minReplicas": (spec.workers.min_replicas or spec.workers.replicas) * at_once,
                    "maxReplicas": replicas,
                    "rayStartParams": {},
                    "template": worker_template,
                }
            ],
        },
    }
    runtime_env = spec.runtime_env.as_ray() if spec.runtime_env is not None else {}
    runtime_env.pop("env_vars", None)  # in the pods' env, from the Secret (workload_env)
    if runtime_env:
        # The job's runtime environment: KubeRay hands it to Ray with the submission, so the driver
        # and every worker run in workingDir (downloaded by Ray) with the pip packages.
        rayjob_spec["runtimeEnvYAML"] = yaml.safe_dump(runtime_env, sort_keys=True)
    if spec.failure_policy.active_deadline_seconds is not None:
        rayjob_spec["activeDeadlineSeconds"] = spec.failure_policy.active_deadline_seconds
    if spec.startup_deadline_seconds is not None:
        rayjob_spec["preRunningDeadlineSeconds"] = spec.startup_deadline_seconds
    metadata = _rayjob_metadata(tj, labels, wired)
    return secret, {
        "apiVersion": pods.RAY_API_VERSION,
        "kind": "RayJob",
        "metadata": metadata,
        "spec": rayjob_spec,
    }


def build_workload_rbac(tj: api.TrainingJob, config: OperatorConfig) -> list[dict[str, Any]]:
    """ServiceAccount and RoleBinding for the Ray pods: bound to the chart release's ClusterRole
    (config.workload_role: patch TrainingJob status), narrowed by the chart's admission policy
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
                "name": config.workload_role,
            },
            "subjects": [subject],
        },
    ]


def render_trainingjob(tj: api.TrainingJob, config: OperatorConfig) -> list[dict[str, Any]]:
    """Every object the operator creates for a TrainingJob, in creation order."""
    policy = build_network_policy(config, tj.metadata, "TrainingJob", names.rayjob_name(tj.metadata.name))
    return [*build_workload_rbac(tj, config), *policy, *_build(tj, config)]


def worker_pods(spec: api.TrainingJobSpec) -> int:
    """The worker group's size: workers.replicas, for each tuning trial that runs at once (a trial
    trains on workers of its own; with fewer pods, a second trial waited for workers that never came,
    and PBT, whose whole population runs at once, hung)."""
    return spec.workers.replicas * (spec.tuning.concurrent_trials() if spec.tuning is not None else 1)


def total_gpus(tj: api.TrainingJob) -> int:
    return worker_pods(tj.spec) * tj.spec.workers.gpus_per_worker


def total_cpus(tj: api.TrainingJob) -> float:
    """CPUs the job's Ray pods request: the head's and every worker's."""
    return tj.spec.head.cpus + worker_pods(tj.spec) * tj.spec.workers.cpus_per_worker
