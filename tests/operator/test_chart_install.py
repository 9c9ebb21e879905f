"""The chart's objects applied with the real kubectl, then the operator started exactly as the chart's
Deployment configures it (args and env) reconciling a sample: what `helm install` + a pod would do."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import RESOURCES

from tests.conftest import ROOT, SAMPLES
from tests.emulator import Resource, running_emulator

pytestmark = pytest.mark.operator

KUBECTL = shutil.which("kubectl") or str(Path(sys.executable).parent / "kubectl")
INSTALL = [
    Resource("apps", "v1", "deployments", "Deployment"),
    Resource("", "v1", "services", "Service", status_subresource=False),
    Resource(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        namespaced=False,
        status_subresource=False,
    ),
    Resource(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
        status_subresource=False,
    ),
    Resource(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
    ),
]


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl is not installed: run `make setup`")
def test_install_manifest_applies_and_the_configured_operator_reconciles(tmp_path: Path) -> None:
    resources = list(RESOURCES.values()) + INSTALL
    with running_emulator(resources, namespaces=("default", "rayship-system")) as emulator:
        applied = kubectl(
            emulator.kubeconfig_path,
            "apply",
            "--validate=false",
            "-f",
            str(ROOT / "manifests" / "install.yaml"),
        )
        assert applied.returncode == 0, applied.stderr
        assert "deployment.apps/rayship created" in applied.stdout
        assert {c["metadata"]["name"] for c in emulator.list(INSTALL[4])} == {
            "trainingjobs.rayship.dev",
            "modelservices.rayship.dev",
        }

        (deployment,) = emulator.list(INSTALL[0], "rayship-system")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        health = f"http://127.0.0.1:{free_port()}/healthz"
        args = [health if a.startswith("http://0.0.0.0:") else a for a in container["args"]]
        env = {e["name"]: e["value"] for e in container["env"]}
        env.update(RAYSHIP_METRICS_PORT=str(free_port()))
        log = (tmp_path / "operator.log").open("w+")
        proc = subprocess.Popen(
            [sys.executable, "-m", "rayship.cli", "operator", *args],
            env={**os.environ, **env, "KUBECONFIG": str(emulator.kubeconfig_path), "HOME": str(tmp_path)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            sample = kubectl(
                emulator.kubeconfig_path,
                "apply",
                "--validate=false",
                "-f",
                str(SAMPLES / "trainingjob-ddp.yaml"),
            )
            assert sample.returncode == 0, sample.stderr
            rayjob = emulator.wait_for(
                lambda: emulator.get(RESOURCES["rayjobs"], "default", "mlp-ddp"), timeout=30
            )
            chart_values = yaml.safe_load((ROOT / "charts" / "rayship" / "values.yaml").read_text())
            head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
            assert (
                head["image"] == chart_values["defaults"]["workloadImage"]
            )  # the chart's default reached the operator
            with urllib.request.urlopen(
                f"http://127.0.0.1:{env['RAYSHIP_METRICS_PORT']}/metrics", timeout=5
            ) as response:
                assert 'rayship_reconciles_total{kind="TrainingJob"}' in response.read().decode()
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
            log.seek(0)
            output = log.read()
        assert code == 0, output
