"""The local cluster's plan: addresses (POD_CIDR, SERVICE_CIDR, the API server's), the kwok nodes,
admission plugins, storage class, where state lives, and the RBAC rules of KubeRay, kwok and the
provisioner. Constants only."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# --- the plan ---------------------------------------------------------------------------------------
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
NETNS = "rayship-pods"
NETNS_DIR = "/run/netns"  # made by `up` when absent (with the mount `ip netns add` leaves), removed by `down`
VETH_HOST, VETH_NS = "rs-pods0", "rs-pods1"
LINK_HOST_IP, LINK_NS_IP = "169.254.244.1", "169.254.244.2"  # a /30 between the host and NETNS
CLUSTER_DOMAIN = "cluster.local"
SERVICE_IP = SERVICE_CIDR.split("/")[0].rsplit(".", 1)[0] + ".1"  # the `kubernetes` Service
ADVERTISE_IP = "10.244.0.1"  # the API server's advertise address: the `kubernetes` Service's endpoint
API_FORWARD_PORT = 443  # LINK_HOST_IP:443 -> the API server, for the real node's components
APISERVER_SANS = ["IP:127.0.0.1", f"IP:{SERVICE_IP}", f"IP:{LINK_HOST_IP}", "DNS:localhost", "DNS:kubernetes",
                  "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                  f"DNS:kubernetes.default.svc.{CLUSTER_DOMAIN}"]  # fmt: skip

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    ip: str
    pod_cidr: str
    cpu: str
    memory: str
    gpus: int = 0
    gpu_product: str = ""


NODES = (
    NodeSpec("kwok-cpu-0", "10.244.0.11", "10.244.1.0/24", cpu="16", memory="64Gi"),
    NodeSpec("kwok-gpu-l4-0", "10.244.0.12", "10.244.2.0/24", "32", "128Gi", 8, "NVIDIA-L4"),
    NodeSpec("kwok-gpu-a100-0", "10.244.0.13", "10.244.3.0/24", "64", "512Gi", 8, "NVIDIA-A100-SXM4-80GB"),
)

ADMISSION_PLUGINS = (
    "NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,DefaultTolerationSeconds,"
    "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,ResourceQuota,"
    "Priority,OwnerReferencesPermissionEnforcement,PodNodeSelector,PodTolerationRestriction"
)
STORAGE_CLASS = "standard"
PROVISIONER = "rayship.dev/hostpath"
KUBERAY_NAMESPACE, KUBERAY_SA = "kuberay-system", "kuberay-operator"
RAYSHIP_RELEASE, RAYSHIP_NAMESPACE = "rayship", "rayship-system"
TOKEN_SECONDS = 48 * 3600

STATE_DIR = Path(os.environ.get("RAYSHIP_CLUSTER_DIR") or ROOT / ".cluster")
VENV_BIN = ROOT / ".venv" / "bin"
KUBERAY_CRDS = Path(os.environ.get("RAYSHIP_KUBERAY_CRDS") or ROOT.parent / "shared" / "kuberay" / "crds")
CHART = Path(os.environ.get("RAYSHIP_CHART") or ROOT / "charts" / "rayship")  # helm-installed as is

# KubeRay's own ClusterRole (ray-operator/config/rbac/role.yaml, which its Helm chart installs), for
# the KubeRay operator's ServiceAccount. Verbs as upstream; OpenShift routes and gateway API omitted.
_CRUD = ["create", "delete", "get", "list", "patch", "update", "watch"]
KUBERAY_RULES = [
    {"apiGroups": [""], "resources": ["events", "pods/status", "services"], "verbs": _CRUD},
    {"apiGroups": [""], "resources": ["pods"], "verbs": [*_CRUD, "deletecollection"]},
    {"apiGroups": [""], "resources": ["pods/proxy", "services/status"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "get", "list", "watch"]},
    {
        "apiGroups": [""],
        "resources": ["serviceaccounts"],
        "verbs": ["create", "delete", "get", "list", "watch"],
    },
    {"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["create", "get", "patch", "update"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": _CRUD},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create", "get", "list", "update"],
    },
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["extensions", "networking.k8s.io"], "resources": ["ingresses"], "verbs": _CRUD},
    {"apiGroups": ["networking.k8s.io"], "resources": ["ingressclasses"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": ["ray.io"],
        "resources": ["rayclusters", "raycronjobs", "rayjobs", "rayservices"],
        "verbs": _CRUD,
    },
    {
        "apiGroups": ["ray.io"],
        "resources": [f"{r}/finalizers" for r in ("rayclusters", "raycronjobs", "rayjobs", "rayservices")],
        "verbs": ["update"],
    },
    {
        "apiGroups": ["ray.io"],
        "resources": [f"{r}/status" for r in ("rayclusters", "raycronjobs", "rayjobs", "rayservices")],
        "verbs": ["get", "patch", "update"],
    },
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["rolebindings"],
        "verbs": ["create", "delete", "get", "list", "watch"],
    },
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles"],
        "verbs": ["create", "delete", "get", "list", "update", "watch"],
    },
]
# kwok's ClusterRole (kustomize/rbac/role.yaml in sigs.k8s.io/kwok), minus its own CRDs (stages come
# from a file here).
KWOK_RULES = [
    {"apiGroups": [""], "resources": ["events"], "verbs": _CRUD},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["nodes/status", "pods/status"], "verbs": ["patch", "update"]},
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["delete", "get", "list", "patch", "update", "watch"],
    },
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create", "get", "list", "patch", "update", "watch"],
    },
]
PROVISIONER_RULES = [
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": [""],
        "resources": ["persistentvolumes"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
    {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
]


def log(msg: str) -> None:
    print(f"cluster: {msg}", flush=True)


# Started in this order, stopped in the reverse one (containerd last: the containers go before it).
NODE_PROCS = ("containerd", "kubelet", "kube-proxy", "coredns", "node-api-forward", "netpol")
WORKLOAD_IMAGE_CPU = "rayship/rayship-workloads:{version}-cpu"
