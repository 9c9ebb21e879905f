"""A kind cluster on this host, KubeRay and rayship installed as users install them (`make kind-up`,
`make kind-down`).

    python3 controlplane/kindcluster.py up      # dockerd, `kind create cluster`, images, KubeRay, the chart
    python3 controlplane/kindcluster.py down    # `kind delete cluster`, dockerd stopped, host checked
    python3 controlplane/kindcluster.py env     # KUBECONFIG=... for a shell

What runs where:
- kind (v0.33.0, controlplane/go/kind) drives a dockerd of its own: Debian's dockerd 20.10 (with its
  own containerd) in the network namespace NETNS and a private mount namespace, its state in the cache.
  Its `kind` bridge, iptables rules and the node container's mounts live and die in those namespaces;
  a veth pair links NETNS to the host (HOST_IP <-> NS_IP), and kind publishes the API server on NS_IP.
- Its default runtime is controlplane/kind-runc (runc, less the capabilities root here lacks: Debian's
  dockerd asks for all of them under --privileged).
- /usr/lib is overlaid in that mount namespace: kind mounts /lib/modules into the node, and dockerd
  would otherwise create that folder on the host (it has none).
- The node image is controlplane/kindnode.py's (built here, cached by content hash); the cluster is
  made with kind's own `kind create cluster`, on cgroup v1 (`failCgroupV1: false`), with containerd's
  `restrict_oom_score_adj` (root here may not lower a process's OOM score), the bridge CNI baked into
  the image (`disableDefaultCNI`). Storage: make_claim_volume() makes a hostPath PersistentVolume
  reserved for a claim (kind's local-path provisioner is an image from Docker Hub).
- The operator and workload images reach the node's containerd from the registry `make images` pushes
  to (a TCP forwarder on HOST_IP to it, while they are pulled): only the layers the node lacks move.
  KubeRay's operator image is its v1.6.2 binary (controlplane/go/kuberay) on an empty base, loaded
  with `kind load image-archive`; it runs as a Deployment from KubeRay's own kustomize manifests
  (config/rbac, config/manager of the pinned module), with the v1.7.0 CRDs.
- rayship is `helm install`ed from charts/rayship.

`down` leaves the host as it was: no process, mount, cgroup, network namespace, veth or sysctl change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane import build, kindnode
from controlplane.config import CHART, KUBERAY_CRDS, RAYSHIP_NAMESPACE, RAYSHIP_RELEASE, ROOT, VENV_BIN
from controlplane.oci import file_layer, oci_archive
from controlplane.processes import run_command
from images.dockerd import DOCKER, Docker
from images.processes import BuildError, group_members, processes_mentioning

CLUSTER = "rayship"
NODE = f"{CLUSTER}-control-plane"  # kind's name for the one node
NETNS = "rayship-kind"
VETH_HOST, VETH_NS = "rs-kind0", "rs-kind1"
HOST_IP, NS_IP = "169.254.245.1", "169.254.245.2"  # a /30 between the host and NETNS
API_PORT = 6443
REGISTRY_FORWARD_PORT = 29183  # HOST_IP:29183 -> the image registry on 127.0.0.1, while images load
CGROUP = "rayship-kind"
STATE_DIR = Path(os.environ.get("RAYSHIP_KIND_DIR") or ROOT / ".kind")
KUBECONFIG = STATE_DIR / "kubeconfig"
KUBERAY_IMAGE = "rayship.local/kuberay-operator:v1.6.2"
KUBERAY_NAMESPACE = "kuberay-system"
RUNTIME = Path(__file__).resolve().parent / "kind-runc"


# Host-wide kernel settings a privileged node could rewrite: the kubelet's, and those Debian's
# sysctl.d files set at boot. `up` records them before anything starts; `down` says any that changed.
HOST_SETTINGS = (
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes", "fs/protected_hardlinks", "fs/protected_symlinks", "fs/protected_regular",
    "fs/protected_fifos", "kernel/pid_max",
)  # fmt: skip


def host_settings() -> dict[str, str]:
    return {key: (Path("/proc/sys") / key).read_text().strip() for key in HOST_SETTINGS}


def log(message: str) -> None:
    print(f"kind: {message}", flush=True)


def cache_root() -> Path:
    return kindnode.cache_root()


# --- pure: what kind and the cluster are given -------------------------------------------------------
def kind_config() -> str:
    """kind's cluster configuration (YAML is JSON): one node, the API server on NS_IP."""
    # this host has cgroup v1 only: the kubelet refuses it unless told not to
    kubelet = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
    }
    config = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": CLUSTER,
        "networking": {
            "apiServerAddress": NS_IP,
            "apiServerPort": API_PORT,
            "disableDefaultCNI": True,  # the node image's bridge configuration
            "podSubnet": kindnode.POD_SUBNET,
            "serviceSubnet": kindnode.SERVICE_SUBNET,
            "kubeProxyMode": "nftables",  # as on the real node (controlplane/node.py)
        },
        "nodes": [{"role": "control-plane"}],
        "kubeadmConfigPatches": [kindnode.image_tags(), json.dumps(kubelet)],
        "containerdConfigPatches": [
            # root here may not lower an OOM score (restrict_oom_score_adj of the real node, too)
            '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n'
        ],
    }
    return json.dumps(config, indent=2) + "\n"


def chart_values(workload_image: str) -> dict:
    """What `helm install` is given beyond the chart's defaults on kind: the images are in the node's
    containerd (never pulled by the kubelet), Ray pods default to the CPU workload image and request
    CPU without a limit (a 2-CPU node: a worker importing torch capped at its fraction starves)."""
    return {
        "image": {"pullPolicy": "Never"},
        "defaults": {"workloadImage": workload_image, "cpuLimits": False},
    }


def claim_volume(namespace: str, claim: str, gib: int = 5) -> dict:
    """A hostPath PersistentVolume on the node's /var, reserved for one claim (claimRef). kind's
    local-path provisioner is an image from Docker Hub; the fallback StorageClass kind then installs
    (`standard`, kube-controller-manager's host-path provisioner) makes root-owned folders inside the
    controller manager's own container, and the Ray pods' user cannot write there: a job on such a
    claim failed "PermissionError: [Errno 13] Permission denied: '/mnt/checkpoints/...'"."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"kind-{namespace}-{claim}", "labels": {"app.kubernetes.io/part-of": "rayship"}},
        "spec": {
            "capacity": {"storage": f"{gib}Gi"},
            "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "standard",
            "claimRef": {"namespace": namespace, "name": claim},
            "hostPath": {"path": volume_path(namespace, claim), "type": "Directory"},
        },
    }


def volume_path(namespace: str, claim: str) -> str:
    return f"/var/local/rayship-volumes/{namespace}/{claim}"


# --- the private dockerd ------------------------------------------------------------------------------
def docker() -> Docker:
    """images.dockerd.Docker with a network: in NETNS, a bridge and iptables rules of its own there, IP forwarding (NETNS's own setting),
    kind-runc as its default runtime, /usr/lib overlaid in its mount namespace."""
    daemon = Docker(cache_root() / "d")  # short: unix socket paths under it
    daemon.cgroup = CGROUP
    # nsenter, not `ip netns exec`: that mounts a fresh /sys in a mount namespace of its own, hiding the
    # cgroup hierarchies under /sys/fs/cgroup ("failed to start daemon: Devices cgroup isn't mounted")
    daemon.prefix = ["nsenter", f"--net=/run/netns/{NETNS}"]
    daemon.network_flags = []
    daemon.daemon_settings = {
        "runtimes": {"rayship-runc": {"path": str(RUNTIME)}},
        "default-runtime": "rayship-runc",
    }
    overlay = cache_root() / "usr-lib"
    daemon.setup = [
        f"mkdir -p {overlay}/upper {overlay}/work",
        f"mount -t overlay -o lowerdir=/usr/lib,upperdir={overlay}/upper,workdir={overlay}/work rayship-kind /usr/lib",
    ]
    return daemon


# --- state ----------------------------------------------------------------------------------------------
def _state_file() -> Path:
    return STATE_DIR / "state.json"


def load_state() -> dict:
    path = _state_file()
    return json.loads(path.read_text()) if path.exists() else {}


def save_state(state: dict) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    _state_file().write_text(json.dumps(state, indent=2) + "\n")


def _alive(pgid: int | None) -> bool:
    """Whether a process of the group still runs. Not a zombie: where `up` ran in this process (the
    kind tier's fixture), dockerd is its child and stays one, unreaped, after it exits, and a
    `killpg(pgid, 0)` that counted it made `down` wait its whole minute for a process already gone."""
    return bool(pgid) and bool(group_members(pgid))


def is_up() -> bool:
    """Whether `up` finished and its dockerd still runs."""
    state = load_state()
    return bool(state.get("up")) and _alive(state.get("dockerd_pgid")) and KUBECONFIG.exists()


def env() -> dict[str, str]:
    """What kind, docker and kubectl run with: the private dockerd, the cluster's kubeconfig, the
    project's helm and kubectl first on PATH."""
    daemon = docker()
    return {
        **daemon.env,
        "KUBECONFIG": str(KUBECONFIG),
        "PATH": f"{VENV_BIN}:{Path(DOCKER).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "KIND_EXPERIMENTAL_PROVIDER": "docker",
        "HELM_CACHE_HOME": str(STATE_DIR / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(STATE_DIR / "helm" / "config"),
        "HELM_DATA_HOME": str(STATE_DIR / "helm" / "data"),
    }


def run(argv: list[str], what: str, input: str | None = None, timeout: float = 600) -> str:
    done = subprocess.run(argv, env=env(), capture_output=True, text=True, input=input, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"{what} failed ({done.returncode}): {(done.stdout + done.stderr).strip()[-3000:]}"
        )
    return done.stdout


def kind_binary() -> str:
    return str(build.binaries()["kind"])


def kubectl(*args: str, input: str | None = None, timeout: float = 300) -> str:
    return run(
        [str(VENV_BIN / "kubectl"), *args], f"kubectl {' '.join(args[:3])}", input=input, timeout=timeout
    )


def node_exec(*args: str, timeout: float = 900) -> str:
    return run([DOCKER, "exec", NODE, *args], f"docker exec {NODE} {' '.join(args[:4])}", timeout=timeout)


# --- the network namespace ------------------------------------------------------------------------------
def ensure_netns(state: dict) -> None:
    from controlplane.config import NETNS_DIR
    from controlplane.network import link_netns, note_netns_dir

    if "made_netns_dir" not in state:
        made_dir, made_mount = note_netns_dir(Path(NETNS_DIR))  # `ip netns add` makes them for good
        state.update(made_netns_dir=made_dir, made_netns_mount=made_mount)
    state["netns"] = True
    save_state(state)
    link_netns(NETNS, VETH_HOST, VETH_NS, HOST_IP, NS_IP)


def remove_netns(state: dict) -> list[str]:
    from controlplane.config import NETNS_DIR
    from controlplane.network import release_netns_dir

    done = []
    if run_command(["ip", "link", "del", VETH_HOST], check=False).returncode == 0:
        done.append(f"veth {VETH_HOST}")
    if NETNS in run_command(["ip", "netns", "list"], check=False).stdout.split():
        run_command(["ip", "netns", "del", NETNS])
        done.append(f"netns {NETNS}")
    made_dir = bool(state.get("made_netns_dir"))
    for problem in release_netns_dir(
        Path(NETNS_DIR), made_dir=made_dir, made_mount=made_dir or bool(state.get("made_netns_mount"))
    ):
        log(problem)
    return done


def make_claim_volume(namespace: str, claim: str, gib: int = 5) -> None:
    """claim_volume() and its folder on the node (writable by the pods' users), before the claim is
    made: the PersistentVolume controller then binds the claim to it, not to a provisioned one."""
    path = volume_path(namespace, claim)
    node_exec("mkdir", "-p", path)
    node_exec("chmod", "0777", path)
    kubectl("apply", "-f", "-", input=json.dumps(claim_volume(namespace, claim, gib)))


# --- up -------------------------------------------------------------------------------------------------
def kuberay_archive() -> Path:
    """KubeRay's operator image: its v1.6.2 binary as /manager (KubeRay's Dockerfile: an empty-ish
    base, USER 65532), an OCI archive cached by the binary's build folder (which carries its hash)."""
    binary = build.binaries()["ray-operator"]
    key = binary.parent.parent.name
    archive = cache_root() / f"kuberay-operator-{key}.tar"
    if not archive.exists():
        layer = file_layer({"manager": (binary.read_bytes(), 0o755)})
        partial = archive.with_suffix(".partial")
        partial.write_bytes(
            oci_archive(KUBERAY_IMAGE, [layer], {"Entrypoint": ["/manager"], "User": "65532:65532"})
        )
        partial.rename(archive)
    return archive


def kuberay_manifests(workdir: Path) -> str:
    """KubeRay's own kustomize manifests (config/rbac and config/manager of the pinned module) with
    its operator image set to ours, in KUBERAY_NAMESPACE (`kubectl kustomize`)."""
    source = build.module_dir("kuberay", "github.com/ray-project/kuberay/ray-operator") / "config"
    for part in ("rbac", "manager"):
        shutil.copytree(source / part, workdir / part)
        for path in (workdir / part).rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)  # the module cache's copies are read-only
    repository, tag = KUBERAY_IMAGE.rsplit(":", 1)
    (workdir / "kustomization.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": KUBERAY_NAMESPACE,
                "resources": ["rbac", "manager"],
                "images": [{"name": "kuberay/operator", "newName": repository, "newTag": tag}],
            }
        )  # fmt: skip
    )
    return kubectl("kustomize", str(workdir))


def install_kuberay() -> None:
    started = time.monotonic()
    run(
        [kind_binary(), "load", "image-archive", "--name", CLUSTER, str(kuberay_archive())],
        "kind load image-archive",
    )
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(KUBERAY_CRDS))
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUBERAY_NAMESPACE}}),
    )
    with tempfile.TemporaryDirectory(prefix="kuberay-", dir=STATE_DIR) as workdir:
        kubectl("apply", "-f", "-", input=kuberay_manifests(Path(workdir)))
    kubectl(
        "-n",
        KUBERAY_NAMESPACE,
        "rollout",
        "status",
        "deployment/kuberay-operator",
        "--timeout=180s",
        timeout=200,
    )
    log(f"KubeRay v1.6.2 (CRDs v1.7.0) running in {time.monotonic() - started:.0f}s")


def load_product_images() -> dict[str, str]:
    """The operator and workload images into the node's containerd, pulled from the registry `make
    images` pushes to (through a forwarder on HOST_IP): only the layers the node lacks move."""
    from images import build as images

    digests = images.ensure_built(log=log)
    forwarder = None
    with images.registry_served(log) as host:
        port = int(host.rsplit(":", 1)[1])
        forwarder = subprocess.Popen(
            [sys.executable, "-c", "import sys; from controlplane.network import api_forward; "
             f"api_forward({HOST_IP!r}, {REGISTRY_FORWARD_PORT}, {port})"],
            cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            for ref, digest in digests.items():
                started = time.monotonic()
                source = images.registry_ref(f"{HOST_IP}:{REGISTRY_FORWARD_PORT}", ref, digest)
                for attempt in range(50):  # the forwarder's listening socket may be a moment away
                    try:
                        node_exec("ctr", "-n", "k8s.io", "images", "pull", "--plain-http", source)
                        break
                    except RuntimeError:
                        if attempt == 49 or forwarder.poll() is not None:
                            raise
                        time.sleep(0.2)
                node_exec("ctr", "-n", "k8s.io", "images", "tag", "--force", source, ref)
                node_exec("ctr", "-n", "k8s.io", "images", "rm", source)
                log(f"pulled {ref} into {NODE} in {time.monotonic() - started:.0f}s")
        finally:
            os.killpg(forwarder.pid, signal.SIGTERM)
            forwarder.wait(timeout=10)
    return digests


def install_rayship() -> None:
    from controlplane.config import WORKLOAD_IMAGE_CPU
    from rayship import __version__

    started = time.monotonic()
    values = STATE_DIR / "rayship-values.json"
    values.write_text(json.dumps(chart_values(WORKLOAD_IMAGE_CPU.format(version=__version__))))
    run(
        [str(VENV_BIN / "helm"), "upgrade", "--install", RAYSHIP_RELEASE, str(CHART), "-n", RAYSHIP_NAMESPACE,
         "--create-namespace", "--wait", "--timeout", "180s", "--values", str(values)],
        "helm install rayship", timeout=240,
    )  # fmt: skip
    log(f"rayship's chart installed in {time.monotonic() - started:.0f}s")


def up() -> None:
    started = time.monotonic()
    state = load_state()
    if is_up():
        log(f"already up (dockerd pgid {state['dockerd_pgid']}); KUBECONFIG={KUBECONFIG}")
        return
    if state:
        log("a kind cluster was left half up: taking it down first")
        down()
        state = {}
    build.ensure_built(log)
    archive = kindnode.ensure_built(log)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state["host_settings"] = host_settings()  # before anything of the cluster runs
    ensure_netns(state)
    daemon = docker()
    try:
        daemon.start(log)
    except Exception:
        daemon.stop(log)  # its containerd too: a second start would find it holding the socket
        raise
    assert daemon.process is not None
    state["dockerd_pgid"] = daemon.process.pid
    save_state(state)
    ref = kindnode.image_ref()
    if not daemon.has_image(ref):
        t = time.monotonic()
        run([DOCKER, "load", "-i", str(archive)], "docker load of the node image")
        log(f"node image {ref} loaded in {time.monotonic() - t:.0f}s")
    for older in daemon.docker(
        "images", "-q", "--filter", f"reference={kindnode.IMAGE.split(':')[0]}"
    ).stdout.split():
        if older not in daemon.docker("images", "-q", ref).stdout.split():  # the builds before this one
            daemon.docker("image", "rm", "--force", older)
    config = STATE_DIR / "kind-config.json"
    config.write_text(kind_config())
    t = time.monotonic()
    run(
        [kind_binary(), "create", "cluster", "--name", CLUSTER, "--image", ref, "--config", str(config),
         "--kubeconfig", str(KUBECONFIG), "--wait", "180s", "--retain"],
        "kind create cluster", timeout=400,
    )  # fmt: skip
    log(f"kind create cluster: {time.monotonic() - t:.0f}s")
    install_kuberay()
    load_product_images()
    install_rayship()
    state["up"] = True
    save_state(state)
    log(f"up in {time.monotonic() - started:.0f}s; KUBECONFIG={KUBECONFIG}")


# --- down -----------------------------------------------------------------------------------------------
def down() -> list[str]:
    """Delete the cluster, stop dockerd, remove the network namespace; returns what is left on the
    host, and the host-wide kernel settings that differ from before `up` (empty: all as before)."""
    state = load_state()
    pgid = state.get("dockerd_pgid")
    daemon = docker()
    if _alive(pgid):
        done = subprocess.run(
            [kind_binary(), "delete", "cluster", "--name", CLUSTER, "--kubeconfig", str(KUBECONFIG)],
            env=env(), capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        log(f"kind delete cluster: {(done.stdout + done.stderr).strip().splitlines()[-1:]}")
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while _alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
    if pgid:
        daemon.check_stopped(pgid, log)
    removed = remove_netns(state)
    if removed:
        log(f"removed {', '.join(removed)}")
    shutil.rmtree(cache_root() / "usr-lib", ignore_errors=True)
    for path in (KUBECONFIG, _state_file()):
        path.unlink(missing_ok=True)
    now = host_settings()
    changed = [f"sysctl {k.replace('/', '.')} {v} (was {state['host_settings'][k]} before up)"
               for k, v in now.items() if k in state.get("host_settings", {}) and state["host_settings"][k] != v]  # fmt: skip
    return leftovers() + changed


def leftovers() -> list[str]:
    """What of a kind cluster is still on the host: processes, mounts, cgroups, netns, veth."""
    from images.processes import cgroup_folders

    found = [f"process {pid}" for pid in processes_mentioning(str(cache_root() / "d" / "run"))]
    found += [f"mount {line.split()[1]}" for line in Path("/proc/mounts").read_text().splitlines()
              if str(cache_root()) in line or "rayship-kind" in line]  # fmt: skip
    found += [f"cgroup {path}" for path in cgroup_folders(CGROUP)]
    if NETNS in run_command(["ip", "netns", "list"], check=False).stdout.split():
        found.append(f"netns {NETNS}")
    if run_command(["ip", "link", "show", VETH_HOST], check=False).returncode == 0:
        found.append(f"veth {VETH_HOST}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "env", "leftovers"))
    parser.add_argument("--check", action="store_true", help="down: exit 1 if anything is left on the host")
    parser.add_argument(
        "--started-file",
        type=Path,
        help="up: write this file if this call starts the cluster (not when one is up): `make test` takes "
        "down only a cluster it started",
    )
    args = parser.parse_args(argv)
    try:
        return _command(args)
    except (RuntimeError, BuildError, OSError, subprocess.SubprocessError) as err:
        # a step that failed (a tool's own output, a process that did not start), said without a
        # traceback; what `up` started is left for `kind-down`, which takes a half-up cluster down
        print(f"kind: {args.command} failed: {err}", file=sys.stderr)
        if args.command == "up":
            print("kind: `make kind-down` takes down what was started", file=sys.stderr)
        return 1


def _command(args: argparse.Namespace) -> int:
    if args.command == "up":
        if args.started_file and not is_up():
            # Before `up`: one that fails half-way leaves a cluster that is ours to take down.
            args.started_file.write_text("started by `controlplane/kindcluster.py up --started-file`\n")
        up()
    elif args.command == "down":
        left = down()
        for item in left:
            log(f"left on the host: {item}")
        if left and args.check:
            return 1
    elif args.command == "env":
        for key in ("KUBECONFIG", "DOCKER_HOST"):
            print(f"export {key}={env()[key]}")
    else:
        for item in leftovers():
            print(item)
    return 0


if __name__ == "__main__":
    sys.exit(main())
