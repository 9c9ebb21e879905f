"""`rayship status`'s "Next step": what to do about an object, from the reason its status gives (the
reason of the condition that carries its phase), pure. Each reason the controllers write has its own
step (tests/unit/test_cli_nextstep.py checks them against the controllers' tables); a reason a later
version adds falls back on the phase."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rayship.api import names

RECREATE = "it resumes from the latest checkpoint"
INVALID = (
    "fix the spec as the Valid condition says (`rayship render -f FILE` says the same offline), then apply "
    "it again"
)

# A Ray pod that cannot start or keeps failing, whichever kind made it.
POD_STEPS: dict[str, str] = {
    "Unschedulable": (
        "no node can take a Ray pod (the message says why): add or free nodes with what it asks for, or ask "
        "for less; kubectl get pods -n {ns} -l {selector} shows its pods"
    ),
    "ImagePullBackOff": (
        "the image cannot be pulled: check spec.image (registry, name, tag) and the pull secret the "
        "namespace needs for it"
    ),
    "ErrImageNeverPull": "the node does not have the image and its imagePullPolicy is Never: load it there",
    "InvalidImageName": "spec.image is not a valid image reference: fix it",
    "CrashLoopBackOff": "a Ray container keeps failing: read its output with rayship logs {ref}",
    "RunContainerError": "a Ray container cannot run: read the message, then rayship logs {ref}",
    "CreateContainerError": "a Ray container cannot be created: read the message (its command, its mounts)",
    "CreateContainerConfigError": (
        "a Ray container names something that does not exist (a Secret or ConfigMap, or a key of one): "
        "create it"
    ),
    "OOMKilled": (
        "a Ray container ran out of memory: give it more (spec.workers.memoryPerWorker, spec.head) or use "
        "less (a smaller batch)"
    ),
    "ResourceQuotaExceeded": "a ResourceQuota of namespace {ns} refused a Ray pod: raise the quota or ask for less",
    "ReplicaFailure": "KubeRay could not create a Ray pod (the message says why): kubectl get events -n {ns}",
}
POD_STEPS["ErrImagePull"] = POD_STEPS["ImagePullBackOff"]
for _failed in ("FailedCreateHeadPod", "FailedCreateWorkerPod", "FailedDeleteHeadPod", "FailedDeleteWorkerPod",
                "FailedDeleteAllPods"):  # fmt: skip
    POD_STEPS[_failed] = POD_STEPS["ReplicaFailure"]

_STARTING = "wait: its Ray cluster is starting; kubectl get pods -n {ns} -l {selector} shows its pods"
_FAILED = (
    "read why it failed: rayship logs {ref} (--attempt N for an earlier attempt); fix it and re-create the "
    f"TrainingJob: {RECREATE}"
)
TRAININGJOB_STEPS: dict[str, str] = {
    "InvalidSpec": INVALID,
    "CreatingRayJob": "wait: the operator is creating its RayJob",
    "RayJobCreated": "wait: KubeRay is starting its Ray cluster",
    "ClusterInitializing": _STARTING,
    "WaitingForSubmission": "wait: the Ray cluster is up and the job is about to be submitted",
    "JobSubmitting": "wait: the job is being submitted to its Ray cluster",
    "JobPending": "wait: the Ray job is submitted and waits for its workers",
    "JobRunning": "follow its output: rayship logs -f {ref}",
    "JobFinishing": "wait: the job succeeded and KubeRay is finishing it",
    "AttemptEnded": "an attempt ended and KubeRay decides whether to retry: rayship logs {ref} says why",
    "Retrying": "an attempt failed and KubeRay is retrying: rayship logs {ref} --attempt N says why it failed",
    "JobSucceeded": "serve its model: a ModelService with spec.model.fromTrainingJob.name: {name}",
    "RayJobGoneAfterExport": "serve its model: a ModelService with spec.model.fromTrainingJob.name: {name}",
    "Suspended": 'resume it: kubectl patch trainingjob {name} -n {ns} --type merge -p \'{{"spec":{{"suspend":false}}}}\'',
    "Suspending": "wait: its Ray cluster is being deleted; resume it later with spec.suspend: false",
    "Queued": "wait for Kueue to admit it (kubectl get workloads -n {ns}): its queue needs quota for it",
    "PreviousRayJobTerminating": "wait: the RayJob of an earlier TrainingJob of this name is being deleted",
    "ClaimNotFound": (
        "create the PersistentVolumeClaim {claim} in namespace {ns} (ReadWriteMany where its pods may span "
        "nodes), or name one that exists in spec.checkpoint.storage.pvc.claimName: the job starts once it does"
    ),
    "RayJobNameTaken": (
        "a RayJob named {rayjob} exists and is not this job's: delete it (kubectl delete rayjob {rayjob} -n "
        "{ns}) or give the TrainingJob another name"
    ),
    "StartupDeadlineExceeded": (
        "its Ray cluster was not running in time (the message says what it was stuck on): fix that, or raise "
        f"spec.startupDeadlineSeconds, and re-create the TrainingJob: {RECREATE}"
    ),
    "RayJobLost": f"re-create the TrainingJob to train again: {RECREATE}",
    "UnknownRayJobState": "look at its RayJob: kubectl describe rayjob {rayjob} -n {ns}",
    "RayJobFailed": _FAILED,
    "JobNotSucceeded": _FAILED,
    "AppFailed": _FAILED,  # KubeRay's reasons of a failed RayJob, passed through
    "DeadlineExceeded": (
        "it ran past spec.failurePolicy.activeDeadlineSeconds: raise it, and re-create the TrainingJob: "
        f"{RECREATE}"
    ),
    "SubmissionFailed": "KubeRay could not submit the job to its Ray cluster (the message says why): "
    + _FAILED,
    "RayJobValidationFailed": "KubeRay refused its RayJob (the message says why): rayship render -f FILE shows it",
    **POD_STEPS,
}
IMMUTABLE = f"delete and re-create the TrainingJob to apply the fields edited after launch: {RECREATE}"

MODELSERVICE_STEPS: dict[str, str] = {
    "InvalidSpec": INVALID,
    "TrainingJobNotFound": "create the TrainingJob it names (spec.model.fromTrainingJob.name), or fix the name "
    "(the message names those that exist and the closest one)",
    "TrainingJobNotSucceeded": "wait for the TrainingJob it serves from to succeed: rayship status tj/{model} -n {ns}",
    "TrainingJobFailed": "the TrainingJob it serves from failed: rayship status tj/{model} -n {ns}",
    "TrainingJobDeleted": "the TrainingJob it served from was deleted: it keeps serving; name another model",
    "TrainingScheduleNotFound": "create the TrainingSchedule it names (fromTrainingSchedule.name), or fix the name",
    "TrainingScheduleDeleted": "the TrainingSchedule it served from was deleted: it keeps serving; name another",
    "NothingPromoted": "wait for a run of the schedule to pass its gate: rayship status ts/{model} -n {ns}",
    "NotALanguageModel": "serve it with engine: rayship, or serve a causal language model",
    "NoExportedModel": "the job reports no exported model: check its spec.checkpoint and rayship logs tj/{model}",
    "ModelVolumesClash": "two models are on PVCs that cannot be mounted together (the message says which)",
    "Waiting": "wait: the operator is resolving its model",
    "RayServiceNameTaken": (
        "a RayService named {rayservice} exists and is not this service's: delete it or give the "
        "ModelService another name"
    ),
    "DeployFailed": "read the replicas' errors: the message names the failing deployment; rayship logs {ref}",
    "Unhealthy": "a replica is unhealthy: rayship logs {ref} shows its requests and errors",
    "RayServiceValidationFailed": "KubeRay refused its RayService: kubectl describe rayservice {rayservice} -n {ns}",
    "InitializingTimeout": "its Ray cluster did not start in time: see the message, fix it, re-create the ModelService",
    "Ready": "call it: {url}",
    "Deploying": "wait: the Serve application is deploying; rayship logs {ref} shows its replicas",
    "Initializing": "wait: its Ray cluster is starting; kubectl get pods -n {ns} -l {selector} shows its pods",
    "ZeroServeEndpoints": "wait: no Ray pod serves yet; kubectl get pods -n {ns} -l {selector} shows its pods",
    **POD_STEPS,
}

TRAININGSCHEDULE_STEPS: dict[str, str] = {
    "InvalidSpec": INVALID,
    "Scheduled": "nothing to do: the next run is due at {next}",
    "Suspended": 'resume it: kubectl patch trainingschedule {name} -n {ns} --type merge -p \'{{"spec":{{"suspend":false}}}}\'',
    "Forbidden": "a run is still active (concurrencyPolicy Forbid): wait for it, or delete it",
    "MissedSchedule": "a run was not started within startingDeadlineSeconds: raise it, or wait for the next",
    "NeverDue": "fix spec.schedule: it is never due",
}

STEPS: dict[str, dict[str, str]] = {
    "TrainingJob": TRAININGJOB_STEPS,
    "ModelService": MODELSERVICE_STEPS,
    "TrainingSchedule": TRAININGSCHEDULE_STEPS,
}
SHORT = {"TrainingJob": "tj", "ModelService": "ms", "TrainingSchedule": "ts"}
NOT_SEEN = (
    "the operator has not written its status yet: is the rayship operator running and watching namespace "
    "{ns}? (kubectl get pods -A -l app.kubernetes.io/name=rayship)"
)


def find(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def telling_condition(kind: str, status: Mapping[str, Any]) -> Mapping[str, Any]:
    """The condition whose reason says what the object waits on or why it stopped."""
    if status.get("phase") == "Invalid":
        return find(status, "Valid")
    if kind == "TrainingJob":
        return find(status, "Running")
    if kind == "ModelService":
        model = find(status, "ModelAvailable")
        if status.get("phase") == "WaitingForModel" or model.get("status") == "False":
            return model or find(status, "Ready")
        return find(status, "Ready")
    return find(status, "Scheduling")


def next_step(obj: Mapping[str, Any]) -> str:
    """What to do next about `obj` (a TrainingJob, ModelService or TrainingSchedule as stored)."""
    kind = str(obj.get("kind"))
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    values = _values(kind, meta, obj.get("spec") or {}, status)
    if not status.get("conditions"):
        return NOT_SEEN.format(**values)
    reason = str(telling_condition(kind, status).get("reason") or "")
    steps = STEPS.get(kind, {})
    step = steps.get(reason) or _by_phase(kind, str(status.get("phase") or ""))
    if kind == "TrainingJob" and find(status, "SpecApplied").get("reason") == "ImmutableAfterLaunch":
        step = f"{step}; and to apply the edited spec, {IMMUTABLE}"
    return step.format(**values)


def _by_phase(kind: str, phase: str) -> str:
    """A step for a reason the table does not know (a later KubeRay's, a later rayship's)."""
    if phase in ("Failed", "Degraded"):
        return "read the message above and the logs: rayship logs {ref}"
    if phase in ("Pending", "Deploying", "WaitingForModel"):
        return "wait, and read the message above: rayship status {ref} again shows what changed"
    if kind == "ModelService" and phase == "Ready":
        return MODELSERVICE_STEPS["Ready"]
    return "nothing to do"


def _values(
    kind: str, meta: Mapping[str, Any], spec: Mapping[str, Any], status: Mapping[str, Any]
) -> dict[str, str]:
    """What a step may name: {ref} (for rayship status/logs), {name}, {ns}, the child's name, the Ray pods'
    label selector, the URL, the next run, the object a ModelService serves from."""
    name, ns = str(meta.get("name", "")), str(meta.get("namespace") or "default")
    model = spec.get("model") or {}
    source = model.get("fromTrainingJob") or model.get("fromTrainingSchedule") or {}
    pvc = ((spec.get("checkpoint") or {}).get("storage") or {}).get("pvc") or {}
    return {
        "name": name,
        "ns": ns,
        "ref": f"{SHORT.get(kind, kind.lower())}/{name} -n {ns}",
        "selector": f"{names.owner_label(kind)}={name}",
        "rayjob": str(status.get("rayJobName") or names.rayjob_name(name)),
        "rayservice": str(status.get("rayServiceName") or names.rayservice_name(name)),
        "url": str(status.get("url") or "its URL (status.url) once set"),
        "next": str(status.get("nextScheduleTime") or "the next time due"),
        "model": str(source.get("name") or "NAME"),
        "claim": str(pvc.get("claimName") or "it names"),
    }
