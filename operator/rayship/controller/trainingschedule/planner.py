"""A TrainingSchedule's reconcile, pure: from the schedule and its runs (TrainingJobs) as stored, and
the time, what to create and delete, the status and the Events. CronJob's controller (`syncCronJob`)
is the model, step for step:

[1] the runs: active ones, the last success, the latest succeeded run;
[2] the gate: the latest succeeded run, once, promoted or not (ours: CronJob has none);
[3] history: finished runs beyond the limits are deleted, oldest first (never the promoted one:
    ModelServices following the schedule serve it);
[4] the schedule: unless suspended, the most recent time due since the last run (or the schedule's
    creation), within startingDeadlineSeconds if set, gets one run, as concurrencyPolicy allows.
    Forbid leaves lastScheduleTime as it is, so that time still runs when the active run ends (if
    still within the deadline), as CronJob's does.

A run is made at most once per due time: its name is the time's (`names.schedule_run_name`), and one
that exists is recorded, not made again (a status write lost after the create).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from rayship import api
from rayship.api import names, validation
from rayship.controller.conditions import Event, condition, find, parse_time, rfc3339
from rayship.controller.trainingschedule import cron
from rayship.controller.trainingschedule.gate import judge

CONDITION = "Scheduling"
# A run in these phases is over for its schedule: an Invalid run does not fix itself, and Forbid must
# not wait on it forever.
FINISHED = frozenset({"Succeeded", "Failed", "Invalid"})
_EPOCH = datetime.fromtimestamp(0, cron.zone(None))


@dataclass(frozen=True)
class Run:
    """A run as the planner needs it, from its TrainingJob."""

    name: str
    uid: str
    scheduled: datetime | None
    phase: str
    finished: datetime | None
    deleting: bool
    status: Mapping[str, Any]
    spec: Mapping[str, Any]

    @property
    def active(self) -> bool:
        return not self.deleting and self.phase not in FINISHED


def runs_of(trainingjobs: Sequence[Mapping[str, Any]]) -> list[Run]:
    """The runs, oldest scheduled first."""
    runs = []
    for tj in trainingjobs:
        meta, status = tj.get("metadata") or {}, tj.get("status") or {}
        runs.append(
            Run(
                name=meta["name"],
                uid=meta.get("uid", ""),
                scheduled=parse_time((meta.get("annotations") or {}).get(names.ANNOTATION_SCHEDULED_TIME)),
                phase=status.get("phase") or "Pending",
                finished=parse_time(status.get("completionTime")),
                deleting=bool(meta.get("deletionTimestamp")),
                status=status,
                spec=tj.get("spec") or {},
            )
        )
    return sorted(runs, key=lambda r: (r.scheduled or _EPOCH, r.name))


@dataclass(frozen=True)
class SchedulePlan:
    create: dict[str, Any] | None = None  # the run's TrainingJob
    delete: tuple[Run, ...] = ()
    status: dict[str, Any] = field(default_factory=dict)  # the operator's fields, whole
    events: tuple[Event, ...] = ()
    wake_at: datetime | None = None  # when the next run is due


def plan(ts: Mapping[str, Any], trainingjobs: Sequence[Mapping[str, Any]], now: datetime) -> SchedulePlan:
    meta, current = ts["metadata"], ts.get("status") or {}
    generation = int(meta.get("generation") or 0)
    runs = runs_of(trainingjobs)
    try:
        obj = validation.parse(ts, admitted=True)
    except validation.SpecError as err:
        message = "; ".join(err.problems)
        return _stopped(current, runs, generation, now, "InvalidSpec", message, warn=True)
    assert isinstance(obj, api.TrainingSchedule), "the informer watches TrainingSchedules only"
    spec = obj.spec
    events: list[Event] = []
    # [1] the runs
    succeeded = [r for r in runs if r.phase == "Succeeded"]
    status: dict[str, Any] = {
        "active": [r.name for r in runs if r.active],
        "lastScheduleTime": current.get("lastScheduleTime"),
        "lastSuccessfulTime": _latest_time([r.finished for r in succeeded])
        or current.get("lastSuccessfulTime"),
        "latestSucceeded": current.get("latestSucceeded"),
        "promoted": current.get("promoted"),
        "lastGate": current.get("lastGate"),
        "observedGeneration": generation,
    }
    # [2] the gate
    # Each succeeded run is judged once, the newest only: a run newer than the last one judged (not
    # merely another: the history limit may delete the judged run, leaving an older one the newest).
    judged = parse_time((current.get("lastGate") or {}).get("scheduledTime"))
    if succeeded and (judged is None or (succeeded[-1].scheduled or _EPOCH) > judged):
        events.append(_judge(spec, succeeded[-1], status, now))
    # [3] history
    doomed = _beyond_history(spec, runs, (status.get("promoted") or {}).get("job"))
    events += [
        Event("Normal", "RunDeleted", f"deleted {r.name} ({r.phase}): beyond the history limit")
        for r in doomed
    ]
    # [4] the schedule
    if spec.suspend:
        return _stopped(current, runs, generation, now, "Suspended", "no new runs while spec.suspend is true",
                        status=status, events=events, delete=doomed)  # fmt: skip
    return _schedule(obj, ts, runs, current, status, now, events, doomed)


def _schedule(
    obj: api.TrainingSchedule,
    ts: Mapping[str, Any],
    runs: list[Run],
    current: Mapping[str, Any],
    status: dict[str, Any],
    now: datetime,
    events: list[Event],
    doomed: tuple[Run, ...],
) -> SchedulePlan:
    spec, meta = obj.spec, ts["metadata"]
    zone = spec.time_zone
    last = parse_time(status.get("lastScheduleTime")) or parse_time(meta.get("creationTimestamp")) or now
    deadline = spec.starting_deadline_seconds
    earliest = max(last, now - timedelta(seconds=deadline)) if deadline is not None else last
    found = cron.due(spec.schedule, zone, earliest, now)
    missed = cron.due(spec.schedule, zone, last, earliest).time if deadline is not None else None
    create, delete = None, doomed
    reason, message = "Scheduled", "waiting for the next time due"
    if missed is not None and found.time is None:
        reason, message = (
            "MissedSchedule",
            (
                f"the run due at {rfc3339(missed)} was not started within startingDeadlineSeconds ({deadline} s)"
            ),
        )
    if found.time is not None:
        run_name = names.schedule_run_name(meta["name"], found.time)
        active = [r for r in runs if r.active]
        if any(r.name == run_name for r in runs):
            status["lastScheduleTime"] = rfc3339(found.time)  # made before; its status write was lost
        elif waits := _waits(spec, active, found.time):
            reason, message = waits
        else:
            if spec.concurrency_policy == "Replace" and active:
                delete = (*delete, *active)
                replaced = ", ".join(r.name for r in active)
                events.append(
                    Event("Normal", "RunsReplaced", f"deleted {replaced} (concurrencyPolicy Replace)")
                )
            create = build_run(obj, ts, found.time)
            status["lastScheduleTime"] = rfc3339(found.time)
            status["active"] = [*(r.name for r in active if r not in delete), run_name]
            events.append(_created(run_name, found))
    wake = cron.next_after(spec.schedule, zone, max(now, found.time or now))
    status["nextScheduleTime"] = rfc3339(wake) if wake else None
    if wake is None:
        reason, message = "NeverDue", f"schedule {spec.schedule!r} has no time due in the next five years"
    conditions = [condition(current, CONDITION, reason in ("Scheduled", "Forbidden", "TooManyActive", "MissedSchedule"),
                            reason, message, status["observedGeneration"], now)]  # fmt: skip
    if reason != "Scheduled" and _changed(current, conditions[0]):
        events.append(Event("Warning" if reason == "NeverDue" else "Normal", reason, message))
    status["conditions"] = conditions
    return SchedulePlan(create, delete, _clean(status), tuple(events), wake)


def _waits(spec: api.TrainingScheduleSpec, active: list[Run], due: datetime) -> tuple[str, str] | None:
    """Why the run due at `due` waits for an active one to end (reason, message), or None: Forbid, or
    Allow with maxActive runs active (`* * * * *` would otherwise start a Ray cluster a minute while
    the earlier runs wait for GPUs)."""
    running = ", ".join(r.name for r in active)
    if spec.concurrency_policy == "Forbid" and active:
        return (
            "Forbidden",
            f"the run due at {rfc3339(due)} waits: {running} still active (concurrencyPolicy Forbid)",
        )
    if spec.concurrency_policy == "Allow" and len(active) >= spec.max_active:
        return "TooManyActive", (
            f"the run due at {rfc3339(due)} waits: {len(active)} runs active, maxActive is {spec.max_active} "
            f"({running})"
        )
    return None


def _created(run_name: str, found: cron.Due) -> Event:
    message = f"created TrainingJob {run_name} for {rfc3339(found.time)}" if found.time else run_name
    if found.count > cron.TOO_MANY_MISSED:
        return Event("Warning", "TooManyMissedTimes", f"{message}; more than {cron.TOO_MANY_MISSED} times "
                     "were missed before it (only the latest runs)")  # fmt: skip
    if found.count > 1:
        message += f"; {found.count - 1} earlier time(s) missed (only the latest runs)"
    return Event("Normal", "RunCreated", message)


def _judge(spec: api.TrainingScheduleSpec, run: Run, status: dict[str, Any], now: datetime) -> Event:
    """The gate's verdict on the latest succeeded run, into `status` (promoted, lastGate)."""
    metrics = (run.status.get("progress") or {}).get("metrics") or {}
    verdict = judge(spec.promote, run.name, metrics, status.get("promoted"))
    scheduled = rfc3339(run.scheduled) if run.scheduled else None
    status["latestSucceeded"] = run.name
    status["lastGate"] = {
        "job": run.name,
        "scheduledTime": scheduled,
        "passed": verdict.passed,
        "message": verdict.message,
    }
    if not verdict.passed:
        return Event("Normal", "NotPromoted", verdict.message)
    checkpoint = run.status.get("checkpoint") or {}
    pvc = ((run.spec.get("checkpoint") or {}).get("storage") or {}).get("pvc")
    status["promoted"] = {
        "job": run.name,
        "scheduledTime": scheduled,
        "value": verdict.value,
        "time": rfc3339(now),
        "model": checkpoint.get("model"),
        "bestModel": checkpoint.get("bestModel"),
        "volume": pvc,
    }
    return Event("Normal", "Promoted", f"promoted {verdict.message.removeprefix(run.name + ': ')}"
                 if spec.promote else f"promoted {run.name}")  # fmt: skip


def _beyond_history(spec: api.TrainingScheduleSpec, runs: list[Run], promoted: str | None) -> tuple[Run, ...]:
    """Finished runs beyond successfulJobsHistoryLimit / failedJobsHistoryLimit, oldest first."""
    doomed: list[Run] = []
    for phases, limit in (
        ({"Succeeded"}, spec.successful_jobs_history_limit),
        ({"Failed", "Invalid"}, spec.failed_jobs_history_limit),
    ):
        finished = [r for r in runs if r.phase in phases and not r.deleting and r.name != promoted]
        doomed += finished[: max(0, len(finished) - limit)]
    return tuple(doomed)


def _stopped(
    current: Mapping[str, Any],
    runs: list[Run],
    generation: int,
    now: datetime,
    reason: str,
    message: str,
    *,
    warn: bool = False,
    status: dict[str, Any] | None = None,
    events: list[Event] | None = None,
    delete: tuple[Run, ...] = (),
) -> SchedulePlan:
    """No run is made (suspended, or a spec the operator cannot read): the status says why."""
    status = dict(status) if status is not None else {
        **{k: current.get(k) for k in ("lastScheduleTime", "lastSuccessfulTime", "latestSucceeded", "promoted", "lastGate")},
        "active": [r.name for r in runs if r.active],
        "observedGeneration": generation,
    }  # fmt: skip
    cond = condition(current, CONDITION, False, reason, message, generation, now)
    status.update(conditions=[cond], nextScheduleTime=None)
    events = list(events or [])
    if _changed(current, cond):
        events.append(Event("Warning" if warn else "Normal", reason, message))
    return SchedulePlan(None, delete, _clean(status), tuple(events), None)


def _changed(current: Mapping[str, Any], cond: Mapping[str, Any]) -> bool:
    before = find(current, CONDITION)
    return (before.get("reason"), before.get("message")) != (cond["reason"], cond["message"])


def _latest_time(times: Sequence[datetime | None]) -> str | None:
    known = [t for t in times if t is not None]
    return rfc3339(max(known)) if known else None


def _clean(status: dict[str, Any]) -> dict[str, Any]:
    """Unset fields as None: a merge patch removes what the status no longer says."""
    fields = api.TrainingScheduleStatus.model_fields
    return {key: status.get(key) for key in (f.alias or name for name, f in fields.items())}


def build_run(obj: api.TrainingSchedule, ts: Mapping[str, Any], due: datetime) -> dict[str, Any]:
    """The TrainingJob of the run due at `due`: the template, its data's placeholders replaced,
    labelled and annotated with its schedule and time, owned by the schedule."""
    template, meta = obj.spec.job_template, ts["metadata"]
    local = due.astimezone(cron.zone(obj.spec.time_zone))
    values = {
        "{{ .ScheduledTime }}": rfc3339(due),
        "{{ .ScheduledDate }}": local.strftime("%Y-%m-%d"),
    }
    spec = template.spec.wire()
    if "data" in spec:
        spec["data"] = api.fill_placeholders(spec["data"], values)
    extra = template.metadata or api.JobTemplateMeta()
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.TRAINING_JOB.kind,
        "metadata": {
            "name": names.schedule_run_name(meta["name"], due),
            "namespace": meta.get("namespace") or "default",
            "labels": {**extra.labels, names.LABEL_TRAININGSCHEDULE: meta["name"]},
            "annotations": {**extra.annotations, names.ANNOTATION_SCHEDULED_TIME: rfc3339(due)},
            "ownerReferences": [
                {
                    "apiVersion": api.API_VERSION,
                    "kind": api.TRAINING_SCHEDULE.kind,
                    "name": meta["name"],
                    "uid": meta.get("uid", ""),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }
