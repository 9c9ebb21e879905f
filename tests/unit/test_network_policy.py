"""The NetworkPolicy of each Ray cluster (rayship.controller.network_policy; issue 33 item 3): what it
selects, what it lets in, and how a ModelService's spec.serveFrom reaches it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rayship.api.validation import SpecError, parse
from rayship.config import OperatorConfig
from rayship.controller import modelservice, trainingjob
from tests.conftest import SAMPLES
from tests.unit.test_modelservice import CONFIG, adopted, load, plan, tj
from tests.unit.test_trainingjob_render import rendered_all

KUBERAY = {"app.kubernetes.io/name": "kuberay-operator"}


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def pod_templates(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]


def selects(policy: dict[str, Any], template: dict[str, Any]) -> bool:
    wanted = policy["spec"]["podSelector"]["matchLabels"]
    labels = template["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in wanted.items())


def test_a_trainingjobs_ray_pods_take_connections_from_one_another_and_the_dashboard_from_kuberay() -> None:
    objects = rendered_all(SAMPLES / "trainingjob-ddp.yaml")
    (policy,) = by_kind(objects, "NetworkPolicy")
    (rayjob,) = by_kind(objects, "RayJob")
    # created before the RayJob, so no Ray pod is ever open
    assert [o["kind"] for o in objects].index("NetworkPolicy") < [o["kind"] for o in objects].index("RayJob")
    templates = pod_templates(rayjob["spec"]["rayClusterSpec"])
    assert templates and all(selects(policy, t) for t in templates)
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: data, checkpoints, pip
    own, dashboard = policy["spec"]["ingress"]
    assert own == {"from": [{"podSelector": policy["spec"]["podSelector"]}]}  # every port, among the pods
    assert dashboard == {
        "from": [{"podSelector": {"matchLabels": KUBERAY}, "namespaceSelector": {}}],
        "ports": [{"protocol": "TCP", "port": 8265}],
    }


def test_another_jobs_pods_are_not_selected_as_peers() -> None:
    ours = by_kind(rendered_all(SAMPLES / "trainingjob-ddp.yaml"), "NetworkPolicy")[0]
    doc = load(SAMPLES / "trainingjob-ddp.yaml")
    doc["metadata"]["name"] = "other-job"
    other = trainingjob.render_trainingjob(parse(doc), OperatorConfig())
    (other_rayjob,) = by_kind(other, "RayJob")
    assert not any(selects(ours, t) for t in pod_templates(other_rayjob["spec"]["rayClusterSpec"]))


def test_the_charts_settings_reach_the_policy_and_off_renders_none() -> None:
    config = OperatorConfig(
        network_policy_api_server_cidrs=["10.0.0.0/24"],
        network_policy_kuberay_pods={"app": "kuberay"},
        network_policy_kuberay_namespace="ray-system",
        network_policy_extra_ingress=[{"ports": [{"port": 8080}], "from": [{"namespaceSelector": {}}]}],
    )
    objects = trainingjob.render_trainingjob(parse(load(SAMPLES / "trainingjob-ddp.yaml")), config)
    (policy,) = by_kind(objects, "NetworkPolicy")
    _, dashboard, extra = policy["spec"]["ingress"]
    assert dashboard["from"] == [
        {
            "podSelector": {"matchLabels": {"app": "kuberay"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}},
        },
        {"ipBlock": {"cidr": "10.0.0.0/24"}},
    ]
    assert extra == {"ports": [{"port": 8080}], "from": [{"namespaceSelector": {}}]}
    off = trainingjob.render_trainingjob(
        parse(load(SAMPLES / "trainingjob-ddp.yaml")), OperatorConfig(network_policy=False)
    )
    assert not by_kind(off, "NetworkPolicy")


def service(**spec: Any) -> dict[str, Any]:
    doc = load()
    doc["spec"].update(spec)
    return doc


def serve_rule(policy: dict[str, Any]) -> dict[str, Any]:
    (rule,) = [r for r in policy["spec"]["ingress"] if r.get("ports") == [{"protocol": "TCP", "port": 8000}]]
    return rule


def test_a_modelservices_serve_port_is_open_to_anyone_or_to_what_serve_from_names() -> None:
    (policy,) = modelservice.network_policy(parse(service()), CONFIG)
    assert "from" not in serve_rule(policy)
    peers = [
        {"podSelector": {"matchLabels": {"app": "gateway"}}},
        {
            "namespaceSelector": {"matchLabels": {"team": "a"}},
            "podSelector": {"matchLabels": {"role": "client"}},
        },
        {"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]}},
    ]
    (policy,) = modelservice.network_policy(parse(service(serveFrom=peers)), CONFIG)
    assert serve_rule(policy)["from"] == peers
    rayservice = modelservice.desired_rayservice(parse(service(serveFrom=peers)), CONFIG, "s3://m/v1")
    assert all(selects(policy, t) for t in pod_templates(rayservice["spec"]["rayClusterConfig"]))


@pytest.mark.parametrize(
    ("peer", "message"),
    [
        ({}, "set podSelector, namespaceSelector or ipBlock"),
        ({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}, "ipBlock goes alone"),
        ({"ipBlock": {"cidr": "everyone"}}, "spec.serveFrom[0].ipBlock.cidr"),
        ({"podSelector": {"matchLabels": {"bad key!": "x"}}}, "matchLabels keys must be label keys"),
    ],
)
def test_a_bad_serve_from_is_refused_naming_the_field(peer: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse(service(serveFrom=[peer]))
    assert message in str(err.value) and "serveFrom" in str(err.value)


def test_an_edit_of_serve_from_brings_the_policy_to_it_without_a_new_cluster() -> None:
    job = tj("Succeeded", model="s3://m/v1")
    first = plan(load(), None, job, CONFIG)
    assert first.create is not None
    stored = adopted(first.create)
    assert plan(load(), stored, job, CONFIG).patch is None  # nothing changed: nothing to do

    edited = service(serveFrom=[{"podSelector": {"matchLabels": {"app": "gateway"}}}])
    todo = plan(edited, stored, job, CONFIG)
    assert todo.patch is not None and todo.patch["spec"] == {}  # no new cluster, no rollout
    (policy,) = todo.prerequisites  # made or brought to the spec by k8s.ensure, then recorded
    assert serve_rule(policy)["from"] == [{"podSelector": {"matchLabels": {"app": "gateway"}}}]
    assert todo.on_patch is not None and todo.on_patch.reason == "NetworkPolicyUpdated"
    recorded = copy.deepcopy(stored)
    recorded["metadata"]["annotations"].update(todo.patch["metadata"]["annotations"])
    assert plan(edited, recorded, job, CONFIG).patch is None

    # A RayService made before policies existed gets one at its next reconcile.
    older = copy.deepcopy(stored)
    del older["metadata"]["annotations"]["rayship.dev/network-policy"]
    assert plan(load(), older, job, CONFIG).prerequisites[0]["kind"] == "NetworkPolicy"
    # Turned off by the chart: nothing made, nothing patched.
    assert plan(load(), older, job, CONFIG.model_copy(update={"network_policy": False})).patch is None


def test_a_trainingjob_and_the_modelservice_of_the_same_name_get_a_policy_each() -> None:
    """The samples' pair is `mlp-cpu` and `mlp-cpu`: one name for both policies made the service's
    refused as someone else's (found by the e2e tier)."""
    doc = load(SAMPLES / "trainingjob-ddp.yaml")
    doc["metadata"]["name"] = "mlp"
    (job_policy,) = by_kind(trainingjob.render_trainingjob(parse(doc), CONFIG), "NetworkPolicy")
    (service_policy,) = modelservice.network_policy(parse(service()), CONFIG)
    assert load()["metadata"]["name"] == "mlp"
    assert job_policy["metadata"]["name"] == "mlp-trainingjob-ray-pods"
    assert service_policy["metadata"]["name"] == "mlp-modelservice-ray-pods"
