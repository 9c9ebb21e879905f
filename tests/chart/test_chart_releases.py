"""Two releases of the chart side by side (one per team, each in its own namespace, watching its own
namespaces): nothing of one is named like anything of the other (kubectl, and helm's ownership
check, would refuse the second), each operator binds its own release's ClusterRole, and their
admission policies agree. The real install: tests/controlplane/test_two_releases.py."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import rbac
from rayship.api import names
from rayship.api.validation import parse_trainingjob
from rayship.config import from_environment
from rayship.controller import trainingjob
from tests.chart.render import VARIANTS, by_kind, operator_env, skip_without_helm, template
from tests.conftest import SAMPLES

pytestmark = pytest.mark.chart

skip_without_helm()

# Every kind the chart renders, by scope (a new kind must be placed here to be checked).
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
NAMESPACED = {"Deployment", "Role", "RoleBinding", "Service", "ServiceAccount", "ServiceMonitor"}

# (release, its namespace, its values); the first installs the CRDs, the second does not.
WATCHING = {
    "their-namespaces": (
        ("rayship", "rayship-system", {"watchNamespaces": ["team-a"]}),
        ("rayship-b", "team-b-system", {"watchNamespaces": ["team-b"], "crds": {"install": False}}),
    ),
    "all-namespaces": (  # not a setup to run (both would reconcile everything), but installable
        ("rayship", "rayship-system", {}),
        ("rayship-b", "team-b-system", {"crds": {"install": False}}),
    ),
    "overridden-names": (
        ("ml", "ml-system", {"fullnameOverride": "ml-operator", "watchNamespaces": ["ml"]}),
        ("ml", "ml-b-system", {"nameOverride": "ops", "crds": {"install": False}, "watchNamespaces": ["b"]}),
    ),
}

MONITORED = {"metrics": {"serviceMonitor": {"enabled": True}}}  # every kind the chart can render


def releases(setup: str, tmp_path: Path) -> list[list[dict[str, Any]]]:
    rendered = []
    for release, namespace, values in WATCHING[setup]:
        folder = tmp_path / f"{release}-{namespace}"
        folder.mkdir()
        rendered.append(template({**values, **MONITORED}, folder, release=release, namespace=namespace))
    return rendered


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    kind = obj["kind"]
    assert kind in CLUSTER_SCOPED | NAMESPACED, f"{kind}: cluster-scoped or namespaced? (add it above)"
    if kind in CLUSTER_SCOPED:
        assert "namespace" not in obj["metadata"], obj["metadata"]
        return kind, "", obj["metadata"]["name"]
    return kind, obj["metadata"]["namespace"], obj["metadata"]["name"]


@pytest.mark.parametrize("setup", WATCHING)
def test_two_releases_name_nothing_alike(setup: str, tmp_path: Path) -> None:
    first, second = releases(setup, tmp_path)
    counted = collections.Counter(key(obj) for obj in first + second)
    twice = sorted(k for k, n in counted.items() if n > 1)
    assert not twice, f"made by both releases (the second install would be refused): {twice}"
    for objects in (first, second):  # every cluster-wide object (but the CRDs) carries its release's name
        (deployment,) = by_kind(objects, "Deployment")
        full = deployment["metadata"]["name"]
        for kind, _, name in map(key, objects):
            if kind in CLUSTER_SCOPED and kind != "CustomResourceDefinition":
                assert name == full or name.startswith(f"{full}-"), (kind, name, full)


def test_the_crds_are_the_only_objects_two_releases_cannot_both_install(tmp_path: Path) -> None:
    """They are the cluster's: the second release sets crds.install=false (values.yaml, NOTES.txt)."""
    both = [
        template({"watchNamespaces": [ns]}, tmp_path, release=release, namespace=f"{release}-system")
        for release, ns in (("rayship", "team-a"), ("rayship-b", "team-b"))
    ]
    counted = collections.Counter(key(obj) for objects in both for obj in objects)
    assert {k[0] for k, n in counted.items() if n > 1} == {"CustomResourceDefinition"}


@pytest.mark.parametrize("setup", WATCHING)
def test_each_operator_binds_its_own_releases_workload_role(setup: str, tmp_path: Path, monkeypatch) -> None:
    """The chart's ClusterRole name reaches the operator (RAYSHIP_WORKLOAD_ROLE) and from it every
    TrainingJob's RoleBinding; the operator may bind that ClusterRole and no other."""
    doc = yaml.safe_load((SAMPLES / "trainingjob-ddp.yaml").read_text())
    bound = set()
    for objects in releases(setup, tmp_path):
        (role,) = [r for r in by_kind(objects, "ClusterRole") if r["rules"] == rbac.WORKLOAD_RULES]
        (deployment,) = by_kind(objects, "Deployment")
        full = deployment["metadata"]["name"]
        assert role["metadata"]["name"] == names.workload_role(full)
        env = operator_env(objects)
        assert env["RAYSHIP_WORKLOAD_ROLE"] == role["metadata"]["name"]
        rules = [
            rule for r in by_kind(objects, "ClusterRole") + by_kind(objects, "Role") for rule in r["rules"]
        ]
        binds = [rule for rule in rules if "bind" in rule["verbs"]]
        assert binds and all(rule["resourceNames"] == [role["metadata"]["name"]] for rule in binds)
        with monkeypatch.context() as patched:
            for name, value in env.items():
                patched.setenv(name, value)
            config = from_environment()
        (binding,) = [
            o
            for o in trainingjob.render_trainingjob(parse_trainingjob(doc), config)
            if o["kind"] == "RoleBinding"
        ]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        bound.add(role["metadata"]["name"])
    assert len(bound) == 2


@pytest.mark.parametrize("setup", WATCHING)
def test_the_releases_admission_policies_agree(setup: str, tmp_path: Path) -> None:
    """Each release's policy is bound to itself, and all are the same: each matches every
    namespace's workload accounts (no namespaceSelector; its params, the same for all, are the
    ServiceAccounts of the request's namespace that carry rayship's workload labels, whichever release
    made them), so what one admits, the other admits (neither refuses the other's Ray pods their own
    job's status), and what one refuses, both do."""
    specs = []
    for objects in releases(setup, tmp_path):
        (policy,) = by_kind(objects, "ValidatingAdmissionPolicy")
        (binding,) = by_kind(objects, "ValidatingAdmissionPolicyBinding")
        assert binding["spec"] == {
            "policyName": policy["metadata"]["name"],
            "validationActions": ["Deny"],
            "paramRef": {
                "selector": {"matchLabels": rbac.WORKLOAD_ACCOUNT_LABELS},
                "parameterNotFoundAction": "Allow",
            },
        }
        assert binding["metadata"]["name"] == policy["metadata"]["name"]
        spec = policy["spec"]
        assert spec["paramKind"] == {"apiVersion": "v1", "kind": "ServiceAccount"}
        assert "namespaceSelector" not in spec["matchConstraints"] and "matchResources" not in binding["spec"]
        specs.append(spec)
    assert specs[0] == specs[1] == rbac.workload_policy()


def test_the_second_release_variant_is_one(tmp_path: Path) -> None:
    """VARIANTS['second-release'] (linted and strictly validated by test_chart.py) beside the default."""
    first = template(VARIANTS["default"], tmp_path)
    second = template(VARIANTS["second-release"], tmp_path, release="rayship", namespace="team-b-system")
    counted = collections.Counter(key(obj) for obj in first + second)
    assert not [k for k, n in counted.items() if n > 1]
