"""Status derivation: the KubeRay state table, no contradictions, terminal phases stick."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from rayship import api, trainingjob
from rayship.conditions import owned_changes
from rayship.trainingjob import Observation, derive

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


def test_rayjob_fields_and_gpu_seconds() -> None:
    rj = rayjob(
        "Running",
        "RUNNING",
        rayClusterName="rj-abcde",
        jobId="rj-xyz",
        dashboardURL="rj-head-svc:8265",
        startTime="2026-11-22T11:59:00Z",
    )
    st = derive(obs(rj, gpus=4), NOW)
    assert st["rayJobName"] == "rj" and st["rayClusterName"] == "rj-abcde" and st["jobId"] == "rj-xyz"
    assert st["dashboardURL"] == "rj-head-svc:8265" and st["startTime"] == "2026-11-22T11:59:00Z"
    assert st["gpus"] == 4 and st["gpuSeconds"] == 240.0
    assert "completionTime" not in st


def test_owned_changes_is_empty_when_nothing_changed() -> None:
    st = derive(obs(rayjob("Running", "RUNNING")), NOW)
    stored = {**st, "progress": {"epoch": 2}}  # written by the workload, not ours
    assert owned_changes(stored, derive(obs(rayjob("Running", "RUNNING"), current=stored), NOW)) == {}
    assert "progress" not in derive(obs(rayjob("Complete", "SUCCEEDED"), current=stored), NOW)
