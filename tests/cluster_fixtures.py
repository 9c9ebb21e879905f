"""The local control plane (controlplane/cluster.py) as session fixtures for every tier that needs it
(tests/controlplane, tests/operator, tests/e2e); registered in tests/conftest.py.

`cluster` brings the cluster up without the rayship operator, or reuses one that already runs
(e.g. after `make cluster-up`), and at the end stops only what it started. The binaries are built
(once per machine, into ~/.cache/rayship) at collection time, outside every test's timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from controlplane import build
from controlplane import cluster as controlplane


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the local control plane needs root (it creates a network namespace for the pod network)"
    if shutil.which("ip") is None or shutil.which("openssl") is None:
        return "the local control plane needs `ip` (iproute2) and `openssl`"
    if not (controlplane.KUBERAY_CRDS / "ray.io_rayclusters.yaml").is_file():
        return f"KubeRay v1.7.0 CRDs not found in {controlplane.KUBERAY_CRDS} (set RAYSHIP_KUBERAY_CRDS)"
    if build.missing() and shutil.which("go") is None:
        return "the control-plane binaries are not built and there is no Go toolchain to build them"
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build what is missing before the first test runs (the first build takes many minutes)."""
    if not any(
        item.get_closest_marker(m) for item in session.items for m in ("controlplane", "operator", "realpods")
    ):
        return
    if _why_not() is not None or not build.missing():
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    reporter = session.config.pluginmanager.getplugin("terminalreporter")
    with capture.global_and_fixture_disabled():
        reporter.write_line("controlplane: building the pinned control-plane binaries (first time only)")
        build.ensure_built(log=reporter.write_line)


@pytest.fixture(scope="session")
def cluster() -> Iterator[controlplane.Cluster]:
    reason = _why_not()
    if reason:
        pytest.skip(reason)  # under CI=true a failure (tests/conftest.py)
    running = controlplane.up(operator=None)
    try:
        yield running
    finally:
        if running.started:
            controlplane.down()
            left = controlplane.leftovers()
            assert not left, f"`down` left these on the machine: {left}"


@pytest.fixture(scope="session")
def real_node(cluster: controlplane.Cluster) -> controlplane.Cluster:
    """The cluster with its real node real-0 (containerd, kubelet, kube-proxy, CoreDNS) and the rayship
    operator as the chart's pod there; the node stays up until the cluster stops."""
    reason = controlplane.node_missing()
    if reason:
        pytest.skip(reason)  # under CI=true a failure (tests/conftest.py)
    return controlplane.up(operator=True, node=True)


@pytest.fixture(scope="session")
def api(cluster: controlplane.Cluster):
    """A kubernetes.client.ApiClient as the cluster admin."""
    client = cluster.api_client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def real_namespace(real_node, api) -> Iterator[str]:
    """A fresh namespace whose pods run on real-0 (its node selector and toleration, as namespace
    defaults); deleted, without waiting, at the end of the module."""
    import kubernetes

    core = kubernetes.client.CoreV1Api(api)
    name = f"real-{uuid.uuid4().hex[:6]}"
    core.create_namespace(controlplane.real_node_namespace(name))
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def namespace(api) -> Iterator[str]:
    """A fresh namespace for one test module (deleted, without waiting, at its end)."""
    import kubernetes

    core = kubernetes.client.CoreV1Api(api)
    name = f"cp-test-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@contextlib.contextmanager
def port_forward(cluster: controlplane.Cluster, namespace: str, target: str, port: int) -> Iterator[int]:
    """`kubectl port-forward` to `target`'s `port` (e.g. pod/web) on a loopback port of this machine,
    which it yields; stopped by its process group after."""
    forward = subprocess.Popen(
        [str(controlplane.VENV_BIN / "kubectl"), "--kubeconfig", str(cluster.kubeconfig),
         "port-forward", "-n", namespace, target, f":{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> port"
        assert line.startswith("Forwarding from 127.0.0.1:"), line
        yield int(line.split("127.0.0.1:")[1].split()[0])
    finally:
        os.killpg(forward.pid, signal.SIGTERM)
        forward.wait(10)
