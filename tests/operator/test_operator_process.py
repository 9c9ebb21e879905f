"""`rayship operator` as the chart runs it: a real process with the Deployment's args and env,
authenticated as the chart's ServiceAccount; liveness, Prometheus metrics, a clean SIGTERM exit."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from kubernetes import watch

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
    assert 'rayship_queue_depth{kind="TrainingJob"}' in metrics

    log = Path(handle.log_path)
    start = log.stat().st_size
    assert controlplane.stop_operator(handle), "the operator ignored SIGTERM for 10 s"
    assert not handle.alive()
    tail = log.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in tail, tail


def added_count(kube: Kube, resource: api.Resource, count: int, timeout: float) -> bool:
    """Watch `resource`; True as soon as `count` of them exist (False on timeout). A watch, not a
    poll: it returns within milliseconds of the event. Without a resourceVersion, it starts with an
    ADDED event for each one there already (a watch from a list's resourceVersion once waited out
    its 60 s seeing none while the API server was busy with 1000 new objects)."""
    group, version, plural = resource
    added = 0
    stream = watch.Watch()
    for event in stream.stream(
        kube.custom.list_namespaced_custom_object, group, version, kube.namespace, plural,
        timeout_seconds=int(timeout),
    ):  # fmt: skip
        added += event["type"] == "ADDED"
        if added >= count:
            stream.stop()
            return True
    return False


@pytest.mark.timeout(600)
@pytest.mark.floods_kuberay
def test_sigterm_under_a_backlog_starts_no_reconcile_and_a_restart_finishes_every_job(
    kube: Kube, cluster
) -> None:
    """A rollout of the operator while it works through a burst: on SIGTERM it starts no queued
    reconcile (only those running finish, one per thread of kopf's pool) and exits within the pod's
    grace period, not by SIGKILL; the next operator makes the RayJob of every job.

    The operator is paused (SIGSTOP) the moment the watch sees its 10th RayJob, counted, then sent
    SIGTERM and SIGCONT: the signal lands mid-burst however fast this machine makes RayJobs."""
    from controlplane import cluster as controlplane

    controlplane.stop_operator()
    kube.pvc()
    jobs = 1000  # issue 33 item 5's figure
    for i in range(jobs):
        kube.create(api.TRAININGJOBS, sample(f"backlog-{i:03d}", suspend=True))
    handle = controlplane.start_operator(wait=False)
    started = added_count(kube, api.RAYJOBS, 10, timeout=60)
    handle.pause()
    assert started, f"no 10 RayJobs in 60 s; the operator's log: {handle.log_path}"
    before = len(kube.list(api.RAYJOBS))
    pod = controlplane.operator_deployment(kube.core.api_client).spec.template.spec
    grace = pod.termination_grace_period_seconds
    (threads,) = [int(e.value) for c in pod.containers for e in c.env or [] if e.name == "RAYSHIP_WORKERS"]
    assert before < jobs - 2 * threads, f"the operator was done before SIGTERM ({before} RayJobs)"
    assert controlplane.stop_operator(handle, timeout=grace), f"the operator ignored SIGTERM for {grace} s"
    after = len(kube.list(api.RAYJOBS))
    # Those running at SIGTERM, and those a thread took before the operator cancelled them.
    assert after - before <= 2 * threads, f"{after - before} RayJobs made after SIGTERM ({before} before)"
    controlplane.start_operator()
    wait_for(lambda: len(kube.list(api.RAYJOBS)) == jobs, 300, what=f"{jobs} RayJobs")
