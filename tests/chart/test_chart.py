"""The Helm chart: lint, template with several values files, strict validation of every object for
Kubernetes 1.30-1.35, CRDs and RBAC identical to what the code generates, values schema enforced."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import chart, generate, rbac
from rayship.api import names
from rayship.config import OperatorConfig, from_environment, variable
from tests.chart.render import CHART, VARIANTS, by_kind, helm, operator_env, skip_without_helm
from tests.chart.render import template as render
from tests.conftest import ROOT

pytestmark = pytest.mark.chart

skip_without_helm()


def template(variant: str, tmp_path: Path) -> list[dict[str, Any]]:
    return render(VARIANTS[variant], tmp_path)


@pytest.mark.parametrize("variant", VARIANTS)
def test_lint(variant: str, tmp_path: Path) -> None:
    proc = helm("lint", "--strict", values=VARIANTS[variant], tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("version", ["1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_core_object_is_strictly_valid(variant: str, version: str, tmp_path: Path) -> None:
    import kubernetes_validate

    for obj in template(variant, tmp_path):
        if obj["apiVersion"].startswith("monitoring.coreos.com"):
            continue  # a CRD of the Prometheus Operator, not a core type
        kubernetes_validate.validate(obj, version, strict=True)


def test_crds_are_the_generated_ones_and_kept(tmp_path: Path) -> None:
    objects = template("default", tmp_path)
    crds = {c["metadata"]["name"]: c for c in by_kind(objects, "CustomResourceDefinition")}
    for kind in generate.api.KINDS:
        templated = copy.deepcopy(crds[kind.crd_name])
        assert templated["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
        assert templated == generate.crd(kind)
    assert not by_kind(template("crds-off", tmp_path), "CustomResourceDefinition")
    assert all(
        "annotations" not in c["metadata"]
        for c in by_kind(template("crds-not-kept", tmp_path), "CustomResourceDefinition")
    )


def test_the_workload_admission_policy_is_the_generated_one_and_bound(tmp_path: Path) -> None:
    for variant in ("default", "namespaced"):
        objects = template(variant, tmp_path)
        (policy,) = by_kind(objects, "ValidatingAdmissionPolicy")
        (binding,) = by_kind(objects, "ValidatingAdmissionPolicyBinding")
        assert policy["metadata"]["name"] == names.WORKLOAD_POLICY
        assert policy["spec"] == rbac.workload_policy()
        assert binding["spec"]["policyName"] == names.WORKLOAD_POLICY
        assert binding["spec"]["validationActions"] == ["Deny"]
        # its params: rayship's workload accounts in the request's namespace (none: nothing to judge)
        assert binding["spec"]["paramRef"] == {
            "selector": {"matchLabels": rbac.WORKLOAD_ACCOUNT_LABELS},
            "parameterNotFoundAction": "Allow",
        }


def test_rbac_is_exactly_the_operators_rules_without_wildcards(tmp_path: Path) -> None:
    cluster_roles = {r["metadata"]["name"]: r for r in by_kind(template("default", tmp_path), "ClusterRole")}
    workload = cluster_roles.pop(names.WORKLOAD_ROLE)  # the Ray pods': bound per TrainingJob
    assert workload["rules"] == rbac.WORKLOAD_RULES
    (role,) = cluster_roles.values()
    assert role["rules"] == rbac.OPERATOR_RULES
    for r in (role, workload):
        assert all(
            "*" not in v for rule in r["rules"] for v in rule["apiGroups"] + rule["resources"] + rule["verbs"]
        )
    namespaced = template("namespaced", tmp_path)
    # The operator's rights become Roles in its namespaces; the workload ClusterRole stays (the per-job
    # RoleBindings bind it in those namespaces) and no ClusterRoleBinding is made.
    assert [r["metadata"]["name"] for r in by_kind(namespaced, "ClusterRole")] == [names.WORKLOAD_ROLE]
    assert not by_kind(namespaced, "ClusterRoleBinding")
    roles = by_kind(namespaced, "Role")
    key_role = next(r for r in roles if r["metadata"]["name"].endswith("-token-key"))
    roles.remove(key_role)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert all(r["rules"] == rbac.namespaced_operator_rules(names.WORKLOAD_ROLE) for r in roles)
    # Namespaces: its own Namespace object read, none listed or watched (no cluster-wide right at all)
    assert [rule["verbs"] for r in roles for rule in r["rules"] if "namespaces" in rule["resources"]] == [
        ["get"],
        ["get"],
    ]
    assert len(by_kind(namespaced, "RoleBinding")) == 3
    # Secrets: created anywhere the operator works, read nowhere but its own key, in its own namespace
    for r in roles + [role]:
        assert all("get" not in rule["verbs"] for rule in r["rules"] if "secrets" in rule["resources"])
    assert key_role["metadata"]["namespace"] == "rayship-system" and key_role["rules"] == rbac.KEY_RULES
    (reading,) = [rule for rule in key_role["rules"] if "get" in rule["verbs"]]
    assert reading["resourceNames"] == ["rayship-ray-token-key"]
    (deployment,) = by_kind(namespaced, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-4:] == ["--namespace", "team-a", "--namespace", "team-b"]


def test_deployment_is_hardened_and_probed(tmp_path: Path) -> None:
    (deployment,) = by_kind(template("default", tmp_path), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    # No runAsUser: the image's numeric USER (10001), or the UID OpenShift's restricted SCC assigns.
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080} in container["ports"]
    assert container["image"] == "rayship/rayship-operator:0.1.0"


def test_the_chart_configures_the_operator(tmp_path: Path, monkeypatch) -> None:
    env = operator_env(template("custom-images", tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = from_environment()
    assert config.default_image == "registry.example/rayship-workloads:0.1.0-gpu"
    assert config.gpu_node_selector == {"pool": "a100"} and config.metrics_port == 9090
    assert config.gpu_tolerations == chart.ChartValues().defaults.gpuTolerations
    known = {variable(name) for name in OperatorConfig.model_fields}
    assert set(env) <= known, set(env) - known  # no value the operator would ignore
    assert config.workload_role == names.WORKLOAD_ROLE  # the release rayship's
    off = template("metrics-off", tmp_path)
    assert operator_env(off)["RAYSHIP_METRICS_PORT"] == "0" and not by_kind(
        template("metrics-off", tmp_path), "Service"
    )


def test_service_monitor(tmp_path: Path) -> None:
    (monitor,) = by_kind(template("service-monitor", tmp_path), "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "interval": "30s"}]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"bogus": 1}, "bogus"),
        ({"metrics": {"port": "abc"}}, "port"),
        ({"crds": {"install": "yes"}}, "install"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"watchNamespaces": "team-a"}, "watchNamespaces"),
        ({"resources": {"limits": {"memory": "16GB"}}}, "memory"),
        ({"resources": {"limits": {"cpu": -1}}}, "cpu"),
        ({"extraEnv": {"HTTPS_PROXY": "http://proxy:3128"}}, "extraEnv"),
        ({"extraEnv": [{"value": "http://proxy:3128"}]}, "name"),
        ({"extraEnv": [{"name": "PORT", "value": 8080}]}, "value"),
        ({"podLabels": ["team=ml"]}, "podLabels"),
        ({"image": {"registry": 5000}}, "registry"),
    ],
)
def test_values_schema_rejects_unknown_and_mistyped_values(values, message, tmp_path: Path) -> None:
    proc = helm("template", "rayship", values=values, tmp_path=tmp_path)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_values_yaml_matches_the_model_and_every_value_is_commented() -> None:
    text = (CHART / "values.yaml").read_text()
    assert yaml.safe_load(text) == chart.ChartValues().model_dump()
    paths: set[str] = set()

    def walk(model: Any, prefix: str) -> None:
        for name, field in model.model_fields.items():
            paths.add(prefix + name)
            if isinstance(field.annotation, type) and issubclass(field.annotation, chart.Values):
                walk(field.annotation, f"{prefix}{name}.")

    walk(chart.ChartValues, "")
    lines = text.splitlines()
    stack: list[tuple[int, str]] = []
    seen = set()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        stack = [(n, k) for n, k in stack if n < indent]
        stack.append((indent, stripped.split(":", 1)[0]))
        path = ".".join(k for _, k in stack)
        if path in paths:
            seen.add(path)
            assert lines[i - 1].strip().startswith("#"), f"values.yaml:{i + 1}: no comment above {path}"
    assert seen == paths, f"values missing from values.yaml: {paths - seen}"
    assert json.loads((CHART / "values.schema.json").read_text()) == chart.values_schema()


def test_install_manifest_is_the_chart_with_default_values() -> None:
    expected = generate.helm_outputs(ROOT)
    for path, content in expected.items():
        assert path.read_text() == content, "manifests/install.yaml is stale: run `make generate`"
