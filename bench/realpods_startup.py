"""From `kubectl apply` to the first epoch on real pods, against `rayship run` of the same job on local Ray.

    flock /tmp/rayship-ray.lock .venv/bin/python bench/realpods_startup.py [--workers 1] [--timeout-s 600]

Question (issue 36 §3): how long does the CPU sample TrainingJob take from `kubectl apply` to its first
epoch on real pods (the local control plane's real node real-0, images already built and pulled:
cached), where does that time go, and how does it compare with `rayship run -f` of the same YAML on
local Ray on the same machine? Goal: realpods_apply_to_first_epoch_s <= 1.5x local_run_to_first_epoch_s
(reported, never enforced).

The job: manifests/samples/kind-trainingjob-cpu.yaml (mlp, DDP, 3 epochs of 1024 synthetic rows) cut to
the node's 2 allocatable CPUs as the real-pod tests cut it: a head of 0.5 CPU / 3Gi and --workers (1)
workers of 0.5 CPU / 2Gi each; its checkpoint PVC (rayship-checkpoints) is made and bound beforehand.
One YAML file serves both paths.

The control plane is brought up as `make cluster-up` does (controlplane.up with the real node and the
rayship operator as the chart's pod: images built and pulled if a source changed, all before any
timing); a cluster already running is reused. What this run started is stopped at the end (the cluster:
`controlplane/cluster.py down`, then its leftovers are listed; only the node, when the cluster ran
without it). The job runs in a namespace of its own whose pods go to real-0, deleted (and its pods
waited for) before the local run, so both paths run beside the same idle control plane.

Cluster path, every time on this machine's wall clock (the node is this machine: the kubelet's log
timestamps are on the same clock), from the moment `kubectl apply -f` is started:
  scheduling       -> every Ray pod PodScheduled (watches of the TrainingJob, RayJob, RayCluster and the
                   pods stamp each change on arrival; the operator's RayJob and KubeRay's pods are rows)
  container start  -> every Ray pod's containers running (KubeRay's worker init container waits for the
                   head's GCS: the per-pod table shows that overlap)
  Ray start        -> `Ray runtime started.` in every Ray pod's container log (`kubectl logs
                   --timestamps`: the head's GCS and raylet up, each worker's raylet joined); pods
                   Ready (KubeRay's probes) and the RayCluster's `ready` are rows
  workers joining  -> every rank's `rayship: training worker rank R of N` line in its worker pod's log
                   (KubeRay submitted the job, the driver started, Ray Train's worker group formed and
                   DDP's process group is up); rows: RayJob jobStatus RUNNING, the driver's log file
                   created on the PVC (polled every 0.1 s)
  first epoch      -> the TrainingJob's status.progress.epoch >= 1 (the workload's first report, patched by
                   its progress callback: what `kubectl get tj` shows); row: rank 0's own `epoch 1/`
                   log line. The workload reports nothing per batch: the first batch is inside this phase.
Local path: `rayship run -f <the same file>` (python -m rayship.cli) in a fresh HOME and TMPDIR,
RAY_USAGE_STATS_ENABLED=0, its own session; each output line stamped on arrival:
  startup          -> its `local run:` line (interpreter, imports, the spec read)
  Ray start        -> local Ray up: the first line of the driver's core-worker log in the Ray session
                   (Ray's own timestamp; ray.init connected to GCS and raylet); row: GCS's first line
  workers joining  -> every rank's `rayship: training worker rank` line (as Ray forwards it)
  first epoch      -> its `epoch 1/` line (printed as metrics.json gets the first report; polled 0.5 s)
The run goes on to its end (3 epochs, the export); processes it leaves are listed and killed by pid
(a marker in their environment), as bench/demo.py does.

Prints a phase table per path, the milestones in time order and a per-pod table, then the ratio to
the goal, ending with one RESULT line per figure. Exits 1 only if a path fails. Takes ~2.5 min with a
running cluster (the job's namespace takes ~50 s to go); ~5 min when it starts and stops one (the
workload image's import into the node's containerd ~80 s), ~7 min when images/build.py rebuilds too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import kubernetes
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.demo import MARKER, reap_leftovers  # noqa: E402
from bench.operator_scale import delete_namespace  # noqa: E402
from controlplane import cluster as controlplane  # noqa: E402
from controlplane.config import NODE_PROCS  # noqa: E402
from rayship import api  # noqa: E402
from rayship.api import names  # noqa: E402

SAMPLE = ROOT / "manifests/samples/kind-trainingjob-cpu.yaml"
CLAIM = "rayship-checkpoints"
GOAL = 1.5  # cluster path <= 1.5x the local path
RAYCLUSTERS: api.Resource = (api.KUBERAY_GROUP, api.KUBERAY_VERSION, "rayclusters")
RAY_STARTED = "Ray runtime started."
RANK_LINE = "rayship: training worker rank "
EPOCH_LINE = "rayship: rank 0 epoch 1/"
Milestones = list[tuple[str, float | None]]  # (what, the wall time it was seen; None: not seen)


def job_document(namespace: str, workers: int) -> dict[str, Any]:
    """The sample CPU TrainingJob, cut to real-0's 2 CPUs as tests/e2e/test_realpods.py cuts it."""
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["head"] = {"cpus": 0.5, "memory": "3Gi"}
    doc["spec"]["workers"] = {
        "replicas": workers,
        "gpusPerWorker": 0,
        "cpusPerWorker": 0.5,
        "memoryPerWorker": "2Gi",
    }
    return doc


# --- the cluster path ----------------------------------------------------------------------------------
class Stamps:
    """The wall time each milestone was first seen (thread-safe)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.lock = threading.Lock()

    def mark(self, key: str, when: float | None = None) -> None:
        with self.lock:
            self.at.setdefault(key, time.time() if when is None else when)

    def get(self, key: str) -> float | None:
        with self.lock:
            return self.at.get(key)


class Watcher:
    """Watches one kind in the namespace from now on: `see(obj)` names the milestones an object has
    reached, each stamped the first time an event shows it; the last state of each object is kept."""

    def __init__(self, stamps: Stamps, see: Callable[[dict[str, Any]], list[str]], fn: Any, *args: Any,
                 **kwargs: Any) -> None:  # fmt: skip
        self.stamps, self.see, self.fn, self.args, self.kwargs = stamps, see, fn, args, kwargs
        listed = fn(*args, **kwargs)
        self.version = (
            listed["metadata"]["resourceVersion"]
            if isinstance(listed, dict)
            else listed.metadata.resource_version
        )
        self.last: dict[str, dict[str, Any]] = {}
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping:
            stream = kubernetes.watch.Watch().stream(
                self.fn, *self.args, resource_version=self.version, timeout_seconds=5, **self.kwargs
            )
            for event in stream:
                now, obj = time.time(), event["raw_object"]
                self.version = obj["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.last[obj["metadata"]["name"]] = obj
                    for key in self.see(obj):
                        self.stamps.mark(key, now)
                if self.stopping:
                    break

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(timeout=30)


def pod_seen(pod: dict[str, Any]) -> list[str]:
    name, status = pod["metadata"]["name"], pod.get("status") or {}
    true = {c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"}
    found = [f"pod:{name}:created"] + [f"pod:{name}:{c}" for c in ("PodScheduled", "Ready") if c in true]
    inits = status.get("initContainerStatuses") or []
    if inits and all((s.get("state") or {}).get("terminated", {}).get("exitCode") == 0 for s in inits):
        found.append(f"pod:{name}:init done")
    mains = status.get("containerStatuses") or []
    if mains and all("running" in (s.get("state") or {}) for s in mains):
        found.append(f"pod:{name}:running")
    return found


def tj_seen(obj: dict[str, Any]) -> list[str]:
    status = obj.get("status") or {}
    found = ["tj:Running"] if status.get("phase") == "Running" else []
    if ((status.get("progress") or {}).get("epoch") or 0) >= 1:
        found.append("tj:epoch 1")
    if status.get("phase") in ("Failed", "Invalid"):
        found.append("tj:failed")
    return found


def rayjob_seen(obj: dict[str, Any]) -> list[str]:
    status = obj.get("status") or {}
    return ["rayjob:created"] + (["rayjob:RUNNING"] if status.get("jobStatus") == "RUNNING" else [])


def raycluster_seen(obj: dict[str, Any]) -> list[str]:
    return ["raycluster:created"] + (
        ["raycluster:ready"] if (obj.get("status") or {}).get("state") == "ready" else []
    )


def log_time(stamp: str) -> float:
    """An RFC 3339 timestamp of `kubectl logs --timestamps` (nanoseconds, UTC) as a wall time."""
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}.{(frac or '0')[:6]:0<6}+00:00").timestamp()


def pod_log_stamps(
    cluster: controlplane.Cluster, namespace: str, pod: dict[str, Any], stamps: Stamps
) -> None:
    """The pod's container log lines that mark Ray's start, a rank joining and rank 0's first epoch."""
    name, container = pod["metadata"]["name"], pod["spec"]["containers"][0]["name"]
    out = cluster.kubectl("logs", "-n", namespace, name, "-c", container, "--timestamps", check=False).stdout
    for line in out.splitlines():
        stamp, _, text = line.partition(" ")
        if RAY_STARTED in text:
            stamps.mark(f"pod:{name}:ray started", log_time(stamp))
        elif RANK_LINE in text:
            rank = text.split(RANK_LINE, 1)[1].split()[0]
            stamps.mark(f"rank:{rank}", log_time(stamp))
        elif EPOCH_LINE in text:
            stamps.mark("rank 0:epoch 1", log_time(stamp))


def poll_driver_log(run_dir: Path, stamps: Stamps, stop: threading.Event) -> None:
    """Stamps the driver's log file appearing on the PVC (the PV's folder on this machine)."""
    while not stop.wait(0.1):
        if any((run_dir / names.LOGS_DIR).glob(f"attempt-*/{names.DRIVER_LOG}*")):
            stamps.mark("driver:log created")
            return


def claim_ready(client: Any, namespace: str) -> Path:
    """The checkpoint PVC made and bound; its folder on this machine (the provisioner's hostPath PV)."""
    core: Any = kubernetes.client.CoreV1Api(client)  # dicts for bodies (the client's stubs want its models)
    body = {"metadata": {"name": CLAIM}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    core.create_namespaced_persistent_volume_claim(namespace, body)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        volume = core.read_namespaced_persistent_volume_claim(CLAIM, namespace).spec.volume_name
        if volume:
            return Path(core.read_persistent_volume(volume).spec.host_path.path)
        time.sleep(0.5)
    raise RuntimeError(f"the claim {CLAIM} was not bound in 120 s")


@dataclass
class ClusterRun:
    t0: float
    applied: float
    stamps: Stamps
    pods: dict[str, str]  # name -> role (head, worker)
    workers: int


def start_watches(client: Any, namespace: str, name: str, stamps: Stamps) -> list[Watcher]:
    core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
    selector = f"{names.owner_label('TrainingJob')}={name},ray.io/node-type"
    return [
        Watcher(stamps, pod_seen, core.list_namespaced_pod, namespace, label_selector=selector),
        Watcher(stamps, tj_seen, custom.list_namespaced_custom_object, *api.TRAININGJOBS[:2], namespace, api.TRAININGJOBS[2]),
        Watcher(stamps, rayjob_seen, custom.list_namespaced_custom_object, *api.RAYJOBS[:2], namespace, api.RAYJOBS[2]),
        Watcher(stamps, raycluster_seen, custom.list_namespaced_custom_object, *RAYCLUSTERS[:2], namespace, RAYCLUSTERS[2]),
    ]  # fmt: skip


def cluster_path(cluster: controlplane.Cluster, client: Any, namespace: str, job_file: Path,
                 doc: dict[str, Any], timeout_s: float) -> ClusterRun:  # fmt: skip
    """`kubectl apply -f job_file` and its milestones until its first epoch is in its status."""
    stamps, stop = Stamps(), threading.Event()
    run_dir = claim_ready(client, namespace) / names.run_name(namespace, doc["metadata"]["name"])
    watches = start_watches(client, namespace, doc["metadata"]["name"], stamps)
    poller = threading.Thread(target=poll_driver_log, args=(run_dir, stamps, stop), daemon=True)
    poller.start()
    try:
        t0 = time.time()
        cluster.kubectl("apply", "-f", str(job_file))
        applied = time.time()
        deadline = time.monotonic() + timeout_s
        while stamps.get("tj:epoch 1") is None:
            if stamps.get("tj:failed") is not None or time.monotonic() > deadline:
                status = watches[1].last.get(doc["metadata"]["name"], {}).get("status")
                raise RuntimeError(
                    f"no first epoch in {timeout_s:.0f} s (or the job failed): status {status}"
                )
            time.sleep(0.05)
        pods = watches[0].last
        for pod in pods.values():
            pod_log_stamps(cluster, namespace, pod, stamps)
    finally:
        stop.set()
        for watch in watches:
            watch.stop()
    roles = {n: p["metadata"]["labels"]["ray.io/node-type"] for n, p in pods.items()}
    return ClusterRun(t0, applied, stamps, roles, doc["spec"]["workers"]["replicas"])


def all_pods(run: ClusterRun, what: str) -> float | None:
    """When every expected Ray pod (one head, `workers` workers) had reached `what` (replacements count)."""
    latest = 0.0
    for role, expected in (("head", 1), ("worker", run.workers)):
        times = sorted(
            t for n, r in run.pods.items() if r == role and (t := run.stamps.get(f"pod:{n}:{what}"))
        )
        if len(times) < expected:
            return None
        latest = max(latest, times[expected - 1])
    return latest


def cluster_milestones(run: ClusterRun) -> tuple[Milestones, Milestones]:
    """(the phases' ends in order, as (phase, wall time)), (every other milestone)."""
    ranks = sorted(t for k, t in run.stamps.at.items() if k.startswith("rank:"))
    joined = ranks[run.workers - 1] if len(ranks) >= run.workers else None
    phases = [
        ("scheduling", all_pods(run, "PodScheduled")),
        ("container_start", all_pods(run, "running")),
        ("ray_start", all_pods(run, "ray started") or all_pods(run, "Ready")),
        ("workers_join", joined),
        ("first_epoch", run.stamps.get("tj:epoch 1")),
    ]
    rows = [
        ("kubectl apply returned", run.applied),
        ("RayJob created (the operator)", run.stamps.get("rayjob:created")),
        ("RayCluster created (KubeRay)", run.stamps.get("raycluster:created")),
        ("every Ray pod created", all_pods(run, "created")),
        ("every Ray pod scheduled", phases[0][1]),
        ("TrainingJob phase Running", run.stamps.get("tj:Running")),
        ("every Ray pod's containers running", phases[1][1]),
        (f"`{RAY_STARTED}` in every Ray pod", all_pods(run, "ray started")),
        ("every Ray pod Ready (KubeRay's probes)", all_pods(run, "Ready")),
        ("RayCluster state ready", run.stamps.get("raycluster:ready")),
        ("RayJob jobStatus RUNNING (KubeRay's poll)", run.stamps.get("rayjob:RUNNING")),
        ("the driver's log created on the PVC", run.stamps.get("driver:log created")),
        (f"every rank's `{RANK_LINE.strip()}` line", joined),
        (f"rank 0's `{EPOCH_LINE.removeprefix('rayship: ')}` line", run.stamps.get("rank 0:epoch 1")),
        ("TrainingJob status.progress.epoch 1", phases[4][1]),
    ]
    return phases, rows


def pod_table(run: ClusterRun) -> None:
    columns = ("created", "PodScheduled", "init done", "running", "ray started", "Ready")
    print(f"\n{'  per Ray pod, s after the apply started:':52}{'  '.join(f'{c:>12}' for c in columns)}")
    for name, role in sorted(run.pods.items(), key=lambda item: item[1]):
        cells = [run.stamps.get(f"pod:{name}:{c}") for c in columns]
        shown = "  ".join(f"{t - run.t0:12.2f}" if t else f"{'-':>12}" for t in cells)
        print(f"    {role:6} {name[-40:]:40} {shown}")


# --- the local path ------------------------------------------------------------------------------------
@dataclass
class LocalRun:
    t0: float
    returncode: int
    lines: list[tuple[float, str]] = field(default_factory=list)
    ray: dict[str, float] = field(default_factory=dict)  # GCS's and the driver's first log line
    leftovers: list[str] = field(default_factory=list)


def ray_log_start(logs: Path, pattern: str) -> float | None:
    """The timestamp of the first line of a Ray log (`[2026-11-28 22:12:58,997 I ...`, local time)."""
    for path in sorted(logs.glob(pattern)):
        with path.open() as log, contextlib.suppress(ValueError):  # not Ray's timestamp: no time
            return datetime.strptime(log.readline()[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def run_local(job_file: Path, timeout_s: float) -> LocalRun:
    """`rayship run -f job_file` in a fresh HOME/TMPDIR (short: Ray's socket paths), its own session."""
    home = Path(tempfile.mkdtemp(prefix="rs-rp-", dir="/tmp"))
    token = secrets.token_hex(8)
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(home), "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONUNBUFFERED": "1", MARKER: token}  # fmt: skip
    command = [
        sys.executable,
        "-m",
        "rayship.cli",
        "run",
        "-f",
        str(job_file),
        "--runs-dir",
        str(home / "runs"),
    ]
    t0 = time.time()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=home, start_new_session=True)  # fmt: skip
    run = LocalRun(t0, 0)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            run.lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        run.returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the process group we started
        run.returncode = proc.wait()
    reader.join(timeout=10)
    logs = home / "ray" / "session_latest" / "logs"
    for key, pattern in (("gcs", "gcs_server.out"), ("driver", "python-core-driver-*.log")):
        if (found := ray_log_start(logs, pattern)) is not None:
            run.ray[key] = found
    run.leftovers = reap_leftovers(token, proc.pid)
    shutil.rmtree(home, ignore_errors=True)
    return run


def local_milestones(run: LocalRun, workers: int) -> tuple[Milestones, Milestones]:
    def first(test: Callable[[str], bool]) -> float | None:
        return next((t for t, line in run.lines if test(line)), None)

    ranks: dict[str, float] = {}
    for t, line in run.lines:
        if RANK_LINE in line:
            ranks.setdefault(line.split(RANK_LINE, 1)[1].split()[0], t)
    joined = sorted(ranks.values())[workers - 1] if len(ranks) >= workers else None
    phases = [
        ("startup", first(lambda line: line.startswith("local run:"))),
        ("ray_start", run.ray.get("driver")),
        ("workers_join", joined),
        ("first_epoch", first(lambda line: line.startswith("epoch 1/"))),
    ]
    rows = [
        ("its `local run:` line", phases[0][1]),
        ("GCS's first log line (Ray starting)", run.ray.get("gcs")),
        ("the driver's core-worker log starts (Ray up)", phases[1][1]),
        (f"every rank's `{RANK_LINE.strip()}` line", joined),
        (f"rank 0's `{EPOCH_LINE.removeprefix('rayship: ')}` line", first(lambda line: EPOCH_LINE in line)),
        ("its `epoch 1/` line", phases[3][1]),
    ]
    return phases, rows


# --- the report ----------------------------------------------------------------------------------------
def phase_table(title: str, t0: float, phases: Milestones, rows: Milestones,
                prefix: str) -> dict[str, float]:  # fmt: skip
    """Prints the phases (each from the end of the one before it that was seen) and the milestones in
    time order; returns the figures by RESULT name."""
    print(f"\n{title}\n  {'phase':18} {'s':>7} {'ends at s':>10}")
    figures: dict[str, float] = {}
    previous = t0
    for name, end in phases:
        if end is None:
            print(f"  {name:18} {'n/a':>7} {'(not seen)':>10}")
            continue
        figures[f"{prefix}_{name}_s"] = end - previous
        print(f"  {name:18} {end - previous:7.2f} {end - t0:10.2f}")
        previous = end
    print(f"  {'total':18} {previous - t0:7.2f}")
    print("  milestones, s after the start:")
    for label, at in sorted(rows, key=lambda row: row[1] if row[1] is not None else float("inf")):
        print(f"    {(f'{at - t0:8.2f}' if at is not None else '     n/a')}  {label}")
    return figures


# --- the cluster, as found and left ----------------------------------------------------------------------
@dataclass
class Found:
    cluster_up: bool
    node_up: bool


def cluster_as_found() -> Found:
    status = controlplane.status()
    procs = status["processes"]
    return Found(bool(status["apiserver_ready"]), all(procs.get(n, {}).get("alive") for n in NODE_PROCS))


def leave_as_found(found: Found) -> None:
    if not found.cluster_up:
        print("\nstopping the cluster this run started: controlplane/cluster.py down", flush=True)
        controlplane.down()
        left = controlplane.leftovers()
        print(f"left on the machine: {left if left else 'nothing'}")
    elif not found.node_up:
        print("\nstopping the real node this run started", flush=True)
        controlplane.up(operator=None, node=False)


def measure(args: argparse.Namespace, job_file: Path) -> tuple[ClusterRun, LocalRun]:
    """Both paths: the cluster's in a namespace of its own (gone before the local run), then the local one."""
    cluster = controlplane.up(operator=True, node=True)
    client = cluster.api_client()
    namespace = f"bench-rp-{uuid.uuid4().hex[:6]}"
    doc = job_document(namespace, args.workers)
    job_file.write_text(yaml.safe_dump(doc))
    core: Any = kubernetes.client.CoreV1Api(client)
    core.create_namespace(controlplane.real_node_namespace(namespace))
    try:
        print(
            f"\n--- cluster path: kubectl apply -f {job_file.name} in {namespace} (pods on real-0)",
            flush=True,
        )
        on_cluster = cluster_path(cluster, client, namespace, job_file, doc, args.timeout_s)
    finally:
        print(
            f"namespace {namespace} deleted in {delete_namespace(client, namespace, timeout=300):.0f} s",
            flush=True,
        )
        client.close()
    print(f"--- local path: rayship run -f {job_file.name}", flush=True)
    return on_cluster, run_local(job_file, args.timeout_s)


def report(on_cluster: ClusterRun, local: LocalRun, workers: int) -> bool:
    """The tables, the goal and the RESULT lines; False if the local path failed."""
    phases, rows = cluster_milestones(on_cluster)
    figures = phase_table(f"cluster path: kubectl apply -> first epoch on real pods (1 head + {workers} worker(s), "
                          "cached images)", on_cluster.t0, phases, rows, "realpods")  # fmt: skip
    pod_table(on_cluster)
    phases_local, rows_local = local_milestones(local, workers)
    figures |= phase_table(f"local path: rayship run -f (exit {local.returncode})", local.t0, phases_local,
                           rows_local, "local")  # fmt: skip
    ok = local.returncode == 0 and phases_local[-1][1] is not None
    if not ok:
        print("  FAILED; its last output:\n" + "\n".join(f"    {line}" for _, line in local.lines[-25:]))
    print(f"  left behind: {local.leftovers if local.leftovers else 'nothing'}")
    cluster_total = (phases[-1][1] or float("nan")) - on_cluster.t0
    local_total = (phases_local[-1][1] or float("nan")) - local.t0
    ratio = cluster_total / local_total
    print(f"\napply -> first epoch on real pods {cluster_total:.1f} s; rayship run -> first epoch {local_total:.1f} s: "
          f"{ratio:.2f}x ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}); goal <= {GOAL}x: "
          f"{'met' if ratio <= GOAL else 'NOT met'}")  # fmt: skip
    results = {"realpods_apply_to_first_epoch_s": cluster_total, "local_run_to_first_epoch_s": local_total,
               "realpods_over_local_first_epoch": ratio, **figures}  # fmt: skip
    for name, value in results.items():
        print(f"RESULT {name}={value:.2f}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=1, help="worker pods (0.5 CPU each; the node has 2)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="for each path's first epoch")
    args = parser.parse_args()
    reason = controlplane.node_missing()
    if reason:
        raise SystemExit(f"realpods_startup: {reason}")
    found = cluster_as_found()
    print(f"control plane {'running' if found.cluster_up else 'down'}, real node {'running' if found.node_up else 'down'}"
          " at the start", flush=True)  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="rs-rp-job-", dir="/tmp"))
    try:
        on_cluster, local = measure(args, folder / "trainingjob-cpu.yaml")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        leave_as_found(found)  # before the report: its RESULT lines end the output
    if not report(on_cluster, local, args.workers):
        sys.exit(1)


if __name__ == "__main__":
    main()
