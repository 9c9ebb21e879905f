"""The kind node image, built here with no registry (`make kind-up`).

kind needs a node image: systemd, containerd, kubeadm, the kubelet and kubectl, kind's own files (its
entrypoint, units and containerd configuration) and the control plane's images already in the
node's containerd. `kindest/node` is pulled from Docker Hub, which is not reachable here, so this
module makes an equivalent from what the project already builds:

- the root filesystem: mmdebstrap's bookworm minbase with kind's base package list (less what only
  storage e2e tests and rootless kind use: nfs-common, open-iscsi, fuse-overlayfs) plus Debian's
  containerd, runc and CNI plugins (kind compiles newer ones: containerd 2.x, runc 1.4); every Debian
  package of the node and of kube-proxy's image at the version in controlplane/kindnode.lock, and a
  build whose root filesystem holds anything else fails (`--relock` writes the lock anew);
- kind v0.33.0's `images/base/files`, copied from the pinned module and set up as its Dockerfile does
  (units enabled and masked, /sbin/init, /kind/version);
- kubeadm, kubelet and kubectl from the pinned k8s.io/kubernetes (controlplane/build.py);
- the control plane's images under the names `kubeadm config images list` prints for KUBEADM_CONFIG
  (etcd and CoreDNS are this project's pins, 3.6.5 and v1.15.0, so their tags say so): the static
  binary on an empty base, kube-proxy's on a small Debian root filesystem with nft, and the pause
  image compiled from Kubernetes' pause.c under the name kind's containerd configuration asks for;
  imported into the node's containerd store at build time as kind's own builder does
  (`ctr images import --no-unpack --digests`), with the host's containerd (the same Debian build);
- a CNI configuration (the bridge plugin, one node) instead of kindnetd, which kind no longer
  carries in its tree: clusters are made with `networking.disableDefaultCNI: true`;
- host hygiene (RAYSHIP_ENTRYPOINT): the node is a privileged container, so /proc/sys is the host's
  for every setting not namespaced by the network namespace. Before kind's entrypoint runs, the
  settings the kubelet rewrites are masked by node-local files and the rest of /proc/sys is made
  read-only (net/ stays writable: it is the node's own); the sysctl.d files that would rewrite
  kernel-wide settings at boot (Debian's fs.protected_*, kernel.pid_max, ...) are left out, kind's
  two net/ files stay.

The result is a `docker load` archive, cached OUTSIDE the clone by a hash of everything that goes in:

    ${RAYSHIP_CACHE:-~/.cache/rayship}/kind/node-<hash>.tar
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if not __package__:  # run as a script: python3 controlplane/kindnode.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane import build
from controlplane.node import KUBELET_SYSCTLS  # what the kubelet rewrites at start
from controlplane.oci import file_layer, oci_archive

HERE = Path(__file__).resolve().parent
KIND_MODULE = "sigs.k8s.io/kind"
K8S_VERSION = build.K8S_VERSION
ETCD_TAG = "3.6.5-0"  # controlplane/go/etcd pins go.etcd.io/etcd/server/v3 v3.6.5
COREDNS_TAG = "v1.15.0"  # controlplane/go/coredns pins github.com/coredns/coredns v1.15.0
IMAGE = f"rayship.local/kind-node:{K8S_VERSION}"  # the tag gets the content hash appended

DEBIAN_SUITE = "bookworm"
DEBIAN_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# kind's images/base/Dockerfile list, less nfs-common, open-iscsi (storage e2e tests) and
# fuse-overlayfs (rootless), plus the runtime kind builds itself (Debian's: containerd 1.6, runc 1.1,
# the CNI plugins).
# The runtime is pinned to the builds the real node runs (the Makefile's NODE_DEBS; a unit test holds
# them equal): the host's containerd writes the node's image store at build time, so they must match.
RUNTIME_PINS = (
    "containerd=1.6.20~ds1-1+deb12u3", "runc=1.1.5+ds1-1+deb12u1", "containernetworking-plugins=1.1.1+ds1-3+b5",
)  # fmt: skip
NODE_PACKAGES = (
    "systemd", "conntrack", "iptables", "nftables", "iproute2", "ethtool", "util-linux", "mount", "kmod",
    "libseccomp2", "pigz", "e2fsprogs", "bash", "ca-certificates", "curl", "jq", "procps", *RUNTIME_PINS,
)  # fmt: skip
PROXY_PACKAGES = ("nftables", "iptables", "conntrack")  # kube-proxy's image: nft for its nftables mode
# Every Debian package of each root filesystem, name=version: what the named packages above resolved to
# when the lock was written (`python3 controlplane/kindnode.py --relock`), minbase's own included.
LOCK = HERE / "kindnode.lock"
LOCK_SECTIONS = {"node": NODE_PACKAGES, "kube-proxy": PROXY_PACKAGES}
RELOCK = "python3 controlplane/kindnode.py --relock"
MMDEBSTRAP_OPTIONS = (
    "--variant=minbase",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("man", "info", "doc", "locale")),
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
)
POD_SUBNET = "10.245.0.0/16"  # not the local control plane's 10.244/16: both may run at once
SERVICE_SUBNET = "10.97.0.0/16"
# The node's only CNI configuration: Debian's bridge, host-local and portmap plugins (a single node).
CNI_CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "rayship-kind",
    "plugins": [
        {
            "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]},
        },
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}  # fmt: skip
RAYSHIP_ENTRYPOINT = """#!/bin/bash
# rayship: the node is privileged, so /proc/sys is the host's for every setting the network namespace
# does not own. Mask what the kubelet rewrites, keep net/ writable, make the rest read-only; then
# kind's own entrypoint.
set -o errexit -o nounset -o pipefail
mount --bind /proc/sys /proc/sys
mount --bind /proc/sys/net /proc/sys/net
mkdir -p /kind/sysctl
for key in {keys}; do
  mask="/kind/sysctl/${{key//\\//.}}"
  cat "/proc/sys/$key" > "$mask"
  mount --bind "$mask" "/proc/sys/$key"
done
mount -o remount,bind,ro /proc/sys
exec "$@"
""".format(keys=" ".join(KUBELET_SYSCTLS))
# The base OCI spec kind's containerd configuration names (kind's Dockerfile makes it so): containerd's
# default spec, a hook that mounts the node's product_uuid into containers, no rlimits.
CRI_BASE_SPEC = (
    "ctr oci spec"
    """ | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}'"""
    " | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json"
)
ENTRYPOINT = ["/usr/local/bin/rayship-entrypoint", "/usr/local/bin/entrypoint", "/sbin/init"]


def image_tags() -> str:
    """The part of kubeadm's ClusterConfiguration that names this project's etcd and CoreDNS builds
    (kind merges it into its own, whichever kubeadm API version it writes: no apiVersion here)."""
    return f"kind: ClusterConfiguration\netcd:\n  local:\n    imageTag: {ETCD_TAG}\ndns:\n  imageTag: {COREDNS_TAG}\n"


def kubeadm_config() -> str:
    """A whole ClusterConfiguration with image_tags(), for `kubeadm config images list`."""
    return f"apiVersion: kubeadm.k8s.io/v1beta4\nkubernetesVersion: {K8S_VERSION}\n" + image_tags()


# --- inputs -------------------------------------------------------------------------------------------
def cache_root() -> Path:
    return build.cache_root().parent / "kind"


def kind_files() -> Path:
    return build.module_dir("kind", KIND_MODULE) / "images" / "base" / "files"


# The control-plane modules whose binaries go into the node image (kubeadm, the kubelet, kubectl, the
# control plane's images); KubeRay, kwok, kube-router and kind itself do not, so `make builds` builds
# these first and the node image beside the rest.
NODE_MODULES = ("kubernetes", "etcd", "coredns", "kubeadm")


def _binaries() -> dict[str, Path]:
    return build.binaries(NODE_MODULES)


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def key() -> str:
    """A hash of everything that goes into the node image."""
    bins = _binaries()
    parts = [
        Path(__file__).read_bytes(), (HERE / "oci.py").read_bytes(), LOCK.read_bytes(),
        _tree_digest(kind_files()).encode(),
        *(str(bins[name]).encode() for name in sorted(bins)),  # their folders carry the build's hash
        _pause_source().read_bytes(),
    ]  # fmt: skip
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part + b"\0")
    return digest.hexdigest()[:16]


def archive_path() -> Path:
    return cache_root() / f"node-{key()}.tar"


def image_ref() -> str:
    return f"{IMAGE}-{key()}"


def _pause_source() -> Path:
    return build.module_dir("kubernetes", "k8s.io/kubernetes") / "build" / "pause" / "linux" / "pause.c"


# --- the control plane's images -----------------------------------------------------------------------
def kubeadm_images(kubeadm: Path, workdir: Path) -> list[str]:
    """`kubeadm config images list` for kubeadm_config(), as kind's builder asks (its pause aside)."""
    config = workdir / "kubeadm.yaml"
    config.write_text(kubeadm_config())
    out = subprocess.run(
        [str(kubeadm), "config", "images", "list", "--config", str(config)], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"kind node: kubeadm config images list failed: {out.stderr.strip()}")
    return out.stdout.split()


def sandbox_image() -> str:
    """The pause image kind's containerd configuration names (kind's builder loads that one)."""
    for line in (kind_files() / "etc" / "containerd" / "config.toml").read_text().splitlines():
        if line.strip().startswith("sandbox_image"):
            return line.split("=", 1)[1].strip().strip('"')
    raise SystemExit("kind node: no sandbox_image in kind's containerd config.toml")


# --- the Debian packages, locked ------------------------------------------------------------------------
def read_lock(text: str) -> dict[str, dict[str, str]]:
    """The lock's sections: {section: {package: version}} (lines `[section]` and `package=version`)."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        elif "=" in line and current is not None:
            name, version = line.split("=", 1)
            current[name] = version
        else:
            raise SystemExit(f"{LOCK.name}:{number}: expected [section] or package=version, got {raw!r}")
    return sections


def write_lock(sections: dict[str, dict[str, str]]) -> str:
    lines = [
        "# The kind node image's Debian packages (controlplane/kindnode.py), each at the version it is",
        "# built with: every package of each root filesystem, not only the named ones.",
        f"# Written by `{RELOCK}`.",
    ]
    for section, packages in sections.items():
        lines += ["", f"[{section}]", *(f"{name}={packages[name]}" for name in sorted(packages))]
    return "\n".join(lines) + "\n"


def locked(section: str) -> dict[str, str]:
    found = read_lock(LOCK.read_text()).get(section)
    if not found:
        raise SystemExit(f"kind node: {LOCK.name} has no [{section}] section; run `{RELOCK}`")
    return found


def installed_packages(rootfs_tar: Path) -> dict[str, str]:
    """{package: version} of what dpkg installed in a root filesystem tar (its var/lib/dpkg/status)."""
    with tarfile.open(rootfs_tar) as tar:
        member = next((m for m in tar if m.name.removeprefix("./") == "var/lib/dpkg/status"), None)
        status = tar.extractfile(member) if member is not None else None
        if status is None:
            raise SystemExit(
                f"kind node: {rootfs_tar} has no var/lib/dpkg/status: not a Debian root filesystem"
            )
        text = status.read().decode()
    found = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
        if fields.get("Status", "").endswith(" installed"):
            found[fields["Package"]] = fields["Version"]
    return found


def lock_differences(wanted: dict[str, str], found: dict[str, str]) -> list[str]:
    """What a root filesystem holds apart from its lock, a line each (none: it is the lock)."""
    return [
        f"{name}: locked {wanted.get(name, '(not locked)')}, installed {found.get(name, '(not installed)')}"
        for name in sorted(set(wanted) | set(found))
        if wanted.get(name) != found.get(name)
    ]


def _not_served(log_tail: str) -> list[str]:
    """apt's words for a pinned version Debian no longer serves (its archive keeps the newest build)."""
    return [line.strip() for line in log_tail.splitlines() if "was not found" in line and "Version '" in line]


def _mmdebstrap(packages: Sequence[str], out: Path, log_file: Path, hooks: Sequence[str] = ()) -> None:
    """A bookworm minbase root filesystem tar with `packages` (`name` or `name=version`)."""
    # In its own mount namespace: what mmdebstrap (and a hook) mounts goes away with it.
    cmd = ["unshare", "--mount", "--propagation", "private", "--", "mmdebstrap", *MMDEBSTRAP_OPTIONS]
    cmd += ["--mode=root", "--format=tar", f"--include={','.join(packages)}"]
    cmd += [f"--customize-hook={hook}" for hook in hooks]
    cmd += [DEBIAN_SUITE, str(out), *DEBIAN_SOURCES]
    start = log_file.stat().st_size if log_file.exists() else 0
    with open(log_file, "ab") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        with open(log_file, "rb") as log:
            log.seek(start)
            gone = _not_served(log.read().decode(errors="replace"))
        if gone:
            raise SystemExit(
                f"kind node: Debian no longer serves a locked version ({'; '.join(gone[:3])}): a newer "
                f"bookworm build replaced it; run `{RELOCK}`, rebuild and test, and commit {LOCK.name}"
            )
        raise SystemExit(f"kind node: mmdebstrap failed ({done.returncode}); see {log_file}")


def _locked_rootfs(section: str, out: Path, log_file: Path, hooks: Sequence[str] = ()) -> None:
    """The lock's `section` as a root filesystem tar: every package at its locked version, and a
    failure naming what else it holds."""
    lock = locked(section)
    _mmdebstrap([f"{name}={version}" for name, version in sorted(lock.items())], out, log_file, hooks)
    extra = lock_differences(lock, installed_packages(out))
    if extra:
        raise SystemExit(
            f"kind node: {out.name} differs from {LOCK.name} [{section}] ({'; '.join(extra[:5])}"
            f"{' ...' if len(extra) > 5 else ''}); run `{RELOCK}` if that is wanted"
        )


def relock(log=print) -> None:
    """Resolve each section's named packages anew (Debian's current bookworm builds) and write every
    package of the result to the lock."""
    cache_root().mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="kindlock-", dir=cache_root()))
    sections = {}
    try:
        for section, packages in LOCK_SECTIONS.items():
            log(f"kind node: resolving [{section}]: {' '.join(packages)} ...")
            rootfs = workdir / f"{section}.tar"
            _mmdebstrap(packages, rootfs, cache_root() / "kindnode.log")
            sections[section] = installed_packages(rootfs)
            rootfs.unlink()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    LOCK.write_text(write_lock(sections))
    log(f"kind node: wrote {LOCK} ({', '.join(f'{k}: {len(v)} packages' for k, v in sections.items())})")


def control_plane_images(workdir: Path, log_file: Path, log=print) -> list[Path]:
    """OCI archives of every image the node preloads, named as kubeadm and kind's containerd ask."""
    from controlplane import node

    bins = _binaries()
    images = workdir / "images"
    images.mkdir()
    path_env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    archives = []
    for ref in kubeadm_images(bins["kubeadm"], workdir):
        name = ref.rsplit("/", 1)[1].split(":")[0]
        if name == "pause":
            continue  # kind's containerd configuration names its own (below)
        binary = {"etcd": "etcd", "coredns": "coredns"}.get(name, name)
        data = bins[binary].read_bytes()
        if name == "coredns":  # the Deployment kubeadm writes runs the image's entrypoint with -conf
            layers, config = [file_layer({"coredns": (data, 0o755)})], {"Entrypoint": ["/coredns"]}
        else:  # kubeadm's manifests name the command; PATH finds it
            layers = [file_layer({f"usr/local/bin/{binary}": (data, 0o755)})]
            config = {"Env": path_env, "Entrypoint": [f"/usr/local/bin/{binary}"]}
        if name == "kube-proxy":
            rootfs = workdir / "proxy-rootfs.tar"
            log("kind node: mmdebstrap kube-proxy's base (nft, iptables) ...")
            _locked_rootfs("kube-proxy", rootfs, log_file)
            layers.insert(0, rootfs.read_bytes())
            rootfs.unlink()
        archive = images / f"{name}.tar"
        archive.write_bytes(oci_archive(ref, layers, config))
        archives.append(archive)
    pause = node.pause_archive(cache_root() / "pause", ref=sandbox_image())
    archives.append(pause)
    return archives


# --- the root filesystem --------------------------------------------------------------------------
def _kind_base_steps(k: str) -> str:
    """kind's images/base/Dockerfile, as shell on the root filesystem "$R": its files (`k`, quoted),
    with its modes, its units enabled and masked, /sbin/init, the base OCI spec."""
    return f"""install -m 0755 {k}/usr/local/bin/* "$R/usr/local/bin/"
mkdir -p "$R/kind/bin" "$R/etc/containerd" "$R/etc/systemd/system/kubelet.service.d"
install -m 0644 {k}/kind/README.txt "$R/kind/"
install -m 0755 {k}/kind/bin/* "$R/kind/bin/"
install -m 0644 {k}/etc/crictl.yaml "$R/etc/"
install -m 0644 {k}/etc/containerd/* "$R/etc/containerd/"
install -m 0644 {k}/etc/default/* "$R/etc/default/"
# host hygiene: no sysctl.d file that rewrites a kernel-wide setting at boot; kind's net/ ones stay
rm -f "$R"/usr/lib/sysctl.d/*.conf "$R"/etc/sysctl.d/*.conf
install -m 0644 {k}/etc/sysctl.d/* "$R/etc/sysctl.d/"
install -m 0644 {k}/etc/systemd/system/*.service {k}/etc/systemd/system/*.slice "$R/etc/systemd/system/"
install -m 0644 {k}/etc/systemd/system/kubelet.service.d/* "$R/etc/systemd/system/kubelet.service.d/"
find "$R/lib/systemd/system/sysinit.target.wants/" -name "systemd-tmpfiles-setup.service" -delete
rm -f "$R"/lib/systemd/system/multi-user.target.wants/* "$R"/etc/systemd/system/*.wants/* \\
  "$R"/lib/systemd/system/local-fs.target.wants/* "$R"/lib/systemd/system/sockets.target.wants/*udev* \\
  "$R"/lib/systemd/system/sockets.target.wants/*initctl* "$R"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> "$R/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$R/sbin/init"
chroot "$R" systemctl enable kubelet.service containerd.service undo-mount-hacks.service
chroot "$R" systemctl mask systemd-binfmt.service
mkdir -p "$R/etc/kubernetes/manifests"
chroot "$R" sh -c {shlex.quote(CRI_BASE_SPEC)}
"""


def _preload_steps(workdir: Path, archives: list[Path]) -> str:
    """The control plane's images into the node's containerd store ("$R/var/lib/containerd"): the
    host's containerd (the same Debian build as the node's), its sockets under a short /tmp folder."""
    q = shlex.quote
    sockets = q(tempfile.mkdtemp(prefix="rk-", dir="/tmp"))  # unix socket paths must be short
    imports = "\n".join(
        f"ctr --address {sockets}/c.sock --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned"
        f" --all-platforms --no-unpack --digests {q(str(a))} >&2"
        for a in archives
    )
    return f"""mkdir -p "$R/var/lib/containerd"
cat > {sockets}/config.toml <<CONFIG
version = 2
root = "$R/var/lib/containerd"
state = "{sockets}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt"]
[grpc]
  address = "{sockets}/c.sock"
[ttrpc]
  address = "{sockets}/t.sock"
CONFIG
containerd --config {sockets}/config.toml >> {q(str(workdir / "preload-containerd.log"))} 2>&1 &
preload=$!
for i in $(seq 100); do [ -S {sockets}/c.sock ] && break; sleep 0.1; done
{imports}
kill $preload; wait $preload || true
rm -rf {sockets}
"""


def _hook_script(workdir: Path, archives: list[Path]) -> str:
    """The customize hook: mmdebstrap runs it with the root filesystem's path as $1."""
    bins = _binaries()
    q = shlex.quote
    return f"""set -eu
R="$1"
# kind's images/base/Dockerfile
{_kind_base_steps(q(str(kind_files())))}
# kind's node-image build: the binaries in /usr/bin, /kind/version
install -m 0755 {q(str(bins["kubeadm"]))} {q(str(bins["kubelet"]))} {q(str(bins["kubectl"]))} "$R/usr/bin/"
printf %s {q(K8S_VERSION)} > "$R/kind/version"
# Debian's runtime where kind's units and containerd look for its own builds
ln -sf /usr/bin/containerd "$R/usr/local/bin/containerd"
mkdir -p "$R/opt/cni" "$R/etc/cni/net.d"
ln -sfn /usr/lib/cni "$R/opt/cni/bin"
install -m 0644 {q(str(workdir / "cni.conflist"))} "$R/etc/cni/net.d/10-rayship-bridge.conflist"
install -m 0755 {q(str(workdir / "rayship-entrypoint"))} "$R/usr/local/bin/rayship-entrypoint"
# the control plane's images, into the node's containerd store
{_preload_steps(workdir, archives)}"""


def docker_archive(rootfs: Path, out: Path, ref: str) -> None:
    """A `docker load` archive of one image whose only layer is `rootfs` (docker 20.10 loads this
    format, not OCI layouts); its config is what kind's builder commits: entrypoint, STOPSIGNAL."""
    digest = hashlib.sha256()
    with open(rootfs, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {
            "Entrypoint": ENTRYPOINT, "StopSignal": "SIGRTMIN+3",
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "container=docker"],
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest.hexdigest()}"]},
    }, sort_keys=True).encode()  # fmt: skip
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [ref], "Layers": ["layer/layer.tar"]}]
    ).encode()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        tar.add(rootfs, arcname="layer/layer.tar")


def ensure_built(log=print) -> Path:
    """The node image's `docker load` archive, built if missing (a few minutes on 2 cores)."""
    final = archive_path()
    if final.is_file():
        log(f"kind node: image cached ({final})")
        return final
    build.ensure_built(log, names=NODE_MODULES)
    cache_root().mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="kindnode-", dir=cache_root()))
    log_file = cache_root() / "kindnode.log"
    try:
        (workdir / "cni.conflist").write_text(json.dumps(CNI_CONFLIST, indent=2) + "\n")
        (workdir / "rayship-entrypoint").write_text(RAYSHIP_ENTRYPOINT)
        archives = control_plane_images(workdir, log_file, log)
        log(f"kind node: control-plane images {[a.name for a in archives]}; mmdebstrap the node ...")
        rootfs = workdir / "rootfs.tar"
        hook = workdir / "customize-hook.sh"
        hook.write_text(_hook_script(workdir, archives))
        _locked_rootfs("node", rootfs, log_file, hooks=[f'sh {shlex.quote(str(hook))} "$1"'])
        partial = final.with_suffix(".partial")
        docker_archive(rootfs, partial, image_ref())
        partial.rename(final)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for older in cache_root().glob("node-*.tar"):  # one node image is kept: the current one
        if older != final:
            older.unlink()
    size = final.stat().st_size / 2**20
    log(f"kind node: built {image_ref()} in {time.monotonic() - started:.0f}s ({size:.0f} MiB) -> {final}")
    return final


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--print", action="store_true", help="print the archive's path and ref; build nothing"
    )
    parser.add_argument(
        "--relock", action="store_true", help=f"resolve the named packages anew and write {LOCK.name}"
    )
    parser.add_argument(
        "--binaries", action="store_true",
        help=f"build only the control-plane modules the image needs ({', '.join(NODE_MODULES)}), not the image",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.binaries:
        build.ensure_built(names=NODE_MODULES)
        return 0
    if args.relock:
        relock()
        return 0
    if args.print:
        print(f"{image_ref()}\t{archive_path()}\t{'built' if archive_path().is_file() else 'missing'}")
        return 0
    ensure_built()
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
