"""What the serving benchmarks measure alike: the CPU each part of the serving path spends (by
process, from psutil), latency percentiles, a free loopback port, removing a run's temporary directory.
No side effects on import."""

from __future__ import annotations

import os
import shutil
import socket
import time

import psutil


def process_group(proc: psutil.Process) -> str:
    """Which part of the serving path a process is: Serve's proxy, the replica, the clients, Ray's own."""
    if proc.pid == os.getpid():
        return "clients (this process)"
    title = " ".join(proc.cmdline()) or proc.name()
    for needle, group in (
        ("haproxy", "haproxy"),
        ("ProxyActor", "proxy"),
        ("ServeReplica", "replica"),
        ("ServeController", "serve controller"),
        ("raylet", "raylet"),
        ("gcs_server", "gcs"),
    ):
        if needle in title:
            return group
    return "other Ray processes"


def cpu_by_group() -> dict[str, float]:
    """User + system CPU seconds of this process and each live descendant, summed per process_group."""
    me = psutil.Process()
    totals: dict[str, float] = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            group = process_group(proc)
        except psutil.Error:  # exited meanwhile
            continue
        totals[group] = totals.get(group, 0.0) + times.user + times.system
    return totals


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def remove_when_unused(directory: str, timeout_s: float = 10.0) -> None:
    """Remove a run's temporary directory once no process names it any more: HAProxy (its config is
    under it) outlives `ray.shutdown()` by a moment and writes its logs there as it stops."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        users = [
            p for p in psutil.process_iter(["cmdline"]) if directory in " ".join(p.info["cmdline"] or [])
        ]
        if not users:
            break
        time.sleep(0.2)
    shutil.rmtree(directory, ignore_errors=True)
