"""`rayship operator` as the chart runs it: a real process with the Deployment's args and env,
authenticated as the chart's ServiceAccount; liveness, Prometheus metrics, a clean SIGTERM exit."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from rayship import api
from tests.operator.kube import Kube, sample, wait_for

pytestmark = pytest.mark.operator


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as response:
        return str(response.read().decode())


def test_liveness_metrics_and_clean_sigterm(kube: Kube, cluster) -> None:
    from controlplane import cluster as controlplane

    handle = controlplane.start_operator()
    assert "--liveness" in handle.argv and fetch(handle.liveness_url)
    kube.pvc()
    kube.create(api.TRAININGJOBS, sample("metered"))
    wait_for(lambda: kube.get(api.RAYJOBS, "metered"), 60, what="the RayJob")
    assert handle.metrics_port, "the chart enables metrics by default"
    metrics = fetch(f"http://127.0.0.1:{handle.metrics_port}/metrics")
    assert 'rayship_reconciles_total{kind="TrainingJob"}' in metrics

    log = Path(handle.log_path)
    start = log.stat().st_size
    controlplane.stop_operator(handle)  # SIGTERM
    assert not handle.alive()
    tail = log.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in tail, tail
