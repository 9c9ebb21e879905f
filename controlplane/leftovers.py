"""What a stopped cluster must not leave on the machine (`cluster.leftovers`, `cluster.py down --check`)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from controlplane import build
from controlplane import node as realnode
from controlplane.config import NETNS, VETH_HOST
from controlplane.network import netns_exists
from controlplane.node_lifecycle import node_paths
from controlplane.processes import Paths, load_state, run_command


def leftovers(paths: Paths | None = None) -> list[str]:
    """What a cluster left on this machine: after `down`, nothing (a process of its binaries, its
    network namespace or veth, a mount, a cgroup, a shim, a KUBE-* iptables chain or a kube-proxy nft
    table on the host, a folder `up` made)."""
    paths = paths or Paths()
    left = [f"netns {NETNS}"] if netns_exists() else []
    if run_command(["ip", "link", "show", VETH_HOST], check=False).returncode == 0:
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
    left += [f"shim {pid}" for pid in realnode.shim_pids(node_paths(paths).socket)]
    if shutil.which("iptables"):
        chains = [
            c
            for c in run_command(["iptables", "-S"], check=False).stdout.splitlines()
            if c.startswith("-N KUBE-")
        ]
        left += [f"iptables chain {c.split()[1]}" for c in chains]
    if shutil.which("nft"):
        tables = run_command(["nft", "list", "tables"], check=False).stdout.splitlines()
        left += [f"nft {t}" for t in tables if "kube-proxy" in t]
    left += [f"folder {d}" for d in load_state(paths).made_dirs if Path(d).exists()]
    return left
