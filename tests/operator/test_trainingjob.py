"""The TrainingJob controller, running for real (kopf) against the Kubernetes API emulator over HTTP.

The test plays KubeRay: it patches the RayJob's status the way KubeRay would and checks that the
TrainingJob's status, conditions and Events follow.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
import yaml
from conftest import RESOURCES

from tests.conftest import SAMPLES
from tests.emulator import EVENTS, EmulatorHandle

pytestmark = pytest.mark.operator

TJ = RESOURCES["trainingjobs"]
RJ = RESOURCES["rayjobs"]
NS = "default"
OPERATOR = "rayship.handlers"


def sample(name: str = "mlp-ddp", **spec_changes: Any) -> dict[str, Any]:
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": NS}
    doc["spec"].update(spec_changes)
    return doc


def apply(emulator: EmulatorHandle, doc: dict[str, Any]) -> dict[str, Any]:
    """Create it as a user would (through the emulator's helper, so that only the operator's own
    requests are recorded for the RBAC check)."""
    return emulator.create(TJ, doc)


def phase(emulator: EmulatorHandle, name: str = "mlp-ddp") -> str | None:
    obj = emulator.get(TJ, NS, name)
    return (obj or {}).get("status", {}).get("phase")


def wait_phase(emulator: EmulatorHandle, expected: str, name: str = "mlp-ddp") -> dict[str, Any]:
    emulator.wait_for(lambda: phase(emulator, name) == expected or None)
    return emulator.get(TJ, NS, name)["status"]


def kuberay_sets(emulator: EmulatorHandle, name: str, **status: Any) -> None:
    emulator.patch(RJ, NS, name, {"status": status}, subresource="status")


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def events_for(emulator: EmulatorHandle, name: str) -> list[dict[str, Any]]:
    return [e for e in emulator.list(EVENTS, NS) if e.get("involvedObject", {}).get("name") == name]


def requests(emulator: EmulatorHandle, verb: str, resource: str, subresource: str | None = None) -> int:
    return sum(
        1 for r in emulator.requests if (r.verb, r.resource, r.subresource) == (verb, resource, subresource)
    )


def test_round_trip_create_run_succeed_delete(emulator, kube_api, run_kopf) -> None:
    with run_kopf(OPERATOR):
        created = apply(emulator, sample())
        rayjob = emulator.wait_for(lambda: emulator.get(RJ, NS, "mlp-ddp"))

        # The RayJob is owned by the TrainingJob, so it is garbage-collected with it.
        (owner,) = rayjob["metadata"]["ownerReferences"]
        assert owner["uid"] == created["metadata"]["uid"] and owner["kind"] == "TrainingJob"
        assert owner["controller"] is True and owner["blockOwnerDeletion"] is True
        assert rayjob["metadata"]["labels"]["rayship.dev/trainingjob"] == "mlp-ddp"
        assert rayjob["spec"]["entrypoint"].startswith("python -m rayship_workloads.job --spec ")
        # The Ray pods' own account may patch this TrainingJob's status (progress), nothing else.
        for kind in ("serviceaccounts", "roles", "rolebindings"):
            obj = emulator.get(RESOURCES[kind], NS, "mlp-ddp-workload")
            assert obj["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"], kind
        role = emulator.get(RESOURCES["roles"], NS, "mlp-ddp-workload")
        assert role["rules"][0]["resourceNames"] == ["mlp-ddp"]

        status = wait_phase(emulator, "Pending")
        assert status["gpus"] == 2 and status["rayJobName"] == "mlp-ddp" and status["observedGeneration"] == 1
        assert condition(status, "Valid")["status"] == "True"

        kuberay_sets(emulator, "mlp-ddp", jobDeploymentStatus="Initializing")
        emulator.wait_for(
            lambda: (
                condition(emulator.get(TJ, NS, "mlp-ddp")["status"], "Running")["reason"]
                == "ClusterInitializing"
            )
        )

        kuberay_sets(
            emulator,
            "mlp-ddp",
            jobDeploymentStatus="Running",
            jobStatus="RUNNING",
            rayClusterName="mlp-ddp-x7k2p",
            jobId="mlp-ddp-abc",
            dashboardURL="mlp-ddp-x7k2p-head-svc.default.svc.cluster.local:8265",
            startTime="2026-11-22T10:00:00Z",
        )
        status = wait_phase(emulator, "Running")
        assert (
            condition(status, "Running")["status"] == "True"
            and condition(status, "Complete")["status"] == "False"
        )
        assert status["rayClusterName"] == "mlp-ddp-x7k2p" and status["jobId"] == "mlp-ddp-abc"
        assert status["startTime"] == "2026-11-22T10:00:00Z"

        kuberay_sets(
            emulator,
            "mlp-ddp",
            jobDeploymentStatus="Complete",
            jobStatus="SUCCEEDED",
            endTime="2026-11-22T10:30:00Z",
        )
        status = wait_phase(emulator, "Succeeded")
        assert (
            condition(status, "Complete")["status"] == "True"
            and condition(status, "Running")["status"] == "False"
        )
        assert status["completionTime"] == "2026-11-22T10:30:00Z"
        assert status["gpuSeconds"] == 2 * 1800.0

        reasons = emulator.wait_for(
            lambda: (
                {e["reason"] for e in events_for(emulator, "mlp-ddp")}
                >= {"RayJobCreated", "JobRunning", "JobSucceeded"}
                and [e["reason"] for e in events_for(emulator, "mlp-ddp")]
            )
        )
        assert "JobSucceeded" in reasons

        emulator.delete(TJ, NS, "mlp-ddp")
        emulator.wait_for(lambda: emulator.get(RJ, NS, "mlp-ddp") is None)
        assert emulator.get(RESOURCES["roles"], NS, "mlp-ddp-workload") is None
    assert requests(emulator, "create", "rayjobs") == 1


def test_failed_rayjob_fails_the_trainingjob_with_kuberays_reason(emulator, kube_api, run_kopf) -> None:
    with run_kopf(OPERATOR):
        apply(emulator, sample())
        emulator.wait_for(lambda: emulator.get(RJ, NS, "mlp-ddp"))
        kuberay_sets(emulator, "mlp-ddp", jobDeploymentStatus="Running", jobStatus="RUNNING")
        wait_phase(emulator, "Running")
        kuberay_sets(
            emulator,
            "mlp-ddp",
            jobDeploymentStatus="Failed",
            jobStatus="FAILED",
            reason="AppFailed",
            message="Job entrypoint command failed with exit code 1",
            failed=3,
        )
        status = wait_phase(emulator, "Failed")
        failed = condition(status, "Failed")
        assert failed["status"] == "True" and failed["reason"] == "AppFailed"
        assert "exit code 1" in failed["message"] and "attempts failed: 3" in failed["message"]
        assert condition(status, "Running")["status"] == "False"
        warning = emulator.wait_for(
            lambda: next((e for e in events_for(emulator, "mlp-ddp") if e["type"] == "Warning"), None)
        )
        assert warning["reason"] == "AppFailed"

        # KubeRay's later writes (e.g. the cluster being torn down) do not resurrect the job.
        seen = requests(emulator, "get", "rayjobs")
        kuberay_sets(emulator, "mlp-ddp", jobDeploymentStatus="Running", jobStatus="RUNNING")
        emulator.wait_for(lambda: requests(emulator, "get", "rayjobs") > seen)  # the operator looked
        assert phase(emulator) == "Failed"


def test_invalid_trainingjob_is_reported_once_without_retries(emulator, kube_api, run_kopf) -> None:
    bad = sample()
    bad["spec"]["trainer"]["entrypoint"] = "mypkg.train:loop"  # recipe and entrypoint both set
    with run_kopf(OPERATOR) as runner:
        apply(emulator, bad)
        status = wait_phase(emulator, "Invalid")
        valid = condition(status, "Valid")
        assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
        assert "spec.trainer: set exactly one of recipe" in valid["message"]
        warning = emulator.wait_for(
            lambda: next((e for e in events_for(emulator, "mlp-ddp") if e["type"] == "Warning"), None)
        )
        assert "spec.trainer" in warning["message"]
        # Give a retry storm a chance to show: kopf's own retry delay is 60 s, ours would be 2 s.
        time.sleep(2.5)
    assert emulator.get(RJ, NS, "mlp-ddp") is None
    assert requests(emulator, "patch", "trainingjobs", "status") == 1
    assert "Traceback" not in runner.output


def test_fixing_an_invalid_spec_launches_the_job(emulator, kube_api, run_kopf) -> None:
    bad = sample()
    bad["spec"]["trainer"]["entrypoint"] = "mypkg.train:loop"
    with run_kopf(OPERATOR):
        apply(emulator, bad)
        wait_phase(emulator, "Invalid")
        emulator.patch(TJ, NS, "mlp-ddp", {"spec": {"trainer": {"entrypoint": None}}})
        emulator.wait_for(lambda: emulator.get(RJ, NS, "mlp-ddp"))
        status = wait_phase(emulator, "Pending")
        assert condition(status, "Valid")["status"] == "True" and status["observedGeneration"] == 2


def test_edits_after_launch_apply_suspend_and_report_the_rest(emulator, kube_api, run_kopf) -> None:
    with run_kopf(OPERATOR):
        apply(emulator, sample())
        before = emulator.wait_for(lambda: emulator.get(RJ, NS, "mlp-ddp"))
        kuberay_sets(emulator, "mlp-ddp", jobDeploymentStatus="Running", jobStatus="RUNNING")
        wait_phase(emulator, "Running")

        emulator.patch(TJ, NS, "mlp-ddp", {"spec": {"trainer": {"epochs": 50}}})
        applied = emulator.wait_for(
            lambda: next(
                (
                    c
                    for c in emulator.get(TJ, NS, "mlp-ddp")["status"]["conditions"]
                    if c["type"] == "SpecApplied" and c["status"] == "False"
                ),
                None,
            )
        )
        assert applied["reason"] == "ImmutableAfterLaunch" and "spec.trainer.epochs" in applied["message"]
        assert applied["observedGeneration"] == 2
        assert emulator.get(RJ, NS, "mlp-ddp")["spec"] == before["spec"]  # not silently changed either
        emulator.wait_for(
            lambda: any(e["reason"] == "ImmutableAfterLaunch" for e in events_for(emulator, "mlp-ddp"))
        )

        emulator.patch(TJ, NS, "mlp-ddp", {"spec": {"suspend": True}})
        emulator.wait_for(lambda: emulator.get(RJ, NS, "mlp-ddp")["spec"]["suspend"] is True)
        kuberay_sets(emulator, "mlp-ddp", jobDeploymentStatus="Suspended", jobStatus="")
        status = wait_phase(emulator, "Suspended")
        assert condition(status, "Suspended")["status"] == "True"
        assert "spec.trainer.epochs" in condition(status, "SpecApplied")["message"]  # still reported

        emulator.patch(TJ, NS, "mlp-ddp", {"spec": {"suspend": False, "trainer": {"epochs": 5}}})
        emulator.wait_for(lambda: emulator.get(RJ, NS, "mlp-ddp")["spec"]["suspend"] is False)
        emulator.wait_for(
            lambda: condition(emulator.get(TJ, NS, "mlp-ddp")["status"], "SpecApplied")["status"] == "True"
        )


def test_restart_is_idempotent(emulator, kube_api, run_kopf) -> None:
    with run_kopf(OPERATOR):
        apply(emulator, sample())
        wait_phase(emulator, "Pending")
    first = copy.deepcopy(emulator.get(RJ, NS, "mlp-ddp"))
    with run_kopf(OPERATOR):
        kuberay_sets(emulator, "mlp-ddp", jobDeploymentStatus="Running", jobStatus="RUNNING")
        wait_phase(emulator, "Running")
    assert requests(emulator, "create", "rayjobs") == 1
    assert emulator.get(RJ, NS, "mlp-ddp")["spec"] == first["spec"]


def test_finished_job_is_never_restarted(emulator, kube_api, run_kopf) -> None:
    with run_kopf(OPERATOR):
        apply(emulator, sample())
        emulator.wait_for(lambda: emulator.get(RJ, NS, "mlp-ddp"))
        kuberay_sets(emulator, "mlp-ddp", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
        wait_phase(emulator, "Succeeded")
        emulator.delete(RJ, NS, "mlp-ddp")  # e.g. someone cleans up RayJobs
        emulator.wait_for(
            lambda: requests(emulator, "get", "rayjobs") >= 3 and emulator.get(RJ, NS, "mlp-ddp") is None
        )
    with run_kopf(OPERATOR):  # and a restart does not bring it back either
        emulator.wait_for(lambda: requests(emulator, "get", "rayjobs") >= 4)
    assert emulator.get(RJ, NS, "mlp-ddp") is None
    assert phase(emulator) == "Succeeded"
    assert requests(emulator, "create", "rayjobs") == 1
