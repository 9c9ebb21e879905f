"""The real node `real-0`: containerd, a real kubelet, kube-proxy, CoreDNS and a NetworkPolicy
engine (`make cluster-up`).

Beside the kwok nodes (which stay for placement: GPUs cannot be real here), `real-0` runs real pods
from real images: containerd (Debian's, with runc and the CNI plugins) and the kubelet and kube-proxy
built from the same k8s.io/kubernetes module as the control plane. Everything of the node lives in
the pod network's namespace (controlplane/cluster.py's NETNS), so whatever it adds to the network
(the bridge, the kubelet's and kube-proxy's rules) goes when that namespace is removed:

    10.244.0.14      the node's InternalIP (on lo there): the kubelet listens on :10250
    10.244.0.10      cluster DNS: CoreDNS, a process bound there (no image, no Service of its own)
    10.244.0.1:<apiserver port>   the `kubernetes` Service's endpoint (the API server's advertise
                     address): a forwarder to the host's LINK_HOST_IP:443, which forwards to
                     127.0.0.1:<apiserver port>
    10.244.4.0/24    real-0's pods, on the bridge rs-cni0 (10.244.4.1), a unicast route in table
                     `local` (more specific than the /16 that refuses every other pod address)

The NetworkPolicy engine is kube-router's firewall: iptables chains and ipsets in that namespace, built
from the policies, filter what reaches or leaves a pod they select (bridged packets pass netfilter:
bridge-nf-call-iptables, on by default). kube-network-policies (kind's engine) was tried first: its
rules need nftables' `queue` expression, which this kernel lacks ("netlink receive: no such file or
directory" at every sync).

containerd and the kubelet share one private mount namespace (`unshare --mount --propagation
private`): every mount they make (overlay root filesystems, volumes, pod network namespaces) dies
with it, and the kernel settings the kubelet would rewrite (KUBELET_SYSCTLS) are masked by bind
mounts of files holding their current values. Paths that the kubelet and containerd hard-code
(/run/containerd, /run/netns, /var/lib/cni, /var/log/containers) are bound to folders of the node
there. Their cgroups live under CGROUP_ROOT in every cgroup v1 hierarchy and are removed at `down`.

containerd's root (the images) is kept in the build cache between clusters; its containers are
removed at `down`. This module holds the node's plan, its configuration files (pure builders) and
the host steps that need no Kubernetes client; controlplane/cluster.py starts and stops it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

# --- the plan ---------------------------------------------------------------------------------------
NAME = "real-0"
NODE_IP = "10.244.0.14"
DNS_IP = "10.244.0.10"
POD_SUBNET = "10.244.4.0/24"
GATEWAY = "10.244.4.1"
BRIDGE = "rs-cni0"
# Only pods that tolerate it run here; the rest keep landing on the kwok nodes as before.
TAINT = {"key": "rayship.dev/real-node", "value": "true", "effect": "NoSchedule"}
LABEL = ("rayship.dev/node", "real")
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"], "effect": TAINT["effect"]}
CGROUP_ROOT = "rayship-node"
PAUSE_REF = "localhost/rayship/pause:3.10.1"
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
CLUSTER_DOMAIN = "cluster.local"

# What the kubelet writes at start unless protectKernelDefaults (pkg/kubelet/cm setupKernelTunables):
# host-wide settings, so each is masked in its mount namespace.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Hard-coded paths -> the node folder bound over each in the private mount namespace.
BOUND = {
    "/run/containerd": "containerd-run",  # the shims' sockets (/run/containerd/s) are not configurable
    "/run/netns": "netns",  # the pods' network namespaces
    "/var/lib/cni": "cni-cache",  # libcni's result cache
    "/var/log/containers": "container-logs",  # the kubelet's log symlinks
}


@dataclass(frozen=True)
class NodePaths:
    """The node's folders under the cluster's state folder, and the persistent containerd root."""

    base: Path  # .cluster/node
    cache: Path  # ~/.cache/rayship/containerd

    @property
    def containerd_root(self) -> Path:
        return self.cache / "root"

    @property
    def socket(self) -> Path:
        return self.base / BOUND["/run/containerd"] / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.base / "kubelet"

    def __truediv__(self, name: str) -> Path:
        return self.base / name


# --- configuration (pure) ---------------------------------------------------------------------------
def containerd_config(paths: NodePaths) -> str:
    """containerd 1.6 (config version 2): the CRI plugin with runc, cgroupfs, our CNI and pause image."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join(
        [
            "version = 2",
            f'root = "{paths.containerd_root}"',
            'state = "/run/containerd"',
            # no btrfs/zfs/devmapper/aufs here: keep them from probing the host at start
            'disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",'
            ' "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]',
            "[grpc]",
            f'  address = "{paths.socket}"',
            "[ttrpc]",
            f'  address = "{paths.socket}.ttrpc"',
            f"[{cri}]",
            f'  sandbox_image = "{PAUSE_REF}"',
            # No process here has CAP_SYS_RESOURCE: without this every sandbox fails in runc with
            # "can't get final child's PID from pipe: EOF" (it cannot lower the OOM score adjustment).
            "  restrict_oom_score_adj = true",
            "  disable_apparmor = true",
            "  enable_selinux = false",
            f"[{cri}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f"[{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.runc.options]",
            "  SystemdCgroup = false",
            f"[{cri}.cni]",
            f'  bin_dir = "{CNI_BIN}"',
            f'  conf_dir = "{paths / "cni-conf"}"',
            "",
        ]
    )


def cni_config(paths: NodePaths) -> dict:
    """The bridge network of real-0's pods (host-local addresses from POD_SUBNET)."""
    return {
        "cniVersion": "1.0.0",
        "name": "rayship",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,  # nothing leaves this machine; the host routes POD_CIDR back here
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths / "cni-ipam"),
                },
            }
        ],
    }


def kubelet_config(paths: NodePaths, pki: Path) -> dict:
    """KubeletConfiguration for real-0 on this machine (cgroup v1, cgroupfs, no swap accounting)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "address": NODE_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(pki / "kubelet.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [DNS_IP],
        "resolvConf": str(paths / "resolv.conf"),
        "podLogsDir": str(paths / "pod-logs"),
        "registerWithTaints": [TAINT],
        # The images are loaded by `make cluster-up`, never pulled by the kubelet: keep them whatever the disk says.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "200Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": False,
        "protectKernelDefaults": False,
        "nodeStatusUpdateFrequency": "5s",
    }


def kube_proxy_config(kubeconfig: Path, pod_cidr: str) -> dict:
    """kube-proxy in nftables mode, touching no host-wide setting (conntrack left as it is)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NAME,
        "clusterCIDR": pod_cidr,
        "bindAddress": NODE_IP,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        # Pods on one bridge reach each other's Services: without masquerading, the reply of a pod
        # on the same bridge would skip the NAT that the request went through.
        "nftables": {"masqueradeAll": True},
    }


def corefile(kubeconfig: Path) -> str:
    """CoreDNS: the cluster's names only; nothing is forwarded (no resolver leaves this machine)."""
    return (
        f".:53 {{\n    bind {DNS_IP}\n    errors\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        f"        kubeconfig {kubeconfig} rayship-local\n        pods insecure\n"
        "        fallthrough in-addr.arpa ip6.arpa\n    }\n    cache 5\n}\n"
    )


def rbac_objects() -> list[dict]:
    """What the node's components need beyond the bootstrap roles (system:node, system:node-proxier)."""
    meta = {"labels": {"app.kubernetes.io/managed-by": "rayship-cluster"}}
    coredns_rules = [
        {
            "apiGroups": [""],
            "resources": ["endpoints", "services", "pods", "namespaces"],
            "verbs": ["list", "watch"],
        },
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ]  # fmt: skip (CoreDNS's own ClusterRole, system:coredns)

    def binding(name: str, role: str, user: str) -> dict:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, **meta},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }

    def granted(user: str, rules: list[dict]) -> list[dict]:  # a ClusterRole of the user's name, bound
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": user, **meta}, "rules": rules}  # fmt: skip
        return [role, binding(user, user, user)]

    return [
        *granted("rayship:coredns", coredns_rules),
        # kubectl logs/exec/port-forward: the API server's client certificate at the kubelet
        binding(
            "rayship:kube-apiserver-kubelet-client",
            "system:kubelet-api-admin",
            "kube-apiserver-kubelet-client",
        ),
        binding("rayship:kube-proxy", "system:node-proxier", "system:kube-proxy"),
        *granted("rayship:netpol", POLICY_ENGINE_RULES),
    ]


# What kube-router's network policy controller reads (its informers start for all of these, whatever
# it runs), as the user of its client certificate.
_READ = ["get", "list", "watch"]
POLICY_ENGINE_RULES = [
    {
        "apiGroups": [""],
        "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
        "verbs": _READ,
    },
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": _READ},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _READ},
]


def policy_engine_argv(binary: Path, kubeconfig: Path, service_cidr: str) -> list[str]:
    """kube-router as real-0's NetworkPolicy engine only: its firewall (iptables and ipset rules in
    the namespace, which go with it), neither its routing nor its service proxy (kube-proxy's); no
    metrics or health port."""
    return [
        str(binary), "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
        f"--kubeconfig={kubeconfig}", f"--hostname-override={NAME}",
        f"--service-cluster-ip-range={service_cidr}", "--metrics-port=0", "--health-port=0", "--v=1",
    ]  # fmt: skip


# Client (and the kubelet's serving) certificates: name -> (subject, usage, SANs)
CERTIFICATES = {
    "kubelet": (f"/O=system:nodes/CN=system:node:{NAME}", "serverAuth,clientAuth", [f"IP:{NODE_IP}", f"DNS:{NAME}"]),
    "kube-proxy": ("/CN=system:kube-proxy", "clientAuth", []),
    "coredns": ("/CN=rayship:coredns", "clientAuth", []),
    "netpol": ("/CN=rayship:netpol", "clientAuth", []),
    "apiserver-kubelet-client": ("/CN=kube-apiserver-kubelet-client", "clientAuth", []),
}  # fmt: skip


# --- the pause image --------------------------------------------------------------------------------
def pause_archive(cache: Path, ref: str = PAUSE_REF) -> Path:
    """An OCI archive of the pause image, compiled from the pinned module's build/pause/linux/pause.c
    (`gcc -static`, as its Makefile does); cached by the source's hash."""
    from controlplane import build
    from controlplane.oci import file_layer, oci_archive

    source = build.module_dir("kubernetes", "k8s.io/kubernetes") / "build" / "pause" / "linux" / "pause.c"
    code = source.read_bytes()
    archive = cache / f"pause-{hashlib.sha256(code + ref.encode()).hexdigest()[:16]}.tar"
    if archive.exists():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    binary = cache / "pause.bin"
    subprocess.run(
        ["gcc", "-Os", "-Wall", "-Werror", "-static", "-DVERSION=v3.10.1-rayship", "-o", str(binary), str(source)],
        check=True,
    )  # fmt: skip
    tmp = archive.with_suffix(".partial")
    layer = file_layer({"pause": (binary.read_bytes(), 0o755)})
    tmp.write_bytes(oci_archive(ref, [layer], {"Entrypoint": ["/pause"], "User": "65535:65535"}))
    binary.unlink()
    tmp.rename(archive)
    return archive


# --- host steps -------------------------------------------------------------------------------------
def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies: v1's (cpu, memory, pids, ..., and systemd's named one) and, on a
    hybrid host, the unified v2 one (/sys/fs/cgroup/unified): runc makes each container's cgroup there
    too, so the node's tree there must be removed and checked like the others (it was left behind)."""
    found = []
    for line in Path("/proc/mounts").read_text().splitlines():
        _, where, fstype, *_ = line.split()
        if fstype in ("cgroup", "cgroup2"):
            found.append(Path(where))
    return sorted(set(found))


def make_cgroups() -> None:
    """CGROUP_ROOT in every hierarchy (the kubelet wants its cgroupRoot to exist); cpuset needs its
    CPUs and memory nodes copied from the parent before anything can join it."""
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / CGROUP_ROOT
        root.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (root / knob).exists() and not (root / knob).read_text().strip():
                (root / knob).write_text((hierarchy / knob).read_text())


def cgroup_pids() -> set[int]:
    """Every process in the node's cgroups (the containers and their shims' children)."""
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        for procs in (hierarchy / CGROUP_ROOT).rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def remove_cgroups() -> list[str]:
    """rmdir CGROUP_ROOT's tree in every hierarchy, leaves first; what could not be removed."""
    stuck = []
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / CGROUP_ROOT
        if not root.exists():
            continue
        for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(FileNotFoundError):
                d.rmdir()
        try:
            root.rmdir()
        except OSError as err:
            stuck.append(f"{root}: {err.strerror}")
    return stuck


def shim_pids(socket: Path) -> set[int]:
    """containerd's shims for this node (they leave containerd's process group): the ones whose
    command line names this node's containerd socket."""
    pids = set()
    needle = str(socket).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"containerd-shim" in argv[0] and needle in argv:
                pids.add(int(proc.name))
    return pids


def kill_leftovers(socket: Path, timeout: float = 10.0) -> int:
    """SIGKILL the node's containers and shims (once the kubelet and containerd are stopped, nothing
    else stops them); returns how many processes there were."""
    pids = cgroup_pids() | shim_pids(socket)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)
    return len(pids)


def mount_points() -> list[str]:
    """The host paths the private mount namespace binds over that do not exist yet (made by `up`,
    removed by `down` when empty)."""
    return [target for target in BOUND if not Path(target).exists()]


def enter(node_dir: Path, argv: list[str]) -> None:
    """Run inside `unshare --mount --propagation private`: mask KUBELET_SYSCTLS, bind BOUND, exec argv.

    Called as `python controlplane/node.py enter NODE_DIR -- ARGV...` (containerd); the kubelet joins
    this mount namespace afterwards with nsenter.
    """
    masks = node_dir / "sysctl"
    masks.mkdir(exist_ok=True)
    for key in KUBELET_SYSCTLS:
        live = Path("/proc/sys") / key
        mask = masks / key.replace("/", ".")
        mask.write_text(live.read_text())
        subprocess.run(["mount", "--bind", str(mask), str(live)], check=True)
    for target, folder in BOUND.items():
        source = node_dir / folder
        source.mkdir(exist_ok=True)
        subprocess.run(["mount", "--bind", str(source), target], check=True)
    os.execvp(argv[0], argv)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "enter" and argv[2] == "--":
        enter(Path(argv[1]), argv[3:])
    print("usage: node.py enter NODE_DIR -- COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
