"""What the real-pod modules share: each module's namespace on real-0 with the samples' checkpoint PVC,
and the operator as the chart's pod there, held to its RBAC."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane import cluster as controlplane
from tests.operator.conftest import refused_lines
from tests.operator.kube import Kube

CLAIM = "rayship-checkpoints"


@pytest.fixture(scope="module")
def kube(real_namespace: str, api) -> Iterator[Kube]:
    """The test namespace (its pods run on real-0) with the samples' checkpoint PVC."""
    kube = Kube(api, real_namespace)
    kube.pvc(CLAIM)
    yield kube


@pytest.fixture(scope="module")
def operator(real_node, api) -> Iterator[Any]:
    """The rayship operator runs as the chart's pod; nothing it asks for may be refused meanwhile."""
    dep = controlplane.operator_deployment(api)
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    yield dep
    logs = real_node.kubectl(
        "logs", "-n", dep.metadata.namespace, f"deployment/{dep.metadata.name}", f"--since-time={since}"
    ).stdout
    refused = refused_lines(logs)
    assert not refused, "the operator made requests its RBAC refuses:\n" + "\n".join(refused[:20])
