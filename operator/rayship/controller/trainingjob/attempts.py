"""status.attempts and the resource totals: every attempt of a TrainingJob on record (pure).

KubeRay runs a RayJob's attempts one after the other (backoffLimit), each on a new Ray cluster, and
keeps only the current one's `startTime` (set again at each attempt, and at a resume) and a count of
failures. The operator turns what it sees into a record: an attempt is opened when a new `startTime`
appears and closed when the next one appears, when the job is suspended (its cluster goes), or when
the job ends. What an attempt reached comes from the workload's own progress (`status.progress`,
taken only while it names the attempt's Ray cluster, so that the last report of one attempt is never
the next one's), frozen when it closes.

An attempt's last report can be lost with it: Ray Train registers a report's checkpoint (and writes
its record of it to the storage) before it calls the callback that patches the status, so a driver
killed between the two leaves a checkpoint no report named. The next attempt resumes from it and its
driver reads Ray Train's record of that report back (`progress.recovered`): the attempt before gets
it, said as recovered (`reportRecovered`). `checkpointEpoch` is the newest checkpoint an attempt left,
from its reports and from the next attempt's resume; above `reachedEpoch`, a report was lost and not
recovered, and the record shows it rather than papering it over.

What an attempt held comes from its Ray pods' own times, not KubeRay's: each pod from its start on
the node (`status.startTime`) to its containers' end, x the CPUs it requests and the GPUs it is
limited to. A cluster's pods outlive its attempt (workers drain for most of their grace period once
KubeRay deletes the cluster) and start after it (scheduling): on real pods, KubeRay's times said 147
CPU-seconds for a job killed twice whose pods had held 199.5. The operator watches no pods, so it
looks (a LIST of the job's Ray pods) when an attempt starts, when its ready worker count changes, at
most every POD_LOOK_SECONDS while it runs, as it ends or fails, when KubeRay is due to delete its
cluster (ttlSecondsAfterFinished) and until every pod of a closed attempt is gone; a pod's end is its
containers' end where a look saw it, else the middle between when it was last seen running and the
earlier of the look that found it gone and its deletion deadline. (Without the look as it ended, a
job's pods were last seen up to POD_LOOK_SECONDS before they went: on real pods an elastic job's
record said 212 CPU-seconds where its pods had held 241.) Until its pods are all gone an attempt is unsettled: it keeps its pods in
`pods`; then it keeps only its figures. The totals are the settled attempts' figures plus the others'
so far, so they always add up. The record lives in the TrainingJob's status: an operator restart
loses nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from kubernetes.utils import parse_quantity

from rayship import api
from rayship.controller.conditions import parse_time, rfc3339

MAX_ATTEMPTS_KEPT = 20  # the oldest are dropped; the totals cover every attempt
ATTEMPT_FAILED_REASONS = frozenset({"AttemptEnded", "Retrying"})  # KubeRay: this attempt failed
SUSPENDED_STATES = frozenset({"Suspending", "Suspended"})
RESOURCES = (("gpu", "gpus"), ("cpu", "cpus"))  # (status field prefix, the pod record's count)
# A running attempt's pods are looked at this often at most (a LIST each), and when its ready worker
# count changes: a pod that comes and goes between two looks unseen by either is not counted.
POD_LOOK_SECONDS = 60
CLUSTER_LABEL = "ray.io/cluster"
# KubeRay's RayJob states in which the attempt's end is in sight (its cluster goes): its pods are
# looked at as it ends, so that a pod's end is not estimated from a look up to POD_LOOK_SECONDS old.
ENDING_DEPLOYMENT_STATES = frozenset(
    {"Complete", "Failed", "ValidationFailed", "Retrying", *SUSPENDED_STATES}
)
ENDING_JOB_STATES = frozenset({"FAILED", "STOPPED"})


def accounted(
    current: Mapping[str, Any],
    rayjob_status: Mapping[str, Any],
    phase: str,
    reason: str,
    attempt: int | None,
    now: datetime,
    ready: int | None = None,
    pods: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """status.attempts after this observation, with gpuSeconds/cpuSeconds (and their hours, and the
    settled attempts' part). `pods`: the job's Ray pods as looked at now (None: not looked at);
    `ready`: the ready worker count while it runs (None: not known)."""
    kept = [dict(a) for a in current.get("attempts") or [] if isinstance(a, Mapping)]
    start = parse_time(rayjob_status.get("startTime"))
    if start is not None and attempt is not None:
        progress = current.get("progress") or {}
        last = kept[-1] if kept else None
        if last is None or parse_time(last.get("startTime")) != start:
            if last is not None and "endTime" not in last:  # its successor began: it ran until then
                said = last.get("reason") or rayjob_status.get("reason") or "Retried"
                _close(last, start, str(last.get("outcome") or "Failed"), str(said), progress)
            # KubeRay counts a failure before it starts the next attempt: `attempt` is this one's.
            last = {"attempt": attempt, "startTime": rfc3339(start), "pods": []}
            kept.append(last)
        cluster = rayjob_status.get("rayClusterName")
        if (
            cluster
            and "rayClusterName" not in last
            and cluster not in {a.get("rayClusterName") for a in kept}
        ):
            last["rayClusterName"] = cluster  # the cluster this attempt runs on: its pods' label
        if "endTime" not in last:
            last.setdefault("pods", [])  # an attempt opened before pods were counted
            if phase in api.TERMINAL_PHASES:
                _close(last, parse_time(rayjob_status.get("endTime")) or now, phase, reason, progress)
            elif rayjob_status.get("jobDeploymentStatus") in SUSPENDED_STATES:
                _close(last, now, "Suspended", "Suspended", progress)
            else:
                _progress(last, progress)
                _note_workers(last, ready, now)
                if reason in ATTEMPT_FAILED_REASONS:
                    # Failed; its cluster goes and the next attempt's comes: closed when that one starts.
                    last.update(outcome="Failed", reason=str(rayjob_status.get("reason") or reason))
        _checkpoints_left(kept, progress.get("recovered"))
    return _totals(current, kept, now, pods)


def _checkpoints_left(kept: list[dict[str, Any]], recovered: Any) -> None:
    """Each ended attempt's checkpointEpoch, and a report it lost that the next attempt recovered.

    Attempts run one after the other and each resumes the newest registered checkpoint, so one newer
    than where an attempt itself resumed from is that attempt's own (on real pods, in the clean-clone
    CI: attempt 2 last reported epoch 5, attempt 3 resumed from epoch 6). `recovered`: Ray Train's
    record of the newest checkpoint's report, read back by the driver of the attempt on the Ray
    cluster it names; it belongs to the attempt before that one when it is newer than anything on
    record up to there."""
    for earlier, later in itertools.pairwise(kept):
        resumed = later.get("resumedFromEpoch")
        if "endTime" in earlier and resumed is not None and resumed > (earlier.get("resumedFromEpoch") or 0):
            earlier["checkpointEpoch"] = max(int(earlier.get("checkpointEpoch") or 0), int(resumed))
    if not isinstance(recovered, Mapping) or not isinstance(recovered.get("epoch"), int):
        return
    epoch = recovered["epoch"]
    for i, (earlier, later) in enumerate(itertools.pairwise(kept)):
        if later.get("rayClusterName") != recovered.get("rayCluster") or "endTime" not in earlier:
            continue
        if later.get("resumedFromEpoch") not in (None, epoch):
            continue  # the attempt that read it back resumed from another checkpoint: not its record
        on_record = [a.get(k) or 0 for a in kept[: i + 1] for k in ("reachedEpoch", "resumedFromEpoch")]
        if epoch > max(on_record):
            earlier.update(reachedEpoch=epoch, reportRecovered=True)
            earlier["checkpointEpoch"] = max(int(earlier.get("checkpointEpoch") or 0), epoch)


def _totals(
    current: Mapping[str, Any],
    kept: list[dict[str, Any]],
    now: datetime,
    pods: Sequence[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    settled_now: list[dict[str, Any]] = []
    for entry in kept:
        if "pods" not in entry:
            continue  # settled: its figures are final
        if pods is not None:
            _look(
                entry, [p for p in pods if _labels(p).get(CLUSTER_LABEL) == entry.get("rayClusterName")], now
            )
        _held(entry, now)
        if "endTime" in entry and _settled(entry):
            del entry["pods"], entry["podsSeenTime"]
            settled_now.append(entry)
    out: dict[str, Any] = {"attempts": kept[-MAX_ATTEMPTS_KEPT:]} if kept else {}
    for field, _ in RESOURCES:
        earlier = float(current.get(f"{field}SecondsEarlierAttempts") or 0.0)
        earlier = round(earlier + sum(a.get(f"{field}Seconds") or 0.0 for a in settled_now), 3)
        total = round(earlier + sum(a.get(f"{field}Seconds") or 0.0 for a in kept if "pods" in a), 3)
        if kept or earlier:
            out.update({
                f"{field}Seconds": total,
                f"{field}SecondsEarlierAttempts": earlier,
                f"{field}Hours": round(total / 3600, 3),
            })  # fmt: skip
    return out


def look_due(
    current: Mapping[str, Any], rayjob_status: Mapping[str, Any], now: datetime, *, suspended: bool = False
) -> bool:
    """Whether this pass should look at the job's Ray pods for its figures: a new attempt (not of a
    `suspended` RayJob: KubeRay stamps its startTime but starts no cluster), one this pass ends or
    fails (its pods' last sight before KubeRay deletes them), one whose ready worker count changed (a
    worker pod went or came), a closed one whose pods may not all be gone, or a running one not looked
    at for POD_LOOK_SECONDS."""
    kept = [a for a in current.get("attempts") or [] if isinstance(a, Mapping)]
    start = rayjob_status.get("startTime")
    if start and not suspended and (not kept or parse_time(kept[-1].get("startTime")) != parse_time(start)):
        return True
    last = kept[-1] if kept else None
    if last is not None and "pods" in last and "endTime" not in last:
        ending = (
            rayjob_status.get("jobDeploymentStatus") in ENDING_DEPLOYMENT_STATES
            or rayjob_status.get("jobStatus") in ENDING_JOB_STATES
        )
        if ending and "outcome" not in last:
            return True
        ready = (rayjob_status.get("rayClusterStatus") or {}).get("readyWorkerReplicas")
        was = current.get("readyWorkers")
        if isinstance(ready, int) and isinstance(was, int) and ready != was:
            return True
    for entry in kept:
        if "pods" not in entry:
            continue
        seen = parse_time(entry.get("podsSeenTime"))
        if "endTime" in entry or seen is None or (now - seen).total_seconds() >= POD_LOOK_SECONDS:
            return True
    return False


def settling(current: Mapping[str, Any], now: datetime, ttl_seconds: float = 0.0) -> float | None:
    """How soon an ending or ended attempt's pods are worth another look (None: no such attempt has pods
    that may still run): soon (0) while one is failing (KubeRay deletes its cluster), while its pods
    are being deleted, or when it has not been looked at since it ended. Else at the time KubeRay
    deletes them: a finished job's cluster `ttl_seconds` (its ttlSecondsAfterFinished) after its end,
    a retried or suspended attempt's at once; then soon for POD_LOOK_SECONDS, then every
    POD_LOOK_SECONDS (a look is never further off than that)."""
    attempts = [a for a in current.get("attempts") or [] if isinstance(a, Mapping)]
    ending = [a for a in attempts if "pods" in a and ("endTime" in a or "outcome" in a)]
    if not ending:
        return None
    waits = []
    for entry in ending:
        seen, end = parse_time(entry.get("podsSeenTime")), parse_time(entry.get("endTime"))
        going = any(r.get("deadline") and not r.get("ended") for r in entry.get("pods") or [])
        if going or seen is None or end is None or seen < end:
            return 0.0
        final = entry is attempts[-1] and entry.get("outcome") in api.TERMINAL_PHASES
        left = (end + timedelta(seconds=ttl_seconds if final else 0) - now).total_seconds()
        waits.append(
            min(left, POD_LOOK_SECONDS) if left > 0 else 0.0 if -left < POD_LOOK_SECONDS else POD_LOOK_SECONDS
        )
    return float(min(waits))


def _labels(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return (pod.get("metadata") or {}).get("labels") or {}


def pod_use(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a Ray pod holds and since when (None: not on a node yet, holding nothing): its start, the
    CPUs its containers request, the GPUs (`*/gpu` resources) they are limited to; `endTime` once its
    containers have all ended (a pod that ran to its end, or one being deleted); `deadline` once it is
    being deleted (the kubelet kills it then at the latest)."""
    status = pod.get("status") or {}
    if not status.get("startTime"):
        return None
    containers = (pod.get("spec") or {}).get("containers") or []
    resources = [c.get("resources") or {} for c in containers]
    use: dict[str, Any] = {
        "name": (pod.get("metadata") or {}).get("name"),
        "startTime": status["startTime"],
        "cpus": float(sum(parse_quantity((r.get("requests") or {}).get("cpu", "0")) for r in resources)),
        "gpus": int(sum(parse_quantity(v) for r in resources for k, v in (r.get("limits") or {}).items()
                        if k.endswith("/gpu"))),
    }  # fmt: skip
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    if deleting:
        use["deadline"] = deleting
    # A container between two runs is terminated too: the pod has ended only if it will not run again.
    ends = [
        ((s.get("state") or {}).get("terminated") or {}).get("finishedAt")
        for s in status.get("containerStatuses") or []
    ]
    finished = [str(end) for end in ends if end]
    if (deleting or status.get("phase") in ("Succeeded", "Failed")) and len(finished) == len(containers) > 0:
        use["endTime"] = max(finished)
    return use


def _look(entry: dict[str, Any], pods: Sequence[Mapping[str, Any]], now: datetime) -> None:
    """The attempt's pod records after a look at its cluster's pods at `now`."""
    records = {r["name"]: dict(r) for r in entry.get("pods") or []}
    present = set()
    for pod in pods:
        use = pod_use(pod)
        if use is None:
            continue
        present.add(use["name"])
        record = records.setdefault(use["name"], {})
        if record.get("ended"):
            continue
        record.update(use)
        if "endTime" in use:
            record["ended"] = True
        else:  # running as of now; killed at its deletion deadline at the latest
            deadline = parse_time(use.get("deadline"))
            record["endTime"] = rfc3339(min(now, deadline) if deadline is not None else now)
    for name, record in records.items():
        if name not in present and not record.get("ended"):
            # Gone since the last look, its end unseen: after it was last seen running, before this
            # look and its deletion deadline: counted to the middle (off by half that gap at most).
            last_seen = parse_time(record.get("endTime")) or now
            deadline = parse_time(record.get("deadline"))
            latest = max(last_seen, min(deadline, now) if deadline is not None else now)
            record["endTime"] = rfc3339(last_seen + (latest - last_seen) / 2)
            record["ended"] = True
    entry["pods"] = [records[n] for n in sorted(records)]
    entry["podsSeenTime"] = rfc3339(now)


def _held(entry: dict[str, Any], now: datetime) -> None:
    """The attempt's GPU- and CPU-seconds: each pod's time x what it holds; a pod not ended is counted
    until now (until its deletion deadline, if that is sooner)."""
    totals = {field: 0.0 for field, _ in RESOURCES}
    for record in entry.get("pods") or []:
        start, end = parse_time(record.get("startTime")), parse_time(record.get("endTime"))
        if start is None or end is None:
            continue
        if not record.get("ended"):
            deadline = parse_time(record.get("deadline"))
            end = max(end, min(now, deadline) if deadline is not None else now)
        seconds = max(0.0, (end - start).total_seconds())
        for field, count in RESOURCES:
            totals[field] += seconds * float(record.get(count) or 0)
    for field, _ in RESOURCES:
        entry[f"{field}Seconds"] = round(totals[field], 3)


def _settled(entry: Mapping[str, Any]) -> bool:
    """Closed, looked at since it closed, and every pod it had has ended."""
    seen, end = parse_time(entry.get("podsSeenTime")), parse_time(entry.get("endTime"))
    return seen is not None and end is not None and seen >= end and all(r.get("ended") for r in entry["pods"])


def _progress(entry: dict[str, Any], progress: Mapping[str, Any]) -> None:
    """What the workload reported of the attempt: the epoch it reached, the one it resumed from and
    the newest it checkpointed. A report that names another Ray cluster is another attempt's (the
    last one before this attempt's own first report): not this one's."""
    cluster = progress.get("rayCluster")
    if cluster is not None and cluster != entry.get("rayClusterName"):
        return
    for field, key in (("reachedEpoch", "epoch"), ("resumedFromEpoch", "resumedFromEpoch")):
        if progress.get(key) is not None:
            entry[field] = progress[key]
    # (progress is merge-patched: until this attempt checkpoints, it names the last one's checkpoint)
    left = progress.get("checkpointEpoch")
    if isinstance(left, int) and left > (entry.get("resumedFromEpoch") or 0):
        entry["checkpointEpoch"] = left


def _note_workers(entry: dict[str, Any], ready: int | None, now: datetime) -> None:
    """A change of the ready worker count while the attempt runs, on record (as seen: a dip shorter
    than the time between two observations is not)."""
    changes = list(entry.get("workerChanges") or [])
    if ready is None or (changes and changes[-1].get("readyWorkers") == ready):
        return
    changes.append({"time": rfc3339(now), "readyWorkers": ready})
    entry["workerChanges"] = changes[-api.MAX_WORKER_CHANGES :]


def _close(
    entry: dict[str, Any], end: datetime, outcome: str, reason: str, progress: Mapping[str, Any]
) -> None:
    _progress(entry, progress)
    entry.update(endTime=rfc3339(end), outcome=outcome, reason=reason)


def changed_attempts(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(attempts that started, attempts that ended) between two statuses: one Event each. By start
    time: a resumed job runs its attempt again (KubeRay counts no failure)."""
    was = {a.get("startTime"): a for a in before.get("attempts") or []}
    now = after.get("attempts") or []
    started = [a for a in now if a.get("startTime") not in was]
    ended = [a for a in now if "endTime" in a and "endTime" not in was.get(a.get("startTime"), {})]
    return started, ended
