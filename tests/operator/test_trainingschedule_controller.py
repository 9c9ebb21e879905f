"""TrainingSchedule on the real control plane: the operator (as the chart's ServiceAccount) makes a
TrainingJob at each minute of a one-minute cron, owned by the schedule, its data naming the run's
day; a succeeded run is judged by the promotion gate; finished runs beyond the history limit go, the
promoted one stays; deleting the schedule takes its runs with it (the real garbage collector).

A run's end is written as the workload and KubeRay report it at the end of a real run (as the
ModelService tier does): kwok's pods run no Ray."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rayship import api
from rayship.api import names
from tests.operator.kube import Kube, sample, wait_for

pytestmark = pytest.mark.operator

TS, TJ, RJ = api.TRAININGSCHEDULES, api.TRAININGJOBS, api.RAYJOBS
MS, RS = api.MODELSERVICES, api.RAYSERVICES
SERVE_CPU = {"gpus": 0, "cpus": 1, "memory": "2Gi"}


def schedule() -> dict:
    template = sample("unused")["spec"]
    template["data"] = {
        "source": "uri",
        "format": "parquet",
        "uri": "/mnt/checkpoints/data/{{ .ScheduledDate }}.parquet",
    }
    return {
        "apiVersion": api.API_VERSION,
        "kind": "TrainingSchedule",
        "metadata": {"name": "retrain"},
        "spec": {
            "schedule": "* * * * *",
            "concurrencyPolicy": "Allow",
            "successfulJobsHistoryLimit": 0,
            "promote": {"metric": "evalLoss", "threshold": 0.2},
            "jobTemplate": {"metadata": {"labels": {"team": "ranking"}}, "spec": template},
        },
    }


def runs(kube: Kube) -> list[dict]:
    found = kube.list(TJ, f"{names.LABEL_TRAININGSCHEDULE}=retrain")
    return sorted(found, key=lambda r: r["metadata"]["annotations"][names.ANNOTATION_SCHEDULED_TIME])


def finish(kube: Kube, name: str, loss: float) -> None:
    group, version, plural = TJ
    kube.custom.patch_namespaced_custom_object_status(
        group, version, kube.namespace, plural, name,
        {"status": {"phase": "Succeeded", "completionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "progress": {"metrics": {"evalLoss": loss}},
                    "checkpoint": {"model": f"/mnt/checkpoints/{kube.namespace}.{name}/model"}}},
    )  # fmt: skip


def test_a_one_minute_schedule_makes_runs_promotes_by_the_gate_and_keeps_its_history(
    kube: Kube, operator
) -> None:
    kube.pvc()
    ts = kube.create(TS, schedule())
    follower = sample("follows", file="modelservice-from-trainingjob.yaml")
    follower["spec"].update(model={"fromTrainingSchedule": {"name": "retrain"}}, resources=SERVE_CPU)
    kube.create(MS, follower)
    waiting = wait_for(
        lambda: (
            (c := kube.condition(MS, "follows", "ModelAvailable")).get("reason") == "NothingPromoted" and c
        ),
        60,
        what="the ModelService waiting for a promoted run",
    )
    assert "TrainingSchedule retrain" in waiting["message"] and kube.get(RS, "follows") is None

    # [1] a run at the next whole minute, owned by the schedule, made from its template
    (first,) = wait_for(lambda: runs(kube), 75, what="the first run")
    meta = first["metadata"]
    (owner,) = meta["ownerReferences"]
    assert (
        owner["kind"] == "TrainingSchedule" and owner["uid"] == ts["metadata"]["uid"] and owner["controller"]
    )
    due = datetime.fromisoformat(meta["annotations"][names.ANNOTATION_SCHEDULED_TIME].replace("Z", "+00:00"))
    assert due.second == 0 and meta["name"] == f"retrain-{int(due.timestamp()) // 60}"
    assert meta["labels"]["team"] == "ranking"
    assert first["spec"]["data"]["uri"] == f"/mnt/checkpoints/data/{due:%Y-%m-%d}.parquet"
    wait_for(lambda: kube.get(RJ, names.rayjob_name(meta["name"])), 60, what="the run's RayJob")
    status = wait_for(
        lambda: (s := kube.status(TS, "retrain")).get("active") and s, 30, what="the schedule's status"
    )
    assert (
        status["active"] == [meta["name"]]
        and status["lastScheduleTime"] == meta["annotations"][names.ANNOTATION_SCHEDULED_TIME]
    )
    assert datetime.fromisoformat(status["nextScheduleTime"].replace("Z", "+00:00")) > due
    assert ("Normal", "RunCreated") in {e[:2] for e in kube.events("retrain")}

    # [2] it succeeds below the threshold: promoted, with its model
    finish(kube, meta["name"], 0.1)
    promoted = wait_for(lambda: kube.status(TS, "retrain").get("promoted"), 60, what="the run promoted")
    assert promoted["job"] == meta["name"] and promoted["value"] == 0.1
    assert (
        promoted["model"].endswith(f"{meta['name']}/model")
        and promoted["volume"]["claimName"] == "rayship-checkpoints"
    )
    # the ModelService following the schedule serves it (its TrainingSchedule's event re-resolves it)
    rayservice = wait_for(lambda: kube.get(RS, names.rayservice_name("follows")), 60, what="the RayService")
    assert rayservice["metadata"]["annotations"][names.ANNOTATION_MODEL] == promoted["model"]

    # [3] the next minute's run fails the gate: not promoted; with successfulJobsHistoryLimit 0 it is
    # deleted, and the promoted run stays
    second = wait_for(
        lambda: (found := runs(kube)) and len(found) >= 2 and found[1], 75, what="the second run"
    )
    finish(kube, second["metadata"]["name"], 0.5)
    gate = wait_for(
        lambda: (
            (g := kube.status(TS, "retrain").get("lastGate") or {}).get("job") == second["metadata"]["name"]
            and g
        ),
        60,
        what="the gate's verdict on the second run",
    )
    assert gate["passed"] is False and "not below the threshold 0.2" in gate["message"]
    assert kube.status(TS, "retrain")["promoted"]["job"] == meta["name"]
    wait_for(lambda: kube.get(TJ, second["metadata"]["name"]) is None, 60, what="the second run deleted")
    assert kube.get(TJ, meta["name"]) is not None
    reasons = {e[1] for e in kube.events("retrain")}
    assert {"Promoted", "NotPromoted", "RunDeleted"} <= reasons, reasons

    # [4] suspended: said in the status at once
    kube.patch(TS, "retrain", {"spec": {"suspend": True}})
    wait_for(
        lambda: kube.condition(TS, "retrain", "Scheduling").get("reason") == "Suspended", 30, what="Suspended"
    )
    assert kube.status(TS, "retrain").get("nextScheduleTime") is None

    # [5] deleting the schedule takes its runs (and their RayJobs) with it, and the service says so.
    # No Serve runs here to confirm the model (status.modelURI), so there is nothing it keeps serving:
    # TrainingScheduleNotFound (a service whose model Serve confirmed says TrainingScheduleDeleted and
    # keeps it: unit-tested).
    kube.delete(TS, "retrain")
    wait_for(lambda: kube.get(TS, "retrain") is None, 60, what="the schedule gone (its finalizer removed)")
    wait_for(lambda: not runs(kube), 90, what="its runs garbage-collected")
    wait_for(
        lambda: kube.condition(MS, "follows", "ModelAvailable").get("reason") == "TrainingScheduleNotFound",
        60,
        what="the service to say its schedule is gone",
    )
