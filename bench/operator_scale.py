"""The operator at scale, on the real control plane: TrainingJobs created at once, against the same
API server taking raw RayJob creates.

    .venv/bin/python bench/operator_scale.py [--jobs 1000] [--burst 100] [--kuberay-jobs 30] [--threads 8]
        [--rounds 3] [--profile FILE]   (py-spy on the operator during the N TrainingJobs: a diagnosis, not a figure)

Questions (issue 14, P1/P2): how much longer than the API server's own create rate does the operator
take to reconcile N TrainingJobs; how fast does one TrainingJob get its RayJob in a burst; how many
API calls does the operator make per TrainingJob; how much memory does it hold at N.
Goals: all-done ÷ raw creates <= 3x at 1000; p99 create -> RayJob <= 2 s at a 100-job burst;
<= 6 API calls per TrainingJob; operator RSS <= 150 MB at 1000.

Uses the local control plane (controlplane/cluster.py: etcd, kube-apiserver, controller-manager,
scheduler, kwok nodes, the real KubeRay operator; the rayship operator started on the host exactly
as the chart's Deployment runs it, as the chart's ServiceAccount). A cluster already running is
reused; one started here is stopped at the end. The operator is started afresh for the run (and
restarted at the end if it was running before). Each phase has its own namespace, deleted (and
waited for) before the next phase; the last one (N TrainingJobs) is not waited for.

  raw RayJobs     baseline: N RayJobs (exactly the RayJob rayship renders for the job, without its
                  rayship labels, suspended) created by --threads client threads; time from the first
                  create sent to the last create answered (after 50 untimed warm-up creates).
  floor           what the API server needs for the objects rayship must make per job (its
                  ServiceAccount, RoleBinding, NetworkPolicy and spec Secret, then the RayJob:
                  rendered by rayship, in that order), by a client with as many threads as the
                  operator has workers, authenticated as the operator (its ServiceAccount's token:
                  RBAC-checked and audit-logged as it is): --burst jobs all given at once, per job
                  from then until its RayJob create is answered (p99); then N jobs, time until the
                  last is answered. Not a goal's baseline: it says how far from the API server's
                  own limit the operator is.
  every write     N TrainingJobs (suspended) created by a client with as many threads as the
                  operator has workers, each followed by every write its life up to its RayJob needs:
                  what rayship plans for it (those objects, owned), one status write and one
                  Event, made as the operator (as the floor); no operator runs, nothing is read.
                  Time until the scale phase's two watches (run here too, on these objects) have
                  seen the last RayJob and status, ÷ raw RayJobs: the goal's ratio for an operator no costlier than this
                  client. The N TrainingJobs' all-done is printed ÷ this too: what the operator
                  (kopf, its watches, its extra status writes) adds to the design's own writes
                  (operator_over_floor_N); also ÷ the last write answered, unwatched, as the rounds
                  before measured it (operator_over_unwatched_writes_N): that baseline had neither
                  the watches' CPU in this process and the API server nor their delivery's lag.
                  --rounds rounds, each in a namespace of its own, deleted after: the first before
                  the operator starts, each later one right before its scale round (the operator
                  stopped for it, then started afresh and warmed up as for the burst).
  burst           --burst TrainingJobs (suspended) created at once by the same threads; per job, from
                  its create request sent to its RayJob seen by a watch: p50/p99/max. First, as the
                  baselines get, 20 untimed warm-up TrainingJobs, each waited for until it has its
                  RayJob and a status (the operator's first jobs: its connections, the API server's
                  caches for its requests).
  N TrainingJobs  N TrainingJobs (suspended) created the same way; all-done = from the first create
                  sent until every TrainingJob has its RayJob and a status.phase (both seen by
                  watches). ratio = all-done ÷ raw RayJobs. --rounds rounds (a namespace each, all
                  but the last deleted before the next): round i ÷ every-write round i, the median
                  is operator_over_floor_N, the lowest and highest _min and _max; the other figures
                  are the last round's.
                  API calls: every request of the operator the API server's audit log records
                  (controlplane/cluster.py: all requests of ServiceAccounts of the operator's
                  namespace, at Metadata level, one line per request by auditID; kopf's watches and
                  Event posts included) from the first create until 5 s after all-done, ÷ N.
                  CPU: user + system seconds of each component's process group (psutil over /proc)
                  and of this process, from the first create to all-done, per job: where the 2
                  cores went (the raw RayJobs phase prints the same table for its creates).
                  RSS: VmRSS (and VmHWM, the peak) of the operator process (/proc/<pid>/status) then;
                  also of a restarted operator holding the same N, once neither its log nor its API
                  calls have grown for 10 s.
  KubeRay alone   --kuberay-jobs raw RayJobs, not suspended: time until KubeRay has made every
                  RayCluster; then as many TrainingJobs, not suspended: time until every RayCluster
                  exists; rayship's added time = the difference. A small N: 1000 RayClusters (3000
                  kwok pods) are too heavy for a 2-core machine shared with the rest.

The phases run in the order raw RayJobs, floor, every write, burst, KubeRay alone, N TrainingJobs,
then (every write, N TrainingJobs) again for each further round.
Timing is on this machine's monotonic clock; the watches run in this process. Prints tables and ends
with one RESULT line per figure; never fails on the goals.
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import kubernetes
import kubernetes.utils
import psutil
import yaml
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controlplane import cluster as controlplane  # noqa: E402
from controlplane import objects, operator_run  # noqa: E402
from controlplane.config import RAYSHIP_NAMESPACE  # noqa: E402
from rayship import api  # noqa: E402
from rayship.api import names, validation  # noqa: E402
from rayship.config import OperatorConfig  # noqa: E402
from rayship.controller import trainingjob  # noqa: E402
from rayship.controller.conditions import owned_changes  # noqa: E402

SAMPLE = ROOT / "manifests/samples/kind-trainingjob-cpu.yaml"
RAYCLUSTERS: api.Resource = (api.KUBERAY_GROUP, api.KUBERAY_VERSION, "rayclusters")


def operator_identity(admin: kubernetes.client.ApiClient) -> Path:
    """A kubeconfig authenticating as the operator does (a token of the chart's Deployment's
    ServiceAccount): a baseline's writes made with it are RBAC-checked and audit-logged as the
    operator's are, where the cluster admin's client certificate is neither."""
    account = operator_run.operator_deployment(admin).spec.template.spec.service_account_name
    return objects.service_account_kubeconfig(RAYSHIP_NAMESPACE, account or "default")


def client_for(kubeconfig: Path, threads: int) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=config)
    config.connection_pool_maxsize = threads + 4
    return kubernetes.client.ApiClient(config)


class Seen:
    """Watches one kind in one namespace; records when each object first met `done`."""

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str, resource: api.Resource,
                 done: Callable[[dict[str, Any]], bool] = lambda _: True, name: Callable[[dict[str, Any]], str] | None = None):  # fmt: skip
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.namespace, self.resource, self.done = namespace, resource, done
        self.name = name or (lambda obj: obj["metadata"]["name"])
        self.at: dict[str, float] = {}
        self.stopping = False
        self.lock = threading.Lock()
        group, version, plural = resource
        listed = self.custom.list_namespaced_custom_object(group, version, namespace, plural)
        self.version = listed["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        group, version, plural = self.resource
        while not self.stopping:
            stream = kubernetes.watch.Watch().stream(
                self.custom.list_namespaced_custom_object, group, version, self.namespace, plural,
                resource_version=self.version, timeout_seconds=5, allow_watch_bookmarks=True,
            )  # fmt: skip
            for event in stream:
                now = time.monotonic()
                obj = event["object"]
                self.version = obj["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED") and self.done(obj):
                    with self.lock:
                        self.at.setdefault(self.name(obj), now)
                if self.stopping:
                    break

    def wait(self, names_: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if all(n in self.at for n in names_):
                    return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Ends the watch within its 5 s timeout: none outlives its phase (an open watch holds the API
        server's shutdown, and a stream cut by that shutdown would raise in the thread)."""
        self.stopping = True
        self.thread.join(timeout=30)


def seen_rayjobs_and_statuses(client: kubernetes.client.ApiClient, namespace: str) -> tuple[Seen, Seen]:
    """The two watches that say a TrainingJob is done: its RayJob made, its status.phase written."""
    rayjobs = Seen(
        client, namespace, api.RAYJOBS, name=lambda o: o["metadata"]["labels"][names.LABEL_TRAININGJOB]
    )
    statuses = Seen(
        client, namespace, api.TRAININGJOBS, done=lambda o: bool((o.get("status") or {}).get("phase"))
    )
    return rayjobs, statuses


def create_all(client: kubernetes.client.ApiClient, namespace: str, resource: api.Resource,
               bodies: list[dict[str, Any]], threads: int) -> tuple[dict[str, float], float]:  # fmt: skip
    """Create every body with `threads` threads: (name -> monotonic time its create was sent, time
    the last create was answered)."""
    custom = kubernetes.client.CustomObjectsApi(client)
    group, version, plural = resource
    sent: dict[str, float] = {}

    def create(body: dict[str, Any]) -> float:
        sent[body["metadata"]["name"]] = time.monotonic()
        custom.create_namespaced_custom_object(group, version, namespace, plural, body)
        return time.monotonic()

    with ThreadPoolExecutor(threads) as pool:
        answered = list(pool.map(create, bodies))
    return sent, max(answered)


def make_namespace(client: kubernetes.client.ApiClient, prefix: str) -> str:
    """A namespace of its own, with the checkpoint claim the sample names (the operator launches no
    job whose claim does not exist), made before any job: it is no part of a job's work."""
    name = f"bench-{prefix}-{uuid.uuid4().hex[:5]}"
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespace({"metadata": {"name": name}})
    claim = yaml.safe_load(SAMPLE.read_text())["spec"]["checkpoint"]["storage"]["pvc"]["claimName"]
    core.create_namespaced_persistent_volume_claim(
        name,
        {
            "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    return name


def delete_namespace(
    client: kubernetes.client.ApiClient, name: str, timeout: float = 900, wait: bool = True
) -> float:
    """Delete a namespace and wait until it is gone (its objects garbage-collected): seconds taken."""
    core = kubernetes.client.CoreV1Api(client)
    start = time.monotonic()
    core.delete_namespace(name)
    if not wait:
        return 0.0
    while time.monotonic() - start < timeout:
        try:
            core.read_namespace(name)
        except ApiException as err:
            if err.status == 404:
                return time.monotonic() - start
            raise
        time.sleep(1)
    print(f"  (namespace {name} still terminating after {timeout:.0f} s)")
    return timeout


def trainingjobs(namespace: str, count: int, prefix: str, suspend: bool) -> list[dict[str, Any]]:
    doc = yaml.safe_load(SAMPLE.read_text())
    out = []
    for i in range(count):
        body = copy.deepcopy(doc)
        body["metadata"] = {"name": f"{prefix}-{i:05d}", "namespace": namespace}
        body["spec"]["suspend"] = suspend
        out.append(body)
    return out


def rendered_objects(namespace: str, count: int, prefix: str, suspend: bool) -> list[list[dict[str, Any]]]:
    """Per job (the `trainingjobs` above), what rayship renders for it, in creation order; the
    RayJob without rayship labels (the operator leaves it alone)."""
    out = []
    for job in trainingjobs(namespace, count, prefix, suspend):
        objects = trainingjob.render_trainingjob(validation.parse_trainingjob(job), OperatorConfig())
        objects[-1]["metadata"].pop("labels", None)
        out.append(objects)
    return out


def raw_rayjobs(namespace: str, count: int, prefix: str, suspend: bool) -> list[dict[str, Any]]:
    """The RayJob rayship renders for each job, as a plain RayJob."""
    return [objects[-1] for objects in rendered_objects(namespace, count, prefix, suspend)]


def create_objects(client: kubernetes.client.ApiClient, namespace: str,
                   objects: list[dict[str, Any]]) -> dict[str, Any] | None:  # fmt: skip
    """Create the objects in order, as the operator does (the RayJob with strict field validation);
    the RayJob among them as stored (None without one)."""
    custom = kubernetes.client.CustomObjectsApi(client)
    rayjob = None
    for obj in objects:
        if obj["kind"] == "RayJob":
            rayjob = custom.create_namespaced_custom_object(
                *api.RAYJOBS[:2], namespace, api.RAYJOBS[2], obj, field_validation="Strict"
            )
        else:
            kubernetes.utils.create_from_dict(client, obj, namespace=namespace)
    return rayjob


def each_at_once(work: Callable[[Any], object], items: list[Any], threads: int) -> tuple[float, list[float]]:
    """`work` on every item, `threads` at once: (the monotonic time all were given, when each ended)."""

    def timed(item: Any) -> float:
        work(item)
        return time.monotonic()

    given = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        return given, list(pool.map(timed, items))


def create_per_job(client: kubernetes.client.ApiClient, namespace: str, jobs: list[list[dict[str, Any]]],
                   threads: int) -> tuple[float, list[float]]:  # fmt: skip
    """Each job's objects in order (one thread per job at a time), `threads` jobs at once: (the
    monotonic time all jobs were given, each job's last create answered)."""
    return each_at_once(lambda objects: create_objects(client, namespace, objects), jobs, threads)


def reconcile_by_hand(user: kubernetes.client.ApiClient, client: kubernetes.client.ApiClient, namespace: str,
                      bodies: list[dict[str, Any]], threads: int) -> tuple[float, list[float]]:  # fmt: skip
    """Per TrainingJob, every API write its life up to its RayJob needs, made by a plain client with no
    watch and no read: the TrainingJob's create (by `user`), then, by `client` (the operator's
    identity: authorized and audited as the operator is), what rayship plans for it (its pure `plan`,
    the same objects, owned): ServiceAccount, RoleBinding, NetworkPolicy, Secret, RayJob; one status
    write (the status `status()` derives, merge-patched at the stored resourceVersion) and one Event
    (as kopf posts it). `threads` jobs at once: (the monotonic time all were given, each job's last
    write answered). What the operator adds beyond this is its own cost; this is the design's."""
    user_custom = kubernetes.client.CustomObjectsApi(user)
    custom = kubernetes.client.CustomObjectsApi(client)
    core = kubernetes.client.CoreV1Api(client)
    config = OperatorConfig()
    posting = kopf.OperatorSettings().posting  # the operator keeps kopf's defaults for these

    def one(body: dict[str, Any]) -> None:
        obj = user_custom.create_namespaced_custom_object(
            *api.TRAININGJOBS[:2], namespace, api.TRAININGJOBS[2], body
        )
        todo = trainingjob.plan(obj, None, [], config)
        if todo.create is None or todo.on_create is None:
            raise RuntimeError(f"rayship planned no RayJob for {obj['metadata']['name']}: {todo}")
        objects = [*todo.prerequisites, todo.create]
        kopf.adopt(objects, owner=kopf.Body(obj))
        rayjob = create_objects(client, namespace, objects)
        status = owned_changes({}, trainingjob.status(obj, rayjob, todo, [], datetime.now(UTC)))
        patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "status": status}
        custom.patch_namespaced_custom_object_status(
            *api.TRAININGJOBS[:2], namespace, api.TRAININGJOBS[2], obj["metadata"]["name"], patch
        )
        now = datetime.now(UTC).isoformat()
        event = todo.on_create
        core.create_namespaced_event(namespace, {
            "metadata": {"namespace": namespace, "generateName": posting.event_name_prefix},
            "action": "Action?", "type": event.type, "reason": event.reason, "message": event.message,
            "reportingComponent": posting.reporting_component, "reportingInstance": posting.reporting_instance,
            "source": {"component": posting.reporting_component},
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
                               "uid": obj["metadata"]["uid"], "namespace": namespace},
            "firstTimestamp": now, "lastTimestamp": now, "eventTime": now,
        })  # fmt: skip

    return each_at_once(one, bodies, threads)


def every_write_round(admin: kubernetes.client.ApiClient, writer: kubernetes.client.ApiClient, n: int,
                      workers: int, timeout: float, round_: str, raw_s: float) -> tuple[float, float]:  # fmt: skip
    """One round of the every-write baseline in a fresh namespace (deleted at the end), watched by
    the scale phase's two watches: (seconds until they saw the last RayJob and status, seconds until
    the last write was answered). Each begins with 20 untimed jobs (connections, the API server's caches)."""
    ns = make_namespace(admin, "writes")
    reconcile_by_hand(admin, writer, ns, trainingjobs(ns, 20, "warm", suspend=True), workers)  # not timed
    # The scale phase's own two watches, on this phase's objects too: its all-done is when they see
    # the last RayJob and status, and they cost this process and the API server CPU it shares with
    # the operator. Watched here as there, the ratio compares the operator with this client alone.
    rayjobs, statuses = seen_rayjobs_and_statuses(admin, ns)
    groups = process_groups()
    cpu_before = cpu_seconds(groups)
    bodies = trainingjobs(ns, n, "j", suspend=True)
    given, answered = reconcile_by_hand(admin, writer, ns, bodies, workers)
    unwatched = max(answered) - given  # the last write answered
    names_ = [b["metadata"]["name"] for b in bodies]
    if not (rayjobs.wait(names_, timeout) and statuses.wait(names_, timeout)):
        # no figure from a partial round: stop (the caller's `finally` still stops what it started)
        raise SystemExit(
            f"every write, {round_}: the watches did not see all {n} jobs done within {timeout:.0f} s"
        )
    # until the last one is seen, as at scale
    watched = max([*rayjobs.at.values(), *statuses.at.values()]) - given
    cpu_after, cpu_wall = cpu_seconds(groups), time.monotonic() - given
    rayjobs.stop()
    statuses.stop()
    delete_namespace(admin, ns)
    print(
        f"every write a job needs, {round_} (TrainingJob create, every object rayship renders, 1 status "
        f"write, 1 Event; {workers} client threads, no operator): {n} jobs seen done by the scale phase's "
        f"watches in {watched:.2f} s ({watched / raw_s:.2f}x the raw RayJobs), the last write answered "
        f"after {unwatched:.2f} s"
    )
    cpu_table(cpu_before, cpu_after, cpu_wall, n, "the first create to the last seen")
    return watched, unwatched


def scale_round(client: kubernetes.client.ApiClient, pid: int, n: int, threads: int, timeout: float, label: str,
                baselines: tuple[float, float, float, float], profile_file: Path | None) -> tuple[str, float, int, float]:  # fmt: skip
    """N TrainingJobs (suspended) in a fresh namespace, against the running operator `pid`; prints the
    round's tables (its ratios to `baselines`: raw RayJobs, floor, this round's every write, watched
    and unwatched). (the namespace, its all-done seconds, the operator's VmRSS in KB then, its API
    calls per TrainingJob)."""
    raw_s, floor_s, writes_s, writes_unwatched_s = baselines
    ns = make_namespace(client, "scale")
    rayjobs, statuses = seen_rayjobs_and_statuses(client, ns)
    offset = controlplane.audit_offset()
    groups = process_groups(pid)
    bodies = trainingjobs(ns, n, "j", suspend=True)
    profile = Profile(pid, profile_file) if profile_file else None
    cpu_before = cpu_seconds(groups)
    sent, last = create_all(client, ns, api.TRAININGJOBS, bodies, threads)
    first = min(sent.values())
    create_s = last - first
    complete = rayjobs.wait(list(sent), timeout) and statuses.wait(list(sent), timeout)
    done_at = max([*rayjobs.at.values(), *statuses.at.values()])
    all_done_s = done_at - first
    cpu_after, cpu_wall = cpu_seconds(groups), time.monotonic() - first
    if profile is not None:
        profile.stop()
    memory = rss_kb(pid)
    time.sleep(5)
    calls = [
        e
        for e in controlplane.audit_since(offset)
        if (e.get("objectRef") or {}).get("namespace") in (ns, None)
    ]
    rayjobs.stop()
    statuses.stop()
    phases = collections.Counter()
    for k in sent:
        phases["with RayJob"] += k in rayjobs.at
        phases["with status"] += k in statuses.at
    print(
        f"{n} TrainingJobs, {label}: created in {create_s:.2f} s; all reconciled after {all_done_s:.2f} s"
        + ("" if complete else f" (TIMED OUT: {dict(phases)})")
    )
    print(
        f"  all-done ÷ raw RayJob creates: {all_done_s / raw_s:.2f}x (goal <= 3x); "
        f"÷ the floor: {all_done_s / floor_s:.2f}x; ÷ every write a job needs (its round's): "
        f"{all_done_s / writes_s:.2f}x (its last write answered: {all_done_s / writes_unwatched_s:.2f}x)"
    )
    cpu_table(cpu_before, cpu_after, cpu_wall, n, "the first create to all-done")
    if profile is not None:
        profile.summary()
    print(
        f"  operator RSS {memory['VmRSS'] / 1024:.0f} MB, peak {memory['VmHWM'] / 1024:.0f} MB (goal <= 150 MB)"
    )
    print(
        f"  operator API calls (audit log): {len(calls)} = {len(calls) / n:.2f} per TrainingJob (goal <= 6)"
    )
    for what, count in collections.Counter(map(call_kind, calls)).most_common():
        print(f"    {count / n:7.3f}  {what}  ({count})")
    refused = [e for e in calls if (e.get("responseStatus") or {}).get("code") == 403]
    print(f"    refused (403): {len(refused)}")
    lat = [rayjobs.at[k] - sent[k] for k in sent if k in rayjobs.at]
    print(f"  create -> RayJob at {n}: p50 {statistics.median(lat):.2f} s, p99 {pct(lat, 0.99):.2f} s")
    return ns, all_done_s, memory["VmRSS"], len(calls) / n


def warm_up(client: kubernetes.client.ApiClient, threads: int, timeout: float) -> None:
    """An operator just started: 20 TrainingJobs it is done with (its connections, the API server's
    caches for its requests), in a namespace deleted after, as the burst phase's warm-up."""
    ns = make_namespace(client, "warm")
    rayjobs, statuses = seen_rayjobs_and_statuses(client, ns)
    warm, _ = create_all(client, ns, api.TRAININGJOBS, trainingjobs(ns, 20, "warm", suspend=True), threads)
    rayjobs.wait(list(warm), timeout)
    statuses.wait(list(warm), timeout)
    rayjobs.stop()
    statuses.stop()
    delete_namespace(client, ns)


def wait_quiet(log: Path, seconds: float, timeout: float) -> float:
    """Until neither the operator's log nor the audit log (its API calls) grew for `seconds`: the
    seconds waited."""
    start = time.monotonic()
    sizes, quiet = None, start
    while time.monotonic() - quiet < seconds and time.monotonic() - start < timeout:
        time.sleep(1)
        now = (log.stat().st_size, controlplane.audit_offset())
        if now != sizes:
            sizes, quiet = now, time.monotonic()
    return time.monotonic() - start


def call_kind(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    what = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return f"{event['verb']} {what}"


def rss_kb(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def process_groups(operator_pid: int | None = None) -> dict[str, int]:
    """Each running control-plane component's process group id, by name (the operator, when given,
    as "rayship operator")."""
    groups = {name: int(proc["pid"]) for name, proc in controlplane.status()["processes"].items()}
    if operator_pid is None:
        return groups
    return {name: pgid for name, pgid in groups.items() if pgid != operator_pid} | {
        "rayship operator": operator_pid
    }


def cpu_seconds(groups: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by every live process of each named process group
    (controlplane starts each component as its own group), and by this process ("benchmark")."""
    by_group: dict[int, float] = collections.defaultdict(float)
    for proc in psutil.process_iter():
        try:
            times = proc.cpu_times()
            by_group[os.getpgid(proc.pid)] += times.user + times.system
        except (psutil.Error, ProcessLookupError):
            continue  # gone since the listing
    own = psutil.Process().cpu_times()
    return {name: by_group.get(pgid, 0.0) for name, pgid in groups.items()} | {
        "benchmark (client, watches)": own.user + own.system
    }


def cpu_table(before: dict[str, float], after: dict[str, float], wall: float, n: int, window: str) -> None:
    used = {name: after[name] - before.get(name, 0.0) for name in after}
    total = sum(used.values())
    print(f"  CPU from {window} ({wall:.1f} s on {os.cpu_count()} cores), by component:")
    for name, seconds in sorted(used.items(), key=lambda kv: -kv[1]):
        print(
            f"    {name:<28} {seconds:7.2f} s  {100 * seconds / total:5.1f}%  {1000 * seconds / n:6.2f} ms/job"
        )
    print(f"    {'all':<28} {total:7.2f} s  = {total / wall:.2f} cores busy")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


class Profile:
    """py-spy (sampling from outside: the operator runs unchanged) recording the Python stack of the
    operator's thread that holds the GIL (`--gil`: where its Python CPU goes; without it, the worker
    threads waiting on the API server's answers in `SSLSocket.read` were half the samples) into `path`
    (py-spy's raw format: one `frame;frame;... count` line per stack) until stopped; `summary` says
    where its samples fell."""

    def __init__(self, pid: int, path: Path, rate: int = 100) -> None:
        spy = Path(sys.executable).with_name("py-spy")
        self.path = path
        self.process = subprocess.Popen(
            [str(spy), "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking",
             "--gil", "--format", "raw", "--output", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        _, err = self.process.communicate(timeout=60)
        if not self.path.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.strip()[-500:]}")

    def summary(self, top: int = 25) -> None:
        """The samples (py-spy keeps those of threads the kernel shows running, not idle ones) by what
        they ran: each stack's innermost frame (self), and every function on it once (inclusive)."""
        own: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        packages: collections.Counter[str] = collections.Counter()
        busy = 0
        for line in self.path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
            if not frames:
                continue
            busy += int(count)
            own[_function(frames[-1])] += int(count)
            packages[_package(frames[-1])] += int(count)
            for name in {_function(f) for f in frames}:
                inclusive[name] += int(count)
        print(f"  operator profile ({self.path}): {busy} samples of running threads")
        for title, counter in (
            ("by package (innermost frame)", packages),
            ("self", own),
            ("inclusive", inclusive),
        ):
            print(f"    {title}:")
            for name, count in counter.most_common(top):
                print(f"      {100 * count / max(busy, 1):5.1f}%  {name}")


def _function(frame: str) -> str:
    """`name (path/to/file.py:line)` -> `name (file.py)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rpartition(':')[0].rpartition('/')[2] or where})"


def _package(frame: str) -> str:
    """`name (kopf/_core/x.py:line)` -> `kopf`: py-spy names a file relative to its sys.path entry."""
    return frame.partition(" (")[2].rpartition(":")[0].split("/")[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000, help="TrainingJobs in the scale phase")
    parser.add_argument("--burst", type=int, default=100, help="TrainingJobs in the burst phase")
    parser.add_argument(
        "--kuberay-jobs", type=int, default=30, help="RayJobs/TrainingJobs in the KubeRay phase"
    )
    parser.add_argument("--threads", type=int, default=8, help="client threads creating objects")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of the every-write baseline and of the N TrainingJobs (the spread of their ratio)",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for one phase")
    parser.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the operator on top of the chart's (to compare settings)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="record the operator with py-spy during the N TrainingJobs (raw stacks in FILE) and print "
        "where its samples fell (a diagnosis run: sampling slows the operator, so its figures are not results)",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    if args.profile is not None:
        if not Path(sys.executable).with_name("py-spy").exists():
            parser.error(
                "--profile: py-spy is not in this environment: run `make setup` (it is a dev dependency)"
            )
        if not args.profile.parent.is_dir():
            parser.error(f"--profile: {args.profile.parent} is not a directory: name a file in one")
    operator_env = dict(item.split("=", 1) for item in args.operator_env)

    running = controlplane.up(operator=None)
    was_running = controlplane.status().get("operator") is not None if not running.started else False
    controlplane.stop_operator()
    results: dict[str, float] = {}
    handle = None
    try:
        client = client_for(running.kubeconfig, args.threads)
        n = args.jobs

        # --- baseline: raw RayJob creates ---------------------------------------------------------
        ns = make_namespace(client, "raw")
        warm = raw_rayjobs(ns, min(n, 50), "warm", suspend=True)  # connections, API server caches: not timed
        create_all(client, ns, api.RAYJOBS, warm, args.threads)
        groups = process_groups()
        bodies = raw_rayjobs(ns, n, "raw", suspend=True)
        cpu_before = cpu_seconds(groups)
        sent, last = create_all(client, ns, api.RAYJOBS, bodies, args.threads)
        raw_s = last - min(sent.values())
        cpu_after, cpu_wall = cpu_seconds(groups), time.monotonic() - min(sent.values())
        gone = delete_namespace(client, ns)
        print(
            f"raw RayJobs: {n} created in {raw_s:.2f} s ({n / raw_s:.0f}/s); namespace deleted in {gone:.0f} s"
        )
        cpu_table(cpu_before, cpu_after, cpu_wall, n, "the first create to the last answered")

        # --- floor: the objects rayship makes per job, by a client as concurrent as the operator ----------
        workers = int(operator_env.get("RAYSHIP_WORKERS", OperatorConfig().workers))
        ns = make_namespace(client, "floor")
        floor_client = client_for(operator_identity(client), workers)  # the operator's identity, not admin
        create_per_job(floor_client, ns, rendered_objects(ns, 20, "warm", suspend=True), workers)  # not timed
        given, answered = create_per_job(
            floor_client, ns, rendered_objects(ns, args.burst, "b", suspend=True), workers
        )
        floor_burst = [t - given for t in answered]
        given, answered = create_per_job(
            floor_client, ns, rendered_objects(ns, n, "j", suspend=True), workers
        )
        floor_s = max(answered) - given
        delete_namespace(client, ns)
        print(
            f"floor (every object rayship renders per job; {workers} client threads): "
            f"{args.burst} jobs at once: RayJob p99 {pct(floor_burst, 0.99):.2f} s; "
            f"{n} jobs in {floor_s:.2f} s ({floor_s / raw_s:.2f}x the raw RayJobs)"
        )

        # --- every write a job needs, by a plain client (no operator runs): the design's own floor ------
        # Round 1 here; each later one right before the scale round it is the baseline of, the operator
        # stopped for it (--rounds: the spread of their ratio, each pair on the cluster as it is then).
        writes_s, writes_unwatched_s = [], []

        def writes_round(i: int) -> None:
            watched, unwatched = every_write_round(
                client, floor_client, n, workers, args.timeout, f"round {i + 1}/{args.rounds}", raw_s
            )
            writes_s.append(watched)
            writes_unwatched_s.append(unwatched)

        writes_round(0)
        handle = controlplane.start_operator(operator_env)
        print(f"rayship operator pid {handle.pid}: {rss_kb(handle.pid)['VmRSS'] / 1024:.0f} MB at start")

        # --- burst: create -> RayJob ----------------------------------------------------------------
        # Not timed, as the baselines' warm-up creates: the operator's first jobs, each waited for.
        warm_up(client, args.threads, args.timeout)
        ns = make_namespace(client, "burst")
        rayjobs, statuses = seen_rayjobs_and_statuses(client, ns)
        bodies = trainingjobs(ns, args.burst, "b", suspend=True)
        sent, _ = create_all(client, ns, api.TRAININGJOBS, bodies, args.threads)
        complete = rayjobs.wait(list(sent), args.timeout)
        statuses.wait(list(sent), args.timeout)  # the operator is done with them before they go
        rayjobs.stop()
        statuses.stop()
        latency = [rayjobs.at[k] - sent[k] for k in sent if k in rayjobs.at]
        print(
            f"burst of {args.burst}: create -> RayJob p50 {statistics.median(latency):.2f} s, "
            f"p99 {pct(latency, 0.99):.2f} s, max {max(latency):.2f} s" + ("" if complete else " (TIMED OUT)")
        )
        results["operator_p99_create_to_rayjob_s_100" if args.burst == 100 else f"operator_p99_create_to_rayjob_s_{args.burst}"] = pct(latency, 0.99)  # fmt: skip
        delete_namespace(client, ns)

        # --- KubeRay alone vs through rayship (RayClusters) ----------------------------------------------
        m = args.kuberay_jobs
        ns = make_namespace(client, "kuberay")
        clusters = Seen(client, ns, RAYCLUSTERS, name=lambda o: o["metadata"]["ownerReferences"][0]["name"])
        sent, _ = create_all(client, ns, api.RAYJOBS, raw_rayjobs(ns, m, "raw", suspend=False), args.threads)
        clusters.wait(list(sent), args.timeout)
        clusters.stop()
        kuberay_s = max(clusters.at.values()) - min(sent.values())
        delete_namespace(client, ns)
        ns = make_namespace(client, "kr-tj")
        clusters = Seen(client, ns, RAYCLUSTERS, name=lambda o: o["metadata"]["ownerReferences"][0]["name"])
        sent, _ = create_all(
            client, ns, api.TRAININGJOBS, trainingjobs(ns, m, "k", suspend=False), args.threads
        )
        expected = [names.rayjob_name(k) for k in sent]
        clusters.wait(expected, args.timeout)
        clusters.stop()
        via_s = max(clusters.at.values()) - min(sent.values())
        delete_namespace(client, ns)
        print(
            f"KubeRay, {m} RayJobs -> RayClusters: {kuberay_s:.2f} s alone; through rayship (TrainingJobs) "
            f"{via_s:.2f} s: rayship adds {via_s - kuberay_s:.2f} s"
        )

        # --- scale: N TrainingJobs, --rounds times -----------------------------------------------------
        # Each round in a namespace of its own, its ratio against the every-write round made just
        # before it; the namespaces before the last are deleted (and waited for) before the next
        # round, the last round's N stay for the rollout and the restart below.
        all_done, over_floor, over_unwatched = [], [], []
        for i in range(args.rounds):
            last_round, label = i == args.rounds - 1, f"round {i + 1}/{args.rounds}"
            if i > 0:  # its baseline, then the operator afresh, warmed up as for the burst
                controlplane.stop_operator(handle)
                writes_round(i)
                handle = controlplane.start_operator(operator_env)
                warm_up(client, args.threads, args.timeout)
            ns, all_done_s, rss, calls_per_job = scale_round(
                client, handle.pid, n, args.threads, args.timeout, label,
                (raw_s, floor_s, writes_s[i], writes_unwatched_s[i]), args.profile if last_round else None,
            )  # fmt: skip
            all_done.append(all_done_s)
            over_floor.append(all_done_s / writes_s[i])  # ÷ every write a job needs, watched
            over_unwatched.append(all_done_s / writes_unwatched_s[i])  # as the rounds before measured it
            if not last_round:
                gone = delete_namespace(client, ns)
                print(f"  namespace deleted in {gone:.0f} s (the operator running)")
        print(
            f"operator ÷ every write a job needs, {args.rounds} rounds: "
            + ", ".join(f"{x:.3f}" for x in over_floor)
            + f"; median {statistics.median(over_floor):.3f}, spread {max(over_floor) - min(over_floor):.3f}"
        )
        results[f"operator_all_done_ratio_{n}"] = statistics.median(all_done) / raw_s
        results[f"operator_over_floor_{n}"] = statistics.median(over_floor)
        results[f"operator_over_floor_{n}_min"] = min(over_floor)
        results[f"operator_over_floor_{n}_max"] = max(over_floor)
        results[f"operator_over_unwatched_writes_{n}"] = statistics.median(over_unwatched)
        results["operator_api_calls_per_job"] = calls_per_job  # the last round's
        results[f"operator_rss_mb_{n}"] = rss / 1024
        # A rollout at this moment: SIGTERM while KubeRay's status updates of the N RayJobs still
        # arrive; a pod gets 30 s (Kubernetes' default grace period) before SIGKILL.
        stopping = time.monotonic()
        if controlplane.stop_operator(handle, timeout=30):
            print(f"  SIGTERM right after: the operator exited in {time.monotonic() - stopping:.1f} s")
        else:
            print("  SIGTERM right after: the operator ignored it for 30 s (SIGKILL)")
        # The same N objects held by an operator that did not live through the burst of events:
        # restarted, it lists them all, reconciles each once (nothing to create), then idles.
        handle = controlplane.start_operator(operator_env)
        wait_quiet(handle.log_path, 10, args.timeout)
        print(
            f"  after a restart with the {n} TrainingJobs: operator RSS {rss_kb(handle.pid)['VmRSS'] / 1024:.0f} MB"
        )
        if not running.started:  # a cluster started here is removed whole at the end
            delete_namespace(client, ns, wait=False)

    finally:
        if handle is not None:
            controlplane.stop_operator(handle)
        if running.started:
            controlplane.down()
        elif was_running:
            controlplane.start_operator()
    for name, value in results.items():
        print(f"RESULT {name}={value:.3f}" if value < 100 else f"RESULT {name}={value:.0f}")


if __name__ == "__main__":
    main()
