"""The local control plane for real: real apiserver/controllers/scheduler, kwok nodes, real KubeRay."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from controlplane import cluster as controlplane

pytestmark = pytest.mark.controlplane


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f}s (last: {last!r})")


def get(url: str, cafile: Path, token: str | None = None) -> int:
    ctx = ssl.create_default_context(cafile=str(cafile))
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture(scope="module")
def core(api) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api)


@pytest.fixture(scope="module")
def custom(api) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api)


def service_account_token(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> str:
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    request = {"spec": {"expirationSeconds": 600}}
    return core.create_namespaced_service_account_token(name, namespace, request).status.token


def test_nodes_are_ready_with_gpu_products_and_taints(core):
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == {spec.name for spec in controlplane.NODES}
    products = set()
    for spec in controlplane.NODES:
        node = nodes[spec.name]
        ready = [c.status for c in node.status.conditions if c.type == "Ready"]
        assert ready == ["True"], spec.name
        assert node.spec.pod_cidr == spec.pod_cidr
        taints = [(t.key, t.effect) for t in node.spec.taints or []]
        if spec.gpus:
            products.add(node.metadata.labels["nvidia.com/gpu.product"])
            assert node.status.allocatable["nvidia.com/gpu"] == str(spec.gpus)
            assert taints == [("nvidia.com/gpu", "NoSchedule")]
        else:
            assert "nvidia.com/gpu" not in node.status.allocatable
            assert "nvidia.com/gpu.product" not in node.metadata.labels
            assert taints == []
    assert products == {"NVIDIA-L4", "NVIDIA-A100-SXM4-80GB"}


def test_pod_and_service_addresses_stay_on_this_machine(cluster):
    for address in ("10.244.1.77", "10.244.3.200", "10.96.0.10"):
        route = subprocess.run(
            ["ip", "route", "get", address], capture_output=True, text=True, check=True
        ).stdout
        assert f"dev {controlplane.VETH_HOST}" in route, route
    # Nothing listens in the pod network namespace: a connection is refused at once, not left hanging.
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("10.244.1.77", 8265), timeout=5):
        pass
    assert time.monotonic() - started < 2


def test_unauthenticated_request_is_refused(cluster):
    assert get(f"{cluster.server}/api/v1/namespaces", cluster.ca_file) == 401


def test_service_account_without_rbac_is_forbidden(cluster, core, namespace):
    token = service_account_token(core, namespace, "nobody")
    assert get(f"{cluster.server}/api/v1/namespaces/{namespace}/pods", cluster.ca_file, token) == 403
    kubeconfig = controlplane.service_account_kubeconfig(namespace, "nobody")
    kubectl = [
        str(controlplane.VENV_BIN / "kubectl"),
        "--kubeconfig",
        str(kubeconfig),
        "get",
        "pods",
        "-n",
        namespace,
    ]
    refused = subprocess.run(kubectl, capture_output=True, text=True)
    assert refused.returncode != 0
    assert f'User "system:serviceaccount:{namespace}:nobody" cannot list resource "pods"' in refused.stderr


def test_rayjob_gets_a_raycluster_whose_head_runs_on_the_cpu_node(cluster, core, custom, namespace):
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "tiny", "namespace": namespace},
        "spec": {
            "entrypoint": "python -c 'print(1)'",
            "submissionMode": "K8sJobMode",
            "rayClusterSpec": {
                "rayVersion": "2.60.0",
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "ray-head",
                                    "image": "rayproject/ray:2.60.0-py311",
                                    "resources": {
                                        "requests": {"cpu": "500m", "memory": "1Gi"},
                                        "limits": {"cpu": "500m", "memory": "1Gi"},
                                    },
                                }
                            ]
                        }
                    },
                },
            },
        },
    }
    custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", rayjob)

    def raycluster_name() -> str | None:
        job = custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", "tiny")
        return job.get("status", {}).get("rayClusterName")

    name = wait_for("KubeRay names the RayJob's RayCluster", raycluster_name)
    raycluster = wait_for(
        "the RayCluster exists",
        lambda: custom.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"],
    )[0]
    assert raycluster["metadata"]["name"] == name
    assert raycluster["metadata"]["ownerReferences"][0]["kind"] == "RayJob"

    def running_head():
        selector = f"ray.io/cluster={name},ray.io/node-type=head"
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    head = wait_for("the head pod is Running", running_head)
    assert head.spec.node_name == "kwok-cpu-0"  # the real scheduler: the GPU nodes are tainted
    assert head.status.pod_ip.startswith("10.244.1.")  # kwok, from the node's podCIDR
    # The RayCluster turns ready once its head pod is (kwok reports it Ready), so KubeRay goes on to
    # submit: in K8sJobMode it creates the submitter Job.
    wait_for(
        "KubeRay creates the submitter Job",
        lambda: kubernetes.client.BatchV1Api(core.api_client).list_namespaced_job(namespace).items,
    )
    # All of it as KubeRay's own ServiceAccount, within the ClusterRole of KubeRay's chart.
    kuberay_log = (cluster.state_dir / "logs" / "kuberay-operator.log").read_text()
    assert 'is forbidden: User "system:serviceaccount:kuberay-system:kuberay-operator"' not in kuberay_log


@pytest.mark.parametrize(
    ("product", "node"),
    [("NVIDIA-L4", "kwok-gpu-l4-0"), ("NVIDIA-A100-SXM4-80GB", "kwok-gpu-a100-0")],
)
def test_gpu_pod_lands_on_its_products_node(core, namespace, product, node):
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    pod = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": product},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
            ],
        },
    }
    core.create_namespaced_pod(namespace, pod)

    def running():
        found = core.read_namespaced_pod(name, namespace)
        return found if found.status.phase == "Running" else None

    assert wait_for("the GPU pod runs", running).spec.node_name == node


def test_gpu_pod_without_the_toleration_is_not_scheduled(core, namespace):
    pod = {
        "metadata": {"name": "gpu-untolerated"},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        },
    }
    core.create_namespaced_pod(namespace, pod)

    def unschedulable():
        conditions = core.read_namespaced_pod("gpu-untolerated", namespace).status.conditions or []
        return [c for c in conditions if c.type == "PodScheduled" and c.reason == "Unschedulable"]

    condition = wait_for("the scheduler reports the pod unschedulable", unschedulable)[0]
    assert "untolerated taint" in condition.message and "nvidia.com/gpu" in condition.message


def test_owner_reference_garbage_collection(core, namespace):
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "gc-owner"}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gc-owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(
        namespace,
        {"metadata": {"name": "gc-child", "ownerReferences": [{**reference, "blockOwnerDeletion": True}]}},
    )
    core.delete_namespaced_config_map("gc-owner", namespace)

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("gc-child", namespace)
        except ApiException as err:
            return err.status == 404
        return False

    wait_for("the garbage collector deletes the child", child_gone)


def test_block_owner_deletion_needs_finalizer_rights(cluster, core, namespace):
    """OwnerReferencesPermissionEnforcement: as for rayship's RayJobs owned by TrainingJobs."""
    token = service_account_token(core, namespace, "cm-writer")
    rbac = kubernetes.client.RbacAuthorizationV1Api(core.api_client)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "cm-writer"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "cm-writer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": "cm-writer", "namespace": namespace}],
        },
    )
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner2"}})
    config = kubernetes.client.Configuration()
    config.host = cluster.server
    config.ssl_ca_cert = str(cluster.ca_file)
    config.api_key = {"authorization": f"Bearer {token}"}
    as_writer = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner2", "uid": owner.metadata.uid}

    def create(name: str, block: bool):
        ref = {**reference, "blockOwnerDeletion": block}
        return as_writer.create_namespaced_config_map(
            namespace, {"metadata": {"name": name, "ownerReferences": [ref]}}
        )

    wait_for("the Role takes effect", lambda: _allowed(lambda: create("plain", False)), timeout=10)
    with pytest.raises(ApiException) as refused:
        create("blocking", True)
    assert refused.value.status == 403 and "blockOwnerDeletion" in refused.value.body


def _allowed(call: Callable[[], Any]) -> bool:
    try:
        call()
    except ApiException as err:
        if err.status == 403:
            return False
        raise
    return True


def test_pvc_of_the_default_class_is_provisioned_and_bound(cluster, core, namespace):
    claim = {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    created = core.create_namespaced_persistent_volume_claim(namespace, claim)
    assert created.spec.storage_class_name == controlplane.STORAGE_CLASS  # DefaultStorageClass admission

    def bound():
        pvc = core.read_namespaced_persistent_volume_claim("data", namespace)
        return pvc if pvc.status.phase == "Bound" else None

    pvc = wait_for("the claim is bound", bound)
    pv = core.read_persistent_volume(pvc.spec.volume_name)
    path = Path(pv.spec.host_path.path)
    assert path == cluster.state_dir / "volumes" / created.metadata.uid and path.is_dir()
    core.delete_namespaced_persistent_volume_claim("data", namespace)

    def pv_gone() -> bool:
        try:
            core.read_persistent_volume(pv.metadata.name)
        except ApiException as err:
            return err.status == 404
        return False

    wait_for("the released volume is deleted", pv_gone)
    assert not path.exists()


def test_up_again_on_the_running_cluster_is_harmless_and_fast(cluster):
    started = time.monotonic()
    again = controlplane.up(operator=None)
    assert time.monotonic() - started < 10
    assert not again.started and again.server == cluster.server and again.ports == cluster.ports


def test_up_names_no_cluster_as_its_own_when_one_runs(cluster, tmp_path):
    """`make test` starts the e2e tier's cluster beside the Ray tier and stops it at the end only if
    `up --started-file` wrote the file: a cluster that was running (someone's `make cluster-up`) stays."""
    mark = tmp_path / "started"
    assert controlplane.main(["up", "--no-node", "--no-operator", "--started-file", str(mark)]) == 0
    assert not mark.exists()


def test_kubectl_explain_knows_the_kuberay_crds(cluster):
    result = cluster.kubectl("explain", "rayclusters.spec")
    assert "headGroupSpec" in result.stdout


def test_rayship_operator_runs_as_the_charts_service_account(cluster):
    assert cluster.chart_error is None, cluster.chart_error  # the real API server accepts the chart
    handle = cluster.operator or controlplane.start_operator()
    try:
        assert handle.alive()
        with urllib.request.urlopen(handle.liveness_url, timeout=5) as response:
            assert response.status == 200
        # Its kubeconfig holds a token of the chart's ServiceAccount: the chart's RBAC authorises it.
        review = kubernetes.client.AuthenticationV1Api(
            kubernetes.config.new_client_from_config(config_file=str(handle.kubeconfig))
        ).create_self_subject_review({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert review.status.user_info.username == "system:serviceaccount:rayship-system:rayship"
        # Give kopf a moment to list and watch everything it serves; nothing may be refused.
        time.sleep(3)
        # Refused requests are checked around every operator-tier test (tests/operator/conftest.py).
    finally:
        if cluster.operator is None:
            controlplane.stop_operator(handle)
    assert json.loads(json.dumps(controlplane.status()))["apiserver_ready"]
