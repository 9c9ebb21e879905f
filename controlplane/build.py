"""Build the pinned control-plane binaries (`make cluster-build`).

Each folder under controlplane/go/ is a small wrapper Go module that pins one upstream module (and,
through go.sum, every dependency). Its binaries are built with the local Go toolchain from the Go
module proxy into a cache OUTSIDE the clone:

    ${RAYSHIP_CACHE:-~/.cache/rayship}/controlplane/<module>-<hash>/bin/<binary>

where <hash> covers the wrapper's go.mod, go.sum, any *.go glue and the build flags. A fresh clone on
the same machine (CI) therefore reuses the binaries; changing a pin rebuilds only that module. Nothing
built is ever written into the repository.

    python3 controlplane/build.py            # build what is missing, print timings
    python3 controlplane/build.py kubernetes etcd   # only these modules (what is missing of them)
    python3 controlplane/build.py --print    # the binary paths (builds nothing)
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
GO_DIR = HERE / "go"

K8S_VERSION = "v1.35.4"
_K8S_MAJOR, _K8S_MINOR = K8S_VERSION[1:].split(".")[:2]
# What upstream's hack/lib/version.sh stamps, so servers and clients report v1.35.4 (not v0.0.0-master).
_K8S_VERSION_X = " ".join(
    f"-X {pkg}.{var}={val}"
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    for var, val in (
        ("gitVersion", K8S_VERSION),
        ("gitMajor", _K8S_MAJOR),
        ("gitMinor", _K8S_MINOR),
        ("gitTreeState", "clean"),
        ("buildDate", "1970-01-01T00:00:00Z"),
    )
)


@dataclass(frozen=True)
class Module:
    name: str  # folder under controlplane/go/
    packages: dict[str, str]  # binary name -> Go package (built from inside the wrapper module)
    ldflags: str = ""

    @property
    def source(self) -> Path:
        return GO_DIR / self.name

    def key(self) -> str:
        digest = hashlib.sha256()
        for path in sorted(self.source.iterdir()):
            if path.suffix in (".mod", ".sum", ".go"):
                digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        digest.update(repr(sorted(self.packages.items())).encode() + self.ldflags.encode())
        digest.update(_go_version().encode())
        return digest.hexdigest()[:16]

    def bin_dir(self) -> Path:
        return cache_root() / f"{self.name}-{self.key()}" / "bin"

    def built(self) -> bool:
        return (self.bin_dir().parent / ".complete").is_file()


MODULES = (
    Module(
        "kubernetes",
        {
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            # the real node (controlplane/node.py): the same module, so the same version stamp
            "kubelet": "k8s.io/kubernetes/cmd/kubelet",
            "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
        },
        _K8S_VERSION_X,
    ),
    Module("etcd", {"etcd": "."}),
    Module("kwok", {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}, "-X sigs.k8s.io/kwok/pkg/consts.Version=v0.7.0"),
    Module("kuberay", {"ray-operator": "github.com/ray-project/kuberay/ray-operator"}),
    # the cluster DNS of the real node (controlplane/node.py) and the kind node: CoreDNS with the
    # plugins their Corefiles use (go/coredns/main.go), not all 70 of its main package
    Module("coredns", {"coredns": "."}),
    # the real node's NetworkPolicy engine (kube-router's firewall): the policies rayship renders are
    # enforced on real-0's pods, so a test sees a connection they forbid fail
    Module("netpol", {"kube-router": "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"}),
    # the kind node image's kubeadm and kubectl (images/kindnode.py): the kubernetes pins, so one version
    # stamp with its kubelet and the same compiled packages from Go's build cache
    Module(
        "kubeadm",
        {"kubeadm": "k8s.io/kubernetes/cmd/kubeadm", "kubectl": "k8s.io/kubernetes/cmd/kubectl"},
        _K8S_VERSION_X,
    ),
    # kind itself (`make kind-up`)
    Module("kind", {"kind": "sigs.k8s.io/kind"}),
)


def _user_home() -> Path:
    """The account's home, not $HOME: tests point $HOME at short private folders (Ray's socket paths)
    before the binaries are built, and the cache must stay the machine's one."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def cache_root() -> Path:
    base = os.environ.get("RAYSHIP_CACHE") or str(_user_home() / ".cache" / "rayship")
    return Path(base) / "controlplane"


_GO_VERSION: str | None = None


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise SystemExit("controlplane: the Go toolchain (go 1.25+) is needed to build the control plane")
    return go


def _go_version() -> str:
    global _GO_VERSION
    if _GO_VERSION is None:
        _GO_VERSION = subprocess.run(
            [_go(), "env", "GOVERSION"], capture_output=True, text=True, check=True
        ).stdout.strip()
    return _GO_VERSION


def _go_env() -> dict[str, str]:
    env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=readonly -buildvcs=false")
    home = _user_home()  # Go's module and build caches too, whatever $HOME says
    env.setdefault("GOPATH", str(home / "go"))
    env.setdefault("GOMODCACHE", str(home / "go" / "pkg" / "mod"))
    env.setdefault("GOCACHE", str(home / ".cache" / "go-build"))
    return env


def module_dir(wrapper: str, module_path: str) -> Path:
    """The source folder of a module that a wrapper under controlplane/go/ pins (downloaded if need be)."""
    out = subprocess.run(
        [_go(), "mod", "download", "-json", module_path],
        cwd=GO_DIR / wrapper, env=_go_env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(json.loads(out.stdout)["Dir"])


def binaries(names: Sequence[str] | None = None) -> dict[str, Path]:
    """Binary name -> path in the cache (whether or not it is built yet), of the modules `names` (or all)."""
    return {name: m.bin_dir() / name for m in modules(names) for name in m.packages}


def modules(names: Sequence[str] | None = None) -> tuple[Module, ...]:
    """The modules named (all where `names` is None), in MODULES' order; an unknown name is an error."""
    if names is None:
        return MODULES
    unknown = sorted(set(names) - {m.name for m in MODULES})
    if unknown:
        raise SystemExit(
            f"controlplane: no module {', '.join(unknown)} (known: {', '.join(m.name for m in MODULES)})"
        )
    return tuple(m for m in MODULES if m.name in names)


def missing(names: Sequence[str] | None = None) -> list[Module]:
    return [m for m in modules(names) if not m.built()]


def build_module(module: Module, log=print) -> float:
    """Build one wrapper module into its cache folder; returns the seconds it took."""
    final = module.bin_dir().parent
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "bin").mkdir(parents=True)
    env = _go_env()
    started = time.monotonic()
    for name, pkg in module.packages.items():
        cmd = ["nice", "-n", "10", _go(), "build", "-trimpath", f"-ldflags=-s -w {module.ldflags}".strip()]
        cmd += ["-o", str(tmp / "bin" / name), pkg]
        log(f"controlplane: building {name} ({module.name}) ...")
        subprocess.run(cmd, cwd=module.source, env=env, check=True)
    (tmp / ".complete").write_text(f"{module.key()}\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    seconds = time.monotonic() - started
    log(f"controlplane: built {module.name} in {seconds:.0f}s -> {final / 'bin'}")
    return seconds


def ensure_built(log=print, names: Sequence[str] | None = None) -> dict[str, Path]:
    """Build whatever is missing (of the modules `names`, or all); returns binaries(). One build at a
    time per machine: a second caller waits, then finds the binaries built. A caller whose modules are
    all built takes no lock, so it need not wait for another's build of modules it does not use (the
    kind node image is built while `make builds` goes on with KubeRay and kwok)."""
    started = time.monotonic()
    todo = missing(names)  # a module's folder appears complete or not at all (a rename)
    if todo:
        cache_root().mkdir(parents=True, exist_ok=True)
        with open(cache_root() / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            todo = missing(names)
            for module in todo:
                build_module(module, log)
    total = time.monotonic() - started
    if todo:
        log(f"controlplane: first build of {', '.join(m.name for m in todo)}: {total:.0f}s")
    else:
        log(f"controlplane: binaries cached in {cache_root()} ({total:.1f}s to check)")
    return binaries()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--print", action="store_true", help="print the binary paths; build nothing")
    parser.add_argument("module", nargs="*", help="build only these modules (default: all)")
    args = parser.parse_args(argv)
    if args.print:
        for name, path in binaries().items():
            print(f"{name}\t{path}\t{'built' if path.exists() else 'missing'}")
        return 0
    ensure_built(names=args.module or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
