"""kopf wiring: each kind's `Controller` entry and handlers (TrainingJobs through their work queue and
the resync thread, ModelServices through kopf's handlers and timers), start-up settings, the liveness
probe and the signals. The loop they call is `rayship.controller.reconcile`; the kinds' pure
plan/status/announce live in `rayship.controller.trainingjob` and `rayship.controller.modelservice`.

Run with `rayship operator` or `kopf run --standalone -m rayship.controller.handlers`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any

import kopf
from pydantic import SecretStr

from rayship import api, metrics
from rayship.api import names
from rayship.config import OperatorConfig, from_environment
from rayship.controller import k8s, modelservice, trainingjob
from rayship.controller.kopf_storage import DIFFBASE, PROGRESS, forget_object, kept, one_of
from rayship.controller.reconcile import Controller, Seen, reconcile, running, terminating, written
from rayship.controller.workqueue import WorkQueue

# Timers are declared at import: the resync interval comes from the same RAYSHIP_* environment.
RESYNC_SECONDS = from_environment().resync_seconds

log = logging.getLogger("rayship")


def _modelservice_related(ms: Mapping[str, Any]) -> list[tuple[api.Resource, str]]:
    return [(api.TRAININGJOBS, name) for name in modelservice.referenced_trainingjobs(ms)]


TRAINING = Controller(
    kind=api.TRAINING_JOB.kind,
    resource=api.TRAININGJOBS,
    child=api.RAYJOBS,
    child_name=names.rayjob_name,
    related=lambda _: [],
    plan=trainingjob.plan,
    pods=trainingjob.starting_pods,
    status=trainingjob.status,
    announce=trainingjob.announce,
)
SERVING = Controller(
    kind=api.MODEL_SERVICE.kind,
    resource=api.MODELSERVICES,
    child=api.RAYSERVICES,
    child_name=names.rayservice_name,
    related=_modelservice_related,
    plan=modelservice.plan,
    pods=modelservice.starting_pods,
    status=modelservice.status,
    announce=modelservice.announce,
    probe=modelservice.serve_probe,
    heard=modelservice.heard,
)
# While a model rolls out, Serve is asked this often whether it runs the new model (KubeRay's status
# may not change when the rollout ends, so no event would tell).
ROLLOUT_CHECK_SECONDS = 3.0
# kopf's thread pool, which the startup handler hands to `in_thread` and the work queue, and the
# configuration it reads.
_executor: Executor | None = None
_config: OperatorConfig | None = None


def in_thread(handler: Callable[..., None]) -> Callable[..., Awaitable[None]]:
    """A blocking handler (its reconcile makes API calls) made one kopf awaits while it runs in
    kopf's thread pool, as kopf runs a sync handler, but dropped if cancelled before a thread took it.

    kopf runs a sync handler in its pool and shields it: cancelled (the operator stops), the handler
    still waits for its thread. So on SIGTERM under a backlog (a burst of jobs, or KubeRay's status
    updates for each of them), every queued reconcile still ran, a few API calls each, and the
    operator outlived the pod's grace period, to end in SIGKILL. Dropped instead, a stop waits only
    for the reconciles already running, one per thread; a restarted operator lists every object and
    reconciles each again (the events of its watches' first listing), so nothing dropped is lost.
    Not `functools.wraps`: kopf would see the sync function under `__wrapped__` and call it sync."""

    async def run(**kwargs: Any) -> None:
        call = functools.partial(contextvars.copy_context().run, handler, **kwargs)  # kopf.event needs it
        await asyncio.get_running_loop().run_in_executor(_executor, call)

    run.__name__, run.__qualname__, run.__doc__ = handler.__name__, handler.__qualname__, handler.__doc__
    return run


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf's bookkeeping stays in memory: no writes to the objects for it (see MemoryProgress).
    settings.persistence.progress_storage = PROGRESS
    settings.persistence.diffbase_storage = DIFFBASE
    settings.posting.level = logging.WARNING  # our own Events say what happened; no handler chatter
    settings.watching.server_timeout = 270
    # No CRD or namespace scanning: the resources are known (the chart installs our CRDs, KubeRay its),
    # so the operator needs no cluster-wide read access to CustomResourceDefinitions.
    settings.scanning.disabled = True
    # On SIGTERM, no waiting for kopf's per-object queues to drain: each queued event would start a
    # reconcile (see `in_thread`), and a restarted operator reconciles every object anyway.
    settings.queueing.exit_timeout = 0
    # kopf's worker of an object keeps its last event (the whole decoded object) until no new event
    # has come for this long (5 s by default): after a burst, hundreds of objects' events held at
    # once. Shorter, the operator's peak memory in a burst is lower (bench/operator_memory.py).
    settings.queueing.idle_timeout = 0.5
    config = from_environment()
    settings.execution.max_workers = config.workers
    global _executor
    _executor = settings.execution.executor
    k8s.configure(connections=config.workers + 2)  # + two spare
    if config.ray_token_key is None:
        config = config.model_copy(update={"ray_token_key": SecretStr(k8s.token_key(config.namespace))})
    memo.config = config
    global _config
    _config = config
    logging.getLogger("rayship").setLevel(memo.config.log_level.upper())
    metrics.serve(memo.config.metrics_port)
    _stop_resync.clear()
    threading.Thread(target=resync_trainingjobs, args=(config,), name="rayship-resync", daemon=True).start()


@kopf.on.probe(id="reconciles")
def reconciles_not_wedged(memo: kopf.Memo, **_: Any) -> int:
    """Liveness: fails (kopf answers 500) while one reconcile has run longer than `wedged_seconds`."""
    now = time.monotonic()
    for what, started in list(running.values()):
        if now - started > memo.config.wedged_seconds:
            raise RuntimeError(f"reconcile of {what} has been running for {now - started:.0f} s")
    return len(running)


# --- TrainingJob ---------------------------------------------------------------------------------


# What kopf's watches last showed, kept in memory by kopf (trimmed and packed: see `kept`): the
# first pass of a reconcile reads these instead of GETting the objects again.
@kopf.index(*api.TRAININGJOBS)
async def trainingjobs_seen(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], bytes]:
    return {(namespace, name): kept(body)}


@kopf.index(*api.RAYJOBS, labels={names.LABEL_TRAININGJOB: kopf.PRESENT})
async def rayjobs_seen(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], bytes]:
    return {(namespace, name): kept(body, drop_spec=("rayClusterSpec",))}


def _reconcile_queued(key: tuple[str, str], fresh_child: bool) -> None:
    """A TrainingJob's turn in `TRAINING_QUEUE`: reconciled from kopf's indexes as they stand now
    (a RayJob there is read afresh if `fresh_child`; one absent is confirmed by `reconcile`). A
    temporary failure is queued again after its delay, any other after kopf's default backoff
    (60 s); the resync passes by in any case."""
    namespace, name = key
    try:
        seen = _watched_now(namespace, name)
        if seen is not None and seen.child is not None and fresh_child:
            seen = replace(seen, child=k8s.get(api.RAYJOBS, namespace, names.rayjob_name(name)))
        assert _config is not None, "configure() runs before any event"
        reconcile_trainingjob(namespace, name, _config, seen)
    except kopf.TemporaryError as err:
        log.info("TrainingJob %s/%s: %s; again in %s s", namespace, name, err, err.delay)
        TRAINING_QUEUE.add_after(key, err.delay or 1, fresh_child)
    except kopf.PermanentError as err:
        log.error("TrainingJob %s/%s: %s", namespace, name, err)
    except Exception:
        log.exception("reconcile of TrainingJob %s/%s failed; again in 60 s", namespace, name)
        TRAINING_QUEUE.add_after(key, 60, fresh_child)


# kopf posts Events (`kopf.event`) through a queue its handlers find in context variables: the work
# queue's tasks run in a copy of the context of the first handler that queued a job. (Not each
# handler's own: that holds its event, the whole object, for as long as the job waits.)
_kopf_context: contextvars.Context | None = None


def _keep_kopf_views(
    trainingjobs_seen: kopf.Index[tuple[str | None, str], bytes],
    rayjobs_seen: kopf.Index[tuple[str | None, str], bytes],
) -> None:
    """What a TrainingJob or RayJob handler hands the queue's tasks and the resync: kopf's live
    indexes (`_watched`) and, from the first handler, kopf's context (`_kopf_context`)."""
    global _kopf_context
    if _kopf_context is None:
        _kopf_context = contextvars.copy_context()
    _watched.update(trainingjobs=trainingjobs_seen, rayjobs=rayjobs_seen)


def _submit(task: Callable[[], None]) -> None:
    assert _executor is not None and _kopf_context is not None, "a handler queues the first job"
    _executor.submit(_kopf_context.copy().run, task)


# Every TrainingJob event only queues its job: the events are let go at once (see `rayship.controller.workqueue`).
TRAINING_QUEUE: WorkQueue[tuple[str, str]] = WorkQueue(_reconcile_queued, _submit)
metrics.QUEUE_DEPTH.labels(TRAINING.kind).set_function(lambda: len(TRAINING_QUEUE))


# Namespaces being deleted, kept by kopf from a watch of namespaces: a reconcile there writes nothing.
# Deleting a namespace deletes its objects, children first as often as not; meanwhile the status of a
# job would say it is suspending or lost, and the API server refuses its Events (kopf retries each).
@kopf.index("v1", "namespaces")
async def namespaces_terminating(*, name: str, status: Mapping[str, Any], **_: Any) -> dict[str, bool] | None:
    return {name: True} if status.get("phase") == "Terminating" else None


# Every TrainingJob seen and not seen deleted: (namespace, name). The resync thread reconciles each,
# from what kopf's watches hold (`_watched`: its indexes, set by the first TrainingJob event).
_trainingjobs: set[tuple[str, str]] = set()
_watched: dict[str, kopf.Index[tuple[str | None, str], bytes]] = {}
# When each TrainingJob's last reconcile succeeded, (namespace, name) -> monotonic seconds: the
# resync reconciles only those no event reconciled within the interval.
_reconciled: dict[tuple[str, str], float] = {}
_stop_resync = threading.Event()
# kopf never retries an event handler: `retried` does, this many times, before the resync takes over.
EVENT_ATTEMPTS = 3


def retried(what: str, reconcile_once: Callable[[], None]) -> None:
    """Run a reconcile an event triggered; a temporary failure (the API server busy, or its discovery
    still blind to a CRD installed moments ago: up to half a minute after `helm install`) is retried
    after its delay, up to EVENT_ATTEMPTS in all. Otherwise it would wait for the resync (minutes):
    kopf retries the handlers of changes, never those of events. The operator stopping ends it."""
    for attempt in range(1, EVENT_ATTEMPTS + 1):
        try:
            reconcile_once()
            return
        except kopf.TemporaryError as err:
            if attempt == EVENT_ATTEMPTS:
                raise
            log.info(
                "%s: %s; again in %s s (attempt %d of %d)", what, err, err.delay, attempt + 1, EVENT_ATTEMPTS
            )
            if _stop_resync.wait(err.delay or 1):
                raise


def resync_trainingjobs(config: OperatorConfig) -> None:
    """Converge even if an event, or the reconcile it triggered, was lost (event handlers are never
    retried): every TrainingJob is reconciled at least about every `resync_seconds` (those an event
    reconciled within the interval are skipped), spread over that interval.
    One thread, not a kopf timer per object: kopf puts a finalizer on every object with a timer (a
    PATCH at creation and one at deletion, and no deletion at all while the operator is down).

    Each object is queued (`TRAINING_QUEUE`) as an event queues it, so its reconcile works from what
    the watches hold (kopf re-lists after a broken watch, so they hold every change the API server
    made): a missing RayJob is confirmed with a GET before the plan acts on its absence, and a status
    write at a stale resourceVersion (409) reads both afresh. So a resync that finds nothing to do
    makes no API call; one GET per object per interval would be most of the operator's calls at
    scale. (Queued, it also runs where kopf's Events can be posted: see `_kopf_context`.)"""
    while not _stop_resync.is_set():
        known = sorted(_trainingjobs)
        if not known:
            _stop_resync.wait(config.resync_seconds)
        for namespace, name in known:
            if _stop_resync.wait(config.resync_seconds / len(known)):
                return
            if (namespace, name) not in _trainingjobs:
                continue  # deleted meanwhile
            if time.monotonic() - _reconciled.get((namespace, name), -math.inf) < config.resync_seconds:
                continue  # an event reconciled it within the interval (and none races it now)
            TRAINING_QUEUE.add((namespace, name))


def reconcile_trainingjob(namespace: str, name: str, config: OperatorConfig, seen: Seen | None) -> None:
    """`reconcile` of a TrainingJob, its success noted for the resync."""
    reconcile(TRAINING, namespace, name, config, seen)
    _reconciled[(namespace, name)] = time.monotonic()


def _watched_now(namespace: str, name: str) -> Seen | None:
    """A TrainingJob and its RayJob as kopf's watches hold them (None: not watched yet: read them)."""
    if not _watched or (obj := one_of(_watched["trainingjobs"], (namespace, name))) is None:
        return None
    return Seen(obj, one_of(_watched["rayjobs"], (namespace, names.rayjob_name(name))))


@kopf.on.cleanup()
def stop_resync(**_: Any) -> None:
    _stop_work()


def _stop_work() -> None:
    """No more reconciles of TrainingJobs: the resync ends, what waits in the queue is dropped."""
    _stop_resync.set()
    TRAINING_QUEUE.stop()


# --- running and stopping ------------------------------------------------------------------------

# The flag `run` hands kopf to stop it; set on SIGTERM or SIGINT (`take_signals`).
_stop: asyncio.Event | None = None


def run(**options: Any) -> None:
    """`kopf.run(**options)`, stopped by SIGTERM or SIGINT through a stop flag (`take_signals`), so
    that a stop first drops what waits in the work queue. kopf's cleanup handlers run only once its
    watchers have stopped: the thread pool would work through the queue meanwhile, a reconcile (a
    few API calls) per queued job, and a rollout under a backlog would end in SIGKILL."""
    global _stop
    _stop = asyncio.Event()
    kopf.run(stop_flag=_stop, **options)


@kopf.on.startup()
async def take_signals(**_: Any) -> None:
    """SIGTERM and SIGINT, taken over from kopf when started by `run`: `_stopping`."""
    if _stop is None or threading.current_thread() is not threading.main_thread():
        return  # not started by `run`: kopf keeps its own handlers
    # kopf installs its handlers as its startup tasks take their first step, before this one's
    # next: installed after that, these replace them.
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stopping, sig)


def _stopping(sig: signal.Signals) -> None:
    dropped = len(TRAINING_QUEUE)
    _stop_work()
    log.info("%s: stopping; %d queued TrainingJob reconciles dropped", sig.name, dropped)
    if _stop is not None:
        _stop.set()


@kopf.on.event(*api.RAYJOBS, labels={names.LABEL_TRAININGJOB: kopf.PRESENT})  # type: ignore[arg-type]  # kopf's WatchingFn does not model index kwargs
async def rayjob_changed(
    *,
    namespace: str | None,
    labels: Mapping[str, str],
    trainingjobs_seen: kopf.Index[tuple[str | None, str], bytes],
    rayjobs_seen: kopf.Index[tuple[str | None, str], bytes],
    **_: Any,
) -> None:
    """Its TrainingJob is queued: kopf updated the RayJob index before this handler (gone from it
    when DELETED), so the reconcile sees this RayJob or a later one."""
    _keep_kopf_views(trainingjobs_seen, rayjobs_seen)
    TRAINING_QUEUE.add((_namespaced(namespace), labels[names.LABEL_TRAININGJOB]))


# --- ModelService --------------------------------------------------------------------------------


@kopf.on.resume(*api.MODELSERVICES, id="resume")
@kopf.on.create(*api.MODELSERVICES, id="create")
@kopf.on.update(*api.MODELSERVICES, id="update")
@in_thread
def modelservice_changed(*, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    reconcile(SERVING, _namespaced(namespace), name, memo.config)


@kopf.timer(*api.MODELSERVICES, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS, id="resync")
@in_thread
def modelservice_resync(*, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    reconcile(SERVING, _namespaced(namespace), name, memo.config)


@kopf.timer(
    *api.MODELSERVICES,
    interval=ROLLOUT_CHECK_SECONDS,
    id="rollout",
    when=lambda status, **_: modelservice.rolling_out(status),
)
@in_thread
def modelservice_rollout(*, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """A model rollout in flight: ask Serve again until it runs the new model."""
    reconcile(SERVING, _namespaced(namespace), name, memo.config)


@kopf.on.event(*api.RAYSERVICES, labels={names.LABEL_MODELSERVICE: kopf.PRESENT})
@in_thread
def rayservice_changed(
    *, namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any
) -> None:
    ns, service = _namespaced(namespace), labels[names.LABEL_MODELSERVICE]
    retried(f"ModelService {ns}/{service}", lambda: reconcile(SERVING, ns, service, memo.config))


@kopf.index(*api.MODELSERVICES)
def services_by_trainingjob(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], str] | None:
    """(namespace, TrainingJob name) -> the ModelServices serving its model(s) (kept in memory by kopf)."""
    served = modelservice.referenced_trainingjobs(body)
    return {(namespace, trainingjob): name for trainingjob in served} or None


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
    trainingjobs_seen: kopf.Index[tuple[str | None, str], bytes],
    rayjobs_seen: kopf.Index[tuple[str | None, str], bytes],
    namespaces_terminating: kopf.Index[str, bool],
    memo: kopf.Memo,
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
    _keep_kopf_views(trainingjobs_seen, rayjobs_seen)
    terminating.update(namespaces=namespaces_terminating)
    ns = _namespaced(namespace)
    if type == "DELETED":
        _trainingjobs.discard((ns, name))
        _reconciled.pop((ns, name), None)
        written.pop((TRAINING.kind, ns, name), None)
        if uid:
            forget_object(uid)
    else:
        _trainingjobs.add((ns, name))
        if status.get("observedGeneration") != meta.get("generation"):
            TRAINING_QUEUE.add((ns, name), fresh=True)
    services = list(services_by_trainingjob.get((namespace, name), []))
    if services:
        await _reconcile_services(namespace=ns, services=services, config=memo.config)


@in_thread
def _reconcile_services(*, namespace: str, services: list[str], config: OperatorConfig) -> None:
    for service in services:
        retried(
            f"ModelService {namespace}/{service}",
            functools.partial(reconcile, SERVING, namespace, service, config),
        )


@kopf.on.event(*api.MODELSERVICES)  # type: ignore[arg-type]  # kopf's WatchingFn does not model index kwargs
async def modelservice_gone(
    *, type: str | None, uid: str | None, namespaces_terminating: kopf.Index[str, bool], **_: Any
) -> None:
    terminating.update(namespaces=namespaces_terminating)
    if type == "DELETED" and uid:
        forget_object(uid)


def _namespaced(namespace: str | None) -> str:
    if namespace is None:  # every kind rayship watches is namespaced
        raise kopf.PermanentError("rayship resources are namespaced; got a cluster-scoped object")
    return namespace
