"""A real Kubernetes control plane on loopback, without Docker (`make cluster-up` / `make cluster-down`).

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built from pinned modules by
controlplane/build.py), kwok simulating the GPU and CPU nodes and their pods, a real node real-0
(controlplane/node.py: containerd, kubelet, kube-proxy, CoreDNS) running real pods from our images,
the real KubeRay operator and the real rayship operator (the chart's pod on real-0; a host process
where real-0 does not run), each authenticated and authorised as it would be on a cluster:

    component                 identity                                   authorised by
    kube-apiserver            serving cert for 127.0.0.1 / kubernetes.default.svc
    kube-controller-manager   client cert CN=system:kube-controller-manager  bootstrap RBAC, and one
                              (--use-service-account-credentials)            ServiceAccount per controller
    kube-scheduler            client cert CN=system:kube-scheduler       bootstrap RBAC
    kwok                      client cert CN=rayship:kwok                ClusterRole rayship:kwok (kwok's own rules)
    PV provisioner            client cert CN=rayship:provisioner         ClusterRole rayship:provisioner
    KubeRay operator          ServiceAccount kuberay-system/kuberay-operator, TokenRequest token
                                                                         ClusterRole kuberay-operator (KubeRay's chart rules)
    rayship operator          the chart's ServiceAccount (its pod's token, or a TokenRequest token)
                                                                         the chart's own RBAC
    kubelet (real-0)          client cert O=system:nodes/CN=system:node:real-0   the Node authorizer
    kube-proxy                client cert CN=system:kube-proxy           bootstrap system:node-proxier
    CoreDNS                   client cert CN=rayship:coredns             ClusterRole rayship:coredns
    API server -> kubelet     client cert CN=kube-apiserver-kubelet-client   system:kubelet-api-admin
                              (the kubelet's serving cert is checked against the cluster CA)
    API server forwarders     none (TCP, TLS passes through)
    you (.cluster/kubeconfig) client cert O=system:masters

Address plan (nothing a component dials can leave this machine):

    127.0.0.1            every listener: etcd, apiserver, controller/scheduler health ports, the
                         operators' probe and metrics ports (free ports, recorded in .cluster/state.json)
    10.244.0.0/16        POD_CIDR. The host routes it into the network namespace `rayship-pods` (veth
                         rs-pods0 <-> rs-pods1, link 169.254.244.0/30). There a `local` route (table
                         local) makes every address of it local; as nothing listens, a connection to
                         any pod IP (the apiserver's pod/service proxy, KubeRay's dashboard client
                         through it) is refused at once by this machine's own kernel.
        10.244.0.0/24    node InternalIPs (10.244.0.11-14; .14 is real-0), the API server's advertise
                         address .1 and the cluster DNS .10 (controlplane/node.py); pods never get these
        10.244.1.0/24    podCIDR of node kwok-cpu-0
        10.244.2.0/24    podCIDR of node kwok-gpu-l4-0
        10.244.3.0/24    podCIDR of node kwok-gpu-a100-0
        10.244.4.0/24    real-0's pods, on its bridge in `rayship-pods` (a more specific route there)
    10.96.0.0/16         SERVICE_CIDR (ClusterIPs), routed into the same namespace: kube-proxy's rules
                         there lead a ClusterIP to its pods; any other is refused the same way.
    169.254.244.1:443    (LINK_HOST_IP) the API server as the node reaches it: a TCP forwarder to
                         127.0.0.1:<apiserver>; the IP is a SAN of its certificate.

Nothing here resolves a name: every address is a literal IP (the machine's resolver is not on
loopback), and proxy variables are removed from every component's environment.

CLI:  python controlplane/cluster.py up [--no-operator] [--no-node] | down | status | operator start|stop
API:  up(operator=, node=) -> Cluster, down(), leftovers(), status(), start_operator() -> OperatorHandle,
      stop_operator() -> bool, scale_operator(n), operator_deployment(client), real_node_namespace(name),
      service_account_kubeconfig(namespace, name) -> Path
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if not __package__:  # run as a script: python controlplane/cluster.py ...
    sys.path.insert(0, str(ROOT))
from controlplane import build  # noqa: E402  (stdlib only)
from controlplane import node as realnode  # noqa: E402  (stdlib only)

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


# --- paths and state --------------------------------------------------------------------------------
class Paths:
    def __init__(self, base: Path = STATE_DIR) -> None:
        self.base = base
        self.pki = base / "pki"
        self.logs = base / "logs"
        self.etcd = base / "etcd"
        self.volumes = base / "volumes"
        self.run = base / "run"  # per-start files: kubeconfigs with tokens, kwok config, cert dirs
        self.state = base / "state.json"
        self.lock = base / ".lock"
        self.kubeconfig = base / "kubeconfig"  # admin

    def kubeconfig_for(self, who: str) -> Path:
        return self.run / f"{who}.kubeconfig"


@dataclass
class Proc:
    name: str
    pid: int  # == its process group id (started with start_new_session=True)
    start_ticks: int  # /proc/<pid>/stat starttime: tells our process from a recycled pid
    log: str
    argv: list[str]

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks


@dataclass
class OperatorHandle:
    """The rayship operator running on the host as the chart's ServiceAccount."""

    pid: int
    log_path: Path
    liveness_url: str
    metrics_port: int
    kubeconfig: Path  # the chart ServiceAccount's token
    argv: list[str]
    start_ticks: int = 0

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks

    def pause(self) -> None:
        """SIGSTOP its process group: it does nothing until SIGCONT (`stop_operator` sends one)."""
        if self.alive():
            os.killpg(self.pid, signal.SIGSTOP)


@dataclass
class Cluster:
    """What `up()` returns: where to reach the cluster and as whom."""

    server: str
    kubeconfig: Path  # admin (O=system:masters)
    ca_file: Path
    state_dir: Path
    ports: dict[str, int]
    kuberay_kubeconfig: Path
    operator: OperatorHandle | None = None
    started: bool = False  # False when up() found it already running
    chart_error: str | None = None  # set when `helm install` of the rayship chart failed
    nodes: tuple[NodeSpec, ...] = NODES

    def kubeconfig_for(self, who: str) -> Path:
        return Paths(self.state_dir).kubeconfig_for(who)

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient authenticated as the admin."""
        import kubernetes

        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return _run(
            [str(VENV_BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args], check=check, input=input
        )


@dataclass
class State:
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    netns: bool = False
    operator: dict[str, Any] | None = None
    chart_error: str | None = None  # why `helm install` of the rayship chart failed, if it did
    # What the running components were started with (kwok's stages, the API server's certificate):
    # when a file changed, `up` restarts the component that reads it.
    digests: dict[str, str] = field(default_factory=dict)
    # Host paths that the real node's mount namespace binds over and that `up` had to create.
    made_dirs: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(
            {
                "ports": self.ports,
                "procs": {k: asdict(v) for k, v in self.procs.items()},
                "netns": self.netns,
                "operator": self.operator,
                "chart_error": self.chart_error,
                "digests": self.digests,
                "made_dirs": self.made_dirs,
                "plan": {"pod_cidr": POD_CIDR, "service_cidr": SERVICE_CIDR, "netns": NETNS},
            },
            indent=2,
        )


def _load_state(paths: Paths | None = None) -> State:
    paths = paths or Paths()
    try:
        raw = json.loads(paths.state.read_text())
    except (OSError, ValueError):
        return State()
    return State(
        ports=raw.get("ports", {}),
        procs={k: Proc(**v) for k, v in raw.get("procs", {}).items()},
        netns=raw.get("netns", False),
        operator=raw.get("operator"),
        chart_error=raw.get("chart_error"),
        digests=raw.get("digests", {}),
        made_dirs=raw.get("made_dirs", []),
    )


def _save_state(state: State, paths: Paths) -> None:
    tmp = paths.state.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    tmp.replace(paths.state)


@contextlib.contextmanager
def _locked(paths: Paths) -> Iterator[None]:
    paths.base.mkdir(parents=True, exist_ok=True)
    with open(paths.lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --- small helpers ----------------------------------------------------------------------------------
def _run(
    argv: list[str], check: bool = True, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, capture_output=True, text=True, input=input, env=env)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    return res


def _start_ticks(pid: int) -> int | None:
    """Start time of a live (non-zombie) process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env(paths: Paths, **extra: str) -> dict[str, str]:
    """A minimal environment: no proxy settings, no kubeconfig or in-cluster variables of the caller."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME")}
    keep.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    keep["HOME"] = str(paths.run / "home")
    keep.update(extra)
    return keep


def _wait(what: str, check, timeout: float, proc: Proc | None = None, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{what}: {proc.name} exited; see {proc.log}:\n{_tail(proc.log)}")
        try:
            result = check()
            if result:
                return result
        except Exception as err:  # noqa: BLE001  (polling: any failure means "not yet")
            last = err
        time.sleep(interval)
    tail = f"\n{_tail(proc.log)}" if proc else ""
    raise TimeoutError(f"{what}: not ready after {timeout:.0f}s (last error: {last}){tail}")


def _tail(path: str | Path, lines: int = 25) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _https_get(
    url: str, paths: Paths, client: str | None = "admin", token: str | None = None
) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cafile=str(paths.pki / "ca.crt"))
    if client:
        ctx.load_cert_chain(str(paths.pki / f"{client}.crt"), str(paths.pki / f"{client}.key"))
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _http_ok(url: str, insecure_tls: bool = False) -> bool:
    ctx = ssl._create_unverified_context() if insecure_tls else None  # self-signed health ports
    handlers: list[Any] = [urllib.request.ProxyHandler({})]
    if ctx:
        handlers.append(urllib.request.HTTPSHandler(context=ctx))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


# --- certificates (openssl) -------------------------------------------------------------------------
def _openssl(*args: str) -> None:
    _run(["openssl", *args])


def _ensure_pki(paths: Paths) -> None:
    pki = paths.pki
    if (pki / "complete").exists():
        missing = _apiserver_sans_missing(pki)
        if missing:
            log(f"the API server certificate lacks {', '.join(missing)}: making it again")
            _leaf(pki, "apiserver", "/CN=kube-apiserver", "serverAuth", APISERVER_SANS)
        _node_pki(pki)
        return
    shutil.rmtree(pki, ignore_errors=True)
    pki.mkdir(parents=True)
    ec = ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    _openssl("genpkey", *ec, "-out", str(pki / "ca.key"))
    _openssl(
        "req", "-x509", "-new", "-key", str(pki / "ca.key"), "-subj", "/CN=rayship-local-ca", "-days", "3650",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out", str(pki / "ca.crt"),
    )  # fmt: skip
    leaves = {
        "apiserver": ("/CN=kube-apiserver", "serverAuth", APISERVER_SANS),
        "admin": ("/O=system:masters/CN=rayship-admin", "clientAuth", []),
        "kube-controller-manager": ("/CN=system:kube-controller-manager", "clientAuth", []),
        "kube-scheduler": ("/CN=system:kube-scheduler", "clientAuth", []),
        "kwok": ("/CN=rayship:kwok", "clientAuth", []),
        "provisioner": ("/CN=rayship:provisioner", "clientAuth", []),
    }
    for name, (subject, usage, alt) in leaves.items():
        _leaf(pki, name, subject, usage, alt)
    # Service-account token signing pair.
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(pki / "sa.key"))
    _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    for key in pki.glob("*.key"):
        key.chmod(0o600)
    _node_pki(pki)
    (pki / "complete").write_text("")


def _node_pki(pki: Path) -> None:
    """The real node's certificates (controlplane/node.py), each made if it is missing."""
    for name, (subject, usage, alt) in realnode.CERTIFICATES.items():
        if not (pki / f"{name}.crt").exists():
            _leaf(pki, name, subject, usage, alt)


def _apiserver_sans_missing(pki: Path) -> list[str]:
    """The APISERVER_SANS the serving certificate lacks (e.g. one made before a SAN was added)."""
    out = _run(
        ["openssl", "x509", "-in", str(pki / "apiserver.crt"), "-noout", "-ext", "subjectAltName"]
    ).stdout
    have = {part.strip().replace("IP Address:", "IP:") for part in out.split("\n", 1)[-1].split(",")}
    return [san for san in APISERVER_SANS if san not in have]


def _leaf(pki: Path, name: str, subject: str, usage: str, alt: list[str]) -> None:
    ec = ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    key, csr, crt, ext = (pki / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    _openssl("genpkey", *ec, "-out", str(key))
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    lines = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
             f"extendedKeyUsage={usage}"]  # fmt: skip
    if alt:
        lines.append("subjectAltName=" + ",".join(alt))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
        "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "825", "-extfile", str(ext),
        "-out", str(crt),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()
    key.chmod(0o600)


def _write_kubeconfig(path: Path, server: str, ca: Path, user: dict[str, str], name: str) -> None:
    """A kubeconfig (JSON is valid YAML) for one identity."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "rayship-local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": "rayship-local", "context": {"cluster": "rayship-local", "user": name}}],
        "current-context": "rayship-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(cfg, fh, indent=2)


def _cert_kubeconfig(paths: Paths, who: str, server: str, path: Path | None = None) -> Path:
    path = path or paths.kubeconfig_for(who)
    user = {"client-certificate": str(paths.pki / f"{who}.crt"), "client-key": str(paths.pki / f"{who}.key")}
    _write_kubeconfig(path, server, paths.pki / "ca.crt", user, who)
    return path


# --- network namespace ------------------------------------------------------------------------------
def _netns_exists() -> bool:
    return NETNS in _run(["ip", "netns", "list"], check=False).stdout.split()


def _ensure_netns() -> None:
    """The pod network: POD_CIDR and SERVICE_CIDR lead into NETNS, where every connection is refused."""
    if not _netns_exists():
        _run(["ip", "netns", "add", NETNS])
    ns = ["ip", "-n", NETNS]
    if _run(["ip", "link", "show", VETH_HOST], check=False).returncode != 0:
        _run(["ip", "link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_NS, "netns", NETNS])
    _run(["ip", "addr", "replace", f"{LINK_HOST_IP}/30", "dev", VETH_HOST])
    _run(["ip", "link", "set", VETH_HOST, "up"])
    _run([*ns, "addr", "replace", f"{LINK_NS_IP}/30", "dev", VETH_NS])
    _run([*ns, "link", "set", VETH_NS, "up"])
    _run([*ns, "link", "set", "lo", "up"])
    for cidr in (POD_CIDR, SERVICE_CIDR):
        # In NETNS every address of the range is local, so its kernel answers a SYN with a RST. The
        # route lives in table `local`: only there does the kernel accept such an address as the
        # source of that RST. A more specific route added to the same table later wins over it.
        _run([*ns, "route", "replace", "local", cidr, "dev", "lo", "table", "local"])
        _run(["ip", "route", "replace", cidr, "via", LINK_NS_IP, "dev", VETH_HOST, "src", LINK_HOST_IP])
    probe = NODES[0].pod_cidr.split("/")[0].rsplit(".", 1)[0] + ".250"
    route = _run(["ip", "route", "get", probe]).stdout
    if f"dev {VETH_HOST}" not in route:
        raise RuntimeError(f"pod address {probe} does not route into {NETNS}: {route}")


def _remove_netns() -> bool:
    """Remove NETNS (its veth pair and the host routes through it go with it). True if it existed."""
    for cidr in (POD_CIDR, SERVICE_CIDR):
        _run(["ip", "route", "del", cidr, "dev", VETH_HOST], check=False)
    _run(["ip", "link", "del", VETH_HOST], check=False)
    if not _netns_exists():
        return False
    _run(["ip", "netns", "del", NETNS])
    return True


# --- processes --------------------------------------------------------------------------------------
def _spawn(name: str, argv: list[str], paths: Paths, env: dict[str, str]) -> Proc:
    paths.logs.mkdir(parents=True, exist_ok=True)
    log_path = paths.logs / f"{name}.log"
    with open(log_path, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        popen = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=str(paths.base), start_new_session=True,
        )  # fmt: skip
    popen.returncode = 0  # never waited on here; silence the "still running" warning at exit
    ticks = _start_ticks(popen.pid)
    if ticks is None:
        raise RuntimeError(f"{name} exited at once; see {log_path}:\n{_tail(log_path)}")
    return Proc(name, popen.pid, ticks, str(log_path), argv)


def _stop(proc: Proc, timeout: float = 10.0) -> bool:
    """SIGTERM the process group, SIGKILL it after `timeout`; reap the leader if it is our child.
    True if the leader exited on SIGTERM (or was gone already), False if it took SIGKILL.

    The leader is reaped only at the end: until then its pid, and so the group id, stays ours.
    """

    def wait(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    if not proc.alive():
        _reap(proc.pid)  # gone already: its pid may belong to someone else by now
        return True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
        os.killpg(proc.pid, signal.SIGCONT)  # a paused (SIGSTOPped) group acts on it only once resumed
    wait(timeout)
    exited = not proc.alive()
    if not exited:
        log(f"{proc.name} (pgid {proc.pid}) ignored SIGTERM for {timeout:.0f}s: SIGKILL")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group (e.g. the leader's children)
    wait(5)
    _reap(proc.pid)
    return exited


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


# --- the components ---------------------------------------------------------------------------------
def _start_etcd(paths: Paths, state: State, bins: dict[str, Path]) -> Proc:
    client, peer = state.ports["etcd-client"], state.ports["etcd-peer"]
    argv = [
        str(bins["etcd"]), "--name", "rayship", "--data-dir", str(paths.etcd),
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"rayship=http://127.0.0.1:{peer}", "--initial-cluster-state", "new",
        "--quota-backend-bytes", str(2 * 1024**3), "--unsafe-no-fsync", "--log-level", "warn",
    ]  # fmt: skip
    return _spawn("etcd", argv, paths, _clean_env(paths))


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


def _start_apiserver(paths: Paths, state: State, bins: dict[str, Path]) -> Proc:
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
    return _spawn("kube-apiserver", argv, paths, _clean_env(paths))


def _start_controller_manager(paths: Paths, state: State, bins: dict[str, Path], server: str) -> Proc:
    kc = _cert_kubeconfig(paths, "kube-controller-manager", server)
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
    return _spawn("kube-controller-manager", argv, paths, _clean_env(paths))


def _start_scheduler(paths: Paths, state: State, bins: dict[str, Path], server: str) -> Proc:
    kc = _cert_kubeconfig(paths, "kube-scheduler", server)
    argv = [
        str(bins["kube-scheduler"]), f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        f"--client-ca-file={paths.pki / 'ca.crt'}", "--authentication-skip-lookup=true",  # no front proxy here
        "--bind-address=127.0.0.1", f"--secure-port={state.ports['kube-scheduler']}",
        f"--cert-dir={paths.run / 'kube-scheduler'}", "--leader-elect=false", "--profiling=false", "--v=1",
    ]  # fmt: skip
    return _spawn("kube-scheduler", argv, paths, _clean_env(paths))


def _start_kwok(paths: Paths, bins: dict[str, Path], server: str) -> Proc:
    kc = _cert_kubeconfig(paths, "kwok", server)
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
    return _spawn("kwok", argv, paths, _clean_env(paths))


def _start_provisioner(paths: Paths, server: str) -> Proc:
    kc = _cert_kubeconfig(paths, "provisioner", server)
    argv = [
        _venv_python(),
        str(HERE / "cluster.py"),
        "provisioner",
        "--kubeconfig",
        str(kc),
        "--volumes",
        str(paths.volumes),
    ]
    return _spawn("provisioner", argv, paths, _clean_env(paths, PYTHONUNBUFFERED="1"))


def _start_api_forward(paths: Paths, state: State) -> Proc:
    """LINK_HOST_IP:443 -> 127.0.0.1:<apiserver>: the API server as the Ray heads' pods reach it."""
    argv = [_venv_python(), str(HERE / "cluster.py"), "api-forward", "--listen", LINK_HOST_IP,
            "--port", str(API_FORWARD_PORT), "--to", str(state.ports["apiserver"])]  # fmt: skip
    return _spawn("kube-apiserver-forward", argv, paths, _clean_env(paths, PYTHONUNBUFFERED="1"))


# --- the real node (controlplane/node.py) -----------------------------------------------------------
# Started in this order, stopped in the reverse one (containerd last: the containers go before it).
NODE_PROCS = ("containerd", "kubelet", "kube-proxy", "coredns", "node-api-forward")
NODE_TOOLS = ("containerd", "ctr", "runc", "nft", "unshare", "nsenter", "gcc")
WORKLOAD_IMAGE_CPU = "rayship/rayship-workloads:{version}-cpu"


def node_missing() -> str | None:
    """Why the real node cannot run on this machine, or None."""
    absent = [tool for tool in NODE_TOOLS if shutil.which(tool) is None]
    if not (realnode.CNI_BIN / "bridge").exists():
        absent.append(f"{realnode.CNI_BIN}/bridge")
    if absent:
        return f"the real node needs {', '.join(absent)} (`make node-deps` installs them)"
    return None


def _node_paths(paths: Paths) -> realnode.NodePaths:
    return realnode.NodePaths(paths.base / "node", build.cache_root().parent / "containerd")


def _node_running(state: State) -> bool:
    return all(name in state.procs and state.procs[name].alive() for name in NODE_PROCS)


def _ctr(npaths: realnode.NodePaths, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ctr", "--address", str(npaths.socket), "--namespace", "k8s.io", *args], check=check)


def _node_network() -> None:
    """In NETNS: the node's addresses on lo, the pods' bridge and its route, forwarding on."""
    ns = ["ip", "-n", NETNS]
    for ip in (realnode.NODE_IP, realnode.DNS_IP, ADVERTISE_IP):
        _run([*ns, "addr", "replace", f"{ip}/32", "dev", "lo"])
    if _run([*ns, "link", "show", realnode.BRIDGE], check=False).returncode != 0:
        _run([*ns, "link", "add", realnode.BRIDGE, "type", "bridge"])
    _run([*ns, "addr", "replace", f"{realnode.GATEWAY}/24", "dev", realnode.BRIDGE])
    _run([*ns, "link", "set", realnode.BRIDGE, "up"])
    # A unicast route in table `local`, more specific than the /16 there that refuses every pod address.
    _run([*ns, "route", "replace", realnode.POD_SUBNET, "dev", realnode.BRIDGE, "table", "local"])
    _run(["ip", "netns", "exec", NETNS, "sysctl", "-qw", "net.ipv4.ip_forward=1"])


def _import_images(npaths: realnode.NodePaths, archives: dict[str, Path]) -> None:
    """`ctr images import` each archive not imported yet (containerd's root outlives the cluster)."""
    record = npaths.cache / "imported.json"
    done = json.loads(record.read_text()) if record.exists() else {}
    have = set(_ctr(npaths, "images", "ls", "-q").stdout.split())
    for ref, archive in archives.items():
        if done.get(ref) == archive.name and ref in have:
            continue
        started = time.monotonic()
        _ctr(npaths, "images", "import", str(archive))
        done[ref] = archive.name
        record.write_text(json.dumps(done, indent=2))
        log(f"imported {ref} ({archive.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - started:.0f}s")


def _node_archives(npaths: realnode.NodePaths) -> dict[str, Path]:
    from images import build as images  # the product images (make images), built if missing

    return {
        realnode.PAUSE_REF: realnode.pause_archive(npaths.cache / "pause"),
        **images.ensure_built(log=log),
    }


def _start_node(paths: Paths, state: State, bins: dict[str, Path]) -> None:
    """containerd, the kubelet (node real-0), kube-proxy, CoreDNS and the in-namespace API forwarder."""
    why = node_missing()
    if why:
        raise RuntimeError(why)
    npaths = _node_paths(paths)
    archives = _node_archives(npaths)
    shutil.rmtree(npaths.base, ignore_errors=True)
    for folder in ("cni-conf", "cni-ipam", "pod-logs", *realnode.BOUND.values()):
        (npaths / folder).mkdir(parents=True, exist_ok=True)
    npaths.containerd_root.mkdir(parents=True, exist_ok=True)
    (npaths / "resolv.conf").write_text(f"nameserver {realnode.DNS_IP}\n")
    (npaths / "containerd.toml").write_text(realnode.containerd_config(npaths))
    (npaths / "cni-conf" / "10-rayship.conflist").write_text(json.dumps(realnode.cni_config(npaths)))
    (npaths / "kubelet.json").write_text(json.dumps(realnode.kubelet_config(npaths, paths.pki)))
    link_server = f"https://{LINK_HOST_IP}:{API_FORWARD_PORT}"  # the API server as NETNS reaches it
    kcs = {who: _cert_kubeconfig(paths, who, link_server) for who in ("kubelet", "kube-proxy", "coredns")}
    (npaths / "kube-proxy.json").write_text(
        json.dumps(realnode.kube_proxy_config(kcs["kube-proxy"], POD_CIDR))
    )
    (npaths / "Corefile").write_text(realnode.corefile(kcs["coredns"]))
    _kubectl_apply(paths, realnode.rbac_objects())
    _node_network()
    realnode.make_cgroups()
    for target in realnode.mount_points():
        Path(target).mkdir(parents=True)
        state.made_dirs.append(target)
    _save_state(state, paths)

    def spawn(name: str, argv: list[str]) -> Proc:
        proc = _spawn(name, argv, paths, _clean_env(paths))
        state.procs[name] = proc
        _save_state(state, paths)
        return proc

    # nsenter, not `ip netns exec`: that one mounts a new /sys, without the cgroup hierarchies.
    in_ns = ["nsenter", f"--net=/run/netns/{NETNS}"]
    containerd = spawn("containerd", [
        *in_ns, "unshare", "--mount", "--propagation", "private",
        _venv_python(), str(HERE / "node.py"), "enter", str(npaths.base), "--",
        "containerd", "--config", str(npaths / "containerd.toml"),
    ])  # fmt: skip
    _wait("containerd", lambda: _ctr(npaths, "version", check=False).returncode == 0, 60, containerd)
    _import_images(npaths, archives)
    kubelet = spawn("kubelet", [
        "nsenter", f"--mount=/proc/{containerd.pid}/ns/mnt", f"--net=/run/netns/{NETNS}",
        str(bins["kubelet"]), f"--config={npaths / 'kubelet.json'}", f"--kubeconfig={kcs['kubelet']}",
        f"--hostname-override={realnode.NAME}", f"--node-ip={realnode.NODE_IP}",
        f"--root-dir={npaths.kubelet_root}", f"--node-labels={'='.join(realnode.LABEL)}", "--v=1",
    ])  # fmt: skip
    spawn("kube-proxy", [*in_ns, str(bins["kube-proxy"]), f"--config={npaths / 'kube-proxy.json'}", "--v=1"])
    spawn("coredns", [*in_ns, str(bins["coredns"]), "-conf", str(npaths / "Corefile")])
    spawn("node-api-forward", [
        *in_ns, _venv_python(), str(HERE / "cluster.py"), "api-forward", "--listen", ADVERTISE_IP,
        "--port", str(state.ports["apiserver"]), "--to-host", LINK_HOST_IP, "--to", str(API_FORWARD_PORT),
    ])  # fmt: skip
    client = _api(paths.kubeconfig)
    _wait(f"node {realnode.NAME} Ready", lambda: _node_ready(client, realnode.NAME), 120, kubelet)


def real_node_namespace(name: str) -> dict[str, Any]:
    """A Namespace whose pods all run on real-0: the node selector and the toleration of its taint
    are namespace defaults (the PodNodeSelector and PodTolerationRestriction admission plugins)."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "annotations": {
                "scheduler.alpha.kubernetes.io/node-selector": "=".join(realnode.LABEL),
                "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps([realnode.TOLERATION]),
            },
        },
    }


def _node_ready(client: Any, name: str) -> bool:
    import kubernetes

    node = kubernetes.client.CoreV1Api(client).read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


def _stop_node(paths: Paths, state: State) -> list[str]:
    """Stop the node's processes, remove its containers (with containerd still up), then kill what
    is left in its cgroups, remove those and the mount points `up` made. Harmless when none runs."""
    npaths = _node_paths(paths)
    stopped = []
    for name in reversed(NODE_PROCS):
        proc = state.procs.pop(name, None)
        if proc is None:
            continue
        if proc.alive():
            stopped.append(f"{name} (pgid {proc.pid})")
            if name == "containerd":
                _remove_containers(npaths)
        _stop(proc)
    killed = realnode.kill_leftovers(npaths.socket)
    if killed:
        stopped.append(f"{killed} container processes")
    stuck = realnode.remove_cgroups()
    if stuck:
        log("cgroups that could not be removed: " + "; ".join(stuck))
    for target in [d for d in state.made_dirs if d in realnode.BOUND and d != NETNS_DIR]:
        with contextlib.suppress(OSError):
            Path(target).rmdir()
        state.made_dirs.remove(target)
    shutil.rmtree(npaths.base, ignore_errors=True)
    return stopped


def _remove_containers(npaths: realnode.NodePaths) -> None:
    """Every container of the node, its sandboxes included, killed and removed from containerd (the
    images stay): the next cluster's kubelet finds none to recover."""
    tasks = _ctr(npaths, "tasks", "ls", "-q", check=False).stdout.split()
    for task in tasks:
        _ctr(npaths, "tasks", "kill", "--signal", "SIGKILL", task, check=False)
    for task in tasks:
        _ctr(npaths, "tasks", "delete", "--force", task, check=False)
    for container in _ctr(npaths, "containers", "ls", "-q", check=False).stdout.split():
        _ctr(npaths, "containers", "delete", container, check=False)


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


KWOK_STAGES = HERE / "kwok-stages.yaml"


def _venv_python() -> str:
    py = VENV_BIN / "python"
    return str(py) if py.exists() else sys.executable


# --- objects ----------------------------------------------------------------------------------------
def _api(kubeconfig: Path) -> Any:
    import kubernetes

    return kubernetes.config.new_client_from_config(config_file=str(kubeconfig))


def _kubectl_apply(paths: Paths, objs: list[dict[str, Any]]) -> None:
    """Server-side apply (field manager rayship-cluster) of a list of objects."""
    kubectl = [str(VENV_BIN / "kubectl"), "--kubeconfig", str(paths.kubeconfig)]
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    _run(
        [
            *kubectl,
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=rayship-cluster",
            "-f",
            "-",
        ],
        input=body,
    )


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


def _bootstrap_objects() -> list[dict[str, Any]]:
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


def _create_nodes(client: Any) -> None:
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


def _service_account_token(client: Any, namespace: str, name: str) -> str:
    import kubernetes

    core = kubernetes.client.CoreV1Api(client)
    body = kubernetes.client.AuthenticationV1TokenRequest(
        spec=kubernetes.client.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS)
    )
    return core.create_namespaced_service_account_token(name, namespace, body).status.token


def _token_kubeconfig(paths: Paths, who: str, server: str, token: str) -> Path:
    path = paths.kubeconfig_for(who)
    _write_kubeconfig(path, server, paths.pki / "ca.crt", {"token": token}, who)
    return path


def service_account_kubeconfig(namespace: str, name: str, paths: Paths | None = None) -> Path:
    """A kubeconfig holding a fresh TokenRequest token of ServiceAccount namespace/name (48 h).

    For a test that runs a controller in-process, or kubectl, as that ServiceAccount: its RBAC
    then decides every request, as in a pod. Written to .cluster/run/sa-<namespace>-<name>.kubeconfig.
    """
    paths = paths or Paths()
    state = _load_state(paths)
    token = _service_account_token(_api(paths.kubeconfig), namespace, name)
    server = f"https://127.0.0.1:{state.ports['apiserver']}"
    return _token_kubeconfig(paths, f"sa-{namespace}-{name}", server, token)


def _apply_kuberay_crds(kubeconfig: Path) -> None:
    if not (KUBERAY_CRDS / "ray.io_rayclusters.yaml").is_file():
        raise RuntimeError(f"KubeRay CRDs not found in {KUBERAY_CRDS} (set RAYSHIP_KUBERAY_CRDS)")
    kubectl = [str(VENV_BIN / "kubectl"), "--kubeconfig", str(kubeconfig)]
    _run(
        [
            *kubectl,
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=rayship-cluster",
            "-f",
            str(KUBERAY_CRDS),
        ]
    )
    _run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(KUBERAY_CRDS)])


def _start_kuberay(paths: Paths, state: State, bins: dict[str, Path], client: Any, server: str) -> Proc:
    token = _service_account_token(client, KUBERAY_NAMESPACE, KUBERAY_SA)
    kc = _token_kubeconfig(paths, "kuberay-operator", server, token)
    argv = [
        str(bins["ray-operator"]), "--use-kubernetes-proxy", "--enable-leader-election=false",
        f"--metrics-addr=127.0.0.1:{state.ports['kuberay-metrics']}",
        f"--health-probe-bind-address=127.0.0.1:{state.ports['kuberay-probe']}",
        "--log-stdout-encoder=console",
    ]  # fmt: skip
    return _spawn("kuberay-operator", argv, paths, _clean_env(paths, KUBECONFIG=str(kc)))


class ChartError(RuntimeError):
    """`helm install` of the rayship chart failed (the cluster itself is up)."""


def _chart_digest() -> str:
    import hashlib

    h = hashlib.sha256()
    for f in sorted(p for p in CHART.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(CHART)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _helm_install_rayship(paths: Paths, state: State) -> None:
    """`helm install rayship charts/rayship -n rayship-system --create-namespace`, unless deployed;
    `helm upgrade` when the chart (its CRDs included: they are templates) changed since.

    A release left failed by an earlier attempt is uninstalled first. Raises ChartError.
    """
    helm = [str(VENV_BIN / "helm"), "--kubeconfig", str(paths.kubeconfig)]
    values = paths.run / "rayship-values.json"
    values.write_text(json.dumps(_chart_values(_node_running(state))))
    helm_values = ["--values", str(values)]
    home = paths.run / "helm"
    env = _clean_env(
        paths,
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
    )
    status = _run(
        [*helm, "status", RAYSHIP_RELEASE, "-n", RAYSHIP_NAMESPACE, "-o", "json"], check=False, env=env
    )
    digest = f"{_chart_digest()}-{_digest(values)}"
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
            result = _run([*upgrade, "--timeout", "120s"], check=False, env=env)
            if result.returncode != 0:
                raise ChartError(f"helm upgrade failed:\n{(result.stdout + result.stderr).strip()}")
            state.digests["chart"] = digest
            return
        _run([*helm, "uninstall", RAYSHIP_RELEASE, "-n", RAYSHIP_NAMESPACE, "--wait"], check=False, env=env)
    install = [*helm, "install", RAYSHIP_RELEASE, str(CHART), "-n", RAYSHIP_NAMESPACE, "--create-namespace",
               *helm_values]  # fmt: skip
    result = _run([*install, "--wait", "--timeout", "120s"], check=False, env=env)
    if result.returncode != 0:
        raise ChartError(
            f"helm install {RAYSHIP_RELEASE} {CHART} failed:\n{(result.stdout + result.stderr).strip()}"
        )
    state.digests["chart"] = digest


def _chart_values(node_runs: bool) -> dict[str, Any]:
    """What `helm install` is given beyond the chart's defaults: where real-0 runs, the operator's pod
    runs there (from the image `make images` built) and Ray pods default to the CPU workload image."""
    if not node_runs:
        return {}
    from rayship import __version__

    return {
        "image": {"pullPolicy": "Never"},  # imported into the node's containerd, never pulled
        "nodeSelector": dict([realnode.LABEL]),
        "tolerations": [realnode.TOLERATION],
        "defaults": {"workloadImage": WORKLOAD_IMAGE_CPU.format(version=__version__)},
    }


# --- the rayship operator ---------------------------------------------------------------------------
def operator_deployment(client: Any) -> Any:
    """The chart's operator Deployment, as installed in the cluster."""
    import kubernetes

    apps = kubernetes.client.AppsV1Api(client)
    items = apps.list_namespaced_deployment(
        RAYSHIP_NAMESPACE, label_selector="app.kubernetes.io/component=operator"
    ).items
    if not items:
        raise RuntimeError(f"no rayship operator Deployment in {RAYSHIP_NAMESPACE}: is the chart installed?")
    return items[0]


def start_operator(
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    paths: Paths | None = None,
    wait: bool = True,
    ready_timeout: float = 60,
) -> OperatorHandle:
    """Run the real rayship operator on the host, exactly as the chart's Deployment would run it.

    Its args and env come from the Deployment in the cluster (plus extra_args / extra_env); it
    authenticates as the Deployment's ServiceAccount (a TokenRequest token), so the chart's RBAC
    authorises every request. The liveness and metrics ports move to free loopback ports. If one
    is already running, returns its handle (stop it first to change its args or env). Returns once
    its liveness endpoint answers (within `ready_timeout` s), or (wait=False) as soon as it is spawned.
    """
    paths = paths or Paths()
    with _locked(paths):
        state = _load_state(paths)
        running = _operator_handle(state)
        if running is not None and running.alive():
            return running
        server = f"https://127.0.0.1:{state.ports['apiserver']}"
        client = _api(paths.kubeconfig)
        if _node_running(state):  # the chart's pod runs a real operator there: never two at once
            _scale(client, 0)
        dep = operator_deployment(client)
        pod = dep.spec.template.spec
        container = next(c for c in pod.containers if c.name == "operator")
        token = _service_account_token(client, dep.metadata.namespace, pod.service_account_name or "default")
        kc = _token_kubeconfig(paths, "rayship-operator", server, token)
        live_port = _free_port()
        liveness = f"http://127.0.0.1:{live_port}/healthz"
        args = list(container.args or [])
        if "--liveness" in args:
            args[args.index("--liveness") + 1] = liveness
        else:
            args += ["--liveness", liveness]
        args += extra_args or []
        env = {e.name: e.value for e in (container.env or []) if e.value is not None}
        metrics_port = 0
        if env.get("RAYSHIP_METRICS_PORT", "0") != "0":
            metrics_port = _free_port()
            env["RAYSHIP_METRICS_PORT"] = str(metrics_port)
        env.update(extra_env or {})
        rayship = VENV_BIN / "rayship"
        argv = (
            [str(rayship), "operator", *args]
            if rayship.exists()
            else [sys.executable, "-m", "rayship.cli", "operator", *args]
        )
        full_env = _clean_env(paths, KUBECONFIG=str(kc), PYTHONUNBUFFERED="1", **env)
        full_env["PATH"] = f"{VENV_BIN}:{full_env['PATH']}"
        proc = _spawn("rayship-operator", argv, paths, full_env)
        state.procs["rayship-operator"] = proc
        state.operator = {"liveness_url": liveness, "metrics_port": metrics_port, "kubeconfig": str(kc)}
        _save_state(state, paths)
        handle = _operator_handle(state)
        assert handle is not None
    if not wait:
        return handle
    _wait("rayship operator liveness", lambda: _http_ok(liveness), ready_timeout, proc)
    log(f"rayship operator pid {proc.pid} ({' '.join(args)}), log {proc.log}")
    return handle


def scale_operator(replicas: int, paths: Paths | None = None, timeout: float = 120) -> None:
    """Scale the chart's operator Deployment and wait until that many of its pods are ready (0: gone)."""
    paths = paths or Paths()
    _scale(_api(paths.kubeconfig), replicas, timeout)


def _scale(client: Any, replicas: int, timeout: float = 120) -> None:
    import kubernetes

    dep = operator_deployment(client)
    apps = kubernetes.client.AppsV1Api(client)
    core = kubernetes.client.CoreV1Api(client)
    name, ns = dep.metadata.name, dep.metadata.namespace
    apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": replicas}})
    selector = ",".join(f"{k}={v}" for k, v in dep.spec.selector.match_labels.items())

    def settled() -> bool:
        d = apps.read_namespaced_deployment(name, ns)
        pods = core.list_namespaced_pod(ns, label_selector=selector).items
        if replicas == 0:
            return not pods
        return (d.status.ready_replicas or 0) == replicas and (d.status.updated_replicas or 0) == replicas

    _wait(f"operator Deployment at {replicas} ready replicas", settled, timeout)


def _operator_handle(state: State) -> OperatorHandle | None:
    proc = state.procs.get("rayship-operator")
    if proc is None or state.operator is None:
        return None
    return OperatorHandle(proc.pid, Path(proc.log), state.operator["liveness_url"], state.operator["metrics_port"],
                          Path(state.operator["kubeconfig"]), proc.argv, proc.start_ticks)  # fmt: skip


def stop_operator(
    handle: OperatorHandle | None = None, paths: Paths | None = None, timeout: float = 10.0
) -> bool:
    """Stop the rayship operator (the one recorded in state.json; `handle` must be it, if given):
    SIGTERM, and SIGKILL if it still runs after `timeout` s. False if it took SIGKILL."""
    paths = paths or Paths()
    with _locked(paths):
        state = _load_state(paths)
        proc = state.procs.get("rayship-operator")
        if proc is None or (handle is not None and handle.pid != proc.pid):
            return True
        exited = _stop(proc, timeout)
        del state.procs["rayship-operator"]
        state.operator = None
        _save_state(state, paths)
        return exited


def kill_operator(handle: OperatorHandle | None = None, paths: Paths | None = None) -> None:
    """SIGKILL the rayship operator's process group (a crash: no cleanup), and forget it."""
    paths = paths or Paths()
    with _locked(paths):
        state = _load_state(paths)
        proc = state.procs.get("rayship-operator")
        if proc is None or (handle is not None and handle.pid != proc.pid):
            return
        if proc.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        _wait("the operator to die", lambda: not proc.alive(), 10)
        _reap(proc.pid)
        del state.procs["rayship-operator"]
        state.operator = None
        _save_state(state, paths)


def restart(component: str, paths: Paths | None = None) -> None:
    """Stop one running component (e.g. "kube-apiserver") and start it again with the same arguments,
    as a crash and a restart by its supervisor would; waits until the API server is ready again."""
    paths = paths or Paths()
    with _locked(paths):
        state = _load_state(paths)
        proc = state.procs[component]
        _stop(proc)
        state.procs[component] = _spawn(component, proc.argv, paths, _clean_env(paths))
        _save_state(state, paths)
    server = f"https://127.0.0.1:{state.ports['apiserver']}"
    _wait("kube-apiserver /readyz", lambda: _https_get(f"{server}/readyz", paths)[0] == 200, 90)
    log(f"restarted {component}")


# --- up / down / status -----------------------------------------------------------------------------
CORE = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "provisioner",
    "kuberay-operator",
)
# Started after CORE; `up` on a running cluster starts one that is missing (or restarts kwok / the API
# server when its stages / certificate changed) in place, without restarting the rest.
ADDONS = ("kube-apiserver-forward",)


def _ready(paths: Paths, state: State) -> bool:
    if not state.procs or not all(name in state.procs and state.procs[name].alive() for name in CORE):
        return False
    try:
        code, _ = _https_get(f"https://127.0.0.1:{state.ports['apiserver']}/readyz", paths)
    except OSError:
        return False
    return code == 200


def _cluster(paths: Paths, state: State, started: bool) -> Cluster:
    return Cluster(
        server=f"https://127.0.0.1:{state.ports['apiserver']}",
        kubeconfig=paths.kubeconfig,
        ca_file=paths.pki / "ca.crt",
        state_dir=paths.base,
        ports=dict(state.ports),
        kuberay_kubeconfig=paths.kubeconfig_for("kuberay-operator"),
        operator=_operator_handle(state) if "rayship-operator" in state.procs else None,
        started=started,
        chart_error=state.chart_error,
    )


def up(operator: bool | None = True, paths: Paths | None = None, node: bool | None = None) -> Cluster:
    """Start the cluster, or return the running one. Harmless and fast when it already runs.

    node: True starts the real node real-0 (controlplane/node.py) if it does not run, False stops
    it, None leaves it as it is. The rayship chart is helm-installed (again, if an earlier install
    failed; upgraded when the node came or went: its operator pod runs on real-0 then).
    operator: True runs the rayship operator if it does not run: the chart's pod where real-0 runs,
    a host process elsewhere; False stops the host process (for tests that start their own); None
    leaves it as it is. If the chart does not install, the cluster stays up, the reason is in
    `Cluster.chart_error`, and with operator=True ChartError is raised.
    """
    paths = paths or Paths()
    t0 = time.monotonic()
    with _locked(paths):
        state = _load_state(paths)
        started = False
        if _ready(paths, state):
            log(f"already running: {paths.kubeconfig} (checked in {time.monotonic() - t0:.1f}s)")
            _ensure_addons(paths, state)
        else:
            if state.procs or state.netns:
                log("a previous cluster is partly running: stopping it first")
                _down(paths)
            state = _start(paths)
            started = True
        if node is True and not _node_running(state):
            _stop_node(paths, state)  # what a half-started node left
            try:
                _start_node(paths, state, build.binaries())
            except BaseException:
                log("the real node did not start: stopping what of it was started")
                _stop_node(paths, state)
                _save_state(state, paths)
                raise
            _save_state(state, paths)
        elif node is True:  # running: the images as they are now (rebuilt and imported if a source changed)
            npaths = _node_paths(paths)
            _import_images(npaths, _node_archives(npaths))
        elif node is False and any(name in state.procs for name in NODE_PROCS):
            log(f"stopping the real node: {', '.join(_stop_node(paths, state))}")
            _save_state(state, paths)
        t1 = time.monotonic()
        try:
            _helm_install_rayship(paths, state)
            state.chart_error = None
        except ChartError as err:
            state.chart_error = str(err)
            log(str(err))
        _save_state(state, paths)
        if started:
            log(f"helm install rayship: {time.monotonic() - t1:.1f}s")
    if operator is True and state.chart_error is None:
        if _node_running(state):
            stop_operator(paths=paths)
            scale_operator(1, paths=paths)
        else:
            start_operator(paths=paths)
    elif operator is False:
        stop_operator(paths=paths)
    cluster = _cluster(paths, _load_state(paths), started)
    if started:
        log(
            f"cluster started in {time.monotonic() - t0:.1f}s: kubectl --kubeconfig {paths.kubeconfig} get nodes"
        )
    if operator is True and cluster.chart_error:
        raise ChartError(f"the cluster is up, but the rayship chart did not install: {cluster.chart_error}")
    return cluster


def _ensure_addons(paths: Paths, state: State) -> None:
    """Bring a running cluster up to this file: the API server's certificate and kwok's stages as they
    are now (restarting the one whose input changed), the ADDONS running."""
    server = f"https://127.0.0.1:{state.ports['apiserver']}"
    _ensure_pki(paths)
    for name, source in (("kube-apiserver", paths.pki / "apiserver.crt"), ("kwok", KWOK_STAGES)):
        if state.digests.get(name) == _digest(source):
            continue
        log(f"{source.name} changed since {name} started: restarting {name}")
        proc = state.procs[name]
        _stop(proc)
        state.procs[name] = _spawn(name, proc.argv, paths, _clean_env(paths))
        state.digests[name] = _digest(source)
        _save_state(state, paths)
        if name == "kube-apiserver":
            _wait("kube-apiserver /readyz", lambda: _https_get(f"{server}/readyz", paths)[0] == 200, 90)
    for name in ADDONS:
        proc = state.procs.get(name)
        if proc is not None and proc.alive():
            continue
        if proc is not None:
            _stop(proc)
        log(f"{name} is not running: starting it")
        state.procs[name] = _start_api_forward(paths, state)
        _save_state(state, paths)
    _wait_api_forward(state.procs["kube-apiserver-forward"])


def _wait_api_forward(proc: Proc) -> None:
    def listening() -> bool:
        with socket.create_connection((LINK_HOST_IP, API_FORWARD_PORT), timeout=1):
            return True

    _wait("the API server forwarder", listening, 30, proc)


def _start(paths: Paths) -> State:
    timings: dict[str, float] = {}
    mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        timings[name] = now - mark
        mark = now

    if os.geteuid() != 0:
        raise RuntimeError("cluster-up needs root (it creates the network namespace for the pod network)")
    bins = build.binaries()
    absent = [name for name, path in bins.items() if not path.exists()]
    if absent:
        log(f"binaries missing ({', '.join(absent)}): building them (make cluster-build)")
        build.ensure_built(log=log)
    lap("build check")
    shutil.rmtree(paths.logs, ignore_errors=True)  # a fresh cluster, fresh logs (down keeps the last ones)
    for d in (paths.logs, paths.run, paths.volumes, paths.run / "home"):
        d.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(paths.etcd, ignore_errors=True)
    _ensure_pki(paths)
    lap("certificates")
    netns_dir = Path(NETNS_DIR)
    made_netns_dir = not netns_dir.exists()  # `ip netns add` makes it, and a mount of it, for good
    state = State(ports={name: _free_port() for name in (
        "etcd-client", "etcd-peer", "apiserver", "kube-controller-manager", "kube-scheduler", "kuberay-metrics", "kuberay-probe",
    )})  # fmt: skip
    _ensure_netns()
    state.netns = True
    if made_netns_dir:
        state.made_dirs.append(str(netns_dir))
    _save_state(state, paths)
    lap("network namespace")
    server = f"https://127.0.0.1:{state.ports['apiserver']}"
    _cert_kubeconfig(paths, "admin", server, paths.kubeconfig)

    def spawn(proc: Proc) -> Proc:
        state.procs[proc.name] = proc
        _save_state(state, paths)
        return proc

    try:
        etcd = spawn(_start_etcd(paths, state, bins))
        _wait("etcd", lambda: _http_ok(f"http://127.0.0.1:{state.ports['etcd-client']}/health"), 30, etcd)
        lap("etcd")
        apiserver = spawn(_start_apiserver(paths, state, bins))
        _wait(
            "kube-apiserver /readyz", lambda: _https_get(f"{server}/readyz", paths)[0] == 200, 90, apiserver
        )
        lap("kube-apiserver")
        # The KubeRay CRDs (3 MB) are the apiserver's biggest job here: start them first, meanwhile
        # bring up the rest.
        crds = _Background(_apply_kuberay_crds, paths.kubeconfig)
        kcm = spawn(_start_controller_manager(paths, state, bins, server))
        sched = spawn(_start_scheduler(paths, state, bins, server))
        client = _api(paths.kubeconfig)
        _kubectl_apply(paths, _bootstrap_objects())
        lap("RBAC, StorageClass, namespaces")
        kwok = spawn(_start_kwok(paths, bins, server))
        spawn(_start_provisioner(paths, server))
        forward = spawn(_start_api_forward(paths, state))
        state.digests = {"kube-apiserver": _digest(paths.pki / "apiserver.crt"), "kwok": _digest(KWOK_STAGES)}
        _create_nodes(client)
        _wait_api_forward(forward)
        lap("nodes, forwarder")
        crds.join()
        lap("KubeRay CRDs established")
        kuberay = spawn(_start_kuberay(paths, state, bins, client, server))
        for name, proc, port in (
            ("kube-controller-manager", kcm, "kube-controller-manager"),
            ("kube-scheduler", sched, "kube-scheduler"),
        ):
            _wait(
                f"{name} /healthz",
                lambda p=port: _http_ok(f"https://127.0.0.1:{state.ports[p]}/healthz", insecure_tls=True),
                60,
                proc,
            )
        _wait("nodes Ready", lambda: _nodes_ready(client), 60, kwok)
        _wait(
            "KubeRay operator /readyz",
            lambda: _http_ok(f"http://127.0.0.1:{state.ports['kuberay-probe']}/readyz"),
            60,
            kuberay,
        )
        lap("controllers + nodes Ready")
    except BaseException:
        log("start failed: stopping what was started")
        _down(paths)
        raise
    log("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    return state


class _Background(threading.Thread):
    """Run fn(*args) in a thread; join() re-raises its exception."""

    def __init__(self, fn: Any, *args: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.args, self.error = fn, args, None
        self.start()

    def run(self) -> None:
        try:
            self.fn(*self.args)
        except BaseException as err:  # noqa: BLE001  (handed to join())
            self.error = err

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


def _nodes_ready(client: Any) -> bool:
    import kubernetes

    nodes = kubernetes.client.CoreV1Api(client).list_node().items
    ready = {
        n.metadata.name
        for n in nodes
        if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        and not any(t.key == "node.kubernetes.io/not-ready" for t in (n.spec.taints or []))
    }
    return ready >= {n.name for n in NODES}


def _down(paths: Paths) -> list[str]:
    state = _load_state(paths)
    stopped = _stop_node(paths, state)
    # Reverse start order: the operators first, etcd last.
    for name in reversed(list(state.procs)):
        proc = state.procs[name]
        if proc.alive():
            stopped.append(f"{name} (pgid {proc.pid})")
        _stop(proc)
    if _remove_netns():
        stopped.append(f"netns {NETNS} with its routes")
    netns_dir = Path(NETNS_DIR)
    if str(netns_dir) in state.made_dirs and netns_dir.is_dir() and not any(netns_dir.iterdir()):
        _run(["umount", str(netns_dir)], check=False)  # the bind mount `ip netns add` made of it
        with contextlib.suppress(OSError):
            netns_dir.rmdir()
    for path in (paths.etcd, paths.volumes, paths.run):
        shutil.rmtree(path, ignore_errors=True)
    for path in (paths.state, paths.kubeconfig):
        path.unlink(missing_ok=True)
    return stopped


def down(paths: Paths | None = None) -> None:
    """Stop every process `up` started (by process group), remove the netns, routes and cluster data.

    Keeps the certificates (.cluster/pki), the logs and the build cache. Harmless when nothing runs.
    """
    paths = paths or Paths()
    if not paths.base.exists():
        log(f"removed a leftover netns {NETNS}" if _remove_netns() else "nothing to stop")
        return
    with _locked(paths):
        stopped = _down(paths)
    log(("stopped and removed " + ", ".join(stopped)) if stopped else "nothing to stop")


def leftovers(paths: Paths | None = None) -> list[str]:
    """What a cluster left on this machine: after `down`, nothing (a process of its binaries, its
    network namespace or veth, a mount, a cgroup, a shim, a KUBE-* iptables chain or a kube-proxy nft
    table on the host, a folder `up` made)."""
    paths = paths or Paths()
    left = [f"netns {NETNS}"] if _netns_exists() else []
    if _run(["ip", "link", "show", VETH_HOST], check=False).returncode == 0:
        left.append(f"link {VETH_HOST}")
    for line in Path("/proc/mounts").read_text().splitlines():
        where = line.split()[1]
        if where.startswith(str(paths.base)) or where in realnode.BOUND or "/kubelet/" in where:
            if where == "/run/netns" and any(Path(where).iterdir()):
                continue  # someone else's network namespaces: `ip netns add` mounts it for good
            left.append(f"mount {where}")
    left += [f"cgroup {h / realnode.CGROUP_ROOT}" for h in realnode.cgroup_hierarchies()
             if (h / realnode.CGROUP_ROOT).exists()]  # fmt: skip
    ours = {str(path) for path in build.binaries().values()}
    base = str(paths.base).encode()
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            if not proc.name.isdigit() or proc.name == str(os.getpid()):
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if os.readlink(proc / "exe") in ours or any(base in arg for arg in argv):
                left.append(f"process {proc.name} ({argv[0].decode(errors='replace')})")
    left += [f"shim {pid}" for pid in realnode.shim_pids(_node_paths(paths).socket)]
    if shutil.which("iptables"):
        chains = [
            c for c in _run(["iptables", "-S"], check=False).stdout.splitlines() if c.startswith("-N KUBE-")
        ]
        left += [f"iptables chain {c.split()[1]}" for c in chains]
    if shutil.which("nft"):
        tables = _run(["nft", "list", "tables"], check=False).stdout.splitlines()
        left += [f"nft {t}" for t in tables if "kube-proxy" in t]
    left += [f"folder {d}" for d in _load_state(paths).made_dirs if Path(d).exists()]
    return left


def status(paths: Paths | None = None) -> dict[str, Any]:
    paths = paths or Paths()
    state = _load_state(paths)
    procs = {name: {"pid": p.pid, "alive": p.alive(), "log": p.log} for name, p in state.procs.items()}
    ready = False
    if "apiserver" in state.ports and paths.pki.exists():
        with contextlib.suppress(OSError):
            ready = _https_get(f"https://127.0.0.1:{state.ports['apiserver']}/readyz", paths)[0] == 200
    return {
        "apiserver_ready": ready,
        "kubeconfig": str(paths.kubeconfig) if paths.kubeconfig.exists() else None,
        "ports": state.ports,
        "processes": procs,
        "netns": _netns_exists(),
        "operator": state.operator,
        "chart_error": state.chart_error,
    }


# --- the PV provisioner (runs as its own component) -------------------------------------------------
def provisioner(kubeconfig: Path, volumes: Path, interval: float = 1.0) -> None:
    """Give every pending claim of the default class a hostPath PV under `volumes`/<claim uid>.

    The claim's binding itself is done by the real PV controller (kube-controller-manager): this loop
    only plays the external provisioner of STORAGE_CLASS, and deletes the PVs it made once released.
    """
    import kubernetes
    from kubernetes.client.exceptions import ApiException

    core = kubernetes.client.CoreV1Api(_api(kubeconfig))
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        try:
            for pvc in core.list_persistent_volume_claim_for_all_namespaces().items:
                if (
                    pvc.status.phase != "Pending"
                    or pvc.spec.volume_name
                    or pvc.spec.storage_class_name != STORAGE_CLASS
                ):
                    continue
                path = volumes / pvc.metadata.uid
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)  # as local-path-provisioner: the pods' users are not root
                pv = {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {
                        "name": f"pvc-{pvc.metadata.uid}",
                        "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
                    },
                    "spec": {
                        "capacity": {"storage": pvc.spec.resources.requests["storage"]},
                        "accessModes": pvc.spec.access_modes,
                        "volumeMode": pvc.spec.volume_mode or "Filesystem",
                        "persistentVolumeReclaimPolicy": "Delete",
                        "storageClassName": STORAGE_CLASS,
                        "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                        "claimRef": {
                            "apiVersion": "v1",
                            "kind": "PersistentVolumeClaim",
                            "namespace": pvc.metadata.namespace,
                            "name": pvc.metadata.name,
                            "uid": pvc.metadata.uid,
                        },  # fmt: skip
                    },
                }
                try:
                    core.create_persistent_volume(pv)
                    print(
                        f"provisioned {pv['metadata']['name']} for {pvc.metadata.namespace}/{pvc.metadata.name}",
                        flush=True,
                    )
                except ApiException as err:
                    if err.status != 409:
                        raise
            for pv in core.list_persistent_volume().items:
                annotations = pv.metadata.annotations or {}
                if (
                    annotations.get("pv.kubernetes.io/provisioned-by") == PROVISIONER
                    and pv.status.phase == "Released"
                ):
                    with contextlib.suppress(ApiException):
                        core.delete_persistent_volume(pv.metadata.name)
                    if pv.spec.host_path and Path(pv.spec.host_path.path).parent == volumes:
                        shutil.rmtree(pv.spec.host_path.path, ignore_errors=True)
                    print(f"deleted released {pv.metadata.name}", flush=True)
        except Exception as err:  # noqa: BLE001  (keep running: the apiserver may be restarting)
            print(f"provisioner: {err}", flush=True)
        time.sleep(interval)


# --- the API server forwarder (runs as its own component) -------------------------------------------
def api_forward(listen: str, port: int, to_port: int, to_host: str = "127.0.0.1") -> None:
    """TCP passthrough listen:port -> to_host:to_port (TLS is end to end: the API server's own)."""
    import asyncio

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError) as err:
            print(f"api-forward: connection ended: {err}", flush=True)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(to_host, to_port)
        except OSError as err:
            print(f"api-forward: the API server refused: {err}", flush=True)
            writer.close()
            return
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, listen, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        print(f"api-forward: {listen}:{port} -> {to_host}:{to_port}", flush=True)
        async with server:
            await stop.wait()

    asyncio.run(main())


# --- CLI --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="controlplane/cluster.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="start the cluster (or check the running one)")
    p.add_argument(
        "--no-operator", action="store_true", help="do not run the rayship operator (stop it if it runs)"
    )
    p.add_argument("--no-node", action="store_true", help="without the real node real-0 (kwok nodes only)")
    sub.add_parser("down", help="stop everything and remove the netns and cluster data")
    sub.add_parser("status", help="what runs, as JSON")
    p = sub.add_parser("operator", help="start or stop the rayship operator alone")
    p.add_argument("action", choices=("start", "stop"))
    p = sub.add_parser("provisioner", help=argparse.SUPPRESS)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--volumes", type=Path, required=True)
    p = sub.add_parser("api-forward", help=argparse.SUPPRESS)
    p.add_argument("--listen", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--to", type=int, required=True)
    p.add_argument("--to-host", default="127.0.0.1")
    args = parser.parse_args(argv)
    if args.command == "up":
        try:
            cluster = up(operator=not args.no_operator, node=not args.no_node)
        except ChartError:
            log(
                "the cluster is up, but the rayship chart did not install (see above); `make cluster-down` stops it"
            )
            return 1
        if cluster.operator:
            log(f"rayship operator: pid {cluster.operator.pid}, log {cluster.operator.log_path}")
        log(f"ready: kubectl --kubeconfig {cluster.kubeconfig} get nodes")
    elif args.command == "down":
        down()
    elif args.command == "status":
        print(json.dumps(status(), indent=2))
    elif args.command == "operator":
        if args.action == "start":
            handle = start_operator()
            log(f"rayship operator: pid {handle.pid}, log {handle.log_path}")
        else:
            stop_operator()
    elif args.command == "provisioner":
        provisioner(args.kubeconfig, args.volumes)
    elif args.command == "api-forward":
        api_forward(args.listen, args.port, args.to, args.to_host)
    return 0


if __name__ == "__main__":
    sys.exit(main())
