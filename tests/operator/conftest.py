"""The operator tier runs on the real control plane (`controlplane/cluster.py`, the session fixture
`cluster` in tests/cluster_fixtures.py): the rayship operator as the chart's ServiceAccount, the
real KubeRay, scheduler, garbage collector and kwok nodes.

* `operator`: the rayship operator is running (started as the chart's Deployment would run it);
  the test fails if the operator logged a refused (403) request meanwhile: the chart's RBAC must
  grant every request it makes.
* `kube`: a fresh namespace and helpers to read and write objects there as the cluster admin.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.operator.kube import Kube

# a 403 anywhere but in a log line's timestamp ("19:59:05,403"): its milliseconds once matched
REFUSED = re.compile(r"(?<![,\d])403(?!\d)|Forbidden|forbidden")
# Not RBAC: Events about an object of a test namespace that is being deleted.
TERMINATING = "because it is being terminated"
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


@dataclass
class RunningOperator:
    handle: Any
    # Refusals logged before this moment are expected (e.g. an API server restarting with an empty
    # RBAC cache); a test that causes them sets it once the cluster is whole again.
    refusals_expected_until: datetime | None = None


@pytest.fixture
def operator(cluster) -> Iterator[RunningOperator]:
    from controlplane import cluster as controlplane

    running = RunningOperator(controlplane.start_operator())
    log = Path(running.handle.log_path)
    start = log.stat().st_size
    yield running
    written = log.read_bytes()[start:].decode(errors="replace")
    refused = []
    for line in written.splitlines():
        if not REFUSED.search(line) or TERMINATING in line:
            continue
        stamp = STAMP.match(line)
        when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S") if stamp else None
        if running.refusals_expected_until and when and when <= running.refusals_expected_until:
            continue
        refused.append(line)
    assert not refused, "the operator made requests its RBAC refuses:\n" + "\n".join(refused[:20])


@pytest.fixture
def kube(api) -> Iterator[Kube]:
    core = kubernetes.client.CoreV1Api(api)
    name = f"op-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield Kube(api, name)
    finally:
        core.delete_namespace(name)
