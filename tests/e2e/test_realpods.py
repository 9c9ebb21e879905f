"""End to end on real pods (`make e2e-local`, in `make test`): our images on the real node real-0
(controlplane/node.py: containerd, a real kubelet, kube-proxy, CoreDNS) of the local control plane.

kubectl apply -> the rayship operator (the chart's pod on real-0, as the chart's ServiceAccount) ->
RayJob / RayService -> the real KubeRay -> a Ray head and worker pods from the workload image ->
DDP across three worker pods over the pod network (elastic: one taken away and back), checkpoints on the PVC, Serve answering through its
Service -> statuses from KubeRay's own. The scenarios share one namespace (its pods run on real-0)
and run in order: the service serves the model the training exported to the PVC.

Sizes fit the node's 2 CPUs: heads and workers request fractions of a CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from controlplane import cluster as controlplane
from controlplane import node as realnode
from rayship import __version__, api
from rayship.api import names
from rayship_workloads.haproxy_launcher import REQUEST_TIMEOUT_S
from tests.cluster_fixtures import port_forward
from tests.conftest import SAMPLES
from tests.e2e.conftest import CLAIM
from tests.operator.kube import Kube, wait_for

pytestmark = [pytest.mark.realpods, pytest.mark.timeout(600)]

TJ, MS, RJ, RS = api.TRAININGJOBS, api.MODELSERVICES, api.RAYJOBS, api.RAYSERVICES
TRAINING, SERVING = "mlp-cpu", "mlp-cpu"  # the samples' names
UNDISTURBED = "mlp-cpu-undisturbed"  # the elastic job's twin that nothing disturbs
RETRAINING = "retrain"  # the TrainingSchedule whose promoted run the service rolls out to
GATE_NONE_PASSES, GATE_ALL_PASS = 0.0, 1000.0  # its promote.threshold (loss below it passes)
TS = api.TRAININGSCHEDULES
# What the samples ask, cut to the node: a head of half a CPU, workers of half a CPU each.
SMALL_TRAINING = {
    # the head holds GCS, the dashboard, the job's driver and Ray Train's controller: ~2 GB
    "head": {"cpus": 0.5, "memory": "3Gi"},
    "workers": {"replicas": 2, "gpusPerWorker": 0, "cpusPerWorker": 0.5, "memoryPerWorker": "2Gi"},
    "ttlSecondsAfterFinished": 5,  # the finished job's Ray cluster frees the node soon
}
SAMPLE_TRAINER = yaml.safe_load((SAMPLES / "kind-trainingjob-cpu.yaml").read_text())["spec"]["trainer"]
SAMPLE_CHECKPOINT = yaml.safe_load((SAMPLES / "kind-trainingjob-cpu.yaml").read_text())["spec"]["checkpoint"]
SMALL_SERVICE = {
    "head": {"cpus": 0.25, "memory": "3Gi"},
    "resources": {"gpus": 0, "cpus": 0.5, "memory": "2Gi"},
}


def apply(cluster, kube: Kube, sample: str, name: str | None = None, **spec: Any) -> dict[str, Any]:
    """`kubectl apply` a sample into the test namespace (spec fields replaced by `spec`; `name`
    instead of the sample's)."""
    doc = yaml.safe_load((SAMPLES / sample).read_text())
    doc["metadata"]["namespace"] = kube.namespace
    if name:
        doc["metadata"]["name"] = name
    doc["spec"].update(spec)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    return doc


def claim_folder(kube: Kube) -> Path:
    """The PVC's folder on this machine (the provisioner's hostPath PV)."""
    volume = wait_for(
        lambda: kube.core.read_namespaced_persistent_volume_claim(CLAIM, kube.namespace).spec.volume_name,
        60,
        what=f"the claim {CLAIM} bound",
    )
    return Path(kube.core.read_persistent_volume(volume).spec.host_path.path)


LOCAL_PREDICT = """
import json, sys, torch
from rayship_workloads.models import load_model
net, manifest = load_model(sys.argv[1])
n = len(manifest["features"])
rows = [[float(v) for v in row[:n]] for row in json.loads(sys.argv[2])]
with torch.no_grad():
    print(json.dumps({"rows": rows, "out": net(torch.tensor(rows, dtype=torch.float32)).tolist()}))
"""


def predict_in_pod(
    cluster, kube: Kube, model: str, rows: list[list[float]], service: str = SERVING
) -> tuple[list[list[float]], Any]:
    """(rows cut to the model's features, its outputs for them), computed apart from Serve: the
    model loaded from the PVC by a plain python in a serving pod (the pods' user: the run's checkpoint
    key is trusted only by the user that wrote it)."""
    cluster_name = kube.status(RS, names.rayservice_name(service))["activeServiceStatus"]["rayClusterName"]
    pod = kube.pods(f"ray.io/cluster={cluster_name},ray.io/node-type=head")[0].metadata.name
    out = cluster.kubectl("exec", "-n", kube.namespace, pod, "--", "python", "-c", LOCAL_PREDICT, model,
                          json.dumps(rows)).stdout  # fmt: skip
    found = json.loads(out.strip().splitlines()[-1])
    return found["rows"], found["out"]


def on_host(kube: Kube, pod_path: str) -> Path:
    mount = "/mnt/checkpoints"  # the samples' checkpoint mountPath
    assert pod_path.startswith(mount + "/"), pod_path
    return claim_folder(kube) / pod_path.removeprefix(mount + "/")


def phase(kube: Kube, resource: api.Resource, name: str, *finals: str) -> str:
    """The phase, failing at once on a final phase other than `finals`."""
    status = kube.status(resource, name)
    found = status.get("phase") or ""
    assert found not in ({"Failed", "Invalid"} - set(finals)), json.dumps(status, indent=1)[:3000]
    return found


KILLED = "killed-twice"  # the job whose driver is killed in two attempts
# Kills the job's driver (`python -m rayship_workloads.job`, run by Ray's job supervisor on the head) as
# the kernel's OOM killer would: SIGKILL, no chance to clean up.
KILL_DRIVER = """
import os, signal
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')
    except OSError:
        continue
    if b'rayship_workloads.job' in argv:
        os.kill(int(pid), signal.SIGKILL)
        print(pid)
"""


class PodTimes:
    """Each Ray pod's own running time and CPU request, as the kubelet reports them (a watch on the
    job's pods): from the pod's start (status.startTime: on the node, holding its resources) to its
    containers' end (terminated.finishedAt), or to its deletion when that was not seen."""

    def __init__(self, kube: Kube, job: str):
        self.kube, self.job = kube, job
        self.pods: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        selector = f"{names.owner_label('TrainingJob')}={self.job},ray.io/node-type"
        while not self.stop.is_set():
            watch = kubernetes.watch.Watch()
            for event in watch.stream(self.kube.core.list_namespaced_pod, self.kube.namespace,
                                      label_selector=selector, timeout_seconds=5):  # fmt: skip
                self._see(event["type"], event["object"])
                if self.stop.is_set():
                    watch.stop()

    def _see(self, kind: str, pod: Any) -> None:
        seen = self.pods.setdefault(pod.metadata.uid, {"name": pod.metadata.name})
        seen["type"] = (pod.metadata.labels or {}).get("ray.io/node-type")
        if pod.metadata.deletion_timestamp:
            seen.setdefault("deleted", pod.metadata.deletion_timestamp)
        seen["cpus"] = sum(
            float(kubernetes.utils.parse_quantity((c.resources.requests or {}).get("cpu", "0")))
            for c in pod.spec.containers
        )
        if pod.status.start_time:
            seen["start"] = pod.status.start_time
        ended = [s.state.terminated.finished_at for s in pod.status.container_statuses or []
                 if s.state and s.state.terminated and s.state.terminated.finished_at]  # fmt: skip
        if ended and len(ended) == len(pod.spec.containers):
            seen["end"] = max(ended)
        if kind == "DELETED" and "end" not in seen:
            seen["end"] = datetime.now(UTC)

    def cpu_seconds(self) -> float:
        self.stop.set()
        self.thread.join(10)
        running = [p for p in self.pods.values() if "start" in p]
        assert all("end" in p for p in running), f"pods not ended: {running}"
        return sum(p["cpus"] * (p["end"] - p["start"]).total_seconds() for p in running)

    def heads_left_of_their_grace(self) -> dict[str, float]:
        """Each deleted head pod's seconds from its containers' end (the kubelet's time) to its
        deletionTimestamp: the API server sets that to the deletion plus the grace period, the moment
        the kubelet kills what still runs (0: it ran until the kill)."""
        return {p["name"]: (p["deleted"] - p["end"]).total_seconds() for p in self.pods.values()
                if p["type"] == "head" and "deleted" in p and "end" in p}  # fmt: skip

    def compared(self, attempts: list[dict[str, Any]]) -> str:
        """Each pod's CPU-seconds as watched here, and the operator's per attempt (a failure's words)."""
        lines = [f"{p['name']}: {p['cpus'] * (p['end'] - p['start']).total_seconds():.1f} CPU-s "
                 f"({p['start']:%T}..{p['end']:%T})" for p in self.pods.values() if "start" in p and "end" in p]  # fmt: skip
        return "\n".join([*lines, f"the operator's, per attempt: {[a.get('cpuSeconds') for a in attempts]}"])

    def table(self) -> str:
        """Each pod's figures (for a failure's message): name, CPUs, start, end."""
        return "; ".join(
            f"{p['name']} {p['cpus']} {p.get('start')}..{p.get('end')}" for p in self.pods.values()
        )


def s3_in_the_namespace(cluster, kube: Kube) -> None:
    """An S3 server as a pod of the test namespace, behind the Service `objects` (port 5000; path-style
    buckets: the server would read a Service's host name as a bucket's): the tests' own
    (moto's, `make setup`'s .venv/s3), its packages read from this machine through a hostPath, run by
    the workload image's Python 3.11 as the pods' user."""
    from tests.s3_server import S3_SERVER

    venv = str(S3_SERVER.parent.parent)
    packages = f"{venv}/lib/python3.11/site-packages"
    labels = {"app": "s3"}
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s3", "namespace": kube.namespace, "labels": labels},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
            "containers": [{
                "name": "s3", "image": f"rayship/rayship-workloads:{__version__}-cpu", "imagePullPolicy": "Never",
                "command": ["python", "-c", "from moto.server import main; main()", "-H", "0.0.0.0", "-p", "5000"],
                "env": [{"name": "PYTHONPATH", "value": packages},
                        {"name": "S3_IGNORE_SUBDOMAIN_BUCKETNAME", "value": "true"}],
                "ports": [{"containerPort": 5000}],
                "readinessProbe": {"tcpSocket": {"port": 5000}, "periodSeconds": 1},
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
                "volumeMounts": [{"name": "venv", "mountPath": packages, "readOnly": True}],
            }],
            "volumes": [{"name": "venv", "hostPath": {"path": packages, "type": "Directory"}}],
        },
    }  # fmt: skip
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "objects", "namespace": kube.namespace},
        "spec": {"selector": labels, "ports": [{"port": 5000, "targetPort": 5000}]},
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([pod, service]))
    cluster.kubectl("wait", "-n", kube.namespace, "pod/s3", "--for=condition=Ready", "--timeout=120s")


def settled(kube: Kube, name: str, unsettled: list[Any] | None = None) -> dict[str, Any]:
    """The TrainingJob's status once every attempt is settled: the operator saw each attempt's pods
    gone (it looks again every `startingSeconds` until then) and its figures are final. `unsettled`
    gets the last record seen before, with each pod's times (for a failure's message)."""

    def final() -> dict[str, Any] | None:
        status = kube.status(TJ, name)
        attempts = status.get("attempts") or []
        if attempts and all("pods" not in a for a in attempts):
            return status
        if unsettled is not None:
            unsettled[:] = attempts
        return None

    return wait_for(final, 150, interval=1, what=f"{name}'s attempts settled (their pods seen gone)")


def s3_credentials(cluster, kube: Kube) -> list[dict[str, Any]]:
    """The Secret of the test S3 server's credentials, and a job's env for that server: the
    credentials by reference (secretKeyRef), the endpoint, the region."""
    from tests.s3_server import S3_ENV

    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-credentials", "namespace": kube.namespace},
              "stringData": {k: S3_ENV[k] for k in keys}}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(secret))
    env: list[dict[str, Any]] = [{"name": k, "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": k}}}
                                 for k in keys]  # fmt: skip
    return env + [{"name": "AWS_ENDPOINT_URL", "value": f"http://objects.{kube.namespace}.svc:5000"},
                  {"name": "AWS_DEFAULT_REGION", "value": "us-east-1"},
                  {"name": "AWS_EC2_METADATA_DISABLED", "value": "true"}]  # fmt: skip


def test_a_job_killed_twice_shows_three_attempts_resumed_and_its_pods_cpu_time(
    real_node, operator, kube: Kube
) -> None:
    """Issue 34 §3 (and §1 on object storage) on real pods: a job whose checkpoint storage is an S3
    bucket (an S3 server in the namespace; its credentials by reference) has its driver killed
    (SIGKILL, as the OOM killer does) in its first and its second attempt. KubeRay retries each on a
    new Ray cluster (failurePolicy.retries: 2, the default); each attempt resumes the latest
    checkpoint from the bucket; the third succeeds and exports its model there. Three attempts on
    record, each with the epoch it resumed from and reached, an Event as each ends and starts; the
    CPU-hours add up and match the pods' own running times; once the clusters are gone, `rayship logs
    --attempt` reads each attempt's driver (and --rank 0 a worker's own) from the bucket, from this
    machine with its own credentials (through a port-forward)."""
    from tests.s3_server import S3_ENV

    cluster, t0 = real_node, time.monotonic()
    s3_in_the_namespace(cluster, kube)
    epochs_in_all = 8
    job = dict(SMALL_TRAINING, workers=dict(SMALL_TRAINING["workers"], replicas=1), env=s3_credentials(cluster, kube),
               trainer=dict(SAMPLE_TRAINER, epochs=epochs_in_all), data={"source": "synthetic", "samples": 4096},
               checkpoint={"storage": {"uri": "s3://runs/jobs"}, "everyEpochs": 1})  # fmt: skip
    pods = PodTimes(kube, KILLED)
    killed_after: list[int] = []
    with port_forward(cluster, kube.namespace, "pod/s3", 5000) as port:
        endpoint = f"http://127.0.0.1:{port}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        opener.open(urllib.request.Request(f"{endpoint}/runs", method="PUT"), timeout=10).close()
        here = {**os.environ, **S3_ENV, "AWS_ENDPOINT_URL": endpoint}
        apply(cluster, kube, "kind-trainingjob-cpu.yaml", name=KILLED, **job)
        try:
            for attempt in (1, 2):
                killed_after.append(kill_the_driver_after_two_epochs(cluster, kube, attempt, here))
            wait_for(lambda: phase(kube, TJ, KILLED, "Succeeded") == "Succeeded", 420, interval=0.5,
                     what="Succeeded on the third attempt")  # fmt: skip
            run = f"s3://runs/jobs/{kube.namespace}.{KILLED}"
            assert kube.status(TJ, KILLED)["checkpoint"]["model"] == f"{run}/model"
            wait_for(lambda: not kube.pods(f"{names.owner_label('TrainingJob')}={KILLED},ray.io/node-type"), 180,
                     what="every Ray cluster of the job deleted")  # fmt: skip
            # Each head ended at once when its cluster was deleted, long before the kill at its grace
            # period (30 s). Ray drains a node on SIGTERM until it is idle, and a job's head never is:
            # before head_drain_env each head ran until that kill, holding the node's CPUs and memory.
            heads = pods.heads_left_of_their_grace()
            assert len(heads) == 3 and min(heads.values()) > 20, (heads, pods.table())
            # Its logs, from the bucket, with this machine's credentials: each attempt's driver, a rank's own
            for attempt, said in (
                (1, "rank 0 of 1 on"),
                (2, "resuming after epoch"),
                (3, f"epoch {epochs_in_all}/"),
            ):
                kept = rayship_logs(cluster, kube, "--attempt", str(attempt), ref=f"tj/{KILLED}", env=here)
                assert kept.returncode == 0 and said in kept.stdout, (
                    attempt,
                    kept.stderr,
                    kept.stdout[-2000:],
                )
            rank = rayship_logs(cluster, kube, "--rank", "0", ref=f"tj/{KILLED}", env=here)
            assert rank.returncode == 0 and "rank 0 epoch" in rank.stdout, (rank.stderr, rank.stdout[-2000:])
            unsettled: list[Any] = []
            status = settled(kube, KILLED, unsettled)
            checked_attempts(kube, status, killed_after, epochs_in_all, pods.cpu_seconds(), t0)
            assert status["cpuSeconds"] == pytest.approx(pods.cpu_seconds(), rel=0.05), (
                pods.compared(status["attempts"]) + f"\nunsettled: {unsettled}"
            )
        finally:
            pods.stop.set()
            cluster.kubectl(
                "delete", "tj", KILLED, "-n", kube.namespace, "--ignore-not-found", "--wait=false"
            )


def kill_the_driver_after_two_epochs(cluster, kube: Kube, attempt: int, here: dict[str, str]) -> int:
    """Once `attempt` has trained two epochs (past its resume) and its driver's log on the bucket (read
    with `here`'s credentials) shows its worker's start, its driver is SIGKILLed; the epoch seen. (A
    process killed outright loses the output of its last joblog.PART_SECONDS: the worker's start line,
    forwarded by Ray to the driver, can be that recent after two short epochs.)"""

    def trained_two_epochs() -> int | None:
        status = kube.status(TJ, KILLED)
        assert phase(kube, TJ, KILLED) != "Succeeded", f"finished before kill {attempt}: {status}"
        progress = status.get("progress") or {}
        resumed = progress.get("resumedFromEpoch", 0) if attempt > 1 else 0
        if status.get("attempt") != attempt or (attempt > 1 and "resumedFromEpoch" not in progress):
            return None
        epoch = progress.get("epoch") or 0
        return epoch if epoch >= resumed + 2 else None

    epoch = wait_for(trained_two_epochs, 420, interval=0.2, what=f"attempt {attempt}: 2 epochs")

    def started_on_the_bucket() -> bool:
        logs = rayship_logs(cluster, kube, "--attempt", str(attempt), ref=f"tj/{KILLED}", env=here)
        return logs.returncode == 0 and "training worker rank 0 of 1 on" in logs.stdout

    wait_for(
        started_on_the_bucket, 60, interval=0.5, what=f"attempt {attempt}: its worker's start on the bucket"
    )
    head = kube.pods(f"ray.io/cluster={kube.status(RJ, names.rayjob_name(KILLED))['rayClusterName']},"
                     "ray.io/node-type=head")[0].metadata.name  # fmt: skip
    out = cluster.kubectl("exec", "-n", kube.namespace, head, "-c", "ray-head", "--",
                          "python", "-c", KILL_DRIVER).stdout  # fmt: skip
    assert out.strip(), f"no driver process found in {head}"
    return int(epoch)


def checked_attempts(
    kube: Kube,
    status: dict[str, Any],
    killed_after: list[int],
    epochs_in_all: int,
    pods_cpu: float,
    t0: float,
) -> None:
    """The killed job's record: three attempts, each resumed from the latest checkpoint, their Events,
    lastError, and CPU-seconds that add up and match the pods' own times."""
    record = status["attempts"]
    summary = [(a["attempt"], a["outcome"], a.get("resumedFromEpoch"), a["reachedEpoch"]) for a in record]
    assert [s[:2] for s in summary] == [(1, "Failed"), (2, "Failed"), (3, "Succeeded")], summary
    assert status["attempt"] == 3 and status["progress"]["epoch"] == epochs_in_all, status
    first, second, third = record
    # each attempt resumed the latest complete checkpoint: never from scratch, never behind
    assert first.get("resumedFromEpoch") is None and first["reachedEpoch"] >= killed_after[0], summary
    assert 1 <= second["resumedFromEpoch"] <= first["reachedEpoch"], summary
    assert second["reachedEpoch"] >= killed_after[1] >= second["resumedFromEpoch"] + 2, summary
    assert second["resumedFromEpoch"] < third["resumedFromEpoch"] <= second["reachedEpoch"], summary
    assert third["reachedEpoch"] == epochs_in_all, summary
    # (reachedEpoch is what each attempt reported, never raised to the next one's resume: a report lost
    # as its driver was killed, after Ray Train had registered its checkpoint, is read back by the next
    # attempt, said as reportRecovered, with an Event)
    left = [(a.get("checkpointEpoch"), a.get("reportRecovered")) for a in record]
    assert [a["checkpointEpoch"] for a in record[:2]] == [second["resumedFromEpoch"], third["resumedFromEpoch"]], (
        summary, left)  # fmt: skip
    assert all(a["checkpointEpoch"] <= a["reachedEpoch"] for a in record), (summary, left)
    recovered = {f"attempt {a['attempt']}'s report" for a in record if a.get("reportRecovered")}
    said_recovered = {
        m.split(" of epoch")[0] for _, reason, m in kube.events(KILLED) if reason == "ReportRecovered"
    }
    assert said_recovered == recovered, (said_recovered, left)
    assert [a["endTime"] for a in record[:2]] == [a["startTime"] for a in record[1:]], record
    # the last failed attempt's driver error: KubeRay's words (-9: killed), or, where the operator's pass
    # came after KubeRay's short Retrying state had passed, that attempt named with where its error is
    last_error = status["lastError"]
    assert last_error["source"] == "driver" and last_error["attempt"] == 2, last_error
    cpu = sum(a["cpuSeconds"] for a in record)
    assert cpu == pytest.approx(status["cpuSeconds"], abs=0.01), (record, status["cpuSeconds"])
    assert status["cpuHours"] == round(status["cpuSeconds"] / 3600, 3) and status["gpuSeconds"] == 0
    # (Events carry whole seconds: an attempt's end and the next one's start may share one)
    said = sorted(message.split(" (")[0].split(":")[0] for _, reason, message in kube.events(KILLED)
                  if reason.startswith("Attempt"))  # fmt: skip
    assert said == sorted(["attempt 1 failed", "attempt 2 started on a new Ray cluster", "attempt 2 failed",
                           "attempt 3 started on a new Ray cluster", "attempt 3 succeeded"]), said  # fmt: skip
    print(
        f"killed twice on real pods: killed after epochs {killed_after}; attempts (n, outcome, resumed "
        f"from, reached) {summary}, (checkpoint, report recovered) {left}; CPU-seconds on record {status['cpuSeconds']:.1f} (per attempt "
        f"{[a['cpuSeconds'] for a in record]}), the pods' own {pods_cpu:.1f}; lastError {last_error}; "
        f"done in {time.monotonic() - t0:.0f}s"
    )
    # (the record against the pods' own running times, start on the node to the containers' end: the
    # caller's, with each pod's figures)


@pytest.mark.timeout(900)  # the job, then the same job undisturbed after it
def test_ddp_trains_across_three_worker_pods_shrinks_to_two_and_grows_back(
    real_node, operator, kube: Kube
) -> None:
    """Scenarios 1 and 5 on one elastic job (workers.minReplicas 2 of 3): a head and three worker pods
    from the workload image on real-0; DDP's ranks, one in each worker pod, talk over the pod network;
    each worker pod's `kubectl logs` names its rank. Then a worker pod is taken away mid-training as
    a drain or a spot reclaim takes it: deleted with its own grace period (workers.
    terminationGracePeriodSeconds: 30 s, the default), while the node is cordoned so its replacement
    cannot start.
    Ray drains the pod's node until 5 s before the kill; the ranks learn of it and save each epoch that
    ends meanwhile; Ray Train restarts from the latest checkpoint on the PVC just before the deadline
    (a preemption: retried without limit, apart from maxWorkerFailures) with the two workers left, and
    trains on. Uncordoned, the replacement pod starts and Ray Train grows back to three (workers.
    resizeIntervalSeconds). One attempt on record, its ready workers 3, 2, 3; `Succeeded` from KubeRay's
    status; its final loss in the band of the same job undisturbed, trained after it."""
    cluster = real_node
    t0 = time.monotonic()
    # ~2 s each: the shrink (~epoch 20), the epochs with two and the growth (~epoch 40) fit in them
    epochs_in_all, every = 55, 5
    # 30 s of notice: Ray drains 25 s, Ray Train restarts 3 s before that ends; epochs end meanwhile
    # (with 20 s, an epoch of the two jobs sharing 2 CPUs sometimes outlasted what was left of it)
    # A quarter-CPU head and three fifth-of-a-CPU workers: the job and its undisturbed twin fit the
    # node's 2 CPUs together (the twin's pods start while the job's last pods drain).
    elastic = dict(SMALL_TRAINING["workers"], replicas=3, minReplicas=2, cpusPerWorker=0.2,
                   terminationGracePeriodSeconds=30, resizeIntervalSeconds=10)  # fmt: skip
    job = dict(SMALL_TRAINING, head={"cpus": 0.25, "memory": "3Gi"}, workers=elastic,
               trainer=dict(SAMPLE_TRAINER, epochs=epochs_in_all), data={"source": "synthetic", "samples": 4096},
               checkpoint=dict(SAMPLE_CHECKPOINT, everyEpochs=every))  # fmt: skip
    pods = PodTimes(kube, TRAINING)
    apply(cluster, kube, "kind-trainingjob-cpu.yaml", **job)
    try:
        trained_elastic_job(cluster, kube, t0, epochs_in_all, every, pods, job)
    finally:
        pods.stop.set()
        cluster.kubectl(
            "delete", "tj", UNDISTURBED, "-n", kube.namespace, "--ignore-not-found", "--wait=false"
        )


def trained_elastic_job(
    cluster, kube: Kube, t0: float, epochs_in_all: int, every: int, pods: PodTimes, job: dict[str, Any]
) -> None:
    """The test above, from the job's apply on."""

    # While it runs, `kubectl get tj` shows the epoch and the loss the workload patched (as the job's
    # own ServiceAccount, through the API server, with the token mounted in the pod).
    def progress_row() -> str | None:
        out = cluster.kubectl("get", "tj", TRAINING, "-n", kube.namespace).stdout
        cells = table_row(out)
        if phase(kube, TJ, TRAINING, "Succeeded") == "Succeeded":
            pytest.fail(f"Succeeded before any progress was seen while Running:\n{out}")
        return out if cells.get("PHASE") == "Running" and cells.get("EPOCH", "").isdigit() else None

    out = wait_for(progress_row, 420, interval=0.3, what="EPOCH and LOSS in `kubectl get tj` while Running")
    first_epoch = time.monotonic() - t0
    cells = table_row(out)
    assert {"EPOCH", "LOSS", "GPU-HOURS"} <= set(cells), out
    assert float(cells["LOSS"]) > 0, out
    print(f"kubectl get tj while Running:\n{out}")
    # `rayship logs` while the cluster runs: the driver's log (every rank's lines, as Ray forwards
    # them) read from the PVC through the head pod
    live = wait_for(
        lambda: "rank 0 epoch 1/" in (found := rayship_logs(cluster, kube)).stdout and found,
        30,
        what="`rayship logs` while Running",
    )
    assert live.returncode == 0, live.stderr

    cluster_name = kube.status(RJ, names.rayjob_name(TRAINING))["rayClusterName"]
    worker_selector = f"ray.io/cluster={cluster_name},ray.io/node-type=worker"
    workers = kube.pods(worker_selector)
    assert len(workers) == 3, [p.metadata.name for p in workers]
    assert {p.spec.node_name for p in workers} == {realnode.NAME}
    assert len({p.status.pod_ip for p in workers}) == 3, "the three ranks are in three pods"
    # the chart's cpuLimits: false (cluster-up sets it for this 2-CPU node) reached the pods
    assert {p.status.qos_class for p in workers} == {"Burstable"}, [
        p.spec.containers[0].resources for p in workers
    ]
    assert {p.spec.termination_grace_period_seconds for p in workers} == {30}
    ranks = {}
    for pod in workers:
        logs = cluster.kubectl("logs", "-n", kube.namespace, pod.metadata.name).stdout
        ranks[pod.metadata.name] = {line.split("rank ")[1].split()[0] for line in logs.splitlines()
                                    if "rayship: training worker rank " in line}  # fmt: skip
    assert sorted(r for found in ranks.values() for r in found) == ["0", "1", "2"], ranks

    run = claim_folder(kube) / f"{kube.namespace}.{TRAINING}"
    epochs: list[int] = []  # every epoch seen in status.progress, in order

    def checkpoints() -> list[int]:
        return sorted(int(p.name.rsplit("-", 1)[-1]) for p in run.glob("epoch-*")) if run.is_dir() else []

    def progress() -> dict[str, Any]:
        found = kube.status(TJ, TRAINING).get("progress") or {}
        if found.get("epoch") is not None and (not epochs or epochs[-1] != found["epoch"]):
            epochs.append(found["epoch"])
        return found

    def checkpointed() -> bool:
        epoch = progress().get("epoch")
        assert phase(kube, TJ, TRAINING) != "Succeeded", f"finished before the deletion: epochs {epochs}"
        return bool(epoch and epoch > every and checkpoints())

    wait_for(checkpointed, 420, interval=0.2, what=f"{every + 1} epochs and a checkpoint on the PVC")
    seen, deleted_at = len(epochs), epochs[-1]
    victim = next(p for p in workers if "0" not in ranks[p.metadata.name])
    cluster.kubectl("cordon", realnode.NAME)
    try:
        # As a drain or a spot reclaim takes it: with the pod's own grace period.
        kube.core.delete_namespaced_pod(victim.metadata.name, kube.namespace)
        deleted = time.monotonic()

        def trained_on_with_two() -> int | None:
            found = progress()
            assert phase(kube, TJ, TRAINING) != "Succeeded", f"finished before training on: epochs {epochs}"
            pending = [p for p in kube.pods(worker_selector) if p.metadata.uid != victim.metadata.uid]
            assert len([p for p in pending if p.status.phase == "Running"]) <= 2, (
                "a replacement ran, cordoned"
            )
            resumed = found.get("resumedFromEpoch")
            return resumed if resumed is not None and found.get("epoch", 0) > resumed else None

        what = "an epoch trained with two workers after the restart"
        shrink_resumed = wait_for(trained_on_with_two, 240, interval=0.2, what=what)
        shrunk = time.monotonic() - deleted
    finally:
        cluster.kubectl("uncordon", realnode.NAME)

    def succeeded() -> bool:
        progress()
        return phase(kube, TJ, TRAINING, "Succeeded") == "Succeeded"

    wait_for(succeeded, 420, interval=0.2, what="Succeeded after a worker pod was taken away and came back")
    # The same job (same data, seed and epochs) that nothing disturbs, the quality band's reference, runs
    # once this one is done (beside the checks below). Started beside it, its pods crash-looped: eight
    # Ray pods starting on the 2 CPUs, or four while the other job trained, starved the heads' GCS and a
    # worker's `ray start` gives up when its node is not registered within 30 s (Ray's own limit: "The
    # current node timed out during startup"; the fresh-machine CI of cab7830, then here, for 3 min).
    apply(cluster, kube, "kind-trainingjob-cpu.yaml", name=UNDISTURBED, **job)
    after = epochs[seen:]
    assert after and min(after) >= deleted_at > every, f"epochs {epochs}; deleted after epoch {deleted_at}"
    rayjob = kube.status(RJ, names.rayjob_name(TRAINING))
    assert rayjob["jobStatus"] == "SUCCEEDED" and rayjob["jobDeploymentStatus"] == "Complete", rayjob
    replaced = kube.pods(worker_selector)
    assert victim.metadata.uid not in {p.metadata.uid for p in replaced}, "the deleted pod was replaced"
    status = kube.status(TJ, TRAINING)
    assert status["progress"]["epoch"] == epochs_in_all, status
    # never from scratch: each restart resumed a checkpoint at or after the one before the deletion
    resumed = status["progress"].get("resumedFromEpoch", 0)
    assert deleted_at - 1 <= resumed < epochs_in_all, (status["progress"], epochs)
    model = status["checkpoint"]["model"]
    assert (on_host(kube, model) / "rayship-model.json").is_file(), f"{model} is not on the PVC"
    # One attempt on record (Ray Train shrank and grew inside it: KubeRay did not retry).
    (only,) = status["attempts"]
    assert (only["attempt"], only["outcome"], only["reachedEpoch"]) == (1, "Succeeded", epochs_in_all), only
    # the worker pod taken away and its replacement, in the attempt's record: 3 ready, 2, 3 again
    ready = [change["readyWorkers"] for change in only.get("workerChanges") or []]
    assert 3 in ready and 2 in ready[ready.index(3) :] and ready[-1] == 3, only
    assert (only["startTime"], only["endTime"]) == (rayjob["startTime"], rayjob["endTime"]), (only, rayjob)
    # Once KubeRay has deleted the cluster (ttlSecondsAfterFinished), `rayship logs` reads the same
    # files from the PVC through a reader pod: the driver's (each rank's lines) and one rank's own.
    wait_for(lambda: not kube.pods(f"ray.io/cluster={cluster_name}"), 120, what="the Ray cluster deleted")
    started = time.monotonic()
    kept = rayship_logs(cluster, kube)
    print(f"rayship logs from the PVC through a reader pod: {time.monotonic() - started:.1f}s")
    assert kept.returncode == 0, kept.stderr
    assert f"rank 0 epoch {epochs_in_all}/{epochs_in_all}" in kept.stdout, kept.stdout[-2000:]
    assert f"rank 2 epoch 1/{epochs_in_all}" in kept.stdout, kept.stdout[-2000:]  # before the shrink
    # The ranks learnt of the drain and saved the epoch; Ray Train counted a preemption, retried
    # without limit and not against maxWorkerFailures.
    # every epoch that ended in the notice was saved (whatever everyEpochs), and the group of two
    # resumed one of them (the last may have been cut short by the restart)
    notice = [
        line for line in kept.stdout.splitlines() if "rank 0: ranks [" in line and "being preempted" in line
    ]
    noticed = sorted({int(line.rsplit("checkpoint after epoch ", 1)[1].split()[0]) for line in notice})
    assert shrink_resumed in noticed and shrink_resumed >= deleted_at, (noticed, shrink_resumed, deleted_at)
    assert "Source: preemption" in kept.stdout and "(max allowed: inf)" in kept.stdout, kept.stdout[-3000:]
    assert "Source: worker group" not in kept.stdout, kept.stdout[-3000:]
    sizes = [int(line.split("worker group of size ")[1].split()[0].rstrip(":.,"))
             for line in kept.stdout.splitlines() if "Started training worker group of size" in line]  # fmt: skip
    assert 3 in sizes and 2 in sizes[sizes.index(3) :] and sizes[-1] == 3, sizes
    # the group grown back to three trained epochs of its own (not only a resize after the last)
    starts = [(int(line.split(" of ")[1].split()[0]), int(line.rsplit("resuming after epoch ", 1)[1].strip()) if "resuming" in line else 0)
              for line in kept.stdout.splitlines() if "rayship: training worker rank 0 of " in line]  # fmt: skip
    assert starts[-1][0] == 3 and starts[-1][1] < epochs_in_all, starts
    own = rayship_logs(cluster, kube, "--rank", "1")
    assert own.returncode == 0 and "rank 1 epoch" in own.stdout and "rank 0 epoch" not in own.stdout, own
    assert (run / "logs" / "attempt-1" / "rank-1.log").is_file()
    assert not kube.pods(f"{names.owner_label('TrainingJob')}={TRAINING}"), "the reader pod is deleted"
    # The same final quality band as the job undisturbed (same data, seed and epochs; a different
    # order of rows and fewer workers for some epochs change the last digits): within 25 %.
    wait_for(
        lambda: phase(kube, TJ, UNDISTURBED, "Succeeded") == "Succeeded", 300, what=f"{UNDISTURBED} Succeeded"
    )
    reference = kube.status(TJ, UNDISTURBED)
    assert reference["progress"]["epoch"] == epochs_in_all and "resumedFromEpoch" not in reference["progress"]
    (plain,) = reference["attempts"]
    assert [c["readyWorkers"] for c in plain.get("workerChanges") or []][-1:] == [3], plain
    # Its figures, once its pods are seen gone: the pods' own times (the worker taken away and its
    # replacement included) x the CPUs each requested.
    unsettled: list[Any] = []
    final = settled(kube, TRAINING, unsettled)
    pods_cpu = pods.cpu_seconds()
    print(
        f"CPU-seconds on record {final['cpuSeconds']}, the pods' own {pods_cpu:.1f} over {len(pods.pods)} pods"
    )
    assert final["attempts"][0]["cpuSeconds"] == final["cpuSeconds"] == pytest.approx(pods_cpu, rel=0.05), (
        pods.table(),
        unsettled,
    )
    assert final["gpuSeconds"] == 0 and final["cpuHours"] == round(final["cpuSeconds"] / 3600, 3)
    loss, reference_loss = status["progress"]["metrics"]["loss"], reference["progress"]["metrics"]["loss"]
    assert abs(loss - reference_loss) <= 0.25 * reference_loss, (loss, reference_loss)
    print(
        f"training on real pods: first epoch {first_epoch:.0f}s after apply; worker deleted after epoch "
        f"{deleted_at}, epochs {noticed} saved in the notice, resumed {shrink_resumed}, trained on with two {shrunk:.0f}s after "
        f"the deletion; group starts (size, after epoch) {list(dict.fromkeys(starts))}; "
        f"epochs seen {epochs}; worker group sizes {sizes}; ready workers {ready}; final loss "
        f"{loss:.6g} (undisturbed: {reference_loss:.6g}); Succeeded in {time.monotonic() - t0:.0f}s"
    )


def rayship_logs(
    cluster, kube: Kube, *args: str, ref: str = f"tj/{TRAINING}", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`rayship logs tj/<the training job>` (or `ref`) as a user runs it, with the cluster's kubeconfig."""
    argv = [str(controlplane.VENV_BIN / "rayship"), "logs", ref, "-n", kube.namespace]
    argv += ["--kubeconfig", str(cluster.kubeconfig), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False, env=env)


def table_row(out: str) -> dict[str, str]:
    """The first row of a `kubectl get` table by column: cut where the header's columns start (a
    cell may be blank, so splitting on spaces would shift the cells after it)."""
    header, row = out.splitlines()[:2]
    names = header.split()
    starts = [header.index(f" {n}") + 1 if i else 0 for i, n in enumerate(names)]
    ends = [*starts[1:], None]
    return {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}


def schedule_retraining(cluster, kube: Kube) -> None:
    """`kubectl apply` the TrainingSchedule whose runs the service rolls out to: a run every minute
    (Forbid: one at a time), small enough to run beside the service (its head, KubeRay's autoscaler
    sidecar of 0.5 CPU, a replica) on the node's 2 CPUs. Its gate (loss below 0) fails every run until
    the rollout test raises it, once it has seen the service wait for a promoted run: whether the
    first run ends before that test begins no longer decides what it sees (with a gate every run
    passed, a first run that ended while the tests before took longer left nothing to wait for)."""
    doc = yaml.safe_load((SAMPLES / "kind-trainingjob-cpu.yaml").read_text())
    template = doc["spec"]
    template.update(SMALL_TRAINING)
    template["head"] = {"cpus": 0.25, "memory": "3Gi"}
    template["workers"] = dict(template["workers"], replicas=1, cpusPerWorker=0.25)
    template["trainer"]["learningRate"] = 0.05  # another model than the service's first
    schedule = {
        "apiVersion": "rayship.dev/v1alpha1",
        "kind": "TrainingSchedule",
        "metadata": {"name": RETRAINING, "namespace": kube.namespace},
        "spec": {
            "schedule": "* * * * *",
            "concurrencyPolicy": "Forbid",
            "promote": {"metric": "loss", "goal": "minimize", "threshold": GATE_NONE_PASSES},
            "jobTemplate": {"spec": template},
        },
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(schedule))


def test_modelservice_serves_the_trained_model_through_the_api_servers_service_proxy(
    real_node, operator, kube: Kube
) -> None:
    cluster = real_node
    wait_for(lambda: phase(kube, TJ, TRAINING, "Succeeded") == "Succeeded", 300, what="the training")
    t0 = time.monotonic()
    apply(cluster, kube, "kind-modelservice-cpu.yaml", **SMALL_SERVICE)
    schedule_retraining(cluster, kube)  # for the rollout that follows: runs while the service comes up
    wait_for(lambda: phase(kube, MS, SERVING, "Ready") == "Ready", 420, what="the ModelService Ready")
    status = kube.status(MS, SERVING)
    model = kube.status(TJ, TRAINING)["checkpoint"]["model"]
    assert status["modelURI"] == model

    rows, expected = predict_in_pod(
        cluster, kube, model, [[0.1 * (i + j) for i in range(64)] for j in range(3)]
    )

    spec = yaml.safe_load((SAMPLES / "kind-modelservice-cpu.yaml").read_text())["spec"]
    path = (
        f"/api/v1/namespaces/{kube.namespace}/services/{names.rayservice_name(SERVING)}-serve-svc:serve"
        f"/proxy{spec['routePrefix']}/predict"
    )

    def predict() -> dict[str, Any] | None:
        res = cluster.kubectl(
            "create", "--raw", path, "-f", "-", input=json.dumps({"instances": rows}), check=False
        )
        return json.loads(res.stdout) if res.returncode == 0 else None

    answer = wait_for(predict, 60, what=f"a prediction through {path}")
    served = answer["predictions"]
    assert len(served) == len(expected) and all(
        len(a) == len(b) for a, b in zip(served, expected, strict=True)
    )
    flat = [y for row in served for y in row]
    assert flat == pytest.approx([y for row in expected for y in row], rel=1e-5, abs=1e-6), (served, expected)
    print(f"serving: Ready and predicting in {time.monotonic() - t0:.0f}s")
    # `rayship logs ms/NAME`: the replica's own log, read from the worker pod that runs it, has the
    # request just answered
    replicas = rayship_logs(cluster, kube, ref=f"ms/{SERVING}")
    assert replicas.returncode == 0, replicas.stderr
    assert "=== pod " in replicas.stdout and f"POST {spec['routePrefix']}/predict 200" in replicas.stdout, (
        replicas.stdout[-2000:]
    )


REACH = """
import json, socket, sys
found = {}
for port in sys.argv[2:]:
    try:
        socket.create_connection((sys.argv[1], int(port)), timeout=3).close()
        found[port] = "open"
    except OSError as e:
        found[port] = type(e).__name__
print(json.dumps(found))
"""


TRICKLE = """
import json, select, socket, sys, time
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
t0 = time.monotonic()
sock.sendall(b"POST /predict HTTP/1.1\\r\\nHost: x\\r\\n")
while time.monotonic() - t0 < 40 and not select.select([sock], [], [], 1)[0]:
    sock.sendall(b"X-Slow: 1\\r\\n")
reply = sock.recv(200).decode(errors="replace") if select.select([sock], [], [], 0)[0] else ""
print(json.dumps({"after": time.monotonic() - t0, "reply": reply.splitlines()[:1]}))
"""


def test_the_ray_clusters_ports_are_closed_to_the_namespaces_other_pods(
    real_node, operator, kube: Kube
) -> None:
    """Issue 33 item 3, enforced: real-0 runs a NetworkPolicy engine (kube-router's firewall), so the
    policy the operator renders for the ModelService's Ray cluster is what decides. A pod of the same
    namespace reaches the head's Serve port (the ModelService names no serveFrom: anyone) but neither
    its GCS nor its dashboard; labelled as one of the service's own pods, it reaches both. HAProxy's
    stats page, which Ray's template binds on every interface, listens on the pod's loopback only
    (rayship's launcher), so no pod reaches it; and a client trickling its headers into the Serve port
    is answered 408 once the request time bound has passed (issue 57 section 5, on the real image's
    HAProxy). The Ray cluster itself (workers to head, KubeRay and the API server's proxy to the
    dashboard) kept working through the tests before this one, under the same policy."""
    cluster_name = kube.status(RS, names.rayservice_name(SERVING))["activeServiceStatus"]["rayClusterName"]
    head = kube.pods(f"ray.io/cluster={cluster_name},ray.io/node-type=head")[0]
    # GCS, dashboard, Serve, and HAProxy's stats page
    ports = ["6379", str(names.DASHBOARD_PORT_NUMBER), str(names.SERVE_PORT_NUMBER), "8404"]
    probe = {
        "name": "probe", "image": f"rayship/rayship-operator:{__version__}", "imagePullPolicy": "Never",
        "command": ["sleep", "600"], "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
    }  # fmt: skip
    kube.core.create_namespaced_pod(
        kube.namespace, {"metadata": {"name": "probe"}, "spec": {"containers": [probe]}}
    )
    try:
        wait_for(lambda: kube.core.read_namespaced_pod("probe", kube.namespace).status.phase == "Running",
                 120, what="the probe pod Running")  # fmt: skip

        def reach() -> dict[str, str]:
            out = real_node.kubectl("exec", "-n", kube.namespace, "probe", "--", "python", "-c", REACH,
                                    head.status.pod_ip, *ports).stdout  # fmt: skip
            return json.loads(out.strip().splitlines()[-1])

        outside = reach()
        refused = {"ConnectionRefusedError", "TimeoutError"}  # kube-router rejects; other engines drop
        assert outside["8000"] == "open" and {outside["6379"], outside["8265"], outside["8404"]} <= refused, (
            outside
        )
        owner = names.owner_label("ModelService")
        real_node.kubectl("label", "pod", "-n", kube.namespace, "probe", f"{owner}={SERVING}")

        def let_in() -> dict[str, str] | None:  # the engine sees the new label through its watch
            found = reach()
            return found if found["6379"] == "open" else None

        inside = wait_for(let_in, 30, what="the probe labelled as the service's pod reaching its GCS")
        assert inside == {"6379": "open", "8265": "open", "8000": "open", "8404": "ConnectionRefusedError"}, (
            inside
        )
        out = real_node.kubectl("exec", "-n", kube.namespace, "probe", "--", "python", "-c", TRICKLE,
                                head.status.pod_ip, str(names.SERVE_PORT_NUMBER)).stdout  # fmt: skip
        slow = json.loads(out.strip().splitlines()[-1])
        print(f"a client trickling its headers: {slow}")
        assert slow["reply"] and slow["reply"][0].startswith("HTTP/1.1 408"), slow
        assert REQUEST_TIMEOUT_S - 1 <= slow["after"] <= REQUEST_TIMEOUT_S + 4, slow
    finally:
        kube.core.delete_namespaced_pod("probe", kube.namespace, grace_period_seconds=0)


def test_a_scheduled_run_that_passes_the_gate_rolls_out_in_place_by_itself(
    real_node, operator, kube: Kube
) -> None:
    """Issue 35 on real pods: the service switches to `model.fromTrainingSchedule` (keeping its model
    while nothing is promoted yet); the schedule's run passes the gate, is promoted, and the service
    rolls out to it by itself: only serveConfigV2 changes (an in-place Serve rollout on the same Ray
    cluster), every request during it is answered, and status.modelURI names the new model only once
    Serve answers with it. Then the gate is lowered below any loss: the next run fails it, which the
    next test sees while it runs (never served)."""
    cluster = real_node
    wait_for(lambda: phase(kube, MS, SERVING, "Ready") == "Ready", 300, what="the service from the last test")
    old = kube.status(MS, SERVING)["modelURI"]
    cluster_before = kube.status(RS, names.rayservice_name(SERVING))["activeServiceStatus"]["rayClusterName"]
    rows, _ = predict_in_pod(cluster, kube, old, [[0.05 * (i - j) for i in range(64)] for j in range(2)])
    path = (
        f"/api/v1/namespaces/{kube.namespace}/services/{names.rayservice_name(SERVING)}-serve-svc:serve"
        "/proxy/mlp/predict"
    )
    answers: list[tuple[str | None, list[float] | None]] = []  # (modelURI in status, prediction)
    waiting: list[str] = []  # ModelAvailable messages while nothing was promoted
    stop = threading.Event()

    def load() -> None:  # requests all along: while nothing is promoted, and through the rollout
        while not stop.is_set():
            status = kube.status(MS, SERVING)  # read before the request is sent
            available = next((c for c in status.get("conditions") or [] if c["type"] == "ModelAvailable"), {})
            if available.get("reason") == "NothingPromoted":
                waiting.append(available["message"])
            res = cluster.kubectl(
                "create", "--raw", path, "-f", "-", input=json.dumps({"instances": rows}), check=False
            )
            flat = (
                [y for row in json.loads(res.stdout)["predictions"] for y in row]
                if res.returncode == 0
                else None
            )
            answers.append((status.get("modelURI"), flat))
            time.sleep(0.2)

    t0 = time.monotonic()
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        kube.patch(
            MS,
            SERVING,
            {"spec": {"model": {"fromTrainingJob": None, "fromTrainingSchedule": {"name": RETRAINING}}}},
        )
        # Nothing is promoted (the gate passes no run): the service says so and keeps its model. Seen
        # first (a positive observation), then the gate is raised and the next run to end passes it.
        wait_for(
            lambda: waiting, 120, interval=0.2, what="ModelAvailable NothingPromoted, the old model kept"
        )
        assert not kube.status(TS, RETRAINING).get("promoted"), kube.status(TS, RETRAINING)
        kube.patch(TS, RETRAINING, {"spec": {"promote": {"threshold": GATE_ALL_PASS}}})
        promoted = wait_for(lambda: kube.status(TS, RETRAINING).get("promoted"), 300, what="a promoted run")
        kube.patch(
            TS, RETRAINING, {"spec": {"promote": {"threshold": GATE_NONE_PASSES}}}
        )  # the next run fails
        new = promoted["model"]
        assert new != old and new == kube.status(TJ, promoted["job"])["checkpoint"]["model"], promoted
        wait_for(
            lambda: kube.status(MS, SERVING).get("modelURI") == new,
            240,
            what="modelURI on the promoted model",
        )
        time.sleep(2)
    finally:
        stop.set()
        worker.join(30)
    failed = [a for a in answers if a[1] is None]
    assert answers and not failed, f"{len(failed)} of {len(answers)} requests failed"
    # while no run had passed the gate, the status said so, naming the old model it kept serving
    assert all(f"still serving {old}" in m for m in waiting), waiting
    _, outputs = predict_in_pod(cluster, kube, new, rows)
    expected_new = [y for row in outputs for y in row]
    # Once the status names the new model, Serve answers with it: every request sent after that.
    after = [flat for uri, flat in answers if uri == new]
    assert after, "no request was sent after modelURI named the new model"
    for flat in after:
        assert flat == pytest.approx(expected_new, rel=1e-5, abs=1e-6), (
            "modelURI named a model Serve did not serve"
        )
    assert {uri for uri, _ in answers} <= {old, new}, {uri for uri, _ in answers}
    upgrading = kube.condition(MS, SERVING, "Upgrading")
    assert upgrading["status"] == "False", upgrading
    rs = kube.status(RS, names.rayservice_name(SERVING))
    assert rs["activeServiceStatus"]["rayClusterName"] == cluster_before  # in place: same cluster
    assert "Promoted" in {e[1] for e in kube.events(RETRAINING)}
    print(
        f"schedule: {promoted['job']} promoted ({promoted['value']:g}) and rolled out by itself; "
        f"{len(answers)} requests answered in {time.monotonic() - t0:.0f}s "
        f"({len(waiting)} while nothing was promoted yet)"
    )


def promoted_run(kube: Kube) -> str:
    return kube.status(TS, RETRAINING)["promoted"]["job"]


def test_several_models_serve_side_by_side_and_one_rolls_out_alone(real_node, operator, kube: Kube) -> None:
    """Issue 33 item 9 on real Serve: the service of the last tests switches to spec.models (two
    models by name, Serve model multiplexing). status.models names each with the URI Serve was
    confirmed to serve; a request naming a model in the serve_multiplexed_model_id header gets that
    model's outputs. Then one model rolls out to another checkpoint: its entry shows targetURI until
    Serve runs it, the other model answers every request meanwhile, and the URIs swap in the status
    only as Serve serves them."""
    cluster = real_node
    try:
        wait_for(
            lambda: phase(kube, MS, SERVING, "Ready") == "Ready", 300, what="the service from the last test"
        )
        retrained = promoted_run(kube)
        first, second = (kube.status(TJ, job)["checkpoint"]["model"] for job in (TRAINING, retrained))
        rows = [[0.02 * (i + 3 * j) for i in range(64)] for j in range(2)]
        rows, out_first = predict_in_pod(cluster, kube, first, rows)
        _, out_second = predict_in_pod(cluster, kube, second, rows)
        path = (
            f"/api/v1/namespaces/{kube.namespace}/services/{names.rayservice_name(SERVING)}-serve-svc:serve"
            "/proxy/mlp/predict"
        )

        def predict(model: str) -> list[float] | None:
            """A prediction through the API server's service proxy, the model named in Serve's header."""
            request = kube.client.param_serialize(
                "POST", path, header_params={"Content-Type": "application/json",
                "serve_multiplexed_model_id": model}, body={"instances": rows}, auth_settings=["BearerToken"],
            )  # fmt: skip
            try:
                res = kube.client.call_api(*request, _request_timeout=30)
            except (kubernetes.client.exceptions.ApiException, OSError):
                return None
            if res.status != 200:
                return None
            return [y for row in json.loads(res.read())["predictions"] for y in row]

        def models() -> dict[str, dict[str, Any]]:
            return {m["name"]: m for m in kube.status(MS, SERVING).get("models") or []}

        t0 = time.monotonic()
        kube.patch(MS, SERVING, {"spec": {"model": None, "models": {
            "first": {"fromTrainingJob": {"name": TRAINING}}, "second": {"fromTrainingSchedule": {"name": RETRAINING}},
        }}})  # fmt: skip
        wait_for(
            lambda: (
                {n: (m.get("uri"), m.get("targetURI")) for n, m in models().items()}
                == {"first": (first, None), "second": (second, None)}
            ),
            240,
            what="status.models to name both models as served",
        )
        status = kube.status(MS, SERVING)
        assert status["modelCount"] == 2 and status["phase"] == "Ready" and "modelURI" not in status, status
        flat_first, flat_second = ([y for row in out for y in row] for out in (out_first, out_second))
        assert predict("first") == pytest.approx(flat_first, rel=1e-5, abs=1e-6)
        assert predict("second") == pytest.approx(flat_second, rel=1e-5, abs=1e-6)
        print(f"spec.models: both models served and named in the status after {time.monotonic() - t0:.0f}s")

        # One model rolls out alone: "first" to the retrained checkpoint; "second" keeps answering.
        # (status.models as read before the requests, "first"'s answer, "second"'s answer)
        answers: list[tuple[dict[str, Any], list[float] | None, list[float] | None]] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                answers.append((models(), predict("first"), predict("second")))
                time.sleep(0.2)

        t0 = time.monotonic()
        worker = threading.Thread(target=load, daemon=True)
        worker.start()
        try:
            kube.patch(MS, SERVING, {"spec": {"models": {"first": {"fromTrainingJob": {"name": retrained}}}}})
            wait_for(
                lambda: models()["first"].get("uri") == second and "targetURI" not in models()["first"],
                240,
                what="'first' served from the retrained checkpoint",
            )
            time.sleep(2)
        finally:
            stop.set()
            worker.join(30)
        failed = [a for a in answers if a[1] is None or a[2] is None]
        assert answers and not failed, f"{len(failed)} of {len(answers)} rounds had a failed request"
        assert all(b == pytest.approx(flat_second, rel=1e-5, abs=1e-6) for _, _, b in answers)
        assert all(m["second"].get("uri") == second and "targetURI" not in m["second"] for m, _, _ in answers)
        # Once the status names the new model for "first", Serve answers "first" with it.
        after = [a for m, a, _ in answers if m["first"].get("uri") == second]
        assert after and all(a == pytest.approx(flat_second, rel=1e-5, abs=1e-6) for a in after)
        assert any(m["first"].get("targetURI") == second for m, _, _ in answers), (
            "no targetURI during the rollout"
        )
        print(
            f"spec.models: 'first' rolled out in {time.monotonic() - t0:.0f}s; {len(answers)} rounds of requests answered"
        )

        # The schedule's next run, trained meanwhile under the lowered gate, failed it: not promoted,
        # and "second", which follows the schedule, still serves the promoted run.
        gate = wait_for(
            lambda: (
                (g := kube.status(TS, RETRAINING).get("lastGate") or {}).get("job") not in (None, retrained)
                and g
            ),
            300,
            what="the gate's verdict on the schedule's next run",
        )
        assert gate["passed"] is False and "not below the threshold 0" in gate["message"], gate
        assert phase(kube, TJ, gate["job"], "Succeeded") == "Succeeded"
        assert promoted_run(kube) == retrained
        assert models()["second"].get("uri") == second and "targetURI" not in models()["second"], models()
        assert predict("second") == pytest.approx(flat_second, rel=1e-5, abs=1e-6)
        assert "NotPromoted" in {e[1] for e in kube.events(RETRAINING)}
        print(f"schedule: {gate['message']}: not promoted, not served")
    finally:
        # no more runs on the node: suspended, and a run already started is deleted (with its cluster)
        # (status.active read once the operator said Suspended: a run it made just before is in it)
        kube.patch(TS, RETRAINING, {"spec": {"suspend": True}})
        wait_for(
            lambda: kube.condition(TS, RETRAINING, "Scheduling").get("reason") == "Suspended",
            60,
            what="Suspended",
        )
        for run in kube.status(TS, RETRAINING).get("active") or []:
            kube.delete(TJ, run)
        kube.delete(MS, SERVING)  # frees the CPUs for what follows
        wait_for(
            lambda: kube.get(RS, names.rayservice_name(SERVING)) is None, 120, what="the RayService gone"
        )


def test_a_model_that_cannot_load_fails_with_serves_reason(real_node, operator, kube: Kube) -> None:
    cluster = real_node
    t0 = time.monotonic()
    missing = "/mnt/models/no-such-run/model"
    apply(cluster, kube, "kind-modelservice-cpu.yaml", model={"uri": missing}, **SMALL_SERVICE)
    wait_for(lambda: phase(kube, MS, SERVING, "Failed") == "Failed", 300, what="the ModelService Failed")
    ready = kube.condition(MS, SERVING, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "DeployFailed", ready
    # Serve's own words, as KubeRay read them from the real Serve: the application's message on the
    # ModelService, and (in the RayService) the deployment's, which names the missing model.
    rs = kube.status(RS, names.rayservice_name(SERVING))
    apps = (rs.get("pendingServiceStatus") or {}).get("applicationStatuses") or (
        rs.get("activeServiceStatus") or {}
    ).get("applicationStatuses")
    (app,) = apps.values()
    assert app["status"] == "DEPLOY_FAILED" and ready["message"].startswith(app["message"]), (ready, app)
    (deployment,) = app["serveDeploymentStatuses"].values()
    assert "FileNotFoundError" in deployment["message"] and missing in deployment["message"], deployment
    print(f"bad model: Failed in {time.monotonic() - t0:.0f}s: {ready['message'][:200]}")
    kube.delete(MS, SERVING)
    wait_for(lambda: kube.get(RS, names.rayservice_name(SERVING)) is None, 120, what="the RayService gone")


def test_what_users_hit_first_is_named_in_the_status_with_the_pod(real_node, operator, kube: Kube) -> None:
    """Scenario 7: an image that does not exist, then a worker pod too small for Ray: each named in the
    TrainingJob's Running condition with the pod and the kubelet's reason (an unschedulable pod is
    the operator tier's, on kwok nodes; the kubelet's back-off and a startup deadline:
    test_stuck_realpods)."""

    def job(name: str, **spec: Any) -> None:
        doc = yaml.safe_load((SAMPLES / "kind-trainingjob-cpu.yaml").read_text())
        doc["metadata"] = {"name": name, "namespace": kube.namespace}
        doc["spec"].update(SMALL_TRAINING, **spec)
        real_node.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))

    def reason(name: str, *wanted: str) -> dict[str, Any] | None:
        running = kube.condition(TJ, name, "Running")
        return running if running.get("reason") in wanted else None

    def gone(name: str) -> None:  # its pods free the node for what follows, passed or not
        kube.delete(TJ, name)
        wait_for(lambda: kube.get(RJ, names.rayjob_name(name)) is None, 120, what=f"{name}'s RayJob gone")

    job("no-image", image="rayship/rayship-workloads:does-not-exist")
    try:
        found = wait_for(
            lambda: reason("no-image", "ErrImagePull", "ImagePullBackOff"), 180, what="ErrImagePull"
        )
        assert "pod no-image-" in found["message"] and "does-not-exist" in found["message"], found
    finally:
        gone("no-image")

    # A worker with less memory than Ray's object store needs (30% of the container's memory, at least
    # 75 MiB): `ray start` refuses and exits 1, the kubelet restarts it until it backs off. Its log's
    # last line is its termination message, which the status quotes.
    job("too-small", workers=dict(SMALL_TRAINING["workers"], memoryPerWorker="256Mi"))
    try:
        found = wait_for(lambda: reason("too-small", "CrashLoopBackOff"), 300, what="the worker's crash loop")
        assert "pod too-small-" in found["message"] and "container ray-worker" in found["message"], found
        assert (
            "; it exited with code 1: ValueError: Attempting to cap object store memory" in found["message"]
        ), found
        last = kube.status(TJ, "too-small").get("lastError") or {}
        assert "pod too-small-" in last.get("message", "") and last.get("attempt") == 1, last
        print(f"first problems: {found['message']}")
    finally:
        gone("too-small")


EXAMPLES = SAMPLES.parent.parent / "examples"


def cut_to_the_node(folder: Path, into: Path) -> Path:
    """An example's folder as shipped, its YAML's sizes cut to the node (as every scenario here cuts
    the samples'): heads and workers of half a CPU and no GPU, Serve replicas of a fraction. Code, data and every
    other field as shipped; no namespace in the YAML (`rayship apply -n` gives it)."""
    import shutil

    copy = shutil.copytree(folder, into / folder.name)
    for path in copy.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        spec = doc["spec"]
        assert "namespace" not in doc["metadata"], f"{path.name}: an example takes its namespace from -n"
        if doc["kind"] == "TrainingJob":
            spec.update(head=dict(SMALL_TRAINING["head"]), ttlSecondsAfterFinished=5)
            if "tuning" in spec:
                # the head runs each concurrent trial's driver and Ray Train controller: 3Gi held
                # tune-asha's one at a time, and Ray's memory monitor killed a process of
                # tune-pbt's two there (docs/training/tuning.md: budget the head per trial)
                spec["head"]["memory"] = "6Gi"
            spec["workers"].update(gpusPerWorker=0, cpusPerWorker=0.5, memoryPerWorker="2Gi")
        else:
            spec.update(SMALL_SERVICE)
            for deployment in spec.get("deployments", {}).values():
                deployment.setdefault("rayActorOptions", {})["numCpus"] = 0.1
                deployment.get("autoscaling", {}).update(maxReplicas=1)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return copy


def rayship_apply(cluster, kube: Kube, folder: Path) -> str:
    """`rayship apply -f FOLDER -n NS`, as a user runs it (the cluster's workload image for the pod that
    puts the code on the claim, as the chart here configures the operator's default)."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
           "RAYSHIP_DEFAULT_IMAGE": f"rayship/rayship-workloads:{__version__}-cpu"}  # fmt: skip
    done = subprocess.run(
        [str(controlplane.VENV_BIN / "rayship"), "apply", "-f", str(folder), "-n", kube.namespace],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    return done.stdout


def test_rayship_apply_runs_the_examples_own_code_on_real_pods(
    real_node, operator, kube: Kube, tmp_path: Path
) -> None:
    """Scenario 6: examples/byo-loop and examples/pipeline as shipped (sizes cut to the node), through
    `rayship apply -f FOLDER`: each folder is packed into a zip named by its content hash and put on the
    namespace's checkpoint claim by a short-lived pod, the objects applied pointing at it. The user's
    own Ray Train loop trains on two worker pods from that zip; the user's own Serve application
    (Preprocess -> Model) serves the model the pipeline's TrainingJob trained, from its zip; a second
    apply of an unchanged folder sends nothing."""
    from rayship import codepack

    cluster = real_node
    byo = cut_to_the_node(EXAMPLES / "byo-loop", tmp_path)
    t0 = time.monotonic()
    said = rayship_apply(cluster, kube, byo)
    package = codepack.pack(byo, "f")
    assert f"uploaded: {package.name}" in said and "trainingjob.rayship.dev/houses created" in said, said
    assert (claim_folder(kube) / codepack.CODE_FOLDER / package.name).read_bytes() == package.data
    assert not kube.pods(f"{names.LABEL_COMPONENT}=code-upload"), "the pod that put the code there is gone"
    applied = kube.get(TJ, "houses") or {}
    assert (
        applied["spec"]["runtimeEnv"]["workingDir"] == f"file:///mnt/checkpoints/rayship-code/{package.name}"
    )
    again = rayship_apply(cluster, kube, byo)
    assert (
        f"already there: {package.name}" in again and "trainingjob.rayship.dev/houses unchanged" in again
    ), again
    wait_for(
        lambda: phase(kube, TJ, "houses", "Succeeded") == "Succeeded", 420, what="the own loop Succeeded"
    )
    status = kube.status(TJ, "houses")
    assert status["progress"]["epoch"] == 8 and "evalLoss" in status["progress"]["metrics"], status[
        "progress"
    ]
    print(f"own loop from `rayship apply`: Succeeded in {time.monotonic() - t0:.0f}s")

    t0 = time.monotonic()
    said = rayship_apply(cluster, kube, cut_to_the_node(EXAMPLES / "pipeline", tmp_path))
    assert "modelservice.rayship.dev/pipeline created" in said and "pipeline-mlp created" in said, said
    wait_for(
        lambda: phase(kube, TJ, "pipeline-mlp", "Succeeded") == "Succeeded", 420, what="the pipeline's job"
    )
    wait_for(lambda: phase(kube, MS, "pipeline", "Ready") == "Ready", 420, what="the own Serve app Ready")
    model = kube.status(TJ, "pipeline-mlp")["checkpoint"]["model"]
    assert kube.status(MS, "pipeline")["modelURI"] == model
    rows = [[0.1 * (i + j) for i in range(8)] for j in range(3)]
    _, expected = predict_in_pod(cluster, kube, model, rows, service="pipeline")
    path = (
        f"/api/v1/namespaces/{kube.namespace}/services/{names.rayservice_name('pipeline')}-serve-svc:serve"
        "/proxy/pipeline"
    )

    def predict() -> dict[str, Any] | None:
        res = cluster.kubectl(
            "create", "--raw", path, "-f", "-", input=json.dumps({"instances": rows}), check=False
        )
        return json.loads(res.stdout) if res.returncode == 0 else None

    served = wait_for(predict, 60, what=f"a prediction through {path}")["predictions"]
    flat = [y for row in served for y in row]  # mean 0 and scale 1: Preprocess hands the rows on as they are
    assert flat == pytest.approx([y for row in expected for y in row], rel=1e-5, abs=1e-6), (served, expected)
    print(
        f"own Serve app from `rayship apply`: trained, Ready and predicting in {time.monotonic() - t0:.0f}s"
    )
    kube.delete(MS, "pipeline")  # its Ray cluster frees the node for the next scenario


def _cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def room_on_the_node(kube: Kube, cpus: float, timeout: float = 300) -> None:
    """Wait until real-0 has `cpus` unrequested: the pods of the earlier scenarios (their Ray clusters,
    a ModelService's) are still going away; a Ray cluster that does not fit leaves its worker Pending
    and its job Initializing."""

    def free() -> float:
        node = kube.core.read_node(realnode.NAME)
        pods = kube.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={realnode.NAME}").items
        requested = sum(
            _cpu(c.resources.requests.get("cpu", "0"))
            for p in pods
            if p.status.phase not in ("Succeeded", "Failed")
            for c in p.spec.containers
            if c.resources and c.resources.requests
        )
        return _cpu(node.status.allocatable["cpu"]) - requested

    wait_for(lambda: free() >= cpus - 1e-9, timeout, interval=2, what=f"{cpus} CPUs free on {realnode.NAME}")


def apply_example(cluster, kube: Kube, tmp_path: Path, example: str, cpus: float) -> float:
    """`rayship apply -f` of examples/<example> cut to the node, once real-0 has `cpus` unrequested;
    returns when it was applied (time.monotonic())."""
    room_on_the_node(kube, cpus)
    t0 = time.monotonic()
    rayship_apply(cluster, kube, cut_to_the_node(EXAMPLES / example, tmp_path))
    return t0


def _trial_reports(results: Path) -> dict[str, list[dict[str, Any]]]:
    """Tune's record of each trial (result.json, a report per line) in the job's results on the claim."""
    return {
        trial.name: [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
        for trial in results.iterdir()
        if (trial / "result.json").is_file()
    }


def test_rayship_apply_runs_the_tuning_example_on_real_pods(
    real_node, operator, kube: Kube, tmp_path: Path
) -> None:
    """Scenario 7: examples/tune-asha as shipped (sizes cut to the node: half a CPU and no GPU per
    worker) through `rayship apply -f FOLDER`: the grid's two trials run one at a time, their drivers on
    the head (a slot of its rayship_trial resource each, not a CPU share of the one worker pod, where the
    trial's own Train worker then did not fit), each trial's worker on the worker pod; the best trial in
    the status, Tune's record of both on the claim."""
    claim = claim_folder(kube)
    t0 = apply_example(real_node, kube, tmp_path, "tune-asha", 1.0)  # a head and a worker of half a CPU
    wait_for(
        lambda: phase(kube, TJ, "mlp-tuning", "Succeeded") == "Succeeded", 420, what="tune-asha Succeeded"
    )
    tuning = kube.status(TJ, "mlp-tuning")["tuning"]
    assert tuning["trials"] == 2 and tuning["bestTrial"] and tuning["bestMetric"] > 0, tuning
    assert len(_trial_reports(claim / f"{kube.namespace}.mlp-tuning-tune")) == 2
    print(f"tune-asha from `rayship apply`: Succeeded in {time.monotonic() - t0:.0f}s")


@pytest.mark.timeout(900)  # two trials that restart at the hand-off, each on half a CPU
def test_rayship_apply_runs_the_pbt_example_on_real_pods(
    real_node, operator, kube: Kube, tmp_path: Path
) -> None:
    """Scenario 8: examples/tune-pbt as shipped (sizes cut to the node) through `rayship apply -f
    FOLDER`: PBT's two trials run at once, on two worker pods (a trial's worth each), and the worse one
    goes on from the better one's checkpoint (its report names the donor's run and epoch)."""
    claim = claim_folder(kube)
    t0 = apply_example(real_node, kube, tmp_path, "tune-pbt", 1.5)  # a head and two workers, one per trial
    rayjob = wait_for(lambda: kube.get(RJ, names.rayjob_name("pbt")), 60, what="the RayJob of pbt")
    assert rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2  # a trial's worth each
    wait_for(lambda: phase(kube, TJ, "pbt", "Succeeded") == "Succeeded", 600, what="tune-pbt Succeeded")
    reports = _trial_reports(claim / f"{kube.namespace}.pbt-tune")
    assert len(reports) == 2, reports
    handed = [
        (trial, report["handed_from"])
        for trial, records in reports.items()
        for report in records
        if report.get("handed_from") and f"-{trial}" not in report["handed_from"].split("/")[0]
    ]
    assert handed, reports  # a trial went on from the other's checkpoint
    trial, donor_checkpoint = handed[0]
    (donor,) = set(reports) - {trial}
    donor_run, epoch = donor_checkpoint.split("/")
    assert donor_run.startswith(f"{kube.namespace}.pbt-{donor}") and epoch.startswith("epoch-"), handed
    print(
        f"tune-pbt from `rayship apply`: Succeeded in {time.monotonic() - t0:.0f}s, {trial} from {donor_checkpoint}"
    )


@pytest.mark.timeout(900)  # Transformers and DeepSpeed start on half a CPU per worker
def test_rayship_apply_runs_the_language_model_example_on_real_pods(
    real_node, operator, kube: Kube, tmp_path: Path
) -> None:
    """Scenario 9: examples/lm-finetune as shipped (sizes cut to the node) through `rayship apply -f
    FOLDER`: the language model trains on two worker pods with the Hugging Face Trainer and DeepSpeed
    ZeRO-2 on the corpus shipped in its folder (runtimeEnv.workingDir), evaluates, and exports a model."""
    t0 = apply_example(real_node, kube, tmp_path, "lm-finetune", 1.5)  # a head and two workers
    wait_for(
        lambda: phase(kube, TJ, "lm-finetune", "Succeeded") == "Succeeded", 600, what="lm-finetune Succeeded"
    )
    status = kube.status(TJ, "lm-finetune")
    assert status["progress"]["epoch"] == 2 and "evalLoss" in status["progress"]["metrics"], status[
        "progress"
    ]
    assert status["checkpoint"]["model"], status["checkpoint"]
    print(f"lm-finetune from `rayship apply`: Succeeded in {time.monotonic() - t0:.0f}s")
