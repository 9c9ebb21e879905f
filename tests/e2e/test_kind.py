"""End to end on kind (`make kind-up`, then `make e2e-kind`; in `make test`): a kind cluster whose
node image was built here (controlplane/kindnode.py), KubeRay as a Deployment of its own manifests,
rayship from its chart, the product images in the node's containerd (controlplane/kindcluster.py).

kubectl apply -> the rayship operator (the chart's pod) -> RayJob -> KubeRay -> a Ray head and two
worker pods -> DDP across them, the checkpoint on a PersistentVolume -> Succeeded; a ModelService
`fromTrainingJob` serving it through its Service; `rayship status` on both; deleting them leaves no
Ray pod. The node is a privileged container: the host's kernel settings it could rewrite are
checked to be untouched.

A running kind cluster is reused and left running; otherwise one is brought up for the module and
taken down after it (always under CI=true; elsewhere with RAYSHIP_KIND=1, or the module is skipped
with the command to run). Sizes fit a 2-CPU node whose control plane requests ~0.85 CPU: a quarter
CPU each for the head and the two workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml

from controlplane import kindcluster, kindnode
from controlplane.config import VENV_BIN
from rayship import api
from rayship.api import names
from tests.conftest import SAMPLES
from tests.operator.kube import Kube, sample, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
TJ, MS, RJ = api.TRAININGJOBS, api.MODELSERVICES, api.RAYJOBS
NAMESPACE = "kind-e2e"
NAME = "mlp-cpu"  # the samples' name
SMALL_TRAINING = {
    "head": {"cpus": 0.25, "memory": "3Gi"},
    "workers": {"replicas": 2, "gpusPerWorker": 0, "cpusPerWorker": 0.25, "memoryPerWorker": "2Gi"},
    "ttlSecondsAfterFinished": 5,  # the finished job's Ray cluster frees the node for the service
}
SMALL_SERVICE = {
    "head": {"cpus": 0.25, "memory": "3Gi"},
    "autoscaler": {"cpus": 0.1, "memory": "512Mi"},  # KubeRay's default 500m does not fit beside the rest
    "resources": {"gpus": 0, "cpus": 0.25, "memory": "2Gi"},
}


@pytest.fixture(scope="module")
def kind() -> Iterator[dict[str, str]]:
    """The kind cluster (reused, or brought up and down here); yields the host's kernel settings as
    `kind-up` recorded them before the cluster started."""
    started = False
    if not kindcluster.is_up():
        if os.environ.get("CI") != "true" and os.environ.get("RAYSHIP_KIND") != "1":
            pytest.skip(
                "kind e2e: no kind cluster is up: run `make kind-up` (or RAYSHIP_KIND=1 to start one)"
            )
        started = True
        try:
            kindcluster.up()
        except BaseException:
            kindcluster.down()  # a cluster half up is not left running on the host
            raise
    yield kindcluster.load_state()["host_settings"]
    if started:
        left = kindcluster.down()  # processes, mounts, cgroups, netns, veth, changed host settings
        assert not left, f"`kind-down` left on the host: {left}"


@pytest.fixture(scope="module")
def kube(kind) -> Iterator[Kube]:
    client = kubernetes.config.new_client_from_config(config_file=str(kindcluster.KUBECONFIG))
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    kube = Kube(client, NAMESPACE)
    kindcluster.make_claim_volume(NAMESPACE, "rayship-checkpoints")
    kube.pvc("rayship-checkpoints")
    yield kube
    core.delete_namespace(NAMESPACE)
    wait_for(lambda: NAMESPACE not in [n.metadata.name for n in core.list_namespace().items], 180,
             what=f"namespace {NAMESPACE} gone")  # fmt: skip
    kubectl("delete", "pv", kindcluster.claim_volume(NAMESPACE, "rayship-checkpoints")["metadata"]["name"])
    kindcluster.node_exec("rm", "-rf", kindcluster.volume_path(NAMESPACE, "rayship-checkpoints"))


def kubectl(*args: str, input: str | None = None) -> str:
    return kindcluster.kubectl(*args, input=input)


def rayship(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "rayship"), *argv, "-n", NAMESPACE, "--kubeconfig", str(kindcluster.KUBECONFIG)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def phase(kube: Kube, resource: api.Resource, name: str, *finals: str) -> str:
    status = kube.status(resource, name)
    found = status.get("phase") or ""
    assert found not in ({"Failed", "Invalid"} - set(finals)), json.dumps(status, indent=1)[:3000]
    return found


def test_the_node_runs_the_control_plane_built_here(kind: dict[str, str]) -> None:
    """kind's node is this project's image: its Kubernetes, its control-plane images (kubeadm's
    names), KubeRay's operator from the pinned source, rayship's operator from the chart."""
    assert kindcluster.node_exec("cat", "/kind/version").strip() == kindnode.K8S_VERSION
    version = json.loads(kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == kindnode.K8S_VERSION
    nodes = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
    assert [n["metadata"]["name"] for n in nodes] == [kindcluster.NODE]
    ready = {c["type"]: c["status"] for c in nodes[0]["status"]["conditions"]}
    assert ready["Ready"] == "True", nodes[0]["status"]["conditions"]
    held = set(kindcluster.node_exec("ctr", "-n", "k8s.io", "images", "ls", "-q").split())
    assert {f"registry.k8s.io/etcd:{kindnode.ETCD_TAG}", f"registry.k8s.io/coredns/coredns:{kindnode.COREDNS_TAG}",
            f"registry.k8s.io/kube-apiserver:{kindnode.K8S_VERSION}", kindcluster.KUBERAY_IMAGE} <= held  # fmt: skip
    system = json.loads(kubectl("get", "pods", "-A", "-o", "json"))["items"]
    not_running = [
        (p["metadata"]["name"], p["status"].get("phase"))
        for p in system
        if p["status"].get("phase") != "Running"
    ]
    assert not not_running, not_running
    images = {c["image"] for p in system for c in p["spec"]["containers"]}
    assert kindcluster.KUBERAY_IMAGE in images
    assert any(
        i.startswith("rayship/rayship-operator:") or "/rayship/rayship-operator:" in i for i in images
    ), images


def test_the_host_keeps_its_kernel_settings(kind: dict[str, str]) -> None:
    """The kubelet wrote its settings (it runs with protectKernelDefaults off) into the node's masks,
    not the host's /proc/sys; the rest of the node's /proc/sys is read-only."""
    inside = [
        kindcluster.node_exec("cat", f"/proc/sys/{key}").strip()
        for key in ("vm/overcommit_memory", "kernel/panic")
    ]
    assert inside == ["1", "10"], "the kubelet's writes did not reach the node's masks"
    assert kindcluster.host_settings() == kind, "a host-wide kernel setting changed while the kind node ran"
    refused = subprocess.run(
        ["docker", "exec", kindcluster.NODE, "sh", "-c", "echo 1 > /proc/sys/kernel/panic_on_warn"],
        env=kindcluster.env(), capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused


def test_train_across_two_worker_pods_serve_and_clean_up(kind: dict[str, str], kube: Kube) -> None:
    job = sample(NAME, "kind-trainingjob-cpu.yaml", **SMALL_TRAINING)
    job["metadata"]["namespace"] = NAMESPACE
    kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    t0 = time.monotonic()

    # each worker pod's `kubectl logs` names its rank, while the job runs
    def ranks() -> dict[str, set[str]] | None:
        run = kube.status(RJ, names.rayjob_name(NAME)).get("rayClusterName")
        if phase(kube, TJ, NAME) == "Succeeded":
            pytest.fail("Succeeded before the worker pods' logs were read")
        if not run:
            return None
        workers = kube.pods(f"ray.io/cluster={run},ray.io/node-type=worker")
        found = {}
        for pod in workers:
            logs = (
                kubectl("logs", "-n", NAMESPACE, pod.metadata.name) if pod.status.phase == "Running" else ""
            )
            found[pod.metadata.name] = {line.split("rank ")[1].split()[0] for line in logs.splitlines()
                                        if "rayship: training worker rank " in line}  # fmt: skip
        return found if len(found) == 2 and all(found.values()) else None

    found = wait_for(ranks, 600, interval=1, what="both worker pods' logs naming their rank")
    assert sorted(r for ranks_ in found.values() for r in ranks_) == ["0", "1"], found
    wait_for(lambda: phase(kube, TJ, NAME, "Succeeded") == "Succeeded", 600, interval=2, what="Succeeded")
    status = kube.status(TJ, NAME)
    assert status["checkpoint"]["model"], status
    print(f"kind: trained in {time.monotonic() - t0:.0f}s")
    shown = rayship("status", f"tj/{NAME}")
    assert shown.returncode == 0 and "Succeeded" in shown.stdout, (shown.stdout, shown.stderr)

    service = sample(NAME, "kind-modelservice-cpu.yaml", **SMALL_SERVICE)
    service["metadata"]["namespace"] = NAMESPACE
    kubectl("apply", "-f", "-", input=yaml.safe_dump(service))
    wait_for(
        lambda: phase(kube, MS, NAME, "Ready") == "Ready", 600, interval=2, what="the ModelService Ready"
    )
    assert kube.status(MS, NAME)["modelURI"] == status["checkpoint"]["model"]
    route = yaml.safe_load((SAMPLES / "kind-modelservice-cpu.yaml").read_text())["spec"]["routePrefix"]
    path = (f"/api/v1/namespaces/{NAMESPACE}/services/{names.rayservice_name(NAME)}-serve-svc:serve"
            f"/proxy{route}/predict")  # fmt: skip

    def predict() -> dict[str, Any] | None:
        try:
            return json.loads(
                kubectl("create", "--raw", path, "-f", "-", input=json.dumps({"instances": [[0.1] * 8]}))
            )
        except RuntimeError:
            return None

    answer = wait_for(predict, 120, interval=2, what=f"a prediction through {path}")
    assert len(answer["predictions"]) == 1 and all(isinstance(y, float) for y in answer["predictions"][0]), (
        answer
    )
    shown = rayship("status", f"ms/{NAME}")
    assert shown.returncode == 0 and "Ready" in shown.stdout, (shown.stdout, shown.stderr)

    kubectl("delete", "-n", NAMESPACE, "modelservice", NAME, "--wait=true")
    kubectl("delete", "-n", NAMESPACE, "trainingjob", NAME, "--wait=true")
    wait_for(lambda: not kube.pods("ray.io/is-ray-node=yes"), 180, interval=2, what="no Ray pod left")
