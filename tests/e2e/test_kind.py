"""End to end on a real cluster (kind + KubeRay + rayship from the chart): `make kind-up && make e2e`.

Skipped where there is no Docker engine or kind (like the development machine): the same steps a
user takes, with the CPU-only samples.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLES

pytestmark = pytest.mark.e2e
CONTEXT = "kind-rayship"


def _cluster_problem() -> str | None:
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        return "no Docker engine is running"
    if (
        CONTEXT.removeprefix("kind-")
        not in subprocess.run(["kind", "get", "clusters"], capture_output=True, text=True).stdout
    ):
        return "no kind cluster `rayship`: run `make kind-up`"
    return None


PROBLEM = _cluster_problem()
if PROBLEM:
    pytest.skip(f"kind e2e needs Docker, kind and `make kind-up` ({PROBLEM})", allow_module_level=True)


def kubectl(*args: str) -> str:
    return subprocess.run(
        ["kubectl", "--context", CONTEXT, *args], capture_output=True, text=True, check=True, timeout=120
    ).stdout


def get(kind: str, name: str) -> dict[str, Any]:
    return json.loads(kubectl("get", kind, name, "-o", "json"))


def wait(kind: str, name: str, phase: str, timeout: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = get(kind, name).get("status") or {}
        if status.get("phase") == phase:
            return status
        assert status.get("phase") not in ("Failed", "Invalid"), status
        time.sleep(5)
    raise AssertionError(f"{kind}/{name} did not reach {phase}: {get(kind, name).get('status')}")


def test_train_serve_predict_and_clean_up(tmp_path: Path) -> None:
    kubectl("apply", "-f", str(SAMPLES / "kind-trainingjob-cpu.yaml"))
    status = wait("trainingjob", "mlp-cpu", "Succeeded")
    assert status["checkpoint"]["model"]
    kubectl("apply", "-f", str(SAMPLES / "kind-modelservice-cpu.yaml"))
    service = wait("modelservice", "mlp-cpu", "Ready")
    assert service["modelURI"] == status["checkpoint"]["model"]
    forward = subprocess.Popen(
        [
            "kubectl",
            "--context",
            CONTEXT,
            "port-forward",
            f"svc/{service['rayServiceName']}-serve-svc",
            "18000:8000",
        ]
    )
    try:
        time.sleep(3)
        request = urllib.request.Request(
            "http://127.0.0.1:18000/mlp/predict",
            data=json.dumps({"instances": [[0.0] * 8]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert len(json.loads(response.read())["predictions"]) == 1
    finally:
        forward.terminate()
    kubectl("delete", "modelservice", "mlp-cpu", "--wait=true")
    kubectl("delete", "trainingjob", "mlp-cpu", "--wait=true")
    time.sleep(10)
    assert "mlp-cpu" not in kubectl("get", "rayjobs,rayservices,rayclusters", "-o", "name")
