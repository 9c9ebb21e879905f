"""Why a job is stuck or cannot run, said from real pods on real-0 (issue 59 section 1, issue 57
section 3): the kubelet, containerd and Ray report what happened, the operator (the chart's pod) names
it. No kwok stage, no status made by hand.

The image lives on a registry address no one serves (a closed port of the node's loopback): containerd's
pull is refused at once, without sending anything off the machine, and the kubelet backs off as it
would for any image it cannot have."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
import yaml

from rayship import api
from rayship.api import names
from tests.conftest import SAMPLES
from tests.operator.kube import Kube, sample, wait_for

pytestmark = [pytest.mark.realpods, pytest.mark.timeout(600)]

TJ, RJ = api.TRAININGJOBS, api.RAYJOBS
RAYCLUSTERS = ("ray.io", "v1", "rayclusters")
UNPULLABLE = "127.0.0.1:1/rayship/none:1"  # port 1 of the node's loopback: nothing listens there
# Pods that never run still hold their requests on the node's 2 CPUs: small ones.
SMALL = {
    "head": {"cpus": 0.1, "memory": "256Mi"},
    "workers": {"replicas": 1, "gpusPerWorker": 0, "cpusPerWorker": 0.1, "memoryPerWorker": "256Mi"},
}


def stuck_job(name: str, **spec: Any) -> dict[str, Any]:
    """The CPU sample (its checkpoint claim is the module's), its image one that cannot be pulled."""
    return sample(name, "kind-trainingjob-cpu.yaml", image=UNPULLABLE, **SMALL, **spec)


def test_an_image_that_cannot_be_pulled_is_named_then_the_startup_deadline_fails_the_job_and_frees_it(
    real_node, operator, kube: Kube
) -> None:
    """The head's and the worker's containers wait in ErrImagePull, then ImagePullBackOff, as the
    kubelet reports them; no RayJob event comes meanwhile (KubeRay's cluster is just not ready). The
    status names the pod and the container within the operator's look at a starting job (15 s by
    default), not at the resync (2 min); a Warning says it. Past spec.startupDeadlineSeconds the job
    fails with what it was stuck on, and its Ray cluster is deleted at once."""
    t0 = time.monotonic()
    kube.create(TJ, stuck_job("unpullable", startupDeadlineSeconds=75, failurePolicy={"retries": 0}))
    said: list[str] = []

    def reason() -> str:
        found = str(kube.condition(TJ, "unpullable", "Running").get("reason", ""))
        if not said or said[-1] != found:
            said.append(found)
        return found

    wait_for(lambda: reason() == "ImagePullBackOff", 60, interval=0.5, what="ImagePullBackOff named")
    said_after = time.monotonic() - t0
    cond = kube.condition(TJ, "unpullable", "Running")
    assert kube.status(TJ, "unpullable")["phase"] == "Pending", said
    assert "pod unpullable-" in cond["message"] and "container " in cond["message"], cond
    assert UNPULLABLE in cond["message"], "the kubelet's own words, which name the image"
    # the pod and container it names wait for their image, in the kubelet's own words (an init
    # container first: KubeRay's wait for the head's GCS runs from the same image)
    pod, container = cond["message"].split("pod ", 1)[1].split(":", 1)[0].split(", container ")
    status = kube.core.read_namespaced_pod(pod, kube.namespace).status
    (named,) = [c for c in [*(status.init_container_statuses or []), *(status.container_statuses or [])]
                if c.name == container]  # fmt: skip
    assert named.state.waiting and named.state.waiting.reason in {"ErrImagePull", "ImagePullBackOff"}, named
    wait_for(
        lambda: [e for e in kube.events("unpullable") if e[:2] == ("Warning", "ImagePullBackOff")],
        30,
        what="a Warning Event ImagePullBackOff",
    )
    print(f"ImagePullBackOff named {said_after:.0f}s after the create; reasons {said}")

    cluster = kube.status(TJ, "unpullable")["rayClusterName"]
    failed = wait_for(
        lambda: (c := kube.condition(TJ, "unpullable", "Failed")).get("status") == "True" and c,
        120,
        what="the job Failed at its startup deadline",
    )
    assert failed["reason"] == "StartupDeadlineExceeded", (failed, said)
    # what it was stuck on when the deadline passed: the kubelet swings between the two while it backs off
    stuck = failed["message"].split("it was stuck: ", 1)[-1]
    assert "ImagePullBackOff" in stuck or "ErrImagePull" in stuck, failed["message"]
    assert UNPULLABLE in stuck, failed["message"]
    wait_for(lambda: kube.get(RAYCLUSTERS, cluster) is None, 60, what="its RayCluster deleted")
    wait_for(lambda: not kube.pods(f"ray.io/cluster={cluster}"), 60, what="its pods gone from real-0")
    assert kube.status(TJ, "unpullable")["phase"] == "Failed"
    assert kube.get(RJ, names.rayjob_name("unpullable"))["spec"]["ttlSecondsAfterFinished"] == 0
    print(f"startup deadline: Failed and freed {time.monotonic() - t0:.0f}s after the create")


def test_a_spec_secret_planted_under_its_name_runs_nothing_when_the_job_is_let_go(
    real_node, operator, kube: Kube
) -> None:
    """Issue 57 section 3 for the TrainingJob: the spec Secret's name shows in the RayJob. Someone who
    may write Secrets in the namespace deletes ours and plants theirs under that name while the job is
    suspended; when it is let go, KubeRay makes the Ray cluster and the head mounts the planted Secret.
    The driver checks the files against the digest in the entrypoint and runs nothing of them: the job
    fails with those words, the planted spec never ran."""
    job = {
        **SMALL,
        # a real Ray cluster this time: the head holds GCS, the dashboard and the driver; a worker's
        # object store needs at least 75 MiB of its memory
        "head": {"cpus": 0.5, "memory": "3Gi"},
        "workers": {"replicas": 1, "gpusPerWorker": 0, "cpusPerWorker": 0.25, "memoryPerWorker": "1Gi"},
        "suspend": True,
        "failurePolicy": {"retries": 0},
        "ttlSecondsAfterFinished": 5,
    }
    kube.create(TJ, sample("planted", "kind-trainingjob-cpu.yaml", **job))
    rayjob = wait_for(lambda: kube.get(RJ, names.rayjob_name("planted")), 60, what="the RayJob")
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (name,) = [v["secret"]["secretName"] for v in head["volumes"] if v.get("secret")]
    kube.core.delete_namespaced_secret(name, kube.namespace)
    theirs = yaml.safe_load((SAMPLES / "kind-trainingjob-cpu.yaml").read_text())
    theirs["spec"]["trainer"]["epochs"] = 99  # what would show if it ran
    data = {"trainingjob.json": json.dumps(theirs), "salt": "0" * 64}
    kube.core.create_namespaced_secret(kube.namespace, {
        "metadata": {"name": name},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    })  # fmt: skip
    kube.patch(TJ, "planted", {"spec": {"suspend": False}})
    failed = wait_for(
        lambda: (s := kube.status(TJ, "planted")).get("phase") == "Failed" and s, 300, what="the job Failed"
    )
    error = failed["lastError"]["message"]
    print(f"the planted spec Secret: {failed['lastError']}")
    assert failed["lastError"]["source"] == "driver" and "is not the one the operator made" in error, failed
    assert "epoch" not in json.dumps(failed.get("progress") or {}), "the planted spec ran"


def test_a_checkpoint_claim_that_never_binds_is_named(real_node, operator, kube: Kube) -> None:
    """A claim no StorageClass can provision stays Pending; the scheduler will not place the pods that
    mount it, and the status says so in the scheduler's words, naming the pod."""
    kube.core.create_namespaced_persistent_volume_claim(kube.namespace, {
        "metadata": {"name": "never-bound"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "none-such",
                 "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    doc = sample("unbound", "kind-trainingjob-cpu.yaml", **SMALL)
    doc["spec"]["checkpoint"]["storage"]["pvc"]["claimName"] = "never-bound"
    kube.create(TJ, doc)
    try:
        cond = wait_for(
            lambda: (c := kube.condition(TJ, "unbound", "Running")).get("reason") == "Unschedulable" and c,
            90,
            what="the Running condition to say Unschedulable",
        )
        assert "pod unbound-" in cond["message"] and "PersistentVolumeClaim" in cond["message"], cond
        assert kube.status(TJ, "unbound")["phase"] == "Pending"
        wait_for(
            lambda: [e for e in kube.events("unbound") if e[:2] == ("Warning", "Unschedulable")],
            30,
            what="a Warning Event Unschedulable",
        )
    finally:
        kube.delete(TJ, "unbound")


def test_a_resourcequota_refusing_the_ray_pods_is_named(real_node, operator, kube: Kube) -> None:
    """No Ray pod exists to say why (the API server refused to create it): the job says it, from
    KubeRay's own ReplicaFailure condition, with the quota's words."""
    quota = {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    kube.core.create_namespaced_resource_quota(kube.namespace, quota)
    try:
        kube.create(TJ, sample("quota", "kind-trainingjob-cpu.yaml", **SMALL))
        cond = wait_for(
            lambda: (
                (c := kube.condition(TJ, "quota", "Running")).get("reason") == "ResourceQuotaExceeded" and c
            ),
            90,
            what="the Running condition to say ResourceQuotaExceeded",
        )
        assert "exceeded quota: no-pods" in cond["message"] and kube.status(TJ, "quota")["phase"] == "Pending"
    finally:
        kube.core.delete_namespaced_resource_quota("no-pods", kube.namespace)
        kube.delete(TJ, "quota")
