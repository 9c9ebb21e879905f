"""End to end without Docker (`make e2e-local`): the CPU samples on the local control plane, where
controlplane/raypods.py runs a REAL Ray head for each Ray head pod kwok runs (worker pods stay
simulated; the head offers their CPUs).

kubectl apply -> the rayship operator (as the chart's ServiceAccount) -> RayJob / RayService -> the
real KubeRay -> real training / real Ray Serve on the head -> statuses from KubeRay's own. The test
namespace is labelled rayship.dev/ray-heads=real, the switch raypods.py reads. The scenarios share
one namespace and run in order: the service serves the model the training exported to the PVC.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import torch
import yaml

from controlplane import raypods
from rayship import api, names
from tests.conftest import SAMPLES
from tests.operator.conftest import refused_lines
from tests.operator.kube import Kube, wait_for

pytestmark = [pytest.mark.e2e_local, pytest.mark.timeout(400)]

TJ, MS, RJ, RS = api.TRAININGJOBS, api.MODELSERVICES, api.RAYJOBS, api.RAYSERVICES
TRAINING, SERVING = "mlp-cpu", "mlp-cpu"  # the samples' names
CLAIM = "rayship-checkpoints"


@pytest.fixture(scope="module")
def kube(api) -> Iterator[Kube]:
    """A namespace of real Ray heads with the samples' checkpoint PVC; deleted at the end."""
    core = kubernetes.client.CoreV1Api(api)
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name, "labels": {raypods.NAMESPACE_LABEL: raypods.REAL}}})
    kube = Kube(api, name)
    kube.pvc(CLAIM)
    try:
        yield kube
    finally:
        core.delete_namespace(name)


@pytest.fixture(scope="module")
def operator(cluster) -> Iterator[Any]:
    """The rayship operator runs; nothing it asks for may be refused meanwhile (its chart's RBAC)."""
    from controlplane import cluster as controlplane

    handle = controlplane.start_operator()
    log = Path(handle.log_path)
    start = log.stat().st_size
    yield handle
    refused = refused_lines(log.read_bytes()[start:].decode(errors="replace"))
    assert not refused, "the operator made requests its RBAC refuses:\n" + "\n".join(refused[:20])


def apply(cluster, kube: Kube, sample: str, **spec: Any) -> None:
    """`kubectl apply` a sample into the test namespace (spec fields replaced by `spec`)."""
    doc = yaml.safe_load((SAMPLES / sample).read_text())
    doc["metadata"]["namespace"] = kube.namespace
    doc["spec"].update(spec)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))


def claim_folder(kube: Kube) -> Path:
    """The PVC's folder on this machine (the provisioner's hostPath PV)."""
    volume = wait_for(
        lambda: kube.core.read_namespaced_persistent_volume_claim(CLAIM, kube.namespace).spec.volume_name,
        60,
        what=f"the claim {CLAIM} bound",
    )
    return Path(kube.core.read_persistent_volume(volume).spec.host_path.path)


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


def test_trainingjob_trains_on_a_real_ray_head_and_succeeds_from_kuberays_status(
    cluster, operator, kube: Kube
) -> None:
    t0 = time.monotonic()
    apply(cluster, kube, "kind-trainingjob-cpu.yaml")

    # While it runs, `kubectl get tj` shows the epoch and the loss the workload patched (as the job's
    # own ServiceAccount, through the API server, with the token mounted in the pod).
    def progress_row() -> str | None:
        out = cluster.kubectl("get", "tj", TRAINING, "-n", kube.namespace).stdout
        header, row = out.splitlines()[:2]
        cells = dict(zip(header.split(), row.split(), strict=False))
        if phase(kube, TJ, TRAINING, "Succeeded") == "Succeeded":
            pytest.fail(f"Succeeded before any progress was seen while Running:\n{out}")
        return out if cells.get("PHASE") == "Running" and cells.get("EPOCH", "").isdigit() else None

    out = wait_for(progress_row, 240, interval=0.3, what="EPOCH and LOSS in `kubectl get tj` while Running")
    header = out.splitlines()[0].split()
    assert {"EPOCH", "LOSS"} <= set(header), out
    loss = out.splitlines()[1].split()[header.index("LOSS")]
    assert float(loss) > 0, out

    wait_for(lambda: phase(kube, TJ, TRAINING, "Succeeded") == "Succeeded", 240, what="Succeeded")
    rayjob = kube.status(RJ, names.rayjob_name(TRAINING))
    assert rayjob["jobStatus"] == "SUCCEEDED" and rayjob["jobDeploymentStatus"] == "Complete", rayjob
    status = kube.status(TJ, TRAINING)
    assert status["progress"]["epoch"] == 3
    model = status["checkpoint"]["model"]
    assert (on_host(kube, model) / "rayship-model.json").is_file(), f"{model} is not on the PVC"
    print(f"training: Succeeded in {time.monotonic() - t0:.0f}s")


def test_modelservice_serves_the_trained_model_through_the_api_servers_service_proxy(
    cluster, operator, kube: Kube
) -> None:
    wait_for(lambda: phase(kube, TJ, TRAINING, "Succeeded") == "Succeeded", 300, what="the training")
    t0 = time.monotonic()
    apply(cluster, kube, "kind-modelservice-cpu.yaml")
    wait_for(lambda: phase(kube, MS, SERVING, "Ready") == "Ready", 300, what="the ModelService Ready")
    status = kube.status(MS, SERVING)
    model = kube.status(TJ, TRAINING)["checkpoint"]["model"]
    assert status["modelURI"] == model

    from rayship_workloads.models import load_model

    net, manifest = load_model(str(on_host(kube, model)))
    rows = [[0.1 * (i + j) for i in range(len(manifest["features"]))] for j in range(3)]
    with torch.no_grad():
        expected = net(torch.tensor(rows, dtype=torch.float32)).tolist()

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


def test_a_retrained_model_rolls_out_in_place_while_requests_keep_succeeding(
    cluster, operator, kube: Kube
) -> None:
    """The service follows a new TrainingJob: only serveConfigV2 changes (an in-place Serve rollout
    on the same Ray cluster); every request during it is answered; status.modelURI names the new
    model only once Serve answers with it."""
    from rayship_workloads.models import load_model

    wait_for(lambda: phase(kube, MS, SERVING, "Ready") == "Ready", 300, what="the service from the last test")
    old = kube.status(MS, SERVING)["modelURI"]
    cluster_before = kube.status(RS, names.rayservice_name(SERVING))["activeServiceStatus"]["rayClusterName"]
    doc = yaml.safe_load((SAMPLES / "kind-trainingjob-cpu.yaml").read_text())
    doc["metadata"] = {"name": "mlp-cpu-v2", "namespace": kube.namespace}
    doc["spec"]["trainer"]["learningRate"] = 0.05  # another model
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    wait_for(lambda: phase(kube, TJ, "mlp-cpu-v2", "Succeeded") == "Succeeded", 300, what="the retraining")
    new = kube.status(TJ, "mlp-cpu-v2")["checkpoint"]["model"]
    assert new != old

    net, manifest = load_model(str(on_host(kube, new)))
    rows = [[0.05 * (i - j) for i in range(len(manifest["features"]))] for j in range(2)]
    with torch.no_grad():
        expected_new = [y for row in net(torch.tensor(rows, dtype=torch.float32)).tolist() for y in row]
    path = (
        f"/api/v1/namespaces/{kube.namespace}/services/{names.rayservice_name(SERVING)}-serve-svc:serve"
        "/proxy/mlp/predict"
    )
    answers: list[tuple[str | None, list[float] | None]] = []  # (modelURI in status, prediction)
    stop = threading.Event()

    def load() -> None:  # requests all through the rollout
        while not stop.is_set():
            uri = kube.status(MS, SERVING).get("modelURI")  # read before the request is sent
            res = cluster.kubectl(
                "create", "--raw", path, "-f", "-", input=json.dumps({"instances": rows}), check=False
            )
            flat = (
                [y for row in json.loads(res.stdout)["predictions"] for y in row]
                if res.returncode == 0
                else None
            )
            answers.append((uri, flat))
            time.sleep(0.2)

    t0 = time.monotonic()
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        kube.patch(MS, SERVING, {"spec": {"model": {"fromTrainingJob": {"name": "mlp-cpu-v2"}}}})
        wait_for(
            lambda: kube.status(MS, SERVING).get("modelURI") == new, 240, what="modelURI on the new model"
        )
        time.sleep(2)
    finally:
        stop.set()
        worker.join(30)
    failed = [a for a in answers if a[1] is None]
    assert answers and not failed, f"{len(failed)} of {len(answers)} requests failed during the rollout"
    # Once the status names the new model, Serve answers with it: every request sent after that.
    after = [flat for uri, flat in answers if uri == new]
    assert after, "no request was sent after modelURI named the new model"
    for flat in after:
        assert flat == pytest.approx(expected_new, rel=1e-5, abs=1e-6), (
            "modelURI named a model Serve did not serve"
        )
    upgrading = kube.condition(MS, SERVING, "Upgrading")
    assert upgrading["status"] == "False", upgrading
    rs = kube.status(RS, names.rayservice_name(SERVING))
    assert rs["activeServiceStatus"]["rayClusterName"] == cluster_before  # in place: same cluster
    print(f"rollout: {len(answers)} requests answered, modelURI switched after {time.monotonic() - t0:.0f}s")
    kube.delete(MS, SERVING)  # frees the CPUs for what follows
    wait_for(lambda: kube.get(RS, names.rayservice_name(SERVING)) is None, 120, what="the RayService gone")


def test_a_model_that_cannot_load_fails_with_serves_reason(cluster, operator, kube: Kube) -> None:
    t0 = time.monotonic()
    missing = "/mnt/models/no-such-run/model"
    apply(cluster, kube, "kind-modelservice-cpu.yaml", model={"uri": missing})
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


def test_a_killed_ray_head_restarts_and_kuberay_resubmits_the_job_which_resumes_from_the_checkpoint(
    cluster, operator, kube: Kube
) -> None:
    """The head pod's container restarts in place (raypods.py acts as a kubelet with restartPolicy
    Always): KubeRay finds the job gone from the new head and submits it again (HTTPMode, same job
    id), and the new driver resumes from the latest checkpoint on the PVC."""
    name = "resume"
    doc = yaml.safe_load((SAMPLES / "kind-trainingjob-cpu.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": kube.namespace}
    epochs_in_all = 5  # killed after epoch 2 or 3: the next attempt trains the last 2 or 3
    doc["spec"]["trainer"]["epochs"] = epochs_in_all
    doc["spec"]["data"]["samples"] = 16384  # epochs of a few seconds: the kill lands between two of them
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    run = claim_folder(kube) / f"{kube.namespace}.{name}"
    epochs: list[int] = []  # every epoch seen in status.progress, in order

    def checkpoints() -> list[int]:
        return sorted(int(p.name.rsplit("-", 1)[-1]) for p in run.glob("epoch-*")) if run.is_dir() else []

    def watch(done: str) -> bool:
        epoch = (kube.status(TJ, name).get("progress") or {}).get("epoch")
        if epoch is not None and (not epochs or epochs[-1] != epoch):
            epochs.append(epoch)
        if done == "checkpointed":
            assert phase(kube, TJ, name) != "Succeeded", f"finished before the kill: epochs {epochs}"
            return bool(epoch and epoch >= 2 and checkpoints())
        return phase(kube, TJ, name, "Succeeded") == "Succeeded"

    wait_for(lambda: watch("checkpointed"), 300, interval=0.2, what="two epochs and a checkpoint on the PVC")
    seen = len(epochs)
    killed_at = epochs[-1]  # reported after its checkpoint was; the next may be being written
    cluster_name = kube.status(RJ, names.rayjob_name(name))["rayClusterName"]
    (head,) = kube.pods(f"ray.io/cluster={cluster_name},ray.io/node-type=head")
    record = json.loads((cluster.state_dir / "run" / "raypods" / "heads.json").read_text())[head.metadata.uid]
    os.killpg(record["pgid"], signal.SIGKILL)  # the Ray head dies: GCS, raylet, dashboard, the driver

    wait_for(lambda: watch("succeeded"), 360, interval=0.2, what="Succeeded after the head was killed")
    after = epochs[seen:]
    # The next attempt resumes from the latest checkpoint (that of epoch `killed_at`, or the one after
    # it if that was complete), never from scratch (which would report epoch 1 again).
    assert after and min(after) >= killed_at >= 2, f"epochs {epochs}; killed after epoch {killed_at}"
    pod = kube.core.read_namespaced_pod(head.metadata.name, kube.namespace)
    assert pod.status.container_statuses[0].restart_count >= 1
    rayjob = kube.status(RJ, names.rayjob_name(name))
    assert rayjob["jobStatus"] == "SUCCEEDED" and rayjob["rayClusterName"] == cluster_name, rayjob
    status = kube.status(TJ, name)
    assert status["progress"]["epoch"] == epochs_in_all and status["checkpoint"]["model"], status
    # the status says where the last attempt started: the checkpoint it resumed from
    # (not `< min(after)`: the killed attempt's own last report may land after the kill was noted)
    resumed = status["progress"].get("resumedFromEpoch", 0)
    assert killed_at <= resumed < epochs_in_all, (status["progress"], epochs)
    print(f"resume: head killed after epoch {killed_at} (checkpoints {checkpoints()}); epochs seen {epochs}")
