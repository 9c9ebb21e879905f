"""Start each control-plane component: etcd, kube-apiserver (with its audit log), the controller
manager, the scheduler, kwok, the PV provisioner and the API server forwarder."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from controlplane.certs import cert_kubeconfig
from controlplane.config import (
    ADMISSION_PLUGINS,
    ADVERTISE_IP,
    API_FORWARD_PORT,
    CLUSTER_DOMAIN,
    HERE,
    KWOK_ANNOTATION,
    LINK_HOST_IP,
    NODES,
    POD_CIDR,
    RAYSHIP_NAMESPACE,
    SERVICE_CIDR,
    VENV_BIN,
)
from controlplane.processes import Paths, Proc, State, clean_env, spawn_process


# --- the components ---------------------------------------------------------------------------------
def start_etcd(paths: Paths, state: State, bins: dict[str, Path]) -> Proc:
    client, peer = state.ports["etcd-client"], state.ports["etcd-peer"]
    argv = [
        str(bins["etcd"]), "--name", "rayship", "--data-dir", str(paths.etcd),
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"rayship=http://127.0.0.1:{peer}", "--initial-cluster-state", "new",
        "--quota-backend-bytes", str(2 * 1024**3), "--unsafe-no-fsync", "--log-level", "warn",
    ]  # fmt: skip
    return spawn_process("etcd", argv, paths, clean_env(paths))


def audit_log(paths: Paths | None = None) -> Path:
    """The API server's audit log: one JSON line per request of the rayship operator (any
    ServiceAccount of its namespace), at Metadata level; nothing of anyone else."""
    return (paths or Paths()).logs / "audit.log"


def audit_offset(paths: Paths | None = None) -> int:
    """Where the audit log ends now (0 if there is none yet)."""
    path = audit_log(paths)
    return path.stat().st_size if path.exists() else 0


def audit_since(offset: int, paths: Paths | None = None) -> list[dict[str, Any]]:
    """The operator's requests the audit log recorded after `offset`, one per request (auditID)."""
    path = audit_log(paths)
    if not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    requests: dict[str, dict[str, Any]] = {}
    for line in filter(str.strip, lines):
        event = json.loads(line)
        requests.setdefault(event["auditID"], event)
    return list(requests.values())


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{RAYSHIP_NAMESPACE}"]},
        {"level": "None"},
    ],
}


def start_apiserver(paths: Paths, state: State, bins: dict[str, Path]) -> Proc:
    pki = paths.pki
    policy = paths.run / "audit-policy.json"
    policy.write_text(json.dumps(AUDIT_POLICY))
    argv = [
        str(bins["kube-apiserver"]),
        f"--etcd-servers=http://127.0.0.1:{state.ports['etcd-client']}",
        "--bind-address=127.0.0.1", f"--secure-port={state.ports['apiserver']}",
        f"--advertise-address={ADVERTISE_IP}",  # inside POD_CIDR's reserved /24: see the plan
        f"--cert-dir={paths.run / 'apiserver'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}", "--anonymous-auth=false",
        f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
        "--service-account-max-token-expiration=72h",
        "--authorization-mode=Node,RBAC", f"--enable-admission-plugins={ADMISSION_PLUGINS}",
        f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
        "--kubelet-preferred-address-types=InternalIP", "--profiling=false", "--v=1",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        f"--audit-policy-file={policy}", f"--audit-log-path={audit_log(paths)}", "--audit-log-format=json",
        "--audit-log-maxsize=500", "--audit-log-maxbackup=1",
    ]  # fmt: skip
    return spawn_process("kube-apiserver", argv, paths, clean_env(paths))


def start_controller_manager(paths: Paths, state: State, bins: dict[str, Path], server: str) -> Proc:
    kc = cert_kubeconfig(paths, "kube-controller-manager", server)
    pki = paths.pki
    argv = [
        str(bins["kube-controller-manager"]), f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        f"--client-ca-file={paths.pki / 'ca.crt'}", "--authentication-skip-lookup=true",  # no front proxy here
        "--bind-address=127.0.0.1", f"--secure-port={state.ports['kube-controller-manager']}",
        f"--cert-dir={paths.run / 'kube-controller-manager'}",
        "--use-service-account-credentials=true", f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--controllers=*", "--leader-elect=false", "--allocate-node-cidrs=false",
        f"--cluster-cidr={POD_CIDR}", f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--profiling=false", "--v=1",
    ]  # fmt: skip
    return spawn_process("kube-controller-manager", argv, paths, clean_env(paths))


def start_scheduler(paths: Paths, state: State, bins: dict[str, Path], server: str) -> Proc:
    kc = cert_kubeconfig(paths, "kube-scheduler", server)
    argv = [
        str(bins["kube-scheduler"]), f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        f"--client-ca-file={paths.pki / 'ca.crt'}", "--authentication-skip-lookup=true",  # no front proxy here
        "--bind-address=127.0.0.1", f"--secure-port={state.ports['kube-scheduler']}",
        f"--cert-dir={paths.run / 'kube-scheduler'}", "--leader-elect=false", "--profiling=false", "--v=1",
    ]  # fmt: skip
    return spawn_process("kube-scheduler", argv, paths, clean_env(paths))


def start_kwok(paths: Paths, bins: dict[str, Path], server: str) -> Proc:
    kc = cert_kubeconfig(paths, "kwok", server)
    options = {
        "kind": "KwokConfiguration",
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "options": {
            "manageNodesWithAnnotationSelector": "=".join(KWOK_ANNOTATION),
            "cidr": NODES[0].pod_cidr,  # only used for a node without spec.podCIDR (ours all have one)
            "nodeIP": NODES[0].ip,  # likewise, for a node without an InternalIP
            "nodeLeaseDurationSeconds": 40,
            "enableDebuggingHandlers": False,
        },
    }
    cfg = paths.run / "kwok.yaml"
    cfg.write_text(json.dumps(options) + "\n")
    argv = [
        str(bins["kwok"]),
        f"--kubeconfig={kc}",
        f"--config={cfg}",
        f"--config={KWOK_STAGES}",
    ]
    return spawn_process("kwok", argv, paths, clean_env(paths))


def start_provisioner(paths: Paths, server: str) -> Proc:
    kc = cert_kubeconfig(paths, "provisioner", server)
    argv = [
        venv_python(),
        str(HERE / "cluster.py"),
        "provisioner",
        "--kubeconfig",
        str(kc),
        "--volumes",
        str(paths.volumes),
    ]
    return spawn_process("provisioner", argv, paths, clean_env(paths, PYTHONUNBUFFERED="1"))


def start_api_forward(paths: Paths, state: State) -> Proc:
    """LINK_HOST_IP:443 -> 127.0.0.1:<apiserver>: the API server as the Ray heads' pods reach it."""
    argv = [venv_python(), str(HERE / "cluster.py"), "api-forward", "--listen", LINK_HOST_IP,
            "--port", str(API_FORWARD_PORT), "--to", str(state.ports["apiserver"])]  # fmt: skip
    return spawn_process("kube-apiserver-forward", argv, paths, clean_env(paths, PYTHONUNBUFFERED="1"))


KWOK_STAGES = HERE / "kwok-stages.yaml"


def venv_python() -> str:
    py = VENV_BIN / "python"
    return str(py) if py.exists() else sys.executable
