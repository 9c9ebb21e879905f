"""kopf wiring of TrainingJobs: their events and their RayJobs' only queue the job (the process's work
queue, `queue_for`), the queue's tasks reconcile it from what kopf's watches hold, and one resync
thread converges every job even if an event was lost."""

from __future__ import annotations

import contextvars
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import kopf

from rayship import api
from rayship.api import names
from rayship.controller import k8s, trainingjob
from rayship.controller.kopf_storage import kept, one_of
from rayship.controller.modelservice_handlers import reconcile_services
from rayship.controller.process import Index, Key, OperatorProcess, namespaced, of
from rayship.controller.reconcile import Controller, Seen
from rayship.controller.workqueue import WorkQueue

log = logging.getLogger("rayship")
# A starting job is looked at again (`recheck_in`) at most this often a second, over all jobs: the
# operator watches no pods, so each look is a LIST of the job's pods.
STARTING_LOOKS_PER_SECOND = 20
# An ended attempt's pods, once KubeRay deletes its cluster, go within ~2 s (their Ray exits on SIGTERM):
# one gone between two looks is counted to the middle of the gap, so the looks that see them go are
# this close (at starting_seconds' 15 s, the job's CPU-seconds ran 5% over the pods' own times).
GOING_LOOK_SECONDS = 2.0

TRAINING = Controller(
    kind=api.TRAINING_JOB.kind,
    resource=api.TRAININGJOBS,
    child=api.RAYJOBS,
    child_name=names.rayjob_name,
    related=trainingjob.claim_to_check,
    plan=trainingjob.plan,
    pods=trainingjob.ray_pods,
    status=trainingjob.status,
    announce=trainingjob.announce,
)


# What kopf's watches last showed, kept in memory by kopf (trimmed and packed: see `kept`): the
# first pass of a reconcile reads these instead of GETting the objects again.
@kopf.index(*api.TRAININGJOBS)
async def trainingjobs_seen(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], bytes]:
    return {(namespace, name): kept(body)}


# The claims that exist, by name only: a job names its checkpoint claim, and is not launched while it
# does not exist (`trainingjob.claim_to_check`); read here, that look costs no API call.
@kopf.index(*api.PVCS)
async def claims_seen(*, namespace: str | None, name: str, **_: Any) -> dict[tuple[str | None, str], bool]:
    return {(namespace, name): True}


@kopf.index(*api.RAYJOBS, labels={names.LABEL_TRAININGJOB: kopf.PRESENT})
async def rayjobs_seen(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], bytes]:
    return {(namespace, name): kept(body, drop_spec=("rayClusterSpec",))}


def queue_for(process: OperatorProcess) -> WorkQueue[Key]:
    """The process's TrainingJob work queue: every TrainingJob event only queues its job, and the
    events are let go at once (see `rayship.controller.workqueue`)."""
    return WorkQueue(functools.partial(_reconcile_queued, process), functools.partial(_submit, process))


def _reconcile_queued(process: OperatorProcess, key: Key, fresh_child: bool) -> None:
    """A TrainingJob's turn in the queue: reconciled from kopf's indexes as they stand now (a RayJob
    there is read afresh if `fresh_child`; one absent is confirmed by `reconcile`). A temporary
    failure is queued again after its delay, any other after kopf's default backoff (60 s); the
    resync passes by in any case."""
    namespace, name = key
    assert process.queue is not None, "the queue runs this"
    try:
        seen = _watched_now(process, namespace, name)
        if seen is not None and seen.child is not None and fresh_child:
            seen = replace(seen, child=k8s.get(api.RAYJOBS, namespace, names.rayjob_name(name)))
        reconcile_trainingjob(process, namespace, name, seen)
        if (after := _watched_now(process, namespace, name)) is not None:
            after = process.reconciler.with_own_write(TRAINING.kind, namespace, name, after)
        if (delay := recheck_in(process, after)) is not None:
            process.queue.add_after(key, delay)
    except kopf.TemporaryError as err:
        log.info("TrainingJob %s/%s: %s; again in %s s", namespace, name, err, err.delay)
        process.queue.add_after(key, err.delay or 1, fresh_child)
    except kopf.PermanentError as err:
        log.error("TrainingJob %s/%s: %s", namespace, name, err)
    except Exception:
        log.exception("reconcile of TrainingJob %s/%s failed; again in 60 s", namespace, name)
        process.queue.add_after(key, 60, fresh_child)


def recheck_in(process: OperatorProcess, seen: Seen | None) -> float | None:
    """When to look at a job again whose Ray pods are starting, or whose ended attempt's pods are
    still going (their time counts until they are gone) (None: neither, as far as the watch and our
    own write show). The operator watches RayJobs, not pods, and KubeRay updates a RayJob only when its
    cluster's state changes: a worker that cannot pull its image, or is OOMKilled over and over, changes
    none. Without another look, the status said so only at the resync (two minutes), after about five
    restarts. Spread out by STARTING_LOOKS_PER_SECOND; pods going away looked at every
    GOING_LOOK_SECONDS."""
    now = datetime.now(UTC)
    if seen is None or (wait := trainingjob.look_again_in(seen.obj, seen.child, now)) is None:
        return None
    going = trainingjob.pods_going(seen.obj, seen.child, now)
    floor = GOING_LOOK_SECONDS if going else process.config.starting_seconds
    return max(wait, floor, len(process.trainingjobs) / STARTING_LOOKS_PER_SECOND)


def _keep_kopf_views(
    process: OperatorProcess, trainingjobs_seen: Index, rayjobs_seen: Index, claims_seen: Index
) -> None:
    """What a TrainingJob or RayJob handler hands the queue's tasks and the resync: kopf's live
    indexes (`watched`) and, from the first handler, kopf's context (`kopf_context`)."""
    if process.kopf_context is None:
        process.kopf_context = contextvars.copy_context()
    process.watched.update(trainingjobs=trainingjobs_seen, rayjobs=rayjobs_seen, claims=claims_seen)
    process.reconciler.listed.update(trainingjobs=trainingjobs_seen)  # a ModelService's missing job


def _submit(process: OperatorProcess, task: Callable[[], None]) -> None:
    assert process.executor is not None and process.kopf_context is not None, "a handler queues the first job"
    process.executor.submit(process.kopf_context.copy().run, task)


def resync_trainingjobs(process: OperatorProcess) -> None:
    """Converge even if an event, or the reconcile it triggered, was lost (event handlers are never
    retried): every TrainingJob is reconciled at least about every `resync_seconds` (those an event
    reconciled within the interval are skipped), spread over that interval.
    One thread, not a kopf timer per object: kopf puts a finalizer on every object with a timer (a
    PATCH at creation and one at deletion, and no deletion at all while the operator is down).

    Each object is queued as an event queues it, so its reconcile works from what the watches hold
    (kopf re-lists after a broken watch, so they hold every change the API server made): a missing
    RayJob is confirmed with a GET before the plan acts on its absence, and a status write at a stale
    resourceVersion (409) reads both afresh. So a resync that finds nothing to do makes no API call;
    one GET per object per interval would be most of the operator's calls at scale. (Queued, it also
    runs where kopf's Events can be posted: see `OperatorProcess.kopf_context`.)"""
    interval, stop = process.config.resync_seconds, process.stop_resync
    assert process.queue is not None, "start-up makes the queue before the resync"
    while not stop.is_set():
        known = sorted(process.trainingjobs)
        if not known:
            stop.wait(interval)
        for namespace, name in known:
            if stop.wait(interval / len(known)):
                return
            if (namespace, name) not in process.trainingjobs:
                continue  # deleted meanwhile
            if time.monotonic() - process.reconciled.get((namespace, name), -math.inf) < interval:
                continue  # an event reconciled it within the interval (and none races it now)
            process.queue.add((namespace, name))


def reconcile_trainingjob(process: OperatorProcess, namespace: str, name: str, seen: Seen | None) -> None:
    """`reconcile` of a TrainingJob, its success noted for the resync."""
    process.reconciler.reconcile(TRAINING, namespace, name, seen)
    process.reconciled[(namespace, name)] = time.monotonic()


def _watched_now(process: OperatorProcess, namespace: str, name: str) -> Seen | None:
    """A TrainingJob and its RayJob as kopf's watches hold them (None: not watched yet: read them)."""
    watched = process.watched
    if not watched or (obj := one_of(watched["trainingjobs"], (namespace, name))) is None:
        return None
    claims = [
        {"kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": namespace}}
        for _, claim in trainingjob.claim_to_check(obj)
        if (namespace, claim) in watched["claims"]
    ]
    return Seen(obj, one_of(watched["rayjobs"], (namespace, names.rayjob_name(name))), claims)


@kopf.on.event(*api.RAYJOBS, labels={names.LABEL_TRAININGJOB: kopf.PRESENT})  # type: ignore[arg-type]  # kopf's WatchingFn does not model index kwargs
async def rayjob_changed(
    *,
    namespace: str | None,
    labels: Mapping[str, str],
    trainingjobs_seen: Index,
    rayjobs_seen: Index,
    claims_seen: Index,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Its TrainingJob is queued: kopf updated the RayJob index before this handler (gone from it
    when DELETED), so the reconcile sees this RayJob or a later one."""
    process = of(memo)
    _keep_kopf_views(process, trainingjobs_seen, rayjobs_seen, claims_seen)
    assert process.queue is not None
    process.queue.add((namespaced(namespace), labels[names.LABEL_TRAININGJOB]))


@kopf.on.event(*api.TRAININGJOBS)  # type: ignore[arg-type]  # kopf's WatchingFn does not model index kwargs
async def trainingjob_event(
    *,
    type: str | None,
    namespace: str | None,
    name: str,
    uid: str | None,
    meta: kopf.Meta,
    status: kopf.Status,
    services_by_trainingjob: kopf.Index[tuple[str | None, str], str],
    trainingjobs_seen: Index,
    rayjobs_seen: Index,
    claims_seen: Index,
    memo: kopf.Memo,
    namespaces_terminating: kopf.Index[str, bool] | None = None,  # cluster-wide only (handlers.run)
    **_: Any,
) -> None:
    """Every event of a TrainingJob (kopf's listing at start-up included): the job is queued while its
    status does not reflect its spec, and the ModelServices that serve it re-resolve their model. The
    bookkeeping runs in the event loop; only reconciles go to the thread pool (most TrainingJobs are
    served by none).

    The API server bumps metadata.generation at every spec change of an object with a status
    subresource, never at a status write, and every status the operator writes says the generation it
    reflects (`observedGeneration`). So a new job or a spec change queues the job, with its RayJob to
    be read afresh (the RayJob watch is not ordered with this TrainingJob's: an indexed RayJob may be
    older than the status this TrainingJob already shows); the event of a status write, the
    operator's own or the workload's progress, queues nothing. A job whose status is up to date is
    queued by its RayJob's events (at start-up too) and by the resync. This replaces kopf's create,
    update and resume handlers, and their change detection at every event."""
    process = of(memo)
    _keep_kopf_views(process, trainingjobs_seen, rayjobs_seen, claims_seen)
    if namespaces_terminating is not None:
        process.reconciler.terminating.update(namespaces=namespaces_terminating)
    ns = namespaced(namespace)
    assert process.queue is not None
    if type == "DELETED":
        process.trainingjobs.discard((ns, name))
        process.reconciled.pop((ns, name), None)
        process.reconciler.written.pop((TRAINING.kind, ns, name), None)
        if uid:
            process.forget(uid)
    else:
        process.trainingjobs.add((ns, name))
        if status.get("observedGeneration") != meta.get("generation"):
            process.queue.add((ns, name), fresh=True)
    services = list(services_by_trainingjob.get((namespace, name), []))
    if services:
        await reconcile_services(namespace=ns, services=services, memo=memo)
