"""The cluster's first objects: bootstrap RBAC, the kwok nodes, ServiceAccount tokens, KubeRay's CRDs and
operator, and rayship installed from its chart with `helm install`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controlplane import node as realnode
from controlplane.certs import write_kubeconfig
from controlplane.config import (
    CHART,
    GPU_PRODUCT_LABEL,
    GPU_TAINT,
    KUBERAY_CRDS,
    KUBERAY_NAMESPACE,
    KUBERAY_RULES,
    KUBERAY_SA,
    KWOK_ANNOTATION,
    KWOK_RULES,
    LINK_HOST_IP,
    NODES,
    PROVISIONER,
    PROVISIONER_RULES,
    RAYSHIP_NAMESPACE,
    RAYSHIP_RELEASE,
    STORAGE_CLASS,
    TOKEN_SECONDS,
    VENV_BIN,
    WORKLOAD_IMAGE_CPU,
    NodeSpec,
    log,
)
from controlplane.processes import (
    Paths,
    Proc,
    State,
    clean_env,
    file_digest,
    load_state,
    node_running,
    run_command,
    spawn_process,
)


# --- objects ----------------------------------------------------------------------------------------
def api_client(kubeconfig: Path) -> Any:
    import kubernetes

    return kubernetes.config.new_client_from_config(config_file=str(kubeconfig))


def server_side_apply(kubeconfig: Path, source: str, body: str | None = None) -> None:
    """`kubectl apply --server-side` (field manager rayship-cluster) of a file or folder, or of `body`
    with source "-"."""
    kubectl = [str(VENV_BIN / "kubectl"), "--kubeconfig", str(kubeconfig)]
    apply = ["apply", "--server-side", "--force-conflicts", "--field-manager=rayship-cluster", "-f", source]
    run_command([*kubectl, *apply], input=body)


def kubectl_apply(paths: Paths, objs: list[dict[str, Any]]) -> None:
    """Server-side apply of a list of objects."""
    server_side_apply(paths.kubeconfig, "-", json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))


def _node_object(node: NodeSpec) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "type": "kwok", "node.kubernetes.io/instance-type": "kwok-gpu" if node.gpus else "kwok-cpu",
    }  # fmt: skip
    resources = {"cpu": node.cpu, "memory": node.memory, "pods": "110", "ephemeral-storage": "500Gi"}
    taints = []
    if node.gpus:
        labels[GPU_PRODUCT_LABEL] = node.gpu_product
        labels["nvidia.com/gpu.count"] = str(node.gpus)
        resources["nvidia.com/gpu"] = str(node.gpus)
        taints.append(GPU_TAINT)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
        },
        "spec": {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr], "taints": taints},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": node.ip}],
        },
    }


def _cluster_role(name: str, rules: list[dict[str, Any]], subject: dict[str, str]) -> list[dict[str, Any]]:
    meta = {"name": name, "labels": {"app.kubernetes.io/managed-by": "rayship-cluster"}}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta,
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [subject],
        },
    ]


def bootstrap_objects() -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    objs += _cluster_role(
        "rayship:kwok",
        KWOK_RULES,
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "rayship:kwok"},
    )
    objs += _cluster_role(
        "rayship:provisioner",
        PROVISIONER_RULES,
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "rayship:provisioner"},
    )
    objs.append(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }
    )
    objs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUBERAY_NAMESPACE}})
    objs.append(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": KUBERAY_SA, "namespace": KUBERAY_NAMESPACE},
        }
    )
    objs += _cluster_role(
        "kuberay-operator",
        KUBERAY_RULES,
        {"kind": "ServiceAccount", "name": KUBERAY_SA, "namespace": KUBERAY_NAMESPACE},
    )
    return objs


def create_nodes(client: Any) -> None:
    import kubernetes

    core = kubernetes.client.CoreV1Api(client)
    existing = {n.metadata.name for n in core.list_node().items}
    for node in NODES:
        if node.name in existing:
            continue
        body = _node_object(node)
        core.create_node(body)
        # Creating a Node keeps its status, but write capacity/addresses again through /status in case
        # an admission step dropped them (kwok's initialise stage keeps what it finds there).
        core.patch_node_status(node.name, {"status": body["status"]})


def service_account_token(client: Any, namespace: str, name: str) -> str:
    import kubernetes

    core = kubernetes.client.CoreV1Api(client)
    body = kubernetes.client.AuthenticationV1TokenRequest(
        spec=kubernetes.client.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS)
    )
    return core.create_namespaced_service_account_token(name, namespace, body).status.token


def token_kubeconfig(paths: Paths, who: str, server: str, token: str) -> Path:
    path = paths.kubeconfig_for(who)
    write_kubeconfig(path, server, paths.pki / "ca.crt", {"token": token}, who)
    return path


def service_account_kubeconfig(namespace: str, name: str, paths: Paths | None = None) -> Path:
    """A kubeconfig holding a fresh TokenRequest token of ServiceAccount namespace/name (48 h).

    For a test that runs a controller in-process, or kubectl, as that ServiceAccount: its RBAC
    then decides every request, as in a pod. Written to .cluster/run/sa-<namespace>-<name>.kubeconfig.
    """
    paths = paths or Paths()
    state = load_state(paths)
    token = service_account_token(api_client(paths.kubeconfig), namespace, name)
    server = f"https://127.0.0.1:{state.ports['apiserver']}"
    return token_kubeconfig(paths, f"sa-{namespace}-{name}", server, token)


def apply_kuberay_crds(kubeconfig: Path) -> None:
    if not (KUBERAY_CRDS / "ray.io_rayclusters.yaml").is_file():
        raise RuntimeError(f"KubeRay CRDs not found in {KUBERAY_CRDS} (set RAYSHIP_KUBERAY_CRDS)")
    server_side_apply(kubeconfig, str(KUBERAY_CRDS))
    kubectl = [str(VENV_BIN / "kubectl"), "--kubeconfig", str(kubeconfig)]
    run_command([*kubectl, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(KUBERAY_CRDS)])


def start_kuberay(paths: Paths, state: State, bins: dict[str, Path], client: Any, server: str) -> Proc:
    token = service_account_token(client, KUBERAY_NAMESPACE, KUBERAY_SA)
    kc = token_kubeconfig(paths, "kuberay-operator", server, token)
    argv = [
        str(bins["ray-operator"]), "--use-kubernetes-proxy", "--enable-leader-election=false",
        f"--metrics-addr=127.0.0.1:{state.ports['kuberay-metrics']}",
        f"--health-probe-bind-address=127.0.0.1:{state.ports['kuberay-probe']}",
        "--log-stdout-encoder=console",
    ]  # fmt: skip
    return spawn_process("kuberay-operator", argv, paths, clean_env(paths, KUBECONFIG=str(kc)))


class ChartError(RuntimeError):
    """`helm install` of the rayship chart failed (the cluster itself is up)."""


def _chart_digest() -> str:
    import hashlib

    h = hashlib.sha256()
    for f in sorted(p for p in CHART.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(CHART)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def helm_install_rayship(paths: Paths, state: State) -> None:
    """`helm install rayship charts/rayship -n rayship-system --create-namespace`, unless deployed;
    `helm upgrade` when the chart (its CRDs included: they are templates) changed since.

    A release left failed by an earlier attempt is uninstalled first. Raises ChartError.
    """
    helm = [str(VENV_BIN / "helm"), "--kubeconfig", str(paths.kubeconfig)]
    values = paths.run / "rayship-values.json"
    values.write_text(json.dumps(_chart_values(node_running(state))))
    helm_values = ["--values", str(values)]
    home = paths.run / "helm"
    env = clean_env(
        paths,
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
    )
    status = run_command(
        [*helm, "status", RAYSHIP_RELEASE, "-n", RAYSHIP_NAMESPACE, "-o", "json"], check=False, env=env
    )
    digest = f"{_chart_digest()}-{file_digest(values)}"
    if status.returncode == 0:
        if json.loads(status.stdout).get("info", {}).get("status") == "deployed":
            if state.digests.get("chart") == digest:
                return
            log(f"{CHART} may have changed since it was installed: helm upgrade")
            upgrade = [
                *helm,
                "upgrade",
                RAYSHIP_RELEASE,
                str(CHART),
                "-n",
                RAYSHIP_NAMESPACE,
                "--rollback-on-failure",
                "--wait",
                *helm_values,
            ]  # fmt: skip  (a failed upgrade keeps the release)
            result = run_command([*upgrade, "--timeout", "120s"], check=False, env=env)
            if result.returncode != 0:
                raise ChartError(f"helm upgrade failed:\n{(result.stdout + result.stderr).strip()}")
            state.digests["chart"] = digest
            return
        run_command(
            [*helm, "uninstall", RAYSHIP_RELEASE, "-n", RAYSHIP_NAMESPACE, "--wait"], check=False, env=env
        )
    install = [*helm, "install", RAYSHIP_RELEASE, str(CHART), "-n", RAYSHIP_NAMESPACE, "--create-namespace",
               *helm_values]  # fmt: skip
    result = run_command([*install, "--wait", "--timeout", "120s"], check=False, env=env)
    if result.returncode != 0:
        raise ChartError(
            f"helm install {RAYSHIP_RELEASE} {CHART} failed:\n{(result.stdout + result.stderr).strip()}"
        )
    state.digests["chart"] = digest


def _chart_values(node_runs: bool) -> dict[str, Any]:
    """What `helm install` is given beyond the chart's defaults: where real-0 runs, the operator's pod
    runs there (from the image `make images` built) and Ray pods default to the CPU workload image.

    Ray pods get no CPU limit (`cpuLimits: false`): on real-0's 2 CPUs they request fractions, and
    capped at them a Ray head starting up or a worker importing torch ran at half a CPU while the
    node sat ~50% idle (host CPU sampled over the DDP scenario)."""
    if not node_runs:
        return {}
    from rayship import __version__

    return {
        "image": {"pullPolicy": "Never"},  # loaded into the node's containerd, never pulled by the kubelet
        "nodeSelector": dict([realnode.LABEL]),
        "tolerations": [realnode.TOLERATION],
        "defaults": {"workloadImage": WORKLOAD_IMAGE_CPU.format(version=__version__), "cpuLimits": False},
        # The API server's service proxy reaches real-0's pods from the host's end of the link.
        "networkPolicy": {"apiServerCIDRs": [f"{LINK_HOST_IP}/32"]},
    }
