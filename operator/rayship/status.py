"""Pure status derivation: the owned RayJob's state in, the TrainingJob's status out.

One lookup table maps KubeRay's (jobDeploymentStatus, jobStatus) to our phase; the conditions are
derived from the phase, so they can never contradict it (no "Running" next to a failed deployment).
Only the fields the operator owns are returned; `progress` and `checkpoint` belong to the workload
and are never touched here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rayship.api import TERMINAL_PHASES

ANY = "*"

# (jobDeploymentStatus, jobStatus) -> (phase, reason, message). KubeRay v1.7 values.
# A message of None means "use the RayJob's own status.message".
PHASE_TABLE: dict[tuple[str, str], tuple[str, str, str | None]] = {
    ("", ANY): ("Pending", "RayJobCreated", "KubeRay has not started the Ray cluster yet"),
    ("Initializing", ANY): (
        "Pending",
        "ClusterInitializing",
        "the Ray cluster is starting (pulling images, scheduling GPU pods)",
    ),
    ("Waiting", ANY): (
        "Pending",
        "WaitingForSubmission",
        "the Ray cluster waits for the job to be submitted",
    ),
    ("Running", ""): ("Pending", "JobSubmitting", "the Ray cluster is ready; the job is being submitted"),
    ("Running", "PENDING"): ("Pending", "JobPending", "the Ray job is submitted and waits to start"),
    ("Running", "RUNNING"): ("Running", "JobRunning", "training is running"),
    ("Running", "SUCCEEDED"): ("Running", "JobFinishing", "the Ray job succeeded; KubeRay is finalizing"),
    ("Running", "FAILED"): (
        "Running",
        "AttemptEnded",
        "the Ray job attempt failed; KubeRay decides whether to retry",
    ),
    ("Running", "STOPPED"): (
        "Running",
        "AttemptEnded",
        "the Ray job was stopped; KubeRay decides whether to retry",
    ),
    ("Complete", "SUCCEEDED"): ("Succeeded", "JobSucceeded", "training finished successfully"),
    ("Complete", ANY): ("Failed", "JobNotSucceeded", None),
    ("Failed", ANY): ("Failed", "RayJobFailed", None),
    ("ValidationFailed", ANY): ("Failed", "RayJobValidationFailed", None),
    ("Suspending", ANY): (
        "Suspended",
        "Suspending",
        "the Ray cluster is being deleted; the job can be resumed",
    ),
    ("Suspended", ANY): ("Suspended", "Suspended", "no Ray cluster runs; set spec.suspend: false to resume"),
    ("Retrying", ANY): ("Pending", "Retrying", "an attempt failed; KubeRay is starting a new Ray cluster"),
}

PHASE_CONDITIONS = ("Running", "Complete", "Failed", "Suspended")
_CONDITION_OF_PHASE = {
    "Running": "Running",
    "Succeeded": "Complete",
    "Failed": "Failed",
    "Suspended": "Suspended",
}


@dataclass(frozen=True)
class Observation:
    """Everything the status is derived from, gathered by the operator."""

    generation: int
    current: Mapping[str, Any] = field(default_factory=dict)  # the TrainingJob's status as stored
    rayjob: Mapping[str, Any] | None = None  # the owned RayJob, if any
    rayjob_name: str | None = None
    invalid: str | None = None  # why the spec cannot be rendered (None: valid)
    unapplied: tuple[str, ...] = ()  # spec fields edited after launch that KubeRay cannot apply
    gpus: int | None = None


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def phase_of(rayjob_status: Mapping[str, Any]) -> tuple[str, str, str]:
    """(phase, reason, message) for a RayJob status, through PHASE_TABLE."""
    deployment = rayjob_status.get("jobDeploymentStatus") or ""
    job = rayjob_status.get("jobStatus") or ""
    entry = PHASE_TABLE.get((deployment, job)) or PHASE_TABLE.get((deployment, ANY))
    if entry is None:
        return ("Pending", "UnknownRayJobState", f"unrecognised RayJob state {deployment!r}/{job!r}")
    phase, reason, message = entry
    if phase == "Failed":
        reason = rayjob_status.get("reason") or reason  # KubeRay's own: AppFailed, DeadlineExceeded...
        detail = (
            rayjob_status.get("message") or f"jobDeploymentStatus={deployment}, jobStatus={job or 'none'}"
        )
        message = f"{detail} (attempts failed: {rayjob_status.get('failed') or 0})"
    elif reason == "Retrying":
        message = f"{message} (attempts failed so far: {rayjob_status.get('failed') or 0})"
    return phase, reason, message or ""


def condition(
    current: Mapping[str, Any],
    type_: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
) -> dict[str, Any]:
    """A metav1.Condition; its lastTransitionTime is kept from `current` while its status is unchanged."""
    previous = {c.get("type"): c for c in current.get("conditions") or []}.get(type_, {})
    value = "True" if ok else "False"
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": previous["lastTransitionTime"]
        if previous.get("status") == value and previous.get("lastTransitionTime")
        else rfc3339(now),
        "observedGeneration": generation,
    }


def _condition(type_: str, ok: bool, reason: str, message: str, obs: Observation, now: datetime) -> dict:
    return condition(obs.current, type_, ok, reason, message, obs.generation, now)


def derive(obs: Observation, now: datetime) -> dict[str, Any]:
    """The operator-owned part of the TrainingJob status."""
    current_phase = obs.current.get("phase")
    if obs.invalid is not None and obs.rayjob is None:
        return {
            "phase": "Invalid",
            "observedGeneration": obs.generation,
            "conditions": [_condition("Valid", False, "InvalidSpec", obs.invalid, obs, now)],
        }

    rayjob_status: Mapping[str, Any] = (obs.rayjob or {}).get("status") or {}
    if obs.rayjob is None:
        phase, reason, message = "Pending", "CreatingRayJob", "the RayJob is being created"
    else:
        phase, reason, message = phase_of(rayjob_status)
    if current_phase in TERMINAL_PHASES and phase != current_phase:
        # A finished job stays finished, whatever happens to its RayJob afterwards.
        return _keep_terminal(obs, now)

    conditions = [_condition("Valid", True, "SpecValid", "the spec is valid", obs, now)]
    active = _CONDITION_OF_PHASE.get(phase)
    for type_ in PHASE_CONDITIONS:
        conditions.append(_condition(type_, type_ == active, reason, message, obs, now))
    if obs.rayjob is not None:
        conditions.append(_spec_applied(obs, now))

    status: dict[str, Any] = {"phase": phase, "observedGeneration": obs.generation, "conditions": conditions}
    status.update(_rayjob_fields(obs, rayjob_status, phase, now))
    return status


def _spec_applied(obs: Observation, now: datetime) -> dict:
    if obs.invalid is not None:
        return _condition("SpecApplied", False, "InvalidSpec", obs.invalid, obs, now)
    if obs.unapplied:
        fields = ", ".join(f"spec.{p}" for p in obs.unapplied)
        message = (
            f"{fields} changed after launch; KubeRay cannot change a running RayJob, so the job keeps "
            "its launch settings. Delete and re-create the TrainingJob to apply them "
            "(it resumes from the latest checkpoint)."
        )
        return _condition("SpecApplied", False, "ImmutableAfterLaunch", message, obs, now)
    return _condition("SpecApplied", True, "Applied", "the RayJob matches the spec", obs, now)


def _rayjob_fields(obs: Observation, rj: Mapping[str, Any], phase: str, now: datetime) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if obs.rayjob_name:
        out["rayJobName"] = obs.rayjob_name
    for ours, theirs in (
        ("rayClusterName", "rayClusterName"),
        ("jobId", "jobId"),
        ("dashboardURL", "dashboardURL"),
    ):
        if rj.get(theirs):
            out[ours] = rj[theirs]
    if rj.get("startTime"):
        out["startTime"] = rj["startTime"]
    if phase in TERMINAL_PHASES and rj.get("endTime"):
        out["completionTime"] = rj["endTime"]
    if obs.gpus is not None:
        out["gpus"] = obs.gpus
        start = parse_time(rj.get("startTime"))
        if start is not None:
            end = parse_time(rj.get("endTime")) or now
            out["gpuSeconds"] = float(max(0, round((end - start).total_seconds())) * obs.gpus)
    return out


def _keep_terminal(obs: Observation, now: datetime) -> dict[str, Any]:
    """The stored terminal status, with only the spec-edit condition refreshed."""
    kept = {k: v for k, v in obs.current.items() if k not in ("progress", "checkpoint")}
    conditions = [c for c in kept.get("conditions") or [] if c.get("type") != "SpecApplied"]
    if obs.rayjob is not None:
        conditions.append(_spec_applied(obs, now))
    kept["conditions"] = conditions
    return kept


def owned_changes(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `current` into `desired` for the operator-owned keys only
    (empty when nothing changed: the status is written only when it changes)."""
    return {k: v for k, v in desired.items() if current.get(k) != v}
