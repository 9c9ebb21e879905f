"""The kind harness's pure parts: the cluster configuration kind is given, the node image's CNI
configuration and host guard, the runtime wrapper's capability trim, the OCI archives.

What they add up to (a kind cluster whose node image was built here, KubeRay and rayship on it) is
proven in tests/e2e/test_kind.py on the real thing."""

from __future__ import annotations

import io
import json
import tarfile
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

from controlplane import kindcluster, kindnode, node
from controlplane.oci import file_layer, oci_archive

ROOT = Path(__file__).resolve().parents[2]


def _runtime():
    loader = SourceFileLoader("kind_runc", str(ROOT / "controlplane" / "kind-runc"))
    module = module_from_spec(spec_from_loader("kind_runc", loader))
    loader.exec_module(module)
    return module


def test_kind_is_told_what_this_host_needs() -> None:
    config = json.loads(kindcluster.kind_config())
    patches = config["kubeadmConfigPatches"]
    kubelet = [json.loads(p) for p in patches if "KubeletConfiguration" in p]
    assert kubelet == [{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                        "failCgroupV1": False}]  # fmt: skip
    assert any("restrict_oom_score_adj = true" in p for p in config["containerdConfigPatches"])
    net = config["networking"]
    assert net["disableDefaultCNI"] is True  # the image's bridge configuration instead
    assert net["apiServerAddress"] == kindcluster.NS_IP  # reached from the host over the veth pair
    # the CNI configuration baked into the node hands out addresses of the cluster's pod subnet
    (ranges,) = kindnode.CNI_CONFLIST["plugins"][0]["ipam"]["ranges"]
    assert ranges == [{"subnet": net["podSubnet"]}]
    assert [n["role"] for n in config["nodes"]] == ["control-plane"]  # the bridge CNI is one node's


def test_the_image_tags_kubeadm_is_told_are_the_pinned_builds() -> None:
    etcd = (ROOT / "controlplane" / "go" / "etcd" / "go.mod").read_text()
    coredns = (ROOT / "controlplane" / "go" / "coredns" / "go.mod").read_text()
    assert f"go.etcd.io/etcd/server/v3 v{kindnode.ETCD_TAG.removesuffix('-0')}" in etcd
    assert f"github.com/coredns/coredns {kindnode.COREDNS_TAG}\n" in coredns
    # kind merges the tags into the ClusterConfiguration of whichever kubeadm API it writes (v1beta3
    # for v1.35: a patch naming v1beta4 matched nothing, and kubeadm asked for etcd 3.6.6-0)
    (tags,) = [
        p
        for p in json.loads(kindcluster.kind_config())["kubeadmConfigPatches"]
        if "ClusterConfiguration" in p
    ]
    assert "apiVersion" not in tags and f"imageTag: {kindnode.ETCD_TAG}" in tags
    assert f"imageTag: {kindnode.COREDNS_TAG}" in tags


def test_the_node_masks_every_setting_the_kubelet_rewrites() -> None:
    entrypoint = kindnode.RAYSHIP_ENTRYPOINT
    assert f"for key in {' '.join(node.KUBELET_SYSCTLS)}; do" in entrypoint
    # read-only last: after the masks and the writable net/ are mounted over it
    assert entrypoint.rstrip().splitlines()[-2] == "mount -o remount,bind,ro /proc/sys"
    assert kindnode.ENTRYPOINT[1:] == ["/usr/local/bin/entrypoint", "/sbin/init"]  # then kind's own


def test_the_runtime_drops_only_the_capabilities_root_lacks(tmp_path: Path) -> None:
    runtime = _runtime()
    every = [f"CAP_{name}" for name in runtime.CAPS]
    spec = {"process": {"capabilities": {k: list(every) for k in ("bounding", "effective", "permitted")}},
            "root": {"path": "rootfs"}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(spec))
    held = set(every) - {"CAP_SYS_RESOURCE"}
    runtime.rewrite(str(tmp_path / "config.json"), True, held)
    trimmed = json.loads((tmp_path / "config.json").read_text())
    for names in trimmed["process"]["capabilities"].values():
        assert names == [c for c in every if c != "CAP_SYS_RESOURCE"]
    assert trimmed["root"] == spec["root"]
    # `exec --process FILE`: the process document itself
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"capabilities": {"bounding": ["CAP_SYS_RESOURCE", "CAP_CHOWN"]}}))
    runtime.rewrite(str(process), False, held)
    assert json.loads(process.read_text())["capabilities"]["bounding"] == ["CAP_CHOWN"]
    # a spec that asks for nothing the host lacks is left as it is (byte for byte)
    untouched = json.dumps({"process": {"capabilities": {"bounding": ["CAP_CHOWN"]}}}, indent=3)
    (tmp_path / "config.json").write_text(untouched)
    runtime.rewrite(str(tmp_path / "config.json"), True, held)
    assert (tmp_path / "config.json").read_text() == untouched


def test_the_runtime_reads_its_own_bounding_set() -> None:
    runtime = _runtime()
    mask = int(next(line for line in open("/proc/self/status") if line.startswith("CapBnd:")).split()[1], 16)
    held = runtime.bounding()
    assert ("CAP_SYS_RESOURCE" in held) == bool(mask >> 24 & 1)
    assert len(held) == bin(mask).count("1")


def test_oci_archive_names_its_image_and_carries_the_layers_in_order() -> None:
    base = file_layer({"usr/sbin/nft": (b"nft", 0o755)})
    top = file_layer({"usr/local/bin/kube-proxy": (b"proxy", 0o755)})
    archive = tarfile.open(
        fileobj=io.BytesIO(oci_archive("registry.k8s.io/kube-proxy:v1.35.4", [base, top], {}))
    )
    index = json.load(archive.extractfile("index.json"))
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "registry.k8s.io/kube-proxy:v1.35.4"
    manifest = json.load(archive.extractfile(f"blobs/sha256/{entry['digest'].split(':')[1]}"))
    assert len(manifest["layers"]) == 2
    layer = tarfile.open(fileobj=archive.extractfile(f"blobs/sha256/{manifest['layers'][1]['digest'][7:]}"))
    # parent folders come first, with a mode of their own
    assert [(m.name, m.isdir()) for m in layer.getmembers()] == [
        ("usr", True),
        ("usr/local", True),
        ("usr/local/bin", True),
        ("usr/local/bin/kube-proxy", False),
    ]


def test_the_chart_on_kind_never_pulls_and_requests_cpu_without_limits() -> None:
    values = kindcluster.chart_values("rayship/rayship-workloads:1.2.3-cpu")
    assert values == {
        "image": {"pullPolicy": "Never"},
        "defaults": {"workloadImage": "rayship/rayship-workloads:1.2.3-cpu", "cpuLimits": False},
    }


def test_the_node_runs_the_runtime_the_real_node_runs() -> None:
    """The host's containerd writes the node image's store at build time (the same Debian build must
    read it), and the real node and the kind node run one containerd, runc and CNI plugins."""
    makefile = (ROOT / "Makefile").read_text()
    node_debs = makefile.split("NODE_DEBS := ", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ").split()
    for pin in kindnode.RUNTIME_PINS:
        assert pin in node_debs, (pin, node_debs)


def test_kind_down_checks_every_setting_the_kubelet_and_debian_would_rewrite() -> None:
    assert set(node.KUBELET_SYSCTLS) <= set(kindcluster.HOST_SETTINGS)
    assert {
        "fs/protected_hardlinks",
        "fs/protected_symlinks",
        "fs/protected_regular",
        "fs/protected_fifos",
    } <= set(
        kindcluster.HOST_SETTINGS
    )  # Debian's 99-protect-links.conf, which a node's systemd-sysctl applied host-wide in a probe
    assert set(kindcluster.host_settings()) == set(kindcluster.HOST_SETTINGS)


def test_a_failed_step_is_said_without_a_traceback(monkeypatch, capsys) -> None:
    def fails() -> None:
        raise RuntimeError("kind create cluster failed (1): ERROR: failed to create cluster")

    monkeypatch.setattr(kindcluster, "up", fails)
    assert kindcluster.main(["up"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "kind: up failed: kind create cluster failed (1): ERROR: failed to create cluster",
        "kind: `make kind-down` takes down what was started",
    ]


def test_a_dockerd_that_exited_unreaped_is_not_waited_for() -> None:
    """The kind tier's fixture runs `up` in its own process: dockerd is its child and, once kind-down
    has stopped it, a zombie until the tier ends. It counts as gone (down waited 60 s for it before)."""
    import os
    import subprocess
    import time

    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert kindcluster._alive(child.pid)
    finally:
        child.kill()
    deadline = time.monotonic() + 10
    while kindcluster._alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"  # not reaped yet
    os.killpg(child.pid, 0)  # the group still exists to the kernel: what `_alive` asked before
    assert not kindcluster._alive(child.pid)
    child.wait()
    assert not kindcluster._alive(child.pid) and not kindcluster._alive(None)


def test_up_marks_a_cluster_it_starts_as_its_own_and_one_it_finds_not(monkeypatch, tmp_path: Path) -> None:
    """`make test` takes down the kind cluster only if its `up --started-file` started it: a start that
    fails half-way is marked too (its leftovers are ours to take down); a cluster already up is not."""
    marker = tmp_path / "kind-started"

    def fails() -> None:
        raise RuntimeError("kind create cluster failed (1)")

    monkeypatch.setattr(kindcluster, "up", fails)
    monkeypatch.setattr(kindcluster, "is_up", lambda: False)
    assert kindcluster.main(["up", "--started-file", str(marker)]) == 1
    assert marker.is_file()
    marker.unlink()
    monkeypatch.setattr(kindcluster, "up", lambda: None)
    monkeypatch.setattr(kindcluster, "is_up", lambda: True)
    assert kindcluster.main(["up", "--started-file", str(marker)]) == 0
    assert not marker.exists()


def test_the_lock_names_every_package_of_each_root_filesystem_at_one_version() -> None:
    """The node image is built from the lock only: each section holds its named packages (and minbase's
    own: dpkg, apt, libc6), the runtime at the real node's pins, and reads back as it was written."""
    sections = kindnode.read_lock(kindnode.LOCK.read_text())
    assert set(sections) == set(kindnode.LOCK_SECTIONS)
    for section, named in kindnode.LOCK_SECTIONS.items():
        packages = sections[section]
        assert {p.split("=")[0] for p in named} | {"dpkg", "apt", "libc6"} <= set(packages), section
        for pin in named:
            if "=" in pin:
                name, version = pin.split("=")
                assert packages[name] == version, (section, pin)
    assert kindnode.read_lock(kindnode.write_lock(sections)) == sections


def test_a_root_filesystem_apart_from_its_lock_is_named_package_by_package(tmp_path: Path) -> None:
    status = (
        b"Package: libc6\nStatus: install ok installed\nVersion: 2.36-9+deb12u13\n\n"
        b"Package: systemd\nStatus: install ok installed\nVersion: 252.39-1~deb12u1\nDescription: x\n more\n\n"
        b"Package: old\nStatus: deinstall ok config-files\nVersion: 1\n"
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("./var/lib/dpkg/status")
        info.size = len(status)
        tar.addfile(info, io.BytesIO(status))
    rootfs = tmp_path / "rootfs.tar"
    rootfs.write_bytes(buffer.getvalue())
    found = kindnode.installed_packages(rootfs)
    assert found == {"libc6": "2.36-9+deb12u13", "systemd": "252.39-1~deb12u1"}
    assert kindnode.lock_differences(dict(found), found) == []
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    try:
        kindnode.installed_packages(empty)
    except SystemExit as err:
        assert "has no var/lib/dpkg/status: not a Debian root filesystem" in str(err)
    else:
        raise AssertionError("a root filesystem without dpkg's status was read")
    assert kindnode.lock_differences({"libc6": "2.36-9+deb12u12", "curl": "7.88"}, found) == [
        "curl: locked 7.88, installed (not installed)",
        "libc6: locked 2.36-9+deb12u12, installed 2.36-9+deb12u13",
        "systemd: locked (not locked), installed 252.39-1~deb12u1",
    ]


def test_a_locked_version_debian_no_longer_serves_is_said_with_apts_words() -> None:
    log = "I: installing remaining packages inside the chroot...\nE: Version '252.38-1~deb12u1' for 'systemd' was not found\n"
    assert kindnode._not_served(log) == ["E: Version '252.38-1~deb12u1' for 'systemd' was not found"]
    assert kindnode._not_served("E: Unable to locate package nosuch") == []
    try:
        kindnode.read_lock("[node]\nsystemd 252\n")
    except SystemExit as err:
        assert "kindnode.lock:2: expected [section] or package=version" in str(err)
    else:
        raise AssertionError("a malformed line was read")


def test_the_node_image_is_built_from_its_own_modules_only(tmp_path: Path, monkeypatch) -> None:
    from controlplane import build

    monkeypatch.setenv("RAYSHIP_CACHE", str(tmp_path))
    bins = kindnode._binaries()
    # every binary the image installs (kind's node build) or makes an image of (kubeadm's list, less
    # pause: compiled apart) comes from NODE_MODULES, which `make builds` builds before the image
    assert set(bins) == {"kubeadm", "kubelet", "kubectl", "kube-apiserver", "kube-controller-manager",
                         "kube-scheduler", "kube-proxy", "etcd", "coredns"}  # fmt: skip
    assert {m.name for m in build.modules(kindnode.NODE_MODULES)} == set(kindnode.NODE_MODULES)
    # so a module it does not use (KubeRay, kwok, kube-router, kind) being built takes nothing from it
    assert {"kuberay", "kwok", "netpol", "kind"}.isdisjoint(kindnode.NODE_MODULES)
    assert bins == {name: path for name, path in build.binaries().items() if name in bins}
    assert set(build.binaries()) - set(bins) == {"kwok", "ray-operator", "kube-router", "kind"}


def test_a_build_of_modules_already_built_takes_no_lock(tmp_path: Path, monkeypatch) -> None:
    import fcntl

    from controlplane import build

    monkeypatch.setenv("RAYSHIP_CACHE", str(tmp_path))
    (etcd,) = build.modules(["etcd"])
    etcd.bin_dir().mkdir(parents=True)
    (etcd.bin_dir().parent / ".complete").write_text(etcd.key())
    (tmp_path / "controlplane" / ".lock").touch()
    with open(tmp_path / "controlplane" / ".lock") as held:  # another build holds the machine's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        logged: list[str] = []
        assert build.ensure_built(logged.append, names=["etcd"])["etcd"] == etcd.bin_dir() / "etcd"
    assert logged and "cached" in logged[0]
    with pytest.raises(SystemExit, match="no module kubelet"):
        build.modules(["kubelet"])


def test_coredns_is_built_with_every_plugin_the_real_nodes_corefile_names(tmp_path: Path) -> None:
    """go/coredns/main.go imports only some of CoreDNS's plugins; a directive of the real node's
    Corefile without its plugin would stop CoreDNS at start (kubeadm's Corefile for the kind node is
    proven by the kind tier: its CoreDNS pods must be Running)."""
    main = (ROOT / "controlplane" / "go" / "coredns" / "main.go").read_text()
    plugins = {line.split('"')[1].rsplit("/", 1)[1] for line in main.splitlines() if "/plugin/" in line}
    directives = {line.split()[0] for line in node.corefile(tmp_path / "kubeconfig").splitlines()[1:]
                  if line.startswith("    ") and not line.startswith("        ") and line.strip() != "}"}  # fmt: skip
    assert directives == {"bind", "errors", "kubernetes", "cache"}, directives
    assert directives <= plugins, directives - plugins
    # kubeadm's Corefile (cmd/kubeadm/app/phases/addons/dns): "prometheus" is the metrics plugin's
    assert {"errors", "health", "ready", "kubernetes", "metrics", "forward", "cache", "loop", "reload",
            "loadbalance"} <= plugins  # fmt: skip
