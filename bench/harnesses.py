"""One end-to-end scenario on both cluster harnesses: the local control plane with its real node real-0
(`make cluster-up`) and kind (`make kind-up`), one after the other on this machine (issue 58 §3).

    flock /tmp/rayship-ray.lock .venv/bin/python bench/harnesses.py [--only local|kind]

Question: which harness should the end-to-end tiers run on? Both run rayship as users install it (the
operator from its chart, KubeRay, the product images on the node); they differ in what a node is (a
kubelet and containerd on this machine in a network namespace of their own, against kind's node: a
privileged container of a private dockerd with systemd, kubeadm and containerd inside). This measures
what that costs a test: the start, a Ray job's pods, and the stop, each harness from down to down.

The scenario is the kind tier's (tests/e2e/test_kind.py), sized as it sizes it: the CPU sample
TrainingJob with a head and two workers of 0.25 CPU each trained to Succeeded, then a `fromTrainingJob`
ModelService of the sample answering one prediction through its Service (the API server's service
proxy), then both deleted until no pod of theirs is left. Phases, each from the end of the one before
(wall clock, watches of the pods and the two objects stamp each change on arrival):
  up            -> the harness's own `up` returns (cluster.up(operator=True, node=True) / kindcluster.up():
                   API server, KubeRay, rayship's operator, the images on the node; built images cached)
  namespace     -> a namespace of the scenario's with its checkpoint claim bound (kind: a hostPath
                   volume made for it first, as its tier does)
  first pod     -> `kubectl apply -f` of the TrainingJob until its first Ray pod's containers run
  all pods      -> every Ray pod's containers running
  first epoch   -> the TrainingJob's status.progress.epoch >= 1
  Succeeded     -> the TrainingJob Succeeded
  serving       -> the ModelService applied until one prediction is answered through its Service
  clean         -> both deleted until no pod of theirs is left
  down          -> the harness's own `down`; what it reports left on the host is printed
A harness that is already up is refused (its start would not be measured): take it down first.

Prints a table per harness, then both side by side, ending with one `RESULT <harness>_<phase>_s=` line
per phase and `RESULT <harness>_total_s=`. Exits 1 if a harness fails; reported, never asserted.
Takes ~12 min with both harnesses' images cached.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import yaml
from kubernetes.client import ApiException

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.operator_scale import delete_namespace  # noqa: E402
from bench.realpods_startup import Stamps, Watcher, pod_seen, tj_seen  # noqa: E402
from controlplane import cluster as controlplane  # noqa: E402
from controlplane import kindcluster  # noqa: E402
from rayship import api  # noqa: E402
from rayship.api import names  # noqa: E402

SAMPLES = ROOT / "manifests" / "samples"
CLAIM = "rayship-checkpoints"
NAME = "mlp-cpu"
# tests/e2e/test_kind.py's sizes: a 2-CPU node whose control plane requests ~0.85 CPU
TRAINING = {
    "head": {"cpus": 0.25, "memory": "3Gi"},
    "workers": {"replicas": 2, "gpusPerWorker": 0, "cpusPerWorker": 0.25, "memoryPerWorker": "2Gi"},
    "ttlSecondsAfterFinished": 5,
}
SERVICE = {
    "head": {"cpus": 0.25, "memory": "3Gi"},
    "autoscaler": {"cpus": 0.1, "memory": "512Mi"},
    "resources": {"gpus": 0, "cpus": 0.25, "memory": "2Gi"},
}
PHASES = ("up", "namespace", "first pod", "all pods", "first epoch", "Succeeded", "serving", "clean", "down")
Kubectl = Callable[..., str]


class Harness:
    """What differs between the two: how a cluster starts and stops, how its API is reached, how a
    namespace's pods get a checkpoint volume."""

    name: str

    def is_up(self) -> bool:
        raise NotImplementedError

    def up(self) -> tuple[Any, Kubectl]:
        """Start it; an API client and a kubectl(*args, input=None) -> stdout."""
        raise NotImplementedError

    def namespace(self, client: Any, kubectl: Kubectl, namespace: str) -> None:
        raise NotImplementedError

    def down(self) -> list[str]:
        """Stop it; what is left on the host."""
        raise NotImplementedError


class Local(Harness):
    name = "local"

    def is_up(self) -> bool:
        return bool(controlplane.status()["apiserver_ready"])

    def up(self) -> tuple[Any, Kubectl]:
        cluster = controlplane.up(operator=True, node=True)

        def kubectl(*args: str, input: str | None = None) -> str:
            return str(cluster.kubectl(*args, input=input).stdout)

        return cluster.api_client(), kubectl

    def namespace(self, client: Any, kubectl: Kubectl, namespace: str) -> None:
        kubernetes.client.CoreV1Api(client).create_namespace(controlplane.real_node_namespace(namespace))

    def down(self) -> list[str]:
        controlplane.down()
        return [str(item) for item in controlplane.leftovers()]


class Kind(Harness):
    name = "kind"

    def is_up(self) -> bool:
        return kindcluster.is_up()

    def up(self) -> tuple[Any, Kubectl]:
        kindcluster.up()
        return kubernetes.config.new_client_from_config(
            config_file=str(kindcluster.KUBECONFIG)
        ), kindcluster.kubectl

    def namespace(self, client: Any, kubectl: Kubectl, namespace: str) -> None:
        kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": namespace}})
        kindcluster.make_claim_volume(namespace, CLAIM)

    def down(self) -> list[str]:
        return kindcluster.down()


def document(file: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES / file).read_text())
    doc["metadata"].update(name=NAME, namespace=namespace)
    doc["spec"].update(spec)
    return doc


def wait(test: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not seen in {timeout:.0f} s")
        time.sleep(interval)


def claim_bound(client: Any, namespace: str) -> None:
    core: Any = kubernetes.client.CoreV1Api(client)
    body = {"metadata": {"name": CLAIM}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    core.create_namespaced_persistent_volume_claim(namespace, body)
    wait(lambda: bool(core.read_namespaced_persistent_volume_claim(CLAIM, namespace).spec.volume_name),
         120, f"the claim {CLAIM} bound", interval=0.2)  # fmt: skip


def scenario(harness: Harness, client: Any, kubectl: Kubectl, at: dict[str, float]) -> None:
    """The kind tier's scenario; `at[phase]` is stamped as each phase ends."""
    namespace = f"bench-h-{uuid.uuid4().hex[:6]}"
    core: Any = kubernetes.client.CoreV1Api(client)
    custom: Any = kubernetes.client.CustomObjectsApi(client)
    harness.namespace(client, kubectl, namespace)
    claim_bound(client, namespace)
    at["namespace"] = time.time()
    stamps = Stamps()
    ray_pods = f"{names.owner_label('TrainingJob')}={NAME},ray.io/node-type"
    watches = [
        Watcher(stamps, pod_seen, core.list_namespaced_pod, namespace, label_selector=ray_pods),
        Watcher(stamps, tj_seen, custom.list_namespaced_custom_object, *api.TRAININGJOBS[:2], namespace,
                api.TRAININGJOBS[2]),
    ]  # fmt: skip
    try:
        kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(document("kind-trainingjob-cpu.yaml", namespace, TRAINING)),
        )

        def running() -> list[float]:
            return [when for key, when in dict(stamps.at).items() if key.endswith(":running")]

        def phase() -> str:
            return str((watches[1].last.get(NAME, {}).get("status") or {}).get("phase") or "")

        def not_failed() -> None:
            if stamps.get("tj:failed") is not None:
                raise RuntimeError(f"the TrainingJob failed: {watches[1].last[NAME].get('status')}")

        wait(lambda: not_failed() or bool(running()), 600, "a Ray pod running")
        at["first pod"] = min(running())
        wait(lambda: not_failed() or len(running()) >= 3, 600, "the head and both workers running")
        at["all pods"] = max(running())
        wait(lambda: not_failed() or stamps.get("tj:epoch 1") is not None, 600, "the first epoch")
        at["first epoch"] = stamps.get("tj:epoch 1") or time.time()
        wait(lambda: not_failed() or phase() == "Succeeded", 600, "Succeeded", interval=0.2)
        at["Succeeded"] = time.time()
    finally:
        for watch in watches:
            watch.stop()
    kubectl(
        "apply", "-f", "-", input=yaml.safe_dump(document("kind-modelservice-cpu.yaml", namespace, SERVICE))
    )
    route = yaml.safe_load((SAMPLES / "kind-modelservice-cpu.yaml").read_text())["spec"]["routePrefix"]
    path = (f"/api/v1/namespaces/{namespace}/services/{names.rayservice_name(NAME)}-serve-svc:serve"
            f"/proxy{route}/predict")  # fmt: skip

    said: set[str] = set()

    def answered() -> bool:
        try:
            out = kubectl("create", "--raw", path, "-f", "-", input=json.dumps({"instances": [[0.1] * 8]}))
        except (RuntimeError, subprocess.CalledProcessError, json.JSONDecodeError) as err:
            # not yet: no Service, no endpoint, a 503 while the replica starts (each answer said once)
            why = str(err).strip().splitlines()[-1][:120]
            if why not in said:
                said.add(why)
                print(f"    (not yet serving: {why})", flush=True)
            time.sleep(2)
            return False
        return "predictions" in json.loads(out)

    wait(answered, 900, "a prediction through the ModelService's Service", interval=0.5)
    at["serving"] = time.time()
    seconds = delete_namespace(client, namespace, timeout=300)
    if harness.name == "kind":
        kubectl("delete", "pv", kindcluster.claim_volume(namespace, CLAIM)["metadata"]["name"])
        kindcluster.node_exec("rm", "-rf", kindcluster.volume_path(namespace, CLAIM))
    print(f"  namespace {namespace} gone in {seconds:.0f} s", flush=True)
    at["clean"] = time.time()


# what a harness or the scenario raises when something does not come up or answer
FAILURES = (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired, ApiException)


def measure(harness: Harness) -> tuple[dict[str, float], str | None]:
    """Phase -> seconds (from the end of the one before), and why the scenario failed (None: it did not)."""
    print(f"\n--- {harness.name}: up", flush=True)
    t0 = time.time()
    at: dict[str, float] = {}
    failed = None
    try:
        client, kubectl = harness.up()
        at["up"] = time.time()
        print(f"--- {harness.name}: the scenario", flush=True)
        scenario(harness, client, kubectl, at)
    except FAILURES as err:  # said, and the harness still goes down
        failed = f"{type(err).__name__}: {err}"
        print(f"  {harness.name} FAILED: {failed}", flush=True)
    finally:
        print(f"--- {harness.name}: down", flush=True)
        left = harness.down()
        at["down"] = time.time()
        print(f"  left on the host: {left if left else 'nothing'}", flush=True)
    seconds, before = {}, t0
    for name in PHASES:
        if name in at:
            seconds[name], before = at[name] - before, at[name]
    return seconds, failed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=("local", "kind"), help="one harness")
    args = parser.parse_args()
    harnesses = [h for h in (Local(), Kind()) if args.only in (None, h.name)]
    reason = controlplane.node_missing()
    if reason and any(h.name == "local" for h in harnesses):
        raise SystemExit(f"harnesses: {reason}")
    up = [h.name for h in harnesses if h.is_up()]
    if up:
        raise SystemExit(
            f"harnesses: {', '.join(up)} already up: take it down first (make cluster-down / make kind-down)"
        )
    results: dict[str, dict[str, float]] = {}
    failed = []
    for harness in harnesses:
        results[harness.name], why = measure(harness)
        if why:
            failed.append(f"{harness.name} ({why})")
    print(f"\n{'phase':<12}" + "".join(f"{h:>10}" for h in results))
    for name in (*PHASES, "total"):
        row = [sum(r.values()) if name == "total" else r.get(name) for r in results.values()]
        print(f"{name:<12}" + "".join(f"{v:>9.1f}s" if v is not None else f"{'-':>10}" for v in row))
    for harness, seconds in results.items():
        for name, value in seconds.items():
            print(f"RESULT {harness}_{name.replace(' ', '_')}_s={value:.1f}")
        print(f"RESULT {harness}_total_s={sum(seconds.values()):.1f}")
    if failed:
        print(f"failed: {'; '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
