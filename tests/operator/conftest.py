"""The operator tier runs on the real control plane (`controlplane/cluster.py`, the session fixture
`cluster` in tests/cluster_fixtures.py): the rayship operator as the chart's ServiceAccount, the
real KubeRay, scheduler, garbage collector and kwok nodes.

* `operator`: the rayship operator is running (started as the chart's Deployment would run it).
* every test (`operator_log`, automatic) fails if an operator logged a refused (403) request meanwhile,
  whoever started it: the chart's RBAC must grant every request it makes.
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

# A 403 standing alone: not a log line's milliseconds ("19:59:05,403") nor part of an id (an
# Audit-Id "a7622e4a-92c3-403d-…" in a logged response's headers once matched).
REFUSED = re.compile(r"(?<![\w,.-])403(?![\w-])|Forbidden|forbidden")
# Not RBAC: Events about an object of a test namespace that is being deleted.
TERMINATING = "because it is being terminated"
# Not RBAC: the API server's admission cannot map a kind whose CRD was installed moments ago (its
# discovery is reset every 30 s); the operator retries it in seconds (k8s.Busy, OperatorProcess.retried).
DISCOVERY_LAG = "cannot find RESTMapping"
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def refused_lines(written: str, expected_until: datetime | None = None) -> list[str]:
    """The log lines that tell of a refused request, but those logged up to `expected_until`.

    A message's continuation lines (a logged exception's response headers and body) carry no
    timestamp: they belong to the moment of the last stamped line before them."""
    refused = []
    when = None
    for line in written.splitlines():
        stamp = STAMP.match(line)
        if stamp:
            when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
        if not REFUSED.search(line) or TERMINATING in line or DISCOVERY_LAG in line:
            continue
        if expected_until and when and when <= expected_until:
            continue
        refused.append(line)
    return refused


@dataclass
class OperatorLog:
    """The operator's log (every operator the control plane starts appends to one file) from where a
    test began."""

    path: Path
    start: int
    # Refusals logged before this moment are expected (e.g. an API server restarting with an empty
    # RBAC cache); a test that causes them sets it once the cluster is whole again.
    refusals_expected_until: datetime | None = None

    def refused(self) -> list[str]:
        written = self.path.read_bytes()[self.start :] if self.path.exists() else b""
        return refused_lines(written.decode(errors="replace"), self.refusals_expected_until)


@pytest.fixture(autouse=True)
def operator_log() -> Iterator[OperatorLog]:
    """Every operator that runs during a test (the `operator` fixture's, one a test starts itself with
    other settings, one restarted after a kill) is held to the chart's RBAC: the test fails if a refused
    request was logged meanwhile."""
    from controlplane.processes import Paths

    path = Paths().logs / "rayship-operator.log"
    log = OperatorLog(path, path.stat().st_size if path.exists() else 0)
    yield log
    refused = log.refused()
    assert not refused, "the operator made requests its RBAC refuses:\n" + "\n".join(refused[:20])


@dataclass
class RunningOperator:
    handle: Any
    log: OperatorLog

    @property
    def refusals_expected_until(self) -> datetime | None:
        return self.log.refusals_expected_until

    @refusals_expected_until.setter
    def refusals_expected_until(self, when: datetime | None) -> None:
        self.log.refusals_expected_until = when


@pytest.fixture
def operator(cluster, operator_log: OperatorLog) -> RunningOperator:
    """The rayship operator running (as the chart's Deployment would run it); `operator_log` holds it
    to its RBAC."""
    from controlplane import cluster as controlplane

    return RunningOperator(controlplane.start_operator(), operator_log)


@pytest.fixture
def kube(api) -> Iterator[Kube]:
    core = kubernetes.client.CoreV1Api(api)
    name = f"op-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield Kube(api, name)
    finally:
        try:
            core.delete_namespace(name)
        except kubernetes.client.exceptions.ApiException as err:
            if err.status != 404:  # a test that deletes its namespace itself
                raise
