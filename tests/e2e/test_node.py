"""The real node real-0 (controlplane/node.py): real pods from our images, and what users debug them
with (`kubectl logs`, `exec`, `port-forward`), cluster DNS and ClusterIP Services from a pod.

The pods run the operator image (the smaller one) with a tiny HTTP server in place of the operator.
"""

from __future__ import annotations

import json
import textwrap
import urllib.request
from collections.abc import Iterator

import kubernetes
import pytest

from controlplane import cluster as controlplane
from controlplane import node as realnode
from controlplane.node_lifecycle import image_digests, node_paths
from controlplane.processes import Paths
from images import build as image_build
from rayship import __version__
from tests.cluster_fixtures import port_forward
from tests.operator.kube import wait_for

pytestmark = [pytest.mark.realpods, pytest.mark.timeout(300)]

OPERATOR_IMAGE = f"rayship/rayship-operator:{__version__}"
# Prints a line for `kubectl logs`, then answers every GET with its pod's name.
SERVER = textwrap.dedent(
    """
    import http.server, socket
    print(f"hello from {socket.gethostname()}", flush=True)
    class Name(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = socket.gethostname().encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    http.server.ThreadingHTTPServer(("", 8080), Name).serve_forever()
    """
)


@pytest.fixture(scope="module")
def core(api) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api)


@pytest.fixture(scope="module")
def web(real_namespace: str, core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    """Pod `web` (the HTTP server above, Ready by its readiness probe) and Service `echo` (80 -> 8080)."""
    labels = {"app": "web"}
    container = {
        "name": "web", "image": OPERATOR_IMAGE, "imagePullPolicy": "Never",
        "command": ["python", "-c", SERVER], "ports": [{"containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }  # fmt: skip
    core.create_namespaced_pod(
        real_namespace,
        {"metadata": {"name": "web", "labels": labels},
         "spec": {"containers": [container], "securityContext": {"runAsNonRoot": True}}},
    )  # fmt: skip
    core.create_namespaced_service(
        real_namespace,
        {"metadata": {"name": "echo"}, "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]}},
    )  # fmt: skip

    def ready() -> bool:
        pod = core.read_namespaced_pod("web", real_namespace)
        return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])

    wait_for(ready, 120, what="pod web Ready on real-0")
    yield real_namespace


def test_real_node_is_ready_with_containerd_and_its_taint(real_node, core) -> None:
    node = core.read_node(realnode.NAME)
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    info = node.status.node_info
    assert info.container_runtime_version.startswith("containerd://"), info
    assert info.kubelet_version == "v1.35.4", info
    assert node.metadata.labels[realnode.LABEL[0]] == realnode.LABEL[1]
    assert {(t.key, t.effect) for t in node.spec.taints} == {
        (realnode.TAINT["key"], realnode.TAINT["effect"])
    }
    addresses = {a.type: a.address for a in node.status.addresses}
    assert addresses["InternalIP"] == realnode.NODE_IP


def test_the_node_has_the_builds_make_images_recorded(real_node) -> None:
    """real-0's containerd names each product image by the build `make images` recorded (pulled by
    that digest from the images' registry), and keeps none of the registry's own names."""
    found = image_digests(node_paths(Paths()))
    for image in image_build.images():
        assert found.get(image.ref) == image.record()["digest"], (image.ref, found)
    assert not [name for name in found if name.startswith("127.0.0.1")], found


def test_the_operator_runs_as_the_charts_pod_on_the_real_node(real_node, api, core) -> None:
    dep = controlplane.operator_deployment(api)
    assert dep.status.ready_replicas == 1, dep.status
    selector = ",".join(f"{k}={v}" for k, v in dep.spec.selector.match_labels.items())
    (pod,) = [p for p in core.list_namespaced_pod(dep.metadata.namespace, label_selector=selector).items
              if p.metadata.deletion_timestamp is None]  # fmt: skip
    assert pod.spec.node_name == realnode.NAME
    (status,) = pod.status.container_statuses
    assert status.ready and status.image.endswith(f"rayship/rayship-operator:{__version__}"), status
    assert status.restart_count == 0, status
    out = real_node.kubectl("exec", "-n", pod.metadata.namespace, pod.metadata.name, "--", "id", "-u")
    assert out.stdout.strip() == "10001", out  # the image's non-root user


def test_kubectl_logs_exec_and_port_forward(real_node, web: str) -> None:
    logs = real_node.kubectl("logs", "-n", web, "web").stdout
    assert "hello from web" in logs, logs
    uid = real_node.kubectl("exec", "-n", web, "web", "--", "id", "-u").stdout.strip()
    assert uid == "10001", uid
    with port_forward(real_node, web, "pod/web", 8080) as port:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/", timeout=10) as resp:
            assert resp.read() == b"web"


PROBE = textwrap.dedent(
    """
    import json, socket, sys, urllib.request
    ns = sys.argv[1]
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    out = {
        "echo": socket.gethostbyname(f"echo.{ns}.svc.cluster.local"),
        "kubernetes": socket.gethostbyname("kubernetes.default.svc"),
        "answer": opener.open("http://echo/", timeout=10).read().decode(),  # the search path: echo.<ns>.svc...
    }
    with socket.create_connection((out["kubernetes"], 443), timeout=10):
        out["apiserver"] = "connected"
    print(json.dumps(out))
    """
)


def test_cluster_dns_and_cluster_ip_services_from_a_pod(real_node, web: str, core) -> None:
    service = core.read_namespaced_service("echo", web)

    def probe() -> dict | None:  # kube-proxy programs a new Service's rules a moment after it exists
        out = real_node.kubectl("exec", "-n", web, "web", "--", "python", "-c", PROBE, web, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    seen = wait_for(probe, 60, interval=1, what="DNS and the ClusterIP Service from the pod")
    assert seen["echo"] == service.spec.cluster_ip, seen
    assert seen["kubernetes"] == controlplane.SERVICE_IP, seen
    assert seen["answer"] == "web" and seen["apiserver"] == "connected", seen
