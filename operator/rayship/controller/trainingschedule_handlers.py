"""kopf wiring of TrainingSchedules: one daemon per schedule reconciles it (`reconcile_schedule`: read,
the pure `trainingschedule.plan`, act) and sleeps until its next run is due, at most RESYNC_SECONDS
(so it converges if an event is lost); a change of the schedule or of one of its runs wakes it early.

The daemon, not a timer: a run starts at its time, not up to an interval later, and a schedule costs
nothing between its runs but one reconcile per RESYNC_SECONDS. (kopf keeps a daemon's object with a
finalizer, as it does a ModelService's timers.)"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from rayship import api
from rayship.api import names
from rayship.controller import k8s, trainingschedule
from rayship.controller.conditions import Event, describe_foreign, owned_changes, ownership
from rayship.controller.modelservice_handlers import reconcile_services
from rayship.controller.process import namespaced, of
from rayship.controller.reconcile import CONFLICT_RETRIES, post

log = logging.getLogger("rayship")
# A schedule is reconciled at least this often (seconds), whatever its next time.
RESYNC_SECONDS = 60.0


def reconcile_schedule(namespace: str, name: str, now: datetime) -> datetime | None:
    """One reconcile of a TrainingSchedule; when its next run is due (None: not while it is suspended,
    invalid or gone). A status written over by someone meanwhile (409) is planned again."""
    for _ in range(CONFLICT_RETRIES):
        ts = k8s.get(api.TRAININGSCHEDULES, namespace, name)
        if ts is None or ts["metadata"].get("deletionTimestamp"):
            return None
        selector = f"{names.LABEL_TRAININGSCHEDULE}={name}"
        runs = [
            r for r in k8s.list_objects(api.TRAININGJOBS, namespace, selector) if ownership(r, ts) == "owned"
        ]
        todo = trainingschedule.plan(ts, runs, now)
        owner = kopf.Body(cast(kopf.RawBody, ts))
        for run in todo.delete:
            k8s.delete(api.TRAININGJOBS, namespace, run.name, run.uid)
        events = list(todo.events)
        status = dict(todo.status)
        if todo.create is not None:
            created = k8s.create(api.TRAININGJOBS, todo.create)
            if (how := ownership(created, ts)) != "owned":  # someone else's object holds the run's name
                events = [Event("Warning", "RunNameTaken", describe_foreign(created, "TrainingJob", how))]
                status = {**status, "lastScheduleTime": (ts.get("status") or {}).get("lastScheduleTime")}
        changes = owned_changes(ts.get("status") or {}, status)
        if changes:
            try:
                k8s.patch_status(
                    api.TRAININGSCHEDULES, namespace, name, changes, ts["metadata"]["resourceVersion"]
                )
            except k8s.Conflict:
                continue
        for event in events:
            post(owner, event)
        return todo.wake_at
    raise kopf.TemporaryError(
        f"TrainingSchedule {namespace}/{name} kept changing under its reconcile", delay=1
    )


def _wake(memo: kopf.Memo, namespace: str | None, name: str) -> None:
    if (flag := of(memo).schedule_wakers.get((namespaced(namespace), name))) is not None:
        flag.set()


@kopf.daemon(*api.TRAININGSCHEDULES, id="schedule", cancellation_timeout=0)
async def schedule_daemon(
    *, namespace: str | None, name: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """Reconcile the schedule, then sleep until its next time (at most RESYNC_SECONDS) or a wake-up."""
    process, key = of(memo), (namespaced(namespace), name)
    flag = process.schedule_wakers.setdefault(key, asyncio.Event())
    loop = asyncio.get_running_loop()
    try:
        while not stopped:
            flag.clear()
            call = functools.partial(
                contextvars.copy_context().run, reconcile_schedule, *key, datetime.now(UTC)
            )
            delay = RESYNC_SECONDS
            try:
                wake_at = await loop.run_in_executor(process.executor, call)
                if wake_at is not None:
                    delay = min(delay, max(0.0, (wake_at - datetime.now(UTC)).total_seconds()) + 0.5)
            except (kopf.TemporaryError, k8s.Busy) as err:
                log.info("TrainingSchedule %s/%s: %s; again in a second", *key, err)
                delay = 1.0
            except Exception:
                log.exception(
                    "reconcile of TrainingSchedule %s/%s failed; again in %s s", *key, RESYNC_SECONDS
                )
            try:
                await asyncio.wait_for(flag.wait(), timeout=delay)
            except TimeoutError:
                pass
    finally:
        process.schedule_wakers.pop(key, None)


@kopf.on.event(*api.TRAININGSCHEDULES)  # type: ignore[arg-type]  # kopf's WatchingFn does not model index kwargs
async def schedule_changed(
    *,
    type: str | None,
    namespace: str | None,
    name: str,
    meta: kopf.Meta,
    status: kopf.Status,
    services_by_trainingschedule: kopf.Index[tuple[str | None, str], str],
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """A spec edit (a new schedule, suspend, the gate) is planned at once, not at the next time due
    (the operator's own status writes change no generation: they wake nothing). The ModelServices
    following the schedule re-resolve its promoted run (a new one rolls out)."""
    if type != "DELETED" and status.get("observedGeneration") != meta.get("generation"):
        _wake(memo, namespace, name)
    services = list(services_by_trainingschedule.get((namespace, name), []))
    if services and (type == "DELETED" or status.get("promoted")):
        await reconcile_services(namespace=namespaced(namespace), services=services, memo=memo)


@kopf.on.event(*api.TRAININGJOBS, labels={names.LABEL_TRAININGSCHEDULE: kopf.PRESENT})
async def run_changed(*, namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    """A run's change (it succeeded, failed, went): its schedule's status, gate and history follow."""
    _wake(memo, namespace, labels[names.LABEL_TRAININGSCHEDULE])
