"""The chart's values a platform team sets: each lands where it should in the operator's Deployment
(the values file of the `platform` variant, which test_chart.py lints and strictly validates for
Kubernetes 1.30-1.35, and `--set` as typed on a command line); NOTES.txt says what a user needs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayship import api
from rayship.api import names
from tests.chart.render import (
    VARIANTS,
    by_kind,
    helm,
    operator_env,
    operator_pod,
    skip_without_helm,
    template,
)
from tests.conftest import SAMPLES

pytestmark = pytest.mark.chart

skip_without_helm()


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = operator_pod(objects)["spec"]["containers"]
    return found


@pytest.mark.parametrize(
    ("given", "rendered"), [("1", 1), ("500m", "500m"), ("0.5", "0.5"), ("2", 2), ("1.5Gi", "1.5Gi")]
)
def test_resource_quantities_are_numbers_or_strings(given: str, rendered: Any) -> None:
    """`--set resources.limits.cpu=1` is a number to helm: the schema took strings only."""
    objects = template(sets=(f"resources.limits.cpu={given}", f"resources.requests.memory={given}"))
    resources = container(objects)["resources"]
    assert resources["limits"] == {"cpu": rendered, "memory": "1Gi"}
    assert resources["requests"] == {"cpu": "100m", "memory": rendered}


def test_numbers_in_a_values_file_too(tmp_path: Path) -> None:
    resources = container(template(VARIANTS["platform"], tmp_path))["resources"]
    assert resources == {"requests": {"cpu": 0.5, "memory": "256Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}}


def test_every_platform_value_lands_on_the_operator_pod(tmp_path: Path) -> None:
    values = VARIANTS["platform"]
    objects = template(values, tmp_path)
    pod = operator_pod(objects)
    spec = pod["spec"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["annotations"] == {"example.com/owner": "ml-platform"}
    assert spec["priorityClassName"] == "platform-critical"
    assert spec["nodeSelector"] == values["nodeSelector"]
    assert spec["tolerations"] == values["tolerations"]
    assert spec["affinity"] == values["affinity"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    # helm merges the values file's securityContexts with the secure defaults
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000680000,
        "fsGroup": 1000680000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    operator = container(objects)
    assert operator["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }
    assert operator["image"] == "registry.example:5000/mirror/rayship-operator:0.1.0"
    # extraEnv after the chart's own variables, as given (valueFrom included)
    assert operator["env"][-3:] == values["extraEnv"]
    assert operator["env"][-4]["name"].startswith("RAYSHIP_")


@pytest.mark.parametrize(
    ("sets", "where", "expected"),
    [
        (("podLabels.team=ml",), ("metadata", "labels", "team"), "ml"),
        (("podAnnotations.owner=ml",), ("metadata", "annotations", "owner"), "ml"),
        (("priorityClassName=high",), ("spec", "priorityClassName"), "high"),
        (("nodeSelector.pool=infra",), ("spec", "nodeSelector"), {"pool": "infra"}),
        (
            ("tolerations[0].key=infra", "tolerations[0].operator=Exists"),
            ("spec", "tolerations"),
            [{"key": "infra", "operator": "Exists"}],
        ),
        (
            ("affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey=zone",),
            ("spec", "affinity"),
            {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]
                }
            },
        ),
        (("imagePullSecrets[0].name=regcred",), ("spec", "imagePullSecrets"), [{"name": "regcred"}]),
        (("podSecurityContext.fsGroup=2000",), ("spec", "securityContext", "fsGroup"), 2000),
    ],
)
def test_each_value_set_on_the_command_line_renders(
    sets: tuple[str, ...], where: tuple[str, ...], expected: Any
) -> None:
    found: Any = operator_pod(template(sets=sets))
    for key in where:
        found = found.get(key) if isinstance(found, dict) else None
    assert found == expected


def test_extra_env_is_appended_to_the_operator_container() -> None:
    env = container(template(sets=("extraEnv[0].name=HTTPS_PROXY", "extraEnv[0].value=http://p:3128")))["env"]
    assert env[-1] == {"name": "HTTPS_PROXY", "value": "http://p:3128"}
    assert len([e for e in env if e["name"].startswith("RAYSHIP_")]) == len(env) - 1


@pytest.mark.parametrize("registry", ["reg.example/", "reg.example", "reg.example:5000/team"])
def test_image_registry_prefixes_the_repository(registry: str) -> None:
    image = container(template(sets=(f"image.registry={registry}",)))["image"]
    assert image == f"{registry.rstrip('/')}/rayship/rayship-operator:0.1.0"
    assert container(template())["image"] == "rayship/rayship-operator:0.1.0"  # none by default


def test_pod_labels_never_replace_the_selectors() -> None:
    objects = template(sets=("podLabels.team=ml", "podLabels.app\\.kubernetes\\.io/instance=other"))
    (deployment,) = by_kind(objects, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = operator_pod(objects)["metadata"]["labels"]
    assert labels == {**selector, "team": "ml"} and selector["app.kubernetes.io/instance"] == "rayship"


def test_security_context_defaults_and_what_removes_or_adds_to_them(tmp_path: Path) -> None:
    pod = operator_pod(template())["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert "runAsUser" not in pod["securityContext"]  # OpenShift's restricted SCC assigns its own
    assert container(template())["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    added = operator_pod(template(sets=("podSecurityContext.runAsUser=10001",)))["spec"]["securityContext"]
    assert added["runAsUser"] == 10001 and added["runAsNonRoot"] is True
    # A value set in one values file removed with null (helm's rule), and a null where the defaults
    # have no such key rendered as no key, not as `runAsUser: null`.
    for values, sets in (
        ({"podSecurityContext": {"runAsUser": 10001}}, ("podSecurityContext.runAsUser=null",)),
        (None, ("podSecurityContext.runAsUser=null",)),
    ):
        context = operator_pod(template(values, tmp_path, sets=sets))["spec"]["securityContext"]
        assert context == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    removed = operator_pod(
        template(
            sets=("podSecurityContext.seccompProfile=null", "securityContext.readOnlyRootFilesystem=null")
        )
    )
    assert removed["spec"]["securityContext"] == {"runAsNonRoot": True}
    assert "readOnlyRootFilesystem" not in removed["spec"]["containers"][0]["securityContext"]


def test_name_and_fullname_overrides_rename_every_object() -> None:
    for sets, full, name in (
        (("fullnameOverride=ml-ops",), "ml-ops", "rayship"),
        (("nameOverride=mlops",), "rayship-mlops", "mlops"),
        ((), "rayship", "rayship"),
    ):
        objects = template(sets=sets)
        for obj in objects:
            if obj["kind"] == "CustomResourceDefinition":
                continue  # the cluster's, named by their group
            assert obj["metadata"]["name"].startswith(full), (sets, obj["kind"], obj["metadata"]["name"])
            assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == name
        (role,) = [r for r in by_kind(objects, "ClusterRole") if r["rules"] == [
            {"apiGroups": [api.GROUP], "resources": ["trainingjobs/status"], "verbs": ["patch"]}
        ]]  # fmt: skip
        assert role["metadata"]["name"] == names.workload_role(full)
        (policy,) = by_kind(objects, "ValidatingAdmissionPolicy")
        assert policy["metadata"]["name"] == names.workload_policy(full)
        assert operator_env(objects)["RAYSHIP_WORKLOAD_ROLE"] == names.workload_role(full)
        (deployment,) = by_kind(objects, "Deployment")
        assert deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == name


def notes(*sets: str) -> str:
    proc = helm("install", "rayship", "--namespace", "rayship-system", "--dry-run=client", sets=sets)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\nNOTES:\n", 1)[1]


def test_notes_name_the_real_columns_and_the_checkpoint_claim() -> None:
    text = notes()
    for kind in (api.TRAINING_JOB, api.MODEL_SERVICE):
        (line,) = [line for line in text.splitlines() if f"kubectl get {kind.plural} " in line]
        shown = line.split("#", 1)[1].strip()
        # kubectl's headers: the CRD's printer columns but those for -o wide, in capitals
        assert shown == " / ".join(c.name.upper() for c in kind.columns if not c.priority), line
    claims = {
        doc["spec"]["checkpoint"]["storage"]["pvc"]["claimName"]
        for path in SAMPLES.glob("trainingjob-*.yaml")
        if (doc := yaml.safe_load(path.read_text()))["spec"].get("checkpoint")
    }
    assert claims == {"rayship-checkpoints"}
    assert "PersistentVolumeClaim rayship-checkpoints" in text
    shipped = SAMPLES / "checkpoints-pvc.yaml"  # the claim the samples name, shipped beside them
    assert f"kubectl apply -f manifests/samples/{shipped.name}" in text
    assert yaml.safe_load(shipped.read_text())["metadata"]["name"] == "rayship-checkpoints"
    assert re.search(r"ReadWriteMany +when a job's pods span nodes", text), text
    assert re.search(r"ReadWriteOnce +only when all of a job's pods share one node", text), text


def test_notes_say_how_a_second_release_goes_beside_this_one() -> None:
    text = " ".join(notes("fullnameOverride=team-a").split())
    assert (
        "ClusterRole team-a-workload" in text and "ValidatingAdmissionPolicy team-a-workload-writes" in text
    )
    assert "crds.install=false" in text and "this one watches all namespaces" in text
    text = " ".join(notes("watchNamespaces={a}", "crds.install=false").split())
    assert "crds.install=false (as here)" in text and "watches all namespaces" not in text
