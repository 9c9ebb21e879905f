"""Local Ray for the workload tests: one CPU-only Ray instance per test session.

Ray runs with token auth disabled (Ray 2.60 enables it by default), no usage stats, the dashboard,
a small object store, and HOME/TMPDIR in a short private directory (Ray's socket paths are limited).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("ray", reason="the workload stack is not installed: run `make setup`")

from rayship_workloads.local import private_ray_environment
from rayship_workloads.serve_ingress import haproxy_folder, stop_haproxy_left_behind

_TMP = private_ray_environment("rs-")

LOGICAL_CPUS = 4  # scheduling tokens: 2 train workers + Ray Data / Serve tasks on a 2-core machine


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    ray.init(
        address="local",
        num_cpus=LOGICAL_CPUS,
        # The dashboard's State API is what Ray Train V2's placement-group cleaner asks whether a
        # training run's controller is alive: without it, runs stopped early (ASHA) keep their CPUs.
        include_dashboard=True,
        object_store_memory=256 * 1024 * 1024,
        log_to_driver=True,
    )
    try:
        yield
    finally:
        ray.shutdown()
        # of a module that left Serve running, or of a `rayship serve` the tests started (every local
        # Ray of this session keeps HAProxy's files under its private temporary directory)
        stop_haproxy_left_behind(haproxy_folder())


def _processes_of(folder: str) -> list[int]:
    """The other processes with a file open under `folder`: every Ray process of a session under it
    keeps its log files there (their command lines do not say: Ray retitles its processes)."""
    root, found = os.path.join(folder, ""), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if int(pid) != os.getpid() and any(
                os.readlink(f"/proc/{pid}/fd/{fd}").startswith(root) for fd in fds
            ):
                found.append(int(pid))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The private directory goes at the end of every session, also one that never started Ray (a
    Ray-free test chosen alone); after `ray_session`'s teardown and once Ray's last processes are gone:
    they can outlive `ray.shutdown()` for a moment, and a file one wrote after the directory was
    removed (its metrics discovery file) left /tmp/rs-*/ray/session_*/ behind (the CI run of 14afb60)."""
    deadline = time.monotonic() + 30
    while (left := _processes_of(_TMP)) and time.monotonic() < deadline:
        time.sleep(0.2)
    shutil.rmtree(_TMP, ignore_errors=True)
    if left:
        print(
            f"\ntests/workloads: Ray processes {left} still run from {_TMP} 30 s after the session",
            flush=True,
        )
