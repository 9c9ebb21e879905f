"""`rayship status`: the next step derived from an object's conditions (pure: `cli.nextstep`), one for
every reason the controllers write, and the one screen it prints (phase, conditions with reasons and
messages, attempts, workers, the child, the last Events, the next step)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from rayship.cli import nextstep, status
from rayship.controller import trainingjob
from rayship.controller.modelservice import phase as ms_phase
from rayship.controller.trainingjob import phase as tj_phase

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def obj(kind: str, phase: str | None, reason: str, message: str = "", **status_: Any) -> dict[str, Any]:
    type_ = {"TrainingJob": "Running", "ModelService": "Ready", "TrainingSchedule": "Scheduling"}[kind]
    if phase == "Invalid":
        type_ = "Valid"
    conditions = [{"type": type_, "status": "False", "reason": reason, "message": message,
                   "lastTransitionTime": "2026-12-05T11:58:00Z"}]  # fmt: skip
    return {
        "kind": kind,
        "metadata": {"name": "mlp", "namespace": "team-a", "creationTimestamp": "2026-12-05T11:50:00Z"},
        "spec": {
            "workers": {"replicas": 2, "gpusPerWorker": 1},
            "trainer": {"epochs": 10},
            "checkpoint": {"storage": {"pvc": {"claimName": "rayship-checkpoints"}}},
        },
        "status": {"phase": phase, "conditions": conditions, **status_},
    }


def rayship_reasons() -> set[str]:
    """Every reason rayship's own tables and constants give a TrainingJob's phase."""
    from_table = {reason for _, reason, _ in tj_phase.PHASE_TABLE.values()}
    return from_table | set(trainingjob.BLOCKED_REASONS) | {
        tj_phase.STARTUP_DEADLINE, "CreatingRayJob", "Queued", "RayJobLost", "RayJobGoneAfterExport",
        "UnknownRayJobState", "InvalidSpec",
    }  # fmt: skip


def test_every_reason_a_trainingjob_can_have_has_its_own_step() -> None:
    kuberay_failed = {"AppFailed", "DeadlineExceeded", "SubmissionFailed"}  # KubeRay v1.7's, passed through
    missing = sorted((rayship_reasons() | kuberay_failed) - set(nextstep.TRAININGJOB_STEPS))
    assert not missing, f"no next step for {missing}"


def test_every_reason_a_modelservice_can_have_has_its_own_step() -> None:
    serving = {reason for _, (_, reason, _) in ms_phase.SERVING_TABLE if reason}
    stuck = set(trainingjob.STUCK_REASONS)
    missing = sorted(
        (serving | stuck | {"RayServiceNameTaken", "Deploying"}) - set(nextstep.MODELSERVICE_STEPS)
    )
    assert not missing, f"no next step for {missing}"


@pytest.mark.parametrize(
    ("kind", "phase", "reason", "words"),
    [
        ("TrainingJob", "Pending", "Unschedulable", "no node can take a Ray pod"),
        ("TrainingJob", "Pending", "Unschedulable", "-l rayship.dev/trainingjob=mlp"),
        ("TrainingJob", "Pending", "ImagePullBackOff", "check spec.image"),
        ("TrainingJob", "Pending", "OOMKilled", "memoryPerWorker"),
        ("TrainingJob", "Running", "JobRunning", "rayship logs -f tj/mlp -n team-a"),
        ("TrainingJob", "Failed", "RayJobFailed", "rayship logs tj/mlp -n team-a"),
        ("TrainingJob", "Failed", "AppFailed", "rayship logs tj/mlp -n team-a"),  # KubeRay's: by the phase
        ("TrainingJob", "Suspended", "Suspended", "kubectl patch trainingjob mlp -n team-a --type merge -p "
                                                  "'{\"spec\":{\"suspend\":false}}'"),
        ("TrainingJob", "Pending", "RayJobNameTaken", "kubectl delete rayjob mlp -n team-a"),
        ("TrainingJob", "Pending", "ClaimNotFound", "create the PersistentVolumeClaim rayship-checkpoints in"),
        ("TrainingJob", "Succeeded", "JobSucceeded", "fromTrainingJob.name: mlp"),
        ("TrainingJob", "Invalid", "InvalidSpec", "rayship render -f FILE"),
        ("ModelService", "Failed", "DeployFailed", "rayship logs ms/mlp -n team-a"),
        ("ModelService", "Deploying", "Unschedulable", "no node can take a Ray pod"),
        ("TrainingSchedule", None, "NeverDue", "fix spec.schedule"),
        ("TrainingSchedule", None, "Forbidden", "concurrencyPolicy Forbid"),
    ],
)  # fmt: skip
def test_the_next_step_follows_the_reason(kind: str, phase: str | None, reason: str, words: str) -> None:
    assert words in nextstep.next_step(obj(kind, phase, reason))


def test_the_next_step_of_a_modelservice_waiting_for_its_model_is_about_the_model() -> None:
    waiting = obj("ModelService", "WaitingForModel", "Waiting")
    waiting["spec"] = {"model": {"fromTrainingJob": {"name": "mlp-ddp"}}}
    waiting["status"]["conditions"].append(
        {
            "type": "ModelAvailable",
            "status": "False",
            "reason": "TrainingJobNotSucceeded",
            "message": "waiting",
        }
    )
    assert nextstep.next_step(waiting) == (
        "wait for the TrainingJob it serves from to succeed: rayship status tj/mlp-ddp -n team-a"
    )
    ready = obj("ModelService", "Ready", "Ready", url="http://mlp.team-a.svc:8000/")
    assert nextstep.next_step(ready) == "call it: http://mlp.team-a.svc:8000/"


def test_an_object_without_status_points_at_the_operator() -> None:
    unseen = obj("TrainingJob", None, "x")
    unseen["status"] = {}
    assert "is the rayship operator running and watching namespace team-a" in nextstep.next_step(unseen)


def test_a_spec_edited_after_launch_adds_its_step() -> None:
    running = obj("TrainingJob", "Running", "JobRunning")
    running["status"]["conditions"].append(
        {"type": "SpecApplied", "status": "False", "reason": "ImmutableAfterLaunch"}
    )
    assert nextstep.next_step(running).endswith(
        f"delete and re-create the TrainingJob to apply the fields edited after launch: {nextstep.RECREATE}"
    )


def test_the_screen_says_it_all() -> None:
    job = obj("TrainingJob", "Pending", "Unschedulable", "pod mlp-head cannot be scheduled: 0/3 nodes are available",
              attempt=2, readyWorkers=1, rayJobName="mlp", rayClusterName="mlp-abcde",
              progress={"epoch": 3, "metrics": {"loss": 0.123456}},
              attempts=[{"attempt": 1, "startTime": "2026-12-05T11:51:00Z", "endTime": "2026-12-05T11:55:00Z",
                         "outcome": "Failed", "reason": "AppFailed", "reachedEpoch": 3, "gpuSeconds": 480.0,
                         "workerChanges": [{"time": "x", "readyWorkers": 2}, {"time": "y", "readyWorkers": 1}]}])  # fmt: skip
    job["status"]["conditions"].insert(0, {"type": "Valid", "status": "True", "reason": "SpecValid",
                                           "message": "the spec is valid", "lastTransitionTime": "2026-12-05T11:50:00Z"})  # fmt: skip
    job["status"]["conditions"].append({"type": "Complete", "status": "False", "reason": "Unschedulable",
                                        "message": job["status"]["conditions"][1]["message"],
                                        "lastTransitionTime": "2026-12-05T11:58:00Z"})  # fmt: skip
    events = [{"type": "Normal", "reason": f"R{i}", "message": f"event {i}", "count": 1,
               "lastTimestamp": f"2026-12-05T11:5{i}:00Z"} for i in range(10)]  # fmt: skip
    screen = status.screen(job, events, NOW)
    lines = screen.splitlines()
    assert lines[0].split() == ["TrainingJob:", "team-a/mlp"]
    assert "Phase:       Pending" in screen
    assert "Workers:     2 wanted, 1 ready, 1 GPU each" in screen
    assert "Attempt:     2" in screen and "RayJob:      mlp (RayCluster mlp-abcde)" in screen
    assert "Progress:    epoch 3/10, loss 0.1235" in screen
    valid, running, complete = (
        line.split(maxsplit=4) for line in lines if line.startswith(("  Valid", "  Running", "  Complete"))
    )
    assert valid == ["Valid", "True", "SpecValid", "10m", "the spec is valid"]
    assert running == [
        "Running",
        "False",
        "Unschedulable",
        "2m",
        "pod mlp-head cannot be scheduled: 0/3 nodes are available",
    ]
    assert complete == ["Complete", "False", "Unschedulable", "2m", "(as above)"]  # not said twice
    attempt = next(line for line in lines if line.startswith("  1 "))
    assert attempt.split() == ["1", "9m", "ago", "5m", "ago", "Failed", "AppFailed", "0->3", "2>1", "480"]
    assert "Events (the last 8 of 10, newest last):" in screen
    said = [line.split()[-1] for line in lines if "event " in line]
    assert said == [str(i) for i in range(2, 10)]  # the last eight, newest last
    assert lines[-1].startswith("Next step: no node can take a Ray pod")


def test_the_screen_says_when_events_cannot_be_read() -> None:
    screen = status.screen(obj("TrainingSchedule", None, "Scheduled", nextScheduleTime="2026-12-06T00:00:00Z"),
                           "(cannot read its events: forbidden: ...)", NOW)  # fmt: skip
    assert "Events:\n  (cannot read its events: forbidden: ...)\n" in screen
    assert screen.endswith("Next step: nothing to do: the next run is due at 2026-12-06T00:00:00Z\n")
