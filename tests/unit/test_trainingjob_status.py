"""Status derivation: the KubeRay state table, no contradictions, terminal phases stick."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from rayship import api
from rayship.api import AttemptStatus
from rayship.controller import trainingjob
from rayship.controller.conditions import owned_changes
from rayship.controller.trainingjob import Observation, derive

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
DEPLOYMENT = [
    "",
    "Initializing",
    "Waiting",
    "Running",
    "Complete",
    "Failed",
    "ValidationFailed",
    "Suspending",
    "Suspended",
    "Retrying",
    "SomethingNew",
]
JOB = ["", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"]


def rayjob(deployment: str, job: str = "", **extra) -> dict:
    return {
        "metadata": {"name": "rj"},
        "status": {"jobDeploymentStatus": deployment, "jobStatus": job, **extra},
    }


def obs(rj: dict | None, current: dict | None = None, **kw) -> Observation:
    return Observation(
        generation=3, current=current or {}, rayjob=rj, rayjob_name="rj", gpus=kw.pop("gpus", 2), **kw
    )


def conditions(st: dict) -> dict[str, dict]:
    return {c["type"]: c for c in st["conditions"]}


@pytest.mark.parametrize(
    ("deployment", "job", "phase", "reason"),
    [
        ("", "", "Pending", "RayJobCreated"),
        ("Initializing", "", "Pending", "ClusterInitializing"),
        ("Running", "", "Pending", "JobSubmitting"),
        ("Running", "PENDING", "Pending", "JobPending"),
        ("Running", "RUNNING", "Running", "JobRunning"),
        ("Complete", "SUCCEEDED", "Succeeded", "JobSucceeded"),
        ("Complete", "STOPPED", "Failed", "JobNotSucceeded"),
        ("Failed", "FAILED", "Failed", "RayJobFailed"),
        ("ValidationFailed", "", "Failed", "RayJobValidationFailed"),
        ("Suspending", "", "Suspended", "Suspending"),
        ("Suspended", "", "Suspended", "Suspended"),
        ("Retrying", "FAILED", "Pending", "Retrying"),
        ("SomethingNew", "", "Pending", "UnknownRayJobState"),
    ],
)
def test_phase_table(deployment: str, job: str, phase: str, reason: str) -> None:
    st = derive(obs(rayjob(deployment, job)), NOW)
    assert st["phase"] == phase
    assert conditions(st)["Running"]["reason"] == reason


@pytest.mark.parametrize(("deployment", "job"), list(itertools.product(DEPLOYMENT, JOB)))
def test_no_contradictions(deployment: str, job: str) -> None:
    st = derive(obs(rayjob(deployment, job)), NOW)
    api.TrainingJobStatus.model_validate(st)  # every derived status fits the CRD's status schema
    by_type = conditions(st)
    true = [t for t in trainingjob.PHASE_CONDITIONS if by_type[t]["status"] == "True"]
    assert len(true) <= 1
    expected = {
        "Running": ["Running"],
        "Succeeded": ["Complete"],
        "Failed": ["Failed"],
        "Suspended": ["Suspended"],
    }
    assert true == expected.get(st["phase"], [])
    assert by_type["Valid"]["status"] == "True"
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])


def test_failure_reason_and_message_come_from_kuberay() -> None:
    st = derive(
        obs(rayjob("Failed", "FAILED", reason="DeadlineExceeded", message="deadline passed", failed=3)), NOW
    )
    failed = conditions(st)["Failed"]
    assert (st["phase"], failed["status"], failed["reason"]) == ("Failed", "True", "DeadlineExceeded")
    assert "deadline passed" in failed["message"] and "attempts failed: 3" in failed["message"]


@pytest.mark.parametrize(
    ("deployment", "job", "reason"),
    [
        ("Running", "Failure", "UnknownRayJobState"),  # a state rayship does not know
        ("Running", "", "JobSubmitting"),  # a known one that waits
        ("Initializing", "", "ClusterInitializing"),
    ],
)
def test_a_waiting_job_says_what_kuberay_says(deployment: str, job: str, reason: str) -> None:
    """Seen: a job whose head never answered sat Pending for 12 minutes saying only "unrecognised
    RayJob state" while KubeRay's status.message said why."""
    said = "error trying to reach service: dial tcp 10.244.4.7:8265: connect: connection refused"
    st = derive(obs(rayjob(deployment, job, message=said)), NOW)
    running = conditions(st)["Running"]
    assert (st["phase"], running["reason"]) == ("Pending", reason)
    assert running["message"].endswith(f"KubeRay says: {said}"), running["message"]
    if reason == "UnknownRayJobState":
        assert f"{deployment}/{job}" in running["message"]


@pytest.mark.parametrize(
    ("kuberay_reason", "said", "reason"),
    [
        (
            "FailedCreateHeadPod",
            'pods "rj-head-x" is forbidden: exceeded quota: no-pods, requested: pods=1, used: pods=0, limited: pods=0',
            "ResourceQuotaExceeded",
        ),
        ("FailedCreateWorkerPod", "admission webhook denied the request", "FailedCreateWorkerPod"),
        ("FailedSomethingNew", "a later KubeRay's reason", "ReplicaFailure"),
    ],
)
def test_a_ray_pod_kuberay_could_not_create_is_named(kuberay_reason: str, said: str, reason: str) -> None:
    """No pod exists to say why: KubeRay's RayCluster does, in its ReplicaFailure condition, which the
    RayJob mirrors (status.rayClusterStatus) while its cluster is not ready."""
    cluster = {
        "conditions": [
            {"type": "ReplicaFailure", "status": "True", "reason": kuberay_reason, "message": said}
        ]
    }
    st = derive(obs(rayjob("Initializing", rayClusterStatus=cluster)), NOW)
    running = conditions(st)["Running"]
    assert (st["phase"], running["reason"]) == ("Pending", reason)
    assert said in running["message"] and kuberay_reason in running["message"]
    events = trainingjob.announce({"phase": "Pending"}, st)  # a Warning when it starts being said
    assert [(e.type, e.reason) for e in events if e.type == "Warning"] == [("Warning", reason)]
    cluster["conditions"][0]["status"] = "False"  # KubeRay removes it once pods are made: nothing said
    assert conditions(derive(obs(rayjob("Initializing", rayClusterStatus=cluster)), NOW))["Running"][
        "reason"
    ] == ("ClusterInitializing")


def test_failure_without_kuberay_message_still_says_what_happened() -> None:
    failed = conditions(derive(obs(rayjob("Failed", "FAILED")), NOW))["Failed"]
    assert "jobDeploymentStatus=Failed" in failed["message"] and "jobStatus=FAILED" in failed["message"]


def test_invalid_spec_without_rayjob() -> None:
    st = derive(obs(None, invalid="spec.trainer: set exactly one of recipe or entrypoint"), NOW)
    assert st["phase"] == "Invalid"
    (valid,) = st["conditions"]
    assert (valid["type"], valid["status"], valid["reason"]) == ("Valid", "False", "InvalidSpec")
    assert "spec.trainer" in valid["message"]


def test_invalid_edit_of_a_running_job_keeps_it_running_and_says_so() -> None:
    st = derive(obs(rayjob("Running", "RUNNING"), invalid="spec.workers.replicas: bad"), NOW)
    assert st["phase"] == "Running"
    applied = conditions(st)["SpecApplied"]
    assert (applied["status"], applied["reason"]) == ("False", "InvalidSpec")


def test_unapplied_edits_are_reported() -> None:
    st = derive(obs(rayjob("Running", "RUNNING"), unapplied=("trainer.epochs", "workers.replicas")), NOW)
    applied = conditions(st)["SpecApplied"]
    assert applied["status"] == "False" and applied["reason"] == "ImmutableAfterLaunch"
    assert "spec.trainer.epochs, spec.workers.replicas" in applied["message"]


def test_terminal_phase_sticks() -> None:
    done = derive(
        obs(
            rayjob("Complete", "SUCCEEDED", endTime="2026-11-22T11:00:00Z", startTime="2026-11-22T10:00:00Z")
        ),
        NOW,
    )
    assert done["phase"] == "Succeeded" and done["completionTime"] == "2026-11-22T11:00:00Z"
    for later in (None, rayjob(""), rayjob("Running", "RUNNING")):
        again = derive(obs(later, current=done), NOW + timedelta(hours=1))
        assert again["phase"] == "Succeeded"
        assert conditions(again)["Complete"]["status"] == "True"


def test_transition_time_kept_while_condition_status_is_unchanged() -> None:
    first = derive(obs(rayjob("Running", "RUNNING")), NOW)
    later = derive(obs(rayjob("Running", "RUNNING"), current=first), NOW + timedelta(minutes=5))
    assert conditions(later)["Running"]["lastTransitionTime"] == "2026-11-22T12:00:00Z"
    done = derive(obs(rayjob("Complete", "SUCCEEDED"), current=later), NOW + timedelta(minutes=9))
    assert conditions(done)["Running"]["lastTransitionTime"] == "2026-11-22T12:09:00Z"
    assert conditions(done)["Complete"]["lastTransitionTime"] == "2026-11-22T12:09:00Z"


def ray_pod(
    name: str,
    cluster: str,
    start: datetime | None,
    *,
    cpus: str = "500m",
    gpus: int = 0,
    end: datetime | None = None,
    deleting: datetime | None = None,
    phase: str = "Running",
) -> dict:
    """A Ray pod as the API server returns it: its cluster's label, its requests and limits, its start
    on the node, its containers' end and its deletion deadline."""
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    status: dict = {"phase": phase}
    if start is not None:
        status["startTime"] = rfc(start)
    if end is not None:
        status["containerStatuses"] = [{"name": "ray", "state": {"terminated": {"finishedAt": rfc(end)}}}]
    metadata: dict = {"name": name, "labels": {"ray.io/cluster": cluster}}
    if deleting is not None:
        metadata["deletionTimestamp"] = rfc(deleting)
    resources = {"requests": {"cpu": cpus}, "limits": limits}
    return {"metadata": metadata, "spec": {"containers": [{"name": "ray", "resources": resources}]}, "status": status}  # fmt: skip


def test_rayjob_fields_and_gpu_seconds_from_the_pods_own_times() -> None:
    """GPU- and CPU-seconds are each pod's own running time x what it holds: a pod not on a node yet
    holds nothing; one running is counted until now."""
    rj = rayjob(
        "Running",
        "RUNNING",
        rayClusterName="rj-abcde",
        jobId="rj-xyz",
        dashboardURL="rj-head-svc:8265",
        startTime="2026-11-22T11:59:00Z",
    )
    at = NOW - timedelta(seconds=50)
    pods = (
        ray_pod("head", "rj-abcde", at, cpus="1"),
        ray_pod("w-0", "rj-abcde", at + timedelta(seconds=10), gpus=2, cpus="2"),
        ray_pod("w-1", "rj-abcde", at + timedelta(seconds=10), gpus=2, cpus="2"),
        ray_pod("w-2", "rj-abcde", None, gpus=2, cpus="2", phase="Pending"),  # unschedulable: holds nothing
        ray_pod("other", "rj-other", at, gpus=8),  # another job's cluster
    )
    st = derive(obs(rj, gpus=4, ray_pods=pods), NOW)
    assert st["rayJobName"] == "rj" and st["rayClusterName"] == "rj-abcde" and st["jobId"] == "rj-xyz"
    assert st["dashboardURL"] == "rj-head-svc:8265" and st["startTime"] == "2026-11-22T11:59:00Z"
    assert st["gpus"] == 4 and st["gpuSeconds"] == 2 * 2 * 40 and st["cpuSeconds"] == 50 + 2 * 2 * 40
    assert "completionTime" not in st
    (attempt,) = st["attempts"]
    assert [p["name"] for p in attempt["pods"]] == ["head", "w-0", "w-1"]
    # a pass that does not look counts the pods it knows until its own time
    later = derive(obs(rj, current=st, gpus=4), NOW + timedelta(seconds=10))
    assert later["gpuSeconds"] == 2 * 2 * 50
    AttemptStatus.model_validate(later["attempts"][0])  # what the CRD's schema (generated from it) takes


def test_ready_workers_are_counted_while_running_and_cleared_after() -> None:
    """An elastic job's worker count next to the desired one: KubeRay's ready count while it runs."""
    cluster = {"readyWorkerReplicas": 2, "desiredWorkerReplicas": 3}
    assert derive(obs(rayjob("Running", "RUNNING", rayClusterStatus=cluster)), NOW)["readyWorkers"] == 2
    finished = derive(
        obs(rayjob("Complete", "SUCCEEDED", rayClusterStatus=cluster), {"readyWorkers": 2}), NOW
    )
    assert finished["phase"] == "Succeeded" and finished["readyWorkers"] is None  # the merge patch removes it


def test_the_workload_account_is_named_once_our_rayjob_exists() -> None:
    """status.workloadAccount lets that ServiceAccount (and no other workload account) write the
    status (the chart's admission policy): named only once the RayJob, made after its ServiceAccount
    and RoleBinding, exists; never for a RayJob that is not ours."""
    named = obs(rayjob("Running", "RUNNING"), workload_account="tj-workload")
    assert derive(named, NOW)["workloadAccount"] == "tj-workload"
    assert "workloadAccount" not in derive(obs(None, workload_account="tj-workload"), NOW)
    blocked = obs(None, workload_account="tj-workload", blocked=("RayJobNameTaken", "not ours"))
    assert "workloadAccount" not in derive(blocked, NOW)


def test_owned_changes_is_empty_when_nothing_changed() -> None:
    st = derive(obs(rayjob("Running", "RUNNING")), NOW)
    stored = {**st, "progress": {"epoch": 2}}  # written by the workload, not ours
    assert owned_changes(stored, derive(obs(rayjob("Running", "RUNNING"), current=stored), NOW)) == {}
    assert "progress" not in derive(obs(rayjob("Complete", "SUCCEEDED"), current=stored), NOW)


def test_lost_rayjob_fails_unless_the_workload_had_exported_its_model() -> None:
    running = {"phase": "Running", "rayJobUID": "rj-1"}
    lost = derive(obs(None, current=running, lost="rj-1"), NOW)
    assert lost["phase"] == "Failed" and conditions(lost)["Failed"]["reason"] == "RayJobLost"
    assert "does not start it again" in conditions(lost)["Failed"]["message"]
    exported = {**running, "checkpoint": {"model": "/mnt/checkpoints/x/model"}}
    done = derive(obs(None, current=exported, lost="rj-1"), NOW)
    assert done["phase"] == "Succeeded" and done["rayJobUID"] == "rj-1" and "checkpoint" not in done


def test_blocked_by_a_rayjob_that_is_not_ours_is_pending_with_a_warning() -> None:
    st = derive(obs(None, blocked=("RayJobNameTaken", "RayJob mlp-ddp already exists and is not owned")), NOW)
    assert st["phase"] == "Pending" and conditions(st)["Running"]["reason"] == "RayJobNameTaken"
    (event,) = trainingjob.announce({"phase": "Pending"}, st)
    assert event.type == "Warning" and event.reason == "RayJobNameTaken"
    assert trainingjob.announce(st, st) == []  # said once


def test_a_child_refused_by_the_api_server_is_invalid_with_its_message() -> None:
    refused = ("Invalid", "RejectedByAPIServer", 'RayJob.ray.io "x" is invalid: spec.foo: Invalid value')
    st = derive(obs(None, rejected=refused), NOW)
    assert st["phase"] == "Invalid" and "spec.foo: Invalid value" in conditions(st)["Valid"]["message"]
    failed = derive(
        obs(None, rejected=("Failed", "WorkloadIdentityTaken", "ServiceAccount x is not ours")), NOW
    )
    assert failed["phase"] == "Failed" and conditions(failed)["Failed"]["reason"] == "WorkloadIdentityTaken"


def test_an_attempts_pods_count_until_they_are_gone_and_then_it_is_settled() -> None:
    """KubeRay restarts status.startTime with every attempt and deletes the old cluster: its pods drain
    on (counted until their containers end or their deletion deadline), then the attempt is settled:
    its figures final, counted once in the earlier attempts' part."""
    t0 = NOW - timedelta(hours=1)
    first = rayjob("Running", "RUNNING", startTime=rfc(t0), rayClusterName="c1")
    old = ray_pod("c1-w", "c1", t0, gpus=4, cpus="0")
    st = derive(obs(first, gpus=4, ray_pods=(old,)), NOW - timedelta(minutes=30))  # 30 minutes on 4 GPUs
    assert st["gpuSeconds"] == 4 * 1800 and st["attempt"] == 1
    second = rayjob(
        "Running", "RUNNING", startTime=rfc(NOW - timedelta(minutes=30)), failed=1, rayClusterName="c2"
    )
    going = ray_pod("c1-w", "c1", t0, gpus=4, cpus="0", deleting=NOW - timedelta(minutes=29, seconds=30))
    new = ray_pod("c2-w", "c2", NOW - timedelta(minutes=29, seconds=50), gpus=4, cpus="0")
    st = derive(obs(second, current=st, gpus=4, ray_pods=(going, new)), NOW)
    first_record, second_record = st["attempts"]
    assert first_record["endTime"] == rfc(NOW - timedelta(minutes=30)) and "pods" in first_record  # unsettled
    assert first_record["gpuSeconds"] == 4 * 1830  # until its deletion deadline: it was still there
    assert st["gpuSeconds"] == 4 * 1830 + 4 * 1790 and st["attempt"] == 2
    assert trainingjob.look_again_in({"status": st}, second, NOW) == 0  # its pod is being deleted: soon
    gone = derive(obs(second, current=st, gpus=4, ray_pods=(new,)), NOW + timedelta(minutes=30))
    first_record = gone["attempts"][0]
    assert "pods" not in first_record and first_record["gpuSeconds"] == 4 * 1830  # settled
    assert gone["gpuSecondsEarlierAttempts"] == 4 * 1830
    assert trainingjob.look_again_in({"status": gone}, second, NOW) is None
    assert gone["gpuSeconds"] == 4 * 1830 + 4 * 3590  # the settled attempt is not counted twice
    again = derive(obs(second, current=gone, gpus=4), NOW + timedelta(minutes=30))
    assert again["gpuSeconds"] == gone["gpuSeconds"] and again["attempts"] == gone["attempts"]


def test_a_job_suspended_from_the_start_has_no_pods_to_look_at() -> None:
    """KubeRay stamps a suspended RayJob's startTime without starting a cluster: no LIST for it (the
    benchmark's 1000 suspended jobs made 188 of them)."""
    tj = {"metadata": {"name": "tj"}, "status": {}}
    for state in ("Initializing", "Suspended"):
        suspended = {**rayjob(state, "", startTime=rfc(NOW)), "spec": {"suspend": True}}
        assert trainingjob.ray_pods(tj, suspended, NOW) is None
    resumed = rayjob("Initializing", "", startTime=rfc(NOW + timedelta(minutes=5)), rayClusterName="c1")
    assert trainingjob.ray_pods(tj, resumed, NOW) is not None


def test_a_queued_job_is_reported_as_queued_not_suspended() -> None:
    st = derive(obs(rayjob("Suspended", ""), queue="team-a"), NOW)
    assert st["phase"] == "Pending" and conditions(st)["Running"]["reason"] == "Queued"
    assert "spec.suspend" not in conditions(st)["Running"]["message"]


def test_a_job_created_suspended_says_suspended_through_kuberays_states_in_one_write() -> None:
    """KubeRay passes a RayJob created suspended through Initializing (a start time, a cluster name)
    and Suspending to Suspended, and starts no cluster: the status says Suspended (Queued, by Kueue)
    all along, with no attempt and no cluster: written once. Resumed, the first attempt starts."""
    stamps = {"startTime": rfc(NOW), "rayClusterName": "c1", "jobId": "j1"}
    states = [
        rayjob(""),
        rayjob("Initializing", **stamps),
        rayjob("Suspending", **stamps),
        rayjob("Suspended", startTime=rfc(NOW)),  # KubeRay keeps its start time
    ]
    for queue, said in ((None, "Suspended"), ("team-a", "Queued")):
        st: dict = {}
        for i, rj in enumerate(states):
            was, st = st, derive(obs({**rj, "spec": {"suspend": True}}, current=st, queue=queue), NOW)
            assert conditions(st)["Running"]["reason"] == said and "attempts" not in st, (rj, st)
            assert not {"startTime", "rayClusterName", "jobId"} & set(st), st
            assert i == 0 or owned_changes(was, st) == {}, (rj, owned_changes(was, st))
            assert trainingjob.announce(was, st) == []  # the creation's Event says it
        resumed = derive(obs(rayjob("Initializing", **stamps), current=st, queue=queue), NOW)
        assert resumed["phase"] == "Pending" and resumed["attempts"][0]["startTime"] == rfc(NOW)


def test_a_pod_that_cannot_start_is_named_in_the_pending_status() -> None:
    unschedulable = ("Unschedulable", "pod w-1 cannot be scheduled: 0/3 nodes are available")
    st = derive(obs(rayjob("Initializing"), pods=unschedulable), NOW)
    running = conditions(st)["Running"]
    assert st["phase"] == "Pending" and running["reason"] == "Unschedulable"
    assert running["message"].endswith("pod w-1 cannot be scheduled: 0/3 nodes are available")
    (event,) = trainingjob.announce({"phase": "Pending"}, st)
    assert event.type == "Warning" and event.reason == "Unschedulable"
    assert trainingjob.starting_pods(
        {"status": {"jobDeploymentStatus": "Initializing", "rayClusterName": "c"}}
    ) == ("ray.io/cluster=c")
    suspended = {
        "spec": {"suspend": True},
        "status": {"jobDeploymentStatus": "Initializing", "rayClusterName": "c"},
    }
    assert trainingjob.starting_pods(suspended) is None
    assert (
        trainingjob.starting_pods({"status": {"jobDeploymentStatus": "Running", "rayClusterName": "c"}})
        is None
    )


def test_the_phase_a_new_rayjob_starts_in_is_not_announced_again() -> None:
    """The creating pass posts "created RayJob x"; the Pending/RayJobCreated phase it leads to (which
    the RayJob's own watch event may write first) is not a second Event. Later phases are."""
    created = {
        "phase": "Pending",
        "conditions": [{"type": "Running", "status": "False", "reason": "RayJobCreated", "message": "..."}],
    }
    assert trainingjob.announce({}, created) == []
    initializing = {
        "phase": "Running",
        "conditions": [{"type": "Running", "status": "True", "reason": "JobRunning", "message": "training"}],
    }
    assert [e.reason for e in trainingjob.announce(created, initializing)] == ["JobRunning"]


def test_last_error_names_a_crashing_container_then_a_failed_attempts_driver_error_and_is_kept() -> None:
    """status.lastError: a Ray container crashing (its pod and container named), or a failed
    attempt's error line from the Ray job's log tail (KubeRay's message); kept across attempts and
    unchanged (time included) while the same error is seen again."""
    crash = (
        "CrashLoopBackOff",
        "pod w-0, container ray-worker: CrashLoopBackOff; it exited with code 1: KeyError: 'x'",
    )
    st = derive(obs(rayjob("Initializing"), pods=crash), NOW)
    assert st["lastError"] == {
        "message": crash[1],
        "source": "pod",
        "attempt": 1,
        "time": "2026-11-22T12:00:00Z",
    }
    later = NOW + timedelta(seconds=30)
    assert derive(obs(rayjob("Initializing"), current=st, pods=crash), later)["lastError"] == st["lastError"]
    # A pod that cannot be pulled is a reason to wait, not an error of the job: nothing new.
    pulling = ("ImagePullBackOff", "pod w-0, container ray-worker: ImagePullBackOff")
    assert "lastError" not in derive(obs(rayjob("Initializing"), pods=pulling), NOW)

    log = (
        "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
        'Traceback (most recent call last):\n  File "train.py", line 9, in loop\n'
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\n"
        "\n(exited)\n"
    )
    retrying = rayjob("Retrying", "FAILED", message=log, failed=1)
    st2 = derive(obs(retrying, current=st), later)
    assert st2["lastError"]["source"] == "driver" and st2["lastError"]["attempt"] == 1  # the one that failed
    assert st2["attempt"] == 2
    assert st2["lastError"]["message"].startswith("torch.distributed.DistBackendError: NCCL error")
    running = derive(obs(rayjob("Running", "RUNNING", failed=1), current=st2), later + timedelta(seconds=60))
    assert running["lastError"] == st2["lastError"]  # the next attempt runs: the error stays on record
    failed = derive(obs(rayjob("Failed", "FAILED", message="no traceback here\nonly words", failed=3)), NOW)
    assert failed["lastError"]["message"] == "only words"  # nothing looks like an error: the last line


def test_a_failed_attempt_whose_retrying_state_passed_unseen_is_still_the_last_error() -> None:
    """KubeRay says a failed attempt's error only while Retrying; a reconcile that comes once the next
    attempt started finds the failure in the attempts: lastError names that attempt and where its error
    is (its driver's log), instead of nothing (the e2e run of 164d6f6: `KeyError: 'lastError'`).
    Said once; an error read later (a newer attempt's, KubeRay's words) replaces it."""
    first = derive(obs(rayjob("Running", "RUNNING", startTime=rfc(NOW))), NOW)
    assert "lastError" not in first
    later = NOW + timedelta(seconds=60)
    second = rayjob("Running", "RUNNING", startTime=rfc(later), failed=1)  # no Retrying seen in between
    st = derive(obs(second, current=first), later)
    assert [(a["attempt"], a.get("outcome")) for a in st["attempts"]] == [(1, "Failed"), (2, None)]
    assert st["lastError"] == {
        "message": "attempt 1 failed; KubeRay retried it before its error was read (it says it only while "
        "retrying): its driver's log has it, `rayship logs --attempt 1` on this TrainingJob",
        "source": "driver",
        "attempt": 1,
        "time": rfc(later),
    }
    again = derive(obs(second, current=st), later + timedelta(seconds=30))
    assert again["lastError"] == st["lastError"]  # kept, time included: nothing to write
    retrying = rayjob("Retrying", "FAILED", startTime=rfc(later), failed=2, message="RuntimeError: boom\n")
    words = derive(obs(retrying, current=again), later + timedelta(seconds=40))["lastError"]
    assert (words["attempt"], words["message"]) == (2, "RuntimeError: boom")


def test_a_job_killed_twice_has_three_attempts_on_record_whose_figures_add_up_to_the_totals() -> None:
    """status.attempts from what the operator sees, pass by pass: KubeRay's startTime changing at each
    attempt, its failure count, the workload's progress, each attempt's Ray pods (which start after it
    and drain on after it). Each attempt says what it resumed from and reached; their GPU- and
    CPU-seconds are their pods' own times and add up to the job's totals; an Event at each start and end."""
    t = [NOW + timedelta(seconds=s) for s in (0, 100, 160, 170, 300, 340, 350, 500, 530)]
    when = [rfc(x) for x in t]

    def at(s: int) -> datetime:
        return NOW + timedelta(seconds=s)

    def pod(n: int, start: int | None, **kw) -> dict:
        return ray_pod(f"c{n}-w", f"c{n}", None if start is None else at(start), gpus=2, cpus="2500m", **kw)

    def rj(deployment: str, job: str, start: int, cluster: int, **kw) -> dict:
        status = {"jobDeploymentStatus": deployment, "jobStatus": job, "startTime": when[start],
                  "rayClusterName": f"c{cluster}", **kw}  # fmt: skip
        return {"metadata": {"name": "rj"}, "status": status}

    passes = [  # (time, RayJob, the workload's progress by then, the pods seen then)
        (0, rj("Initializing", "", 0, 1), {}, ()),
        (1, rj("Running", "RUNNING", 0, 1), {"epoch": 2}, (pod(1, 10),)),
        (2, rj("Retrying", "FAILED", 0, 1, failed=1, reason="AppFailed"), {"epoch": 2},
         (pod(1, 10, deleting=at(190)),)),
        (3, rj("Initializing", "", 3, 2, failed=1), {"epoch": 2},
         (pod(1, 10, deleting=at(190)), pod(2, None, phase="Pending"))),
        (4, rj("Running", "RUNNING", 3, 2, failed=1), {"epoch": 3, "resumedFromEpoch": 2}, (pod(2, 180),)),
        (5, rj("Running", "FAILED", 3, 2, failed=1), {"epoch": 4, "resumedFromEpoch": 2}, (pod(2, 180),)),
        (6, rj("Initializing", "", 6, 3, failed=2), {"epoch": 4, "resumedFromEpoch": 2},
         (pod(2, 180, deleting=at(380)),)),
        (7, rj("Complete", "SUCCEEDED", 6, 3, failed=2, endTime=when[7]), {"epoch": 6, "resumedFromEpoch": 4},
         (pod(3, 360),)),
        (8, rj("Complete", "SUCCEEDED", 6, 3, failed=2, endTime=when[7]), {"epoch": 6, "resumedFromEpoch": 4},
         (pod(3, 360, deleting=at(540), end=at(520)),)),
    ]  # fmt: skip
    current: dict = {}
    events: list = []
    for i, rayjob_, progress, pods in passes:
        current = {**current, "progress": progress}
        st = derive(obs(rayjob_, current, gpus=2, ray_pods=pods), t[i])
        events += trainingjob.announce(current, st)
        current = {**st, "progress": progress}
    record = current["attempts"]
    assert [(a["attempt"], a["outcome"], a.get("resumedFromEpoch"), a["reachedEpoch"]) for a in record] == [
        (1, "Failed", None, 2),
        (2, "Failed", 2, 4),
        (3, "Succeeded", 4, 6),
    ]
    assert [(a["startTime"], a["endTime"]) for a in record] == [
        (when[0], when[3]),
        (when[3], when[6]),
        (when[6], when[7]),
    ]
    assert record[0]["reason"] == "AppFailed" and record[2]["reason"] == "JobSucceeded"
    assert [a["rayClusterName"] for a in record] == ["c1", "c2", "c3"]
    assert all("pods" not in a for a in record)  # every pod gone: settled
    # the pods' own times: 10-180 (last seen running at 170, gone before its deadline 190: the
    # middle), 180-365 (last seen at 350, deadline 380), 360-520 (its containers' end, seen)
    assert [a["gpuSeconds"] for a in record] == [2 * 170, 2 * 185, 2 * 160]
    assert sum(a["gpuSeconds"] for a in record) == current["gpuSeconds"] == 2 * 515
    assert sum(a["cpuSeconds"] for a in record) == current["cpuSeconds"] == 2.5 * 515
    assert current["gpuHours"] == round(1030 / 3600, 3) and current["attempt"] == 3
    said = [(e.reason, e.message.split(":")[0]) for e in events if e.reason.startswith("Attempt")]
    assert said == [  # the first attempt's start: the RayJob's creation Event says it
        ("AttemptEnded", "attempt 1 failed (AppFailed)"),
        ("AttemptStarted", "attempt 2 started on a new Ray cluster"),
        ("AttemptEnded", "attempt 2 failed (AttemptEnded)"),
        ("AttemptStarted", "attempt 3 started on a new Ray cluster"),
        ("AttemptEnded", "attempt 3 succeeded (JobSucceeded)"),
    ]
    # Another pass with nothing new changes nothing (a status written only when it changed).
    again = derive(obs(passes[-1][1], current, gpus=2), t[8] + timedelta(seconds=60))
    assert again["attempts"] == record and again["gpuSeconds"] == current["gpuSeconds"]


def killed_between_checkpoint_and_report(recovered: dict | None) -> tuple[dict, list]:
    """Three attempts, on Ray clusters c1..c3; attempt 2's driver is killed after Ray Train registered
    its checkpoint of epoch 6 and before that report's status patch (the clean-clone CI on real pods:
    attempt 2 last reported epoch 5, attempt 3 resumed from epoch 6). `recovered`: what attempt 3's
    driver read back from Ray Train's record, as it starts. (The status, Events) at the end."""
    t = [NOW + timedelta(seconds=s) for s in (0, 100, 110, 120, 200, 210, 215, 220, 300)]
    when = [rfc(x) for x in t]

    def rj(deployment: str, job: str, start: int, cluster: int, **kw) -> dict:
        status = {"jobDeploymentStatus": deployment, "jobStatus": job, "startTime": when[start],
                  "rayClusterName": f"c{cluster}", **kw}  # fmt: skip
        return {"metadata": {"name": "rj"}, "status": status}

    def report(epoch: int, cluster: int, resumed: int | None = None) -> dict:
        return {"epoch": epoch, "checkpointEpoch": epoch, "rayCluster": f"c{cluster}",
                **({"resumedFromEpoch": resumed} if resumed else {})}  # fmt: skip

    passes = [  # (time, RayJob, the workload's progress by then)
        (0, rj("Running", "RUNNING", 0, 1), report(3, 1)),
        (1, rj("Retrying", "FAILED", 0, 1, failed=1, reason="AppFailed"), report(3, 1)),
        (2, rj("Initializing", "", 2, 2, failed=1), report(3, 1)),
        (3, rj("Running", "RUNNING", 2, 2, failed=1), report(4, 2, 3)),
        (4, rj("Retrying", "FAILED", 2, 2, failed=1, reason="AppFailed"), report(5, 2, 3)),
        (5, rj("Initializing", "", 5, 3, failed=2), report(5, 2, 3)),
        (6, rj("Running", "", 5, 3, failed=2), {**report(5, 2, 3), **({"recovered": recovered} if recovered else {})}),
        (7, rj("Running", "RUNNING", 5, 3, failed=2), report(7, 3, 6)),
        (8, rj("Complete", "SUCCEEDED", 5, 3, failed=2, endTime=when[8]), report(8, 3, 6)),
    ]  # fmt: skip
    current: dict = {}
    events: list = []
    for i, rayjob_, progress in passes:
        current = {**current, "progress": {**current.get("progress", {}), **progress}}  # merge-patched
        st = derive(obs(rayjob_, current), t[i])
        events += trainingjob.announce(current, st)
        current = {**st, "progress": current["progress"]}
    return current, events


def epochs(status: dict) -> list[tuple]:
    return [(a["attempt"], a["outcome"], a.get("resumedFromEpoch"), a.get("reachedEpoch"),
             a.get("checkpointEpoch"), a.get("reportRecovered")) for a in status["attempts"]]  # fmt: skip


def test_a_report_lost_as_its_attempt_ended_shows_as_a_checkpoint_beyond_its_last_report() -> None:
    """Issue 59 §2: reachedEpoch is what the workload reported, never raised to the next attempt's
    resume; the checkpoint it left (the epoch the next attempt resumed from) is on record beside it,
    the gap is said in one Warning Event and in `rayship status`."""
    status, events = killed_between_checkpoint_and_report(recovered=None)
    assert epochs(status) == [
        (1, "Failed", None, 3, 3, None),
        (2, "Failed", 3, 5, 6, None),
        (3, "Succeeded", 6, 8, 8, None),
    ]
    lost = [e for e in events if e.reason == "ReportLost"]
    assert [(e.type, e.message.split(":")[0]) for e in lost] == [
        ("Warning", "attempt 2 left a checkpoint of epoch 6 (the next attempt resumed from it), but its "
                    "last report on record is of epoch 5")]  # fmt: skip
    assert "3->5 (checkpoint 6: its report lost)" in status_screen(status)


def test_a_report_lost_as_its_attempt_ended_and_read_back_by_the_next_goes_to_the_attempt_before() -> None:
    """The next attempt's driver read Ray Train's record of the newest checkpoint back (epoch 6): the
    attempt before reached 6, said as recovered (an Event); no gap. A record not newer than what is on
    record, or naming no attempt's cluster, changes nothing."""
    recovered = {"epoch": 6, "step": 96, "metrics": {"loss": 0.5}, "rayCluster": "c3"}
    status, events = killed_between_checkpoint_and_report(recovered)
    assert epochs(status) == [
        (1, "Failed", None, 3, 3, None),
        (2, "Failed", 3, 6, 6, True),
        (3, "Succeeded", 6, 8, 8, None),
    ]
    said = [(e.reason, e.message.split(" (")[0]) for e in events if e.reason.startswith("Report")]
    assert said == [("ReportRecovered", "attempt 2's report of epoch 6 was lost as it ended")]
    assert "3->6 (last report recovered)" in status_screen(status)
    for other in (
        {**recovered, "epoch": 5},
        {**recovered, "rayCluster": "c9"},
        {**recovered, "rayCluster": "c2"},
    ):
        status, events = killed_between_checkpoint_and_report(other)
        assert epochs(status)[1] == (2, "Failed", 3, 5, 6, None), other
        assert [e.reason for e in events if e.reason.startswith("Report")] == ["ReportLost"], other


def test_an_attempt_takes_no_report_of_another_ray_cluster() -> None:
    """The last report of attempt 1 (on c1) stays in status.progress (merge-patched) until attempt 2
    reports: attempt 2, dead before its first report, reached nothing and left no checkpoint."""
    t = [NOW + timedelta(seconds=s) for s in (0, 100, 110, 150, 160)]
    when = [rfc(x) for x in t]
    progress = {"epoch": 4, "checkpointEpoch": 4, "rayCluster": "c1"}

    def rj(deployment: str, job: str, start: int, cluster: int, **kw) -> dict:
        status = {"jobDeploymentStatus": deployment, "jobStatus": job, "startTime": when[start],
                  "rayClusterName": f"c{cluster}", **kw}  # fmt: skip
        return {"metadata": {"name": "rj"}, "status": status}

    current: dict = {}
    for i, rayjob_ in enumerate([
        rj("Running", "RUNNING", 0, 1),
        rj("Retrying", "FAILED", 0, 1, failed=1, reason="AppFailed"),
        rj("Running", "RUNNING", 2, 2, failed=1),
        rj("Failed", "FAILED", 2, 2, failed=2, endTime=when[3]),
    ]):  # fmt: skip
        current = {**derive(obs(rayjob_, {**current, "progress": progress}), t[i]), "progress": progress}
    assert epochs(current) == [(1, "Failed", None, 4, 4, None), (2, "Failed", None, None, None, None)]


def status_screen(status: dict) -> str:
    from rayship.cli import status as cli_status

    return cli_status.attempts_table(status, NOW + timedelta(seconds=400))


def test_an_attempt_records_each_change_of_its_ready_worker_count() -> None:
    """Issue 35: a worker pod taken away and given back shows in the attempt's record (an elastic job
    trains on with fewer); a count seen again unchanged adds nothing; the record outlives the run."""
    t = [NOW + timedelta(seconds=s) for s in (0, 10, 20, 30, 40, 50)]
    running = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "startTime": rfc(t[0])}
    current: dict = {}
    for i, ready in enumerate((2, 2, 1, 1, 2)):
        rj = {**running, "rayClusterStatus": {"readyWorkerReplicas": ready, "desiredWorkerReplicas": 2}}
        current = derive(obs({"metadata": {"name": "rj"}, "status": rj}, current, gpus=2, cpus=2.5), t[i])
    done = {**running, "jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "endTime": rfc(t[5])}
    current = derive(obs({"metadata": {"name": "rj"}, "status": done}, current, gpus=2, cpus=2.5), t[5])
    (attempt,) = current["attempts"]
    assert attempt["outcome"] == "Succeeded" and attempt["workerChanges"] == [
        {"time": rfc(t[0]), "readyWorkers": 2},
        {"time": rfc(t[2]), "readyWorkers": 1},
        {"time": rfc(t[4]), "readyWorkers": 2},
    ]
    AttemptStatus.model_validate(attempt)  # what the CRD's schema (generated from it) takes


def test_only_the_last_20_attempts_are_kept() -> None:
    from rayship.controller.trainingjob.attempts import MAX_ATTEMPTS_KEPT, accounted

    old = [{"attempt": n, "startTime": rfc(NOW + timedelta(seconds=n)), "endTime": rfc(NOW + timedelta(seconds=n)),
            "outcome": "Failed", "reason": "AppFailed"} for n in range(1, 21)]  # fmt: skip
    st = {"jobDeploymentStatus": "Initializing", "startTime": rfc(NOW + timedelta(seconds=60)), "failed": 20}
    stored = {"attempts": old, "gpuSecondsEarlierAttempts": 7.0}
    out = accounted(stored, st, "Pending", "ClusterInitializing", 21, NOW + timedelta(seconds=61))
    record = out["attempts"]
    assert out["gpuSeconds"] == 7.0  # the dropped attempts still count
    assert len(record) == MAX_ATTEMPTS_KEPT and record[0]["attempt"] == 2 and record[-1]["attempt"] == 21


def rfc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_suspension_closes_the_attempt_and_its_time_suspended_is_not_counted() -> None:
    """Suspended, the job's Ray cluster is deleted: its attempt closes then (its pods count until they
    are gone); a resume opens a new one (KubeRay sets a new startTime and counts no failure) on a new
    cluster: no GPU time counted in between."""
    t0, t1, t2, t3 = (NOW + timedelta(seconds=s) for s in (0, 100, 400, 460))
    running = rayjob("Running", "RUNNING", startTime=rfc(t0), rayClusterName="c1")
    st = derive(obs(running, gpus=2, ray_pods=(ray_pod("c1-w", "c1", t0, gpus=2),)), t1)
    going = (ray_pod("c1-w", "c1", t0, gpus=2, deleting=t1 + timedelta(seconds=30)),)
    st = derive(obs(rayjob("Suspended", "", startTime=rfc(t0)), current=st, gpus=2, ray_pods=going), t1)
    assert st["attempts"][0]["outcome"] == "Suspended" and st["gpuSeconds"] == 200
    st = derive(obs(rayjob("Suspended", "", startTime=rfc(t0)), current=st, gpus=2, ray_pods=()), t2)
    # its pod drained on (gone before its deadline, 30 s on: counted to the middle, 15 s); nothing
    # runs while suspended
    assert st["gpuSeconds"] == 230
    resumed_rj = rayjob("Running", "RUNNING", startTime=rfc(t2), rayClusterName="c2")
    pods = (ray_pod("c2-w", "c2", t2 + timedelta(seconds=10), gpus=2),)
    resumed = derive(obs(resumed_rj, current=st, gpus=2, ray_pods=pods), t3)
    assert [(a["attempt"], a.get("outcome")) for a in resumed["attempts"]] == [(1, "Suspended"), (1, None)]
    assert resumed["gpuSeconds"] == 230 + 2 * 50
    (event,) = [e for e in trainingjob.announce(st, resumed) if e.reason == "AttemptStarted"]
    assert event.message == "attempt 1 started on a new Ray cluster"
