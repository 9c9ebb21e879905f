"""The real node real-0 in the cluster's life (its plan and files: `controlplane/node.py`): start it,
import the images it runs, stop it and remove what it made."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from controlplane import build
from controlplane import node as realnode
from controlplane.certs import cert_kubeconfig
from controlplane.components import venv_python
from controlplane.config import (
    ADVERTISE_IP,
    API_FORWARD_PORT,
    HERE,
    LINK_HOST_IP,
    NETNS,
    NETNS_DIR,
    NODE_PROCS,
    POD_CIDR,
    SERVICE_CIDR,
    log,
)
from controlplane.objects import api_client, kubectl_apply
from controlplane.processes import (
    Paths,
    Proc,
    State,
    clean_env,
    run_command,
    save_state,
    spawn_process,
    stop_process,
    wait_until,
)

# --- the real node (controlplane/node.py) -----------------------------------------------------------
NODE_TOOLS = ("containerd", "ctr", "runc", "nft", "iptables", "ipset", "unshare", "nsenter", "gcc")


def node_missing() -> str | None:
    """Why the real node cannot run on this machine, or None."""
    absent = [tool for tool in NODE_TOOLS if shutil.which(tool) is None]
    if not (realnode.CNI_BIN / "bridge").exists():
        absent.append(f"{realnode.CNI_BIN}/bridge")
    if absent:
        return f"the real node needs {', '.join(absent)} (`make node-deps` installs them)"
    return None


def node_paths(paths: Paths) -> realnode.NodePaths:
    return realnode.NodePaths(paths.base / "node", build.cache_root().parent / "containerd")


def _ctr(npaths: realnode.NodePaths, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_command(["ctr", "--address", str(npaths.socket), "--namespace", "k8s.io", *args], check=check)


def _node_network() -> None:
    """In NETNS: the node's addresses on lo, the pods' bridge and its route, forwarding on."""
    ns = ["ip", "-n", NETNS]
    for ip in (realnode.NODE_IP, realnode.DNS_IP, ADVERTISE_IP):
        run_command([*ns, "addr", "replace", f"{ip}/32", "dev", "lo"])
    if run_command([*ns, "link", "show", realnode.BRIDGE], check=False).returncode != 0:
        run_command([*ns, "link", "add", realnode.BRIDGE, "type", "bridge"])
    run_command([*ns, "addr", "replace", f"{realnode.GATEWAY}/24", "dev", realnode.BRIDGE])
    run_command([*ns, "link", "set", realnode.BRIDGE, "up"])
    # A unicast route in table `local`, more specific than the /16 there that refuses every pod address.
    run_command([*ns, "route", "replace", realnode.POD_SUBNET, "dev", realnode.BRIDGE, "table", "local"])
    run_command(["ip", "netns", "exec", NETNS, "sysctl", "-qw", "net.ipv4.ip_forward=1"])


def load_images(npaths: realnode.NodePaths, archives: dict[str, Path], built: dict[str, str]) -> None:
    """Put what the node runs into its containerd, whose root outlives the cluster, so that only what
    changed moves: each archive not imported yet (`ctr images import`: the pause image), and each
    product image whose build (`built`: ref -> digest) it lacks, pulled by digest from the registry
    `make images` pushes to. A pull fetches only the blobs containerd lacks and unpacks only the layers
    it has not unpacked: after a source change, the last one (a few MB, not the 6.8 GB an import read)."""
    record = npaths.cache / "imported.json"
    done = json.loads(record.read_text()) if record.exists() else {}
    have = {row[0] for row in _images(npaths)}
    superseded: list[str | None] = []
    pulled_as: list[str] = []
    try:
        for ref, archive in archives.items():
            if done.get(ref) == archive.name and ref in have:
                continue
            started = time.monotonic()
            old = _digest(npaths, ref)
            _ctr(npaths, "images", "import", str(archive))  # ref now names the new build
            if old != _digest(npaths, ref):  # the same build imported again replaces nothing
                superseded.append(old)
            done[ref] = archive.name
            record.write_text(json.dumps(done, indent=2))
            log(
                f"imported {ref} ({archive.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - started:.0f}s"
            )
        current = image_digests(npaths)
        wanted = {ref: digest for ref, digest in built.items() if current.get(ref) != digest}
        if wanted:
            from images import build as images

            with images.registry_served(log) as host:
                for ref, digest in wanted.items():
                    started = time.monotonic()
                    old, source = current.get(ref), images.registry_ref(host, ref, digest)
                    _ctr(npaths, "images", "pull", "--plain-http", source)
                    pulled_as.append(source)
                    _ctr(npaths, "images", "tag", "--force", source, ref)  # ref now names the new build
                    superseded.append(old)
                    log(f"pulled {ref} ({digest}) in {time.monotonic() - started:.0f}s")
    finally:
        # Only once every image has unpacked (or one failed: the builds replaced so far are still
        # dropped, not left behind): dropping a build starts containerd's garbage collector, and a
        # collection running while the next archive unpacks removed a parent snapshot that import had
        # just found unpacked ("failed to prepare extraction snapshot ...: parent snapshot sha256:...
        # does not exist: not found", the clean-clone CI of 352d649).
        if pulled_as:
            _ctr(npaths, "images", "rm", *pulled_as)  # the registry's names: ref names each build
        for digest in superseded:
            _drop_superseded(npaths, digest)


def image_digests(npaths: realnode.NodePaths) -> dict[str, str]:
    """Each name in the node's containerd -> the digest of the manifest it names."""
    return {row[0]: row[2] for row in _images(npaths) if len(row) > 2}


def _images(npaths: realnode.NodePaths) -> list[list[str]]:
    return [line.split() for line in _ctr(npaths, "images", "ls").stdout.splitlines()[1:] if line.split()]


def _digest(npaths: realnode.NodePaths, ref: str) -> str | None:
    return image_digests(npaths).get(ref)


def _drop_superseded(npaths: realnode.NodePaths, digest: str | None) -> None:
    """After a new build of an image is imported: remove the build it replaced (`digest`), under every
    name still on it (the kubelet's CRI adds its ID, `sha256:...`, as a name too), so that containerd's
    garbage collector frees what only it used. Kept, each rebuild of the workload image left ~13 GB
    behind in the cache (content and the unpacked snapshot) until the disk was full. Removed only
    after the import, so that the layers both builds share (all but the last, when only our source
    changed) stay unpacked and the import unpacks the new layer alone."""
    names = [row[0] for row in _images(npaths) if digest is not None and len(row) > 2 and row[2] == digest]
    if names:
        _ctr(npaths, "images", "rm", "--sync", *names)


def node_images(npaths: realnode.NodePaths) -> tuple[dict[str, Path], dict[str, str]]:
    """What `load_images` loads: the pause image's archive, and the product images' builds (`make
    images`, built if missing) by ref -> digest."""
    from images import build as images

    return {realnode.PAUSE_REF: realnode.pause_archive(npaths.cache / "pause")}, images.ensure_built(log=log)


def _node_files(paths: Paths, npaths: realnode.NodePaths) -> dict[str, Path]:
    """The node's folder, made anew with its components' configuration files; returns their
    kubeconfigs (client certificates, the API server as NETNS reaches it) by component."""
    shutil.rmtree(npaths.base, ignore_errors=True)
    for folder in ("cni-conf", "cni-ipam", "pod-logs", *realnode.BOUND.values()):
        (npaths / folder).mkdir(parents=True, exist_ok=True)
    npaths.containerd_root.mkdir(parents=True, exist_ok=True)
    (npaths / "resolv.conf").write_text(f"nameserver {realnode.DNS_IP}\n")
    (npaths / "containerd.toml").write_text(realnode.containerd_config(npaths))
    (npaths / "cni-conf" / "10-rayship.conflist").write_text(json.dumps(realnode.cni_config(npaths)))
    (npaths / "kubelet.json").write_text(json.dumps(realnode.kubelet_config(npaths, paths.pki)))
    link_server = f"https://{LINK_HOST_IP}:{API_FORWARD_PORT}"
    kcs = {
        who: cert_kubeconfig(paths, who, link_server)
        for who in ("kubelet", "kube-proxy", "coredns", "netpol")
    }
    (npaths / "kube-proxy.json").write_text(
        json.dumps(realnode.kube_proxy_config(kcs["kube-proxy"], POD_CIDR))
    )
    (npaths / "Corefile").write_text(realnode.corefile(kcs["coredns"]))
    return kcs


def start_node(paths: Paths, state: State, bins: dict[str, Path]) -> None:
    """containerd, the kubelet (node real-0), kube-proxy, CoreDNS, the in-namespace API forwarder and
    the NetworkPolicy engine (kube-router's firewall)."""
    why = node_missing()
    if why:
        raise RuntimeError(why)
    npaths = node_paths(paths)
    archives, built = node_images(npaths)
    kcs = _node_files(paths, npaths)
    kubectl_apply(paths, realnode.rbac_objects())
    _node_network()
    realnode.make_cgroups()
    for target in realnode.mount_points():
        Path(target).mkdir(parents=True)
        state.made_dirs.append(target)
    save_state(state, paths)

    def spawn(name: str, argv: list[str]) -> Proc:
        proc = spawn_process(name, argv, paths, clean_env(paths))
        state.procs[name] = proc
        save_state(state, paths)
        return proc

    # nsenter, not `ip netns exec`: that one mounts a new /sys, without the cgroup hierarchies.
    in_ns = ["nsenter", f"--net=/run/netns/{NETNS}"]
    containerd = spawn("containerd", [
        *in_ns, "unshare", "--mount", "--propagation", "private",
        venv_python(), str(HERE / "node.py"), "enter", str(npaths.base), "--",
        "containerd", "--config", str(npaths / "containerd.toml"),
    ])  # fmt: skip
    wait_until("containerd", lambda: _ctr(npaths, "version", check=False).returncode == 0, 60, containerd)
    load_images(npaths, archives, built)
    kubelet = spawn("kubelet", [
        "nsenter", f"--mount=/proc/{containerd.pid}/ns/mnt", f"--net=/run/netns/{NETNS}",
        str(bins["kubelet"]), f"--config={npaths / 'kubelet.json'}", f"--kubeconfig={kcs['kubelet']}",
        f"--hostname-override={realnode.NAME}", f"--node-ip={realnode.NODE_IP}",
        f"--root-dir={npaths.kubelet_root}", f"--node-labels={'='.join(realnode.LABEL)}", "--v=1",
    ])  # fmt: skip
    spawn("kube-proxy", [*in_ns, str(bins["kube-proxy"]), f"--config={npaths / 'kube-proxy.json'}", "--v=1"])
    spawn("coredns", [*in_ns, str(bins["coredns"]), "-conf", str(npaths / "Corefile")])
    spawn("node-api-forward", [
        *in_ns, venv_python(), str(HERE / "cluster.py"), "api-forward", "--listen", ADVERTISE_IP,
        "--port", str(state.ports["apiserver"]), "--to-host", LINK_HOST_IP, "--to", str(API_FORWARD_PORT),
    ])  # fmt: skip
    client = api_client(paths.kubeconfig)
    wait_until(f"node {realnode.NAME} Ready", lambda: _node_ready(client, realnode.NAME), 120, kubelet)
    # after the node is registered: kube-router looks its node up once, at start
    netpol = spawn(
        "netpol", [*in_ns, *realnode.policy_engine_argv(bins["kube-router"], kcs["netpol"], SERVICE_CIDR)]
    )

    def synced() -> bool:
        return "sync iptables took" in Path(netpol.log).read_text(errors="replace")

    wait_until("kube-router's first NetworkPolicy sync", synced, 60, netpol)


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


def stop_node(paths: Paths, state: State) -> list[str]:
    """Stop the node's processes, remove its containers (with containerd still up), then kill what
    is left in its cgroups, remove those and the mount points `up` made. Harmless when none runs."""
    npaths = node_paths(paths)
    stopped = []
    for name in reversed(NODE_PROCS):
        proc = state.procs.pop(name, None)
        if proc is None:
            continue
        if proc.alive():
            stopped.append(f"{name} (pgid {proc.pid})")
            if name == "containerd":
                _remove_containers(npaths)
        stop_process(proc)
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
