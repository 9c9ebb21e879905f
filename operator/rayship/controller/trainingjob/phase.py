"""The TrainingJob's status: one lookup table maps KubeRay's (jobDeploymentStatus, jobStatus) to our
phase; the conditions are derived from the phase, so they never contradict it. Only operator-owned
fields are returned: `progress`, `checkpoint` and `tuning` belong to the workload."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from rayship import api
from rayship.api import names
from rayship.controller.conditions import (
    Event,
    Plan,
    condition,
    error_line,
    find,
    pod_problem,
    rfc3339,
    truncate,
)
from rayship.controller.trainingjob.attempts import (
    ATTEMPT_FAILED_REASONS,
    CLUSTER_LABEL,
    accounted,
    changed_attempts,
    look_due,
    settling,
)
from rayship.controller.trainingjob.rayjob import REPLICA_FAILURE_REASONS, STUCK_REASONS

ANY = "*"
CREATED = "RayJobCreated"  # the reason of the phase a new RayJob starts in, and of its creation's Event
CLAIM_NOT_FOUND = "ClaimNotFound"  # the checkpoint claim does not exist: no RayJob is made yet
STARTUP_DEADLINE = "StartupDeadlineExceeded"  # spec.startupDeadlineSeconds passed (KubeRay: PreRunning...)
KUBERAY_STARTUP_DEADLINE = "PreRunningDeadlineExceeded"

# (jobDeploymentStatus, jobStatus) -> (phase, reason, message). KubeRay v1.7 values.
# A message of None means "use the RayJob's own status.message".
PHASE_TABLE: dict[tuple[str, str], tuple[str, str, str | None]] = {
    ("", ANY): ("Pending", CREATED, "KubeRay has not started the Ray cluster yet"),
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

PHASE_CONDITIONS: tuple[api.TrainingJobConditionType, ...] = ("Running", "Complete", "Failed", "Suspended")
_CONDITION_OF_PHASE: dict[str, api.TrainingJobConditionType] = {
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
    workload_account: str | None = None  # the ServiceAccount its Ray pods run as (may write status)
    invalid: str | None = None  # why the spec cannot be rendered (None: valid)
    unapplied: tuple[str, ...] = ()  # spec fields edited after launch that KubeRay cannot apply
    gpus: int | None = None
    cpus: float = 0.0  # CPUs the Ray pods request (the head's and every worker's)
    # (reason, message): why no RayJob is made (one of that name is not ours; its claim is missing)
    blocked: tuple[str, str] | None = None
    lost: str | None = None  # the UID of our launched RayJob, which is gone
    rejected: tuple[str, str, str] | None = None  # (phase, reason, message) from the API server
    queue: str | None = None  # Kueue LocalQueue: Kueue, not the spec, suspends and resumes the RayJob
    pods: tuple[str, str] | None = None  # (reason, message): why a Ray pod cannot start
    ray_pods: tuple[Mapping[str, Any], ...] | None = None  # the job's Ray pods as looked at (None: not)
    keep: bool = False  # keep the stored status (a spec the API server refused, not edited since)


def phase_of(rayjob_status: Mapping[str, Any]) -> tuple[str, str, str]:
    """(phase, reason, message) for a RayJob status, through PHASE_TABLE."""
    deployment = rayjob_status.get("jobDeploymentStatus") or ""
    job = rayjob_status.get("jobStatus") or ""
    entry = PHASE_TABLE.get((deployment, job)) or PHASE_TABLE.get((deployment, ANY))
    said = str(rayjob_status.get("message") or "")
    if entry is None:
        # KubeRay's own words, whatever the state: a user must not read only "unknown" while KubeRay
        # says why (e.g. `dial tcp ...:8265: connect: connection refused`).
        unknown = f"RayJob state {deployment or 'none'}/{job or 'none'}, unknown to rayship"
        return "Pending", "UnknownRayJobState", f"{unknown}; KubeRay says: {said}" if said else unknown
    phase, reason, message = entry
    if phase == "Pending" and said and message:
        message = f"{message}; KubeRay says: {said}"  # e.g. why a submission cannot reach the dashboard
    if phase == "Failed":
        reason = rayjob_status.get("reason") or reason  # KubeRay's own: AppFailed, DeadlineExceeded...
        detail = (
            rayjob_status.get("message") or f"jobDeploymentStatus={deployment}, jobStatus={job or 'none'}"
        )
        message = f"{detail} (attempts failed: {rayjob_status.get('failed') or 0})"
    elif reason == "Retrying":
        message = f"{message} (attempts failed so far: {rayjob_status.get('failed') or 0})"
    return phase, reason, message or ""


# KubeRay's states of a RayJob created suspended, through to Suspended (its start time kept): no
# cluster starts.
SUSPENDED_FROM_THE_START_STATES = frozenset({"", "New", "Initializing", "Suspending", "Suspended"})


def never_started(rayjob: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """A suspended RayJob (spec.suspend: by the spec, or by Kueue while it queues) whose job has no
    attempt on record: KubeRay passes it through Initializing (stamping a start time and a cluster
    name) and Suspending to Suspended without starting a cluster. Its status says Suspended all along,
    as it is: no cluster starting, none being deleted (and one status write, not four)."""
    if not (rayjob.get("spec") or {}).get("suspend") or current.get("attempts"):
        return False
    return ((rayjob.get("status") or {}).get("jobDeploymentStatus") or "") in SUSPENDED_FROM_THE_START_STATES


def startup_deadline_passed(rayjob: Mapping[str, Any]) -> bool:
    """KubeRay failed the RayJob for good because its cluster was not running by
    spec.startupDeadlineSeconds (preRunningDeadlineSeconds); not while it retries."""
    st = rayjob.get("status") or {}
    return st.get("jobDeploymentStatus") == "Failed" and st.get("reason") == KUBERAY_STARTUP_DEADLINE


def _startup_deadline_message(current: Mapping[str, Any], kuberay_says: str) -> str:
    """Why a job failed its startup deadline, with what the stored status last said it was stuck on;
    once written, kept (the stored status then says the deadline, no longer what it was stuck on)."""
    before = find(current, "Running")
    if before.get("reason") == STARTUP_DEADLINE:
        return str(before.get("message") or "")
    stuck = f"; it was stuck: {before.get('message')}" if before.get("reason") in STUCK_REASONS else ""
    return f"the Ray cluster was not running by spec.startupDeadlineSeconds{stuck}; its Ray cluster is deleted ({kuberay_says})"


def replica_failure(rayjob_status: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when KubeRay could not create a Ray pod, e.g. a ResourceQuota refused it:
    no pod exists to say so; KubeRay's RayCluster does (its ReplicaFailure condition, which the RayJob
    mirrors while its cluster is not ready)."""
    cluster = rayjob_status.get("rayClusterStatus") or {}
    failure = find(cluster, "ReplicaFailure")
    if failure.get("status") != "True":
        return None
    said = str(failure.get("message") or "")
    reason = "ResourceQuotaExceeded" if "exceeded quota" in said else str(failure.get("reason") or "")
    if reason not in REPLICA_FAILURE_REASONS:  # a reason of a later KubeRay
        reason = "ReplicaFailure"
    return reason, f"KubeRay could not create or delete a Ray pod ({failure.get('reason')}): {said}"


def _condition(
    type_: api.TrainingJobConditionType, ok: bool, reason: str, message: str, obs: Observation, now: datetime
) -> dict:
    return condition(obs.current, type_, ok, reason, message, obs.generation, now)


def derive(obs: Observation, now: datetime) -> dict[str, Any]:
    """The operator-owned part of the TrainingJob status."""
    current_phase = obs.current.get("phase")
    if obs.keep:
        return {k: v for k, v in obs.current.items() if k not in WORKLOAD_FIELDS}
    invalid = obs.invalid
    if obs.rejected is not None and obs.rejected[0] == "Invalid":
        invalid = f"{obs.rejected[1]}: {obs.rejected[2]}"
    if invalid is not None and obs.rayjob is None:
        return {
            "phase": "Invalid",
            "observedGeneration": obs.generation,
            "conditions": [_condition("Valid", False, "InvalidSpec", invalid, obs, now)],
        }

    rayjob_status: Mapping[str, Any] = (obs.rayjob or {}).get("status") or {}
    if obs.rayjob is not None:
        phase, reason, message = phase_of(rayjob_status)
        if never_started(obs.rayjob, obs.current):
            phase, reason, message = phase_of({"jobDeploymentStatus": "Suspended"})
        if phase == "Failed" and reason == KUBERAY_STARTUP_DEADLINE:
            reason, message = STARTUP_DEADLINE, _startup_deadline_message(obs.current, message)
        if phase == "Pending" and obs.pods is not None:
            reason, message = obs.pods[0], f"{message}: {obs.pods[1]}"
        elif phase == "Pending" and (refused := replica_failure(rayjob_status)) is not None:
            reason, message = refused[0], f"{message}: {refused[1]}"
        if phase == "Suspended" and obs.queue:
            phase, reason = "Pending", "Queued"
            message = f"waiting for admission by Kueue (queue {obs.queue}); Kueue starts the Ray cluster"
    elif obs.rejected is not None:
        phase, reason, message = obs.rejected
    elif obs.lost is not None:
        phase, reason, message = _lost(obs)
    elif obs.blocked is not None:
        phase, (reason, message) = "Pending", obs.blocked
    else:
        phase, reason, message = "Pending", "CreatingRayJob", "the RayJob is being created"
    if current_phase in api.TERMINAL_PHASES and phase != current_phase:
        # A finished job stays finished, whatever happens to its RayJob afterwards.
        return _keep_terminal(obs, now)

    conditions = [_condition("Valid", True, "SpecValid", "the spec is valid", obs, now)]
    active = _CONDITION_OF_PHASE.get(phase)
    for type_ in PHASE_CONDITIONS:
        conditions.append(_condition(type_, type_ == active, reason, message, obs, now))
    if obs.rayjob is not None:
        conditions.append(_spec_applied(obs, now))

    status: dict[str, Any] = {"phase": phase, "observedGeneration": obs.generation, "conditions": conditions}
    status.update(_rayjob_fields(obs, rayjob_status, phase, reason, now))
    if (
        last := last_error(
            obs, rayjob_status, phase, (reason, message), status.get("attempt"), now, status.get("attempts")
        )
    ) is not None:
        status["lastError"] = last
    return status


# Pod problems that are errors of the job's own containers (not of scheduling or pulling).
CRASH_REASONS = frozenset({"CrashLoopBackOff", "OOMKilled", "RunContainerError", "CreateContainerError"})


def last_error(
    obs: Observation,
    rayjob_status: Mapping[str, Any],
    phase: str,
    said: tuple[str, str],
    attempt: int | None,
    now: datetime,
    attempts: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """status.lastError: a crashing Ray container (from its pod), or a failed attempt's driver error
    (KubeRay's message: the Ray job's log tail), or a missed startup deadline (what the job was stuck
    on), or a failed attempt whose error passed unread; else what the stored status said. `said`: the
    status's (reason, message); `attempts`: status.attempts as now derived. The same error seen again
    keeps its entry (and time): a status written only when it changed."""
    reason, message = said
    stored = obs.current.get("lastError")
    found: tuple[str, str] | None = None
    if obs.pods is not None and obs.pods[0] in CRASH_REASONS:
        found = "pod", obs.pods[1]
    elif reason == STARTUP_DEADLINE:
        found = "pod" if "; it was stuck: " in message else "driver", message
    elif (phase == "Failed" or reason in ATTEMPT_FAILED_REASONS) and rayjob_status.get("message"):
        found = "driver", error_line(str(rayjob_status["message"]))
        if reason == "Retrying" and attempt:  # KubeRay counted the failure: `attempt` is the next one
            attempt = max(1, attempt - 1)
    elif (unread := _failed_unread(attempts or (), stored)) is not None:
        found, attempt = ("driver", unread[1]), unread[0]
    if found is None:
        return dict(stored) if isinstance(stored, Mapping) else None
    source, message = found[0], truncate(found[1], 1024)
    if isinstance(stored, Mapping) and tuple(map(stored.get, ("source", "message", "attempt"))) == (
        source, message, attempt,
    ):  # fmt: skip
        return dict(stored)
    entry: dict[str, Any] = {"message": message, "source": source, "time": rfc3339(now)}
    if attempt is not None:
        entry["attempt"] = attempt
    return entry


def _failed_unread(attempts: Sequence[Mapping[str, Any]], stored: Any) -> tuple[int, str] | None:
    """(attempt, message) for the newest failed attempt newer than the stored lastError's, if any:
    KubeRay says a failed attempt's error only in its short Retrying state, then starts the next on a
    new cluster; a reconcile that came after it finds the failure in the attempts, not its words."""
    noted = stored.get("attempt") if isinstance(stored, Mapping) else None
    failed = [
        a["attempt"] for a in attempts if a.get("outcome") == "Failed" and isinstance(a.get("attempt"), int)
    ]
    newest = max(failed, default=None)
    if newest is None or (isinstance(noted, int) and noted >= newest):
        return None
    return newest, (
        f"attempt {newest} failed; KubeRay retried it before its error was read (it says it only while "
        f"retrying): its driver's log has it, `rayship logs --attempt {newest}` on this TrainingJob"
    )


def _lost(obs: Observation) -> tuple[str, str, str]:
    """A launched RayJob is gone: finished if the workload reported its final model, else failed."""
    gone = f"RayJob {obs.rayjob_name} (uid {obs.lost}) was deleted after launch"
    if (obs.current.get("checkpoint") or {}).get("model"):
        return "Succeeded", "RayJobGoneAfterExport", f"{gone}; the workload had exported its final model"
    return (
        "Failed",
        "RayJobLost",
        f"{gone} (by hand, by KubeRay's DELETE_RAYJOB_CR_AFTER_JOB_FINISHES, or past its TTL while the "
        "operator was down) and its outcome is unknown; rayship does not start it again. Re-create the "
        "TrainingJob to train again: it resumes from the latest checkpoint",
    )


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


def _rayjob_fields(
    obs: Observation, rj: Mapping[str, Any], phase: str, reason: str, now: datetime
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if obs.rayjob_name:
        out["rayJobName"] = obs.rayjob_name
    if obs.rayjob is not None and never_started(obs.rayjob, obs.current):
        rj = {}  # KubeRay's start time, cluster name and job id of a cluster that never starts
    if obs.workload_account and obs.rayjob is not None:  # ours, made after its ServiceAccount
        out["workloadAccount"] = obs.workload_account
    uid = (obs.rayjob or {}).get("metadata", {}).get("uid") or obs.current.get("rayJobUID")
    if uid:
        out["rayJobUID"] = uid  # launched: a RayJob missing later is lost, never re-created
    for ours, theirs in (
        ("rayClusterName", "rayClusterName"),
        ("jobId", "jobId"),
        ("dashboardURL", "dashboardURL"),
    ):
        if rj.get(theirs):
            out[ours] = rj[theirs]
    if rj.get("startTime"):
        out["startTime"] = rj["startTime"]
    if phase in api.TERMINAL_PHASES and rj.get("endTime"):
        out["completionTime"] = rj["endTime"]
    if obs.rayjob is not None:
        # KubeRay counts failed attempts (a final failure included); the one running or succeeded is
        # the next.
        out["attempt"] = int(rj.get("failed") or 0) + (0 if phase == "Failed" else 1) or 1
    if obs.rayjob is not None:
        # The worker pods Ray counts ready while the job runs (an elastic job's may be fewer than
        # spec.workers.replicas); None removes a count that no longer holds.
        ready = (rj.get("rayClusterStatus") or {}).get("readyWorkerReplicas")
        out["readyWorkers"] = ready if phase == "Running" and isinstance(ready, int) else None
    if obs.gpus is not None:
        out["gpus"] = obs.gpus
        attempt, ready = out.get("attempt"), out.get("readyWorkers")
        out.update(accounted(obs.current, rj, phase, reason, attempt, now, ready, obs.ray_pods))
    return out


WORKLOAD_FIELDS = names.WORKLOAD_STATUS_FIELDS  # written by the workload, never by the operator


def _keep_terminal(obs: Observation, now: datetime) -> dict[str, Any]:
    """The stored terminal status, with only the spec-edit condition refreshed."""
    kept = {k: v for k, v in obs.current.items() if k not in WORKLOAD_FIELDS}
    conditions = [c for c in kept.get("conditions") or [] if c.get("type") != "SpecApplied"]
    if obs.rayjob is not None:
        conditions.append(_spec_applied(obs, now))
    kept["conditions"] = conditions
    return kept


def starting_pods(rayjob: Mapping[str, Any] | None) -> str | None:
    """The label selector of the RayJob's Ray pods while its cluster is starting (else None). Not
    while the RayJob is suspended (KubeRay passes through Initializing before it suspends one): its
    pods are going, not starting."""
    st = (rayjob or {}).get("status") or {}
    if st.get("jobDeploymentStatus") != "Initializing" or not st.get("rayClusterName"):
        return None
    if ((rayjob or {}).get("spec") or {}).get("suspend"):
        return None
    return f"{CLUSTER_LABEL}={st['rayClusterName']}"


def ray_pods(trainingjob: Mapping[str, Any], rayjob: Mapping[str, Any] | None, now: datetime) -> str | None:
    """`Controller.pods` of this kind: the label selector of every Ray pod of the job (each attempt's
    cluster) when they are worth a look now: while its cluster starts (why a pod cannot start), and
    for what its attempts hold (`attempts.look_due`). Else None: no LIST."""
    current = trainingjob.get("status") or {}
    suspended = bool(((rayjob or {}).get("spec") or {}).get("suspend"))
    if starting_pods(rayjob) is None and not look_due(
        current, (rayjob or {}).get("status") or {}, now, suspended=suspended
    ):
        return None
    return f"{names.owner_label('TrainingJob')}={trainingjob['metadata']['name']},ray.io/node-type"


def waits_for_claim(trainingjob: Mapping[str, Any]) -> bool:
    """Its status says it waits for its checkpoint claim to exist (planner's `ClaimNotFound`): looked
    at again as a starting cluster is, so that a claim made later starts it without a resync."""
    conditions = (trainingjob.get("status") or {}).get("conditions") or []
    return any(c.get("reason") == CLAIM_NOT_FOUND and c.get("status") == "False" for c in conditions)


def look_again_in(
    trainingjob: Mapping[str, Any], rayjob: Mapping[str, Any] | None, now: datetime
) -> float | None:
    """How soon its pods are worth another look before the resync passes (None: not before): at once
    (0) while its cluster starts or it waits for its checkpoint claim, else as `attempts.settling` (with the RayJob's
    ttlSecondsAfterFinished: when KubeRay deletes a finished job's cluster)."""
    if starting_pods(rayjob) is not None or (rayjob is None and waits_for_claim(trainingjob)):
        return 0.0
    return settling(trainingjob.get("status") or {}, now, _ttl(rayjob))


def pods_going(trainingjob: Mapping[str, Any], rayjob: Mapping[str, Any] | None, now: datetime) -> bool:
    """Whether an ended attempt's pods may be going away now (KubeRay deletes its cluster as the
    attempt fails, or ttlSecondsAfterFinished after the job ends): looked at closely then, also while
    the next attempt's cluster starts."""
    return settling(trainingjob.get("status") or {}, now, _ttl(rayjob)) == 0.0


def _ttl(rayjob: Mapping[str, Any] | None) -> float:
    return float(((rayjob or {}).get("spec") or {}).get("ttlSecondsAfterFinished") or 0)


# `Controller.status` of this kind: the same signature as the other kind's (an intended parallel).
def status(
    trainingjob: Mapping[str, Any],
    rayjob: Mapping[str, Any] | None,
    plan_: Plan,
    pods: list[dict[str, Any]] | None,
    now: datetime,
) -> dict[str, Any]:
    """The operator-owned status, once the plan was carried out and `rayjob` is what the server
    holds; `pods` are its Ray pods as looked at (None: not looked at): why one of its starting
    cluster cannot start is said, and what each attempt's pods held is counted."""
    del trainingjob  # everything it contributes is in the plan's Observation
    obs: Observation = plan_.context
    if obs.blocked is not None:
        rayjob = None  # not ours: its state says nothing about this TrainingJob
    # why a pod cannot start: of the cluster starting now, not of an earlier attempt's draining one
    cluster = ((rayjob or {}).get("status") or {}).get("rayClusterName") if starting_pods(rayjob) else None
    stuck = pod_problem(
        [p for p in pods or [] if (p.get("metadata") or {}).get("labels", {}).get(CLUSTER_LABEL) == cluster]
    )
    looked = tuple(pods) if pods is not None else None
    return derive(replace(obs, rayjob=rayjob, rejected=plan_.rejected, pods=stuck, ray_pods=looked), now)


# Pending for a reason the user must act on (or should know of): announced as a Warning.
BLOCKED_REASONS = frozenset({"PreviousRayJobTerminating", "RayJobNameTaken", CLAIM_NOT_FOUND}) | STUCK_REASONS
FIRST_SUSPENDED = frozenset({"Suspended", "Queued"})  # a job created suspended: its first phase's reasons


def announce(current: Mapping[str, Any], desired: Mapping[str, Any]) -> list[Event]:
    """A Kubernetes Event for each phase transition and each new spec-edit report. Not for the phase
    a new RayJob starts in (reason RayJobCreated; Suspended or Queued for one created suspended): the
    pass that created it said "created RayJob ..." (one Event, and one API call, per fact; the
    RayJob's own watch event may write that phase first)."""
    events: list[Event] = []
    phase = desired.get("phase")
    # Every phase condition carries the phase's reason and message; Invalid has only "Valid".
    cond = find(desired, "Valid" if phase == "Invalid" else "Running")
    said_at_creation = cond.get("reason") == CREATED or (
        current.get("phase") is None and cond.get("reason") in FIRST_SUSPENDED
    )
    if phase != current.get("phase") and not said_at_creation:
        events.append(
            Event(
                "Warning"
                if phase in ("Failed", "Invalid") or cond.get("reason") in BLOCKED_REASONS
                else "Normal",
                str(cond.get("reason", phase)),
                f"{phase}: {cond.get('message', '')}",
            )
        )
    elif phase == "Pending" and (reason := find(desired, "Running").get("reason")) in BLOCKED_REASONS:
        if reason != find(current, "Running").get("reason"):
            events.append(Event("Warning", str(reason), str(find(desired, "Running").get("message"))))
    started, ended = changed_attempts(current, desired)
    for a in ended:
        figures = ", ".join(
            f"{what} {a[key]}"
            for what, key in (("resumed from epoch", "resumedFromEpoch"), ("reached epoch", "reachedEpoch"),
                              ("GPU-seconds", "gpuSeconds"), ("CPU-seconds", "cpuSeconds"))
            if a.get(key) is not None
        )  # fmt: skip
        if "pods" in a:  # its pods still drain: status.attempts has the final figures once they are gone
            figures += " so far"
        events.append(
            Event(
                "Warning" if a.get("outcome") == "Failed" else "Normal",
                "AttemptEnded",
                f"attempt {a['attempt']} {str(a.get('outcome')).lower()} ({a.get('reason')}): {figures}",
            )
        )
    events += _reports_lost_or_recovered(current, desired)
    first: Mapping[str, Any] = next(iter(desired.get("attempts") or []), {})
    for a in started:
        if a is first and a.get("attempt") == 1:
            continue  # the job's first: "created RayJob" said it (one Event, one API call, per fact)
        events.append(
            Event("Normal", "AttemptStarted", f"attempt {a['attempt']} started on a new Ray cluster")
        )
    before, after = find(current, "SpecApplied"), find(desired, "SpecApplied")
    if after.get("status") == "False" and after.get("message") != before.get("message"):
        events.append(Event("Warning", str(after["reason"]), str(after["message"])))
    return events


def _reports_lost_or_recovered(current: Mapping[str, Any], desired: Mapping[str, Any]) -> list[Event]:
    """An Event when an ended attempt's lost last report is recovered, or seen lost (a checkpoint
    newer than its last report on record, which the next attempt resumed from): once each."""
    was = {a.get("startTime"): a for a in current.get("attempts") or []}
    events = []
    for a in desired.get("attempts") or []:
        before = was.get(a.get("startTime"), {})
        n, reached, left = a.get("attempt"), a.get("reachedEpoch"), a.get("checkpointEpoch")
        if a.get("reportRecovered") and not before.get("reportRecovered"):
            events.append(Event("Normal", "ReportRecovered",
                                f"attempt {n}'s report of epoch {reached} was lost as it ended (Ray Train "
                                "registers a checkpoint before the report reaches the status); the next "
                                "attempt read it back from Ray Train's record of that checkpoint"))  # fmt: skip
        gap = isinstance(left, int) and left > (reached or 0)
        had_gap = isinstance(before.get("checkpointEpoch"), int) and before["checkpointEpoch"] > (
            before.get("reachedEpoch") or 0
        )
        if gap and not had_gap:
            events.append(Event("Warning", "ReportLost",
                                f"attempt {n} left a checkpoint of epoch {left} (the next attempt resumed "
                                f"from it), but its last report on record is of epoch {reached}: the "
                                f"report of epoch {left} was lost as the attempt ended"))  # fmt: skip
    return events
