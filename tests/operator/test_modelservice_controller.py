"""The ModelService controller, for real (kopf) against the emulator. The test plays KubeRay and the
training workload: it writes the RayJob/RayService status and the TrainingJob's exported model."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from conftest import RESOURCES

from tests.conftest import SAMPLES
from tests.emulator import EVENTS

pytestmark = pytest.mark.operator

TJ, RJ = RESOURCES["trainingjobs"], RESOURCES["rayjobs"]
MS, RS = RESOURCES["modelservices"], RESOURCES["rayservices"]
NS = "default"


def sample(name: str) -> dict[str, Any]:
    return yaml.safe_load((SAMPLES / name).read_text())


def status(emulator, res, name) -> dict[str, Any]:
    return (emulator.get(res, NS, name) or {}).get("status") or {}


def condition(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


def kuberay_ready(emulator, ready: bool = True) -> None:
    rayservice = emulator.get(RS, NS, "mlp")
    emulator.patch(
        RS,
        NS,
        "mlp",
        {
            "status": {
                "observedGeneration": rayservice["metadata"]["generation"],
                "numServeEndpoints": 2,
                "conditions": [
                    {"type": "Ready", "status": "True" if ready else "False", "reason": "RunningAndHealthy"}
                ],
                "activeServiceStatus": {"applicationStatuses": {"mlp": {"status": "RUNNING"}}},
            }
        },
        subresource="status",
    )


def test_waits_for_training_serves_rolls_out_in_place_and_is_collected(emulator, run_kopf) -> None:
    with run_kopf("rayship.handlers"):
        emulator.create(MS, sample("modelservice-from-trainingjob.yaml"))
        emulator.wait_for(lambda: status(emulator, MS, "mlp").get("phase") == "WaitingForModel")
        assert (
            "TrainingJob mlp-ddp does not exist"
            in condition(status(emulator, MS, "mlp"), "ModelAvailable")["message"]
        )
        assert emulator.get(RS, NS, "mlp") is None

        emulator.create(TJ, sample("trainingjob-ddp.yaml"))
        emulator.wait_for(lambda: emulator.get(RJ, NS, "mlp-ddp"))
        emulator.wait_for(
            lambda: (
                "it is Pending" in condition(status(emulator, MS, "mlp"), "ModelAvailable").get("message", "")
            )
        )
        assert emulator.get(RS, NS, "mlp") is None

        # The workload exports the model; KubeRay reports the job done.
        emulator.patch(
            TJ, NS, "mlp-ddp", {"status": {"checkpoint": {"model": "s3://models/v1"}}}, subresource="status"
        )
        emulator.patch(
            RJ,
            NS,
            "mlp-ddp",
            {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}},
            subresource="status",
        )
        rayservice = emulator.wait_for(lambda: emulator.get(RS, NS, "mlp"))
        assert "modelUri: s3://models/v1" in rayservice["spec"]["serveConfigV2"]
        owner = rayservice["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ModelService" and owner["name"] == "mlp"
        assert status(emulator, MS, "mlp")["phase"] == "Deploying"

        kuberay_ready(emulator)
        emulator.wait_for(lambda: status(emulator, MS, "mlp").get("phase") == "Ready")
        st = status(emulator, MS, "mlp")
        assert st["url"] == "http://mlp-serve-svc.default.svc:8000/mlp" and st["serveEndpoints"] == 2
        assert st["modelURI"] == "s3://models/v1"

        # Re-trained: a new model -> only serveConfigV2 changes (an in-place Serve rollout).
        cluster_before = emulator.get(RS, NS, "mlp")["spec"]["rayClusterConfig"]
        emulator.patch(
            TJ, NS, "mlp-ddp", {"status": {"checkpoint": {"model": "s3://models/v2"}}}, subresource="status"
        )
        emulator.wait_for(lambda: "s3://models/v2" in emulator.get(RS, NS, "mlp")["spec"]["serveConfigV2"])
        assert emulator.get(RS, NS, "mlp")["spec"]["rayClusterConfig"] == cluster_before
        rolling = emulator.wait_for(
            lambda: status(emulator, MS, "mlp").get("targetModelURI") and status(emulator, MS, "mlp")
        )
        assert rolling["modelURI"] == "s3://models/v1" and rolling["targetModelURI"] == "s3://models/v2"
        kuberay_ready(emulator)  # KubeRay reconciled the new serveConfigV2
        emulator.wait_for(lambda: status(emulator, MS, "mlp").get("modelURI") == "s3://models/v2")
        assert status(emulator, MS, "mlp").get("targetModelURI") is None

        # Deleting the TrainingJob does not take the service down.
        emulator.delete(TJ, NS, "mlp-ddp")
        emulator.wait_for(
            lambda: (
                condition(status(emulator, MS, "mlp"), "ModelAvailable").get("reason") == "TrainingJobDeleted"
            )
        )
        assert emulator.get(RS, NS, "mlp") is not None and status(emulator, MS, "mlp")["phase"] == "Ready"

        def reasons() -> set[str]:
            return {e["reason"] for e in emulator.list(EVENTS, NS) if e["involvedObject"]["name"] == "mlp"}

        emulator.wait_for(lambda: {"RayServiceCreated", "RayServiceUpdated", "Ready"} <= reasons())

        emulator.delete(MS, NS, "mlp")
        emulator.wait_for(lambda: emulator.get(RS, NS, "mlp") is None)


def test_invalid_modelservice(emulator, run_kopf) -> None:
    bad = sample("modelservice-from-trainingjob.yaml")
    bad["spec"]["model"]["uri"] = "s3://also"
    with run_kopf("rayship.handlers"):
        emulator.create(MS, bad)
        emulator.wait_for(lambda: status(emulator, MS, "mlp").get("phase") == "Invalid")
        assert "spec.model" in condition(status(emulator, MS, "mlp"), "Valid")["message"]
    assert emulator.get(RS, NS, "mlp") is None
