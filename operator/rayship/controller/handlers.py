"""kopf wiring: one reconcile loop, parameterised per kind; the kinds' pure plan/status/announce live
in `rayship.controller.trainingjob` and `rayship.controller.modelservice`, all I/O goes through `rayship.controller.k8s`.

Run with `rayship operator` or `kopf run --standalone -m rayship.controller.handlers`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import math
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from pydantic import SecretStr

from rayship import api, metrics
from rayship.api import names
from rayship.config import OperatorConfig, from_environment
from rayship.controller import k8s, modelservice, trainingjob
from rayship.controller.conditions import Event, Plan, Probe, describe_foreign, owned_changes, ownership
from rayship.controller.workqueue import WorkQueue

CONFLICT_RETRIES = 5
# Timers are declared at import: the resync interval comes from the same RAYSHIP_* environment.
RESYNC_SECONDS = from_environment().resync_seconds

log = logging.getLogger("rayship")
_running: dict[int, tuple[str, float]] = {}  # thread -> (what, monotonic start) of running reconciles


@dataclass(frozen=True)
class Controller:
    """Everything the reconcile loop needs to know about one kind."""

    kind: str
    resource: api.Resource
    child: api.Resource  # the KubeRay object it owns
    child_name: Callable[[str], str]
    # The other objects (same namespace) its plan depends on, e.g. a ModelService's TrainingJobs; the
    # plan gets those that exist.
    related: Callable[[Mapping[str, Any]], list[tuple[api.Resource, str]]]
    plan: Callable[
        [Mapping[str, Any], Mapping[str, Any] | None, Sequence[Mapping[str, Any]], OperatorConfig], Plan
    ]
    # The label selector of the child's Ray pods while they are worth a look (not running yet).
    pods: Callable[[Mapping[str, Any] | None], str | None]
    status: Callable[
        [Mapping[str, Any], Mapping[str, Any] | None, Plan, list[dict[str, Any]], datetime], dict[str, Any]
    ]
    announce: Callable[[Mapping[str, Any], Mapping[str, Any]], list[Event]]
    # A GET through the API server's service proxy worth making before the status is derived
    # (pure: which, if any), and how its answer (HTTP code, body) goes into the plan.
    probe: Callable[[Plan, Mapping[str, Any] | None, OperatorConfig], Probe | None] = lambda *_: None
    heard: Callable[[Plan, int, str], Plan] = lambda plan, *_: plan


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


class MemoryProgress(kopf.AnnotationsProgressStorage):
    """kopf's per-handler progress (retry counts, delays) in this process's memory, not written to
    the object: a reconcile is idempotent, so after a restart every object is simply handled again.
    Only kopf's nudge to retry a failed handler after its delay (`touch`) is an annotation patch."""

    def __init__(self, prefix: str):
        super().__init__(prefix=prefix)
        self.records: dict[tuple[str, kopf.HandlerId], kopf.ProgressRecord] = {}

    def fetch(self, *, key: kopf.HandlerId, body: kopf.Body) -> kopf.ProgressRecord | None:
        return self.records.get((body.metadata.uid or "", key))

    def store(
        self, *, key: kopf.HandlerId, record: kopf.ProgressRecord, body: kopf.Body, patch: kopf.Patch
    ) -> None:
        self.records[(body.metadata.uid or "", key)] = kopf.ProgressRecord(**record)

    def purge(self, *, key: kopf.HandlerId, body: kopf.Body, patch: kopf.Patch) -> None:
        self.records.pop((body.metadata.uid or "", key), None)
        super().purge(key=key, body=body, patch=patch)  # annotations an earlier version wrote

    def forget(self, uid: str) -> None:
        for stale in [k for k in self.records if k[0] == uid]:
            del self.records[stale]


class MemoryDiffBase(kopf.AnnotationsDiffBaseStorage):
    """The spec kopf last handled for a ModelService (the base of its diffs: it runs the update
    handler only when something but the status changed), in memory packed as compact JSON
    (`_packed`), not written to the object. After a restart an object has none, so kopf handles it as
    created: the same reconcile."""

    def __init__(self, prefix: str):
        super().__init__(prefix=prefix, key="last-handled-configuration")
        self.essences: dict[str, bytes] = {}

    # kopf builds the essence of every object at every event (a deep copy of the whole object, then
    # trimmed: ~51 us) and diffs it with the last one, whether or not the kind has a change handler
    # to give the diff to. TrainingJobs, RayJobs and namespaces have none: only a ModelService's is
    # built (and fetched); kopf takes None for none.
    @staticmethod
    def _diffed(body: kopf.Body) -> bool:
        return body.get("kind") == api.MODEL_SERVICE.kind and body.get("apiVersion") == api.API_VERSION

    def build(  # type: ignore[override]  # kopf's processing takes None for "no essence"
        self, *, body: kopf.Body, extra_fields: Any = None
    ) -> kopf.BodyEssence | None:
        return super().build(body=body, extra_fields=extra_fields) if self._diffed(body) else None

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        if not self._diffed(body):
            return None
        found = self.essences.get(body.metadata.uid or "")
        if found is None:
            return super().fetch(body=body)  # an annotation an earlier version wrote
        return cast(kopf.BodyEssence, _unpacked(found))

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self.essences[body.metadata.uid or ""] = _packed(essence)

    def forget(self, uid: str) -> None:
        self.essences.pop(uid, None)


PROGRESS = MemoryProgress(prefix=names.KOPF_ANNOTATION_PREFIX)
DIFFBASE = MemoryDiffBase(prefix=names.KOPF_ANNOTATION_PREFIX)


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
    # has come for this long (5 s by default): after a burst, hundreds of objects' events. 1000
    # TrainingJobs at once: operator RSS 166-181 MB (3 runs), against 184-190 MB with the default
    # (3 runs; 0.1 s: 170).
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
    for what, started in list(_running.values()):
        if now - started > memo.config.wedged_seconds:
            raise RuntimeError(f"reconcile of {what} has been running for {now - started:.0f} s")
    return len(_running)


# --- TrainingJob ---------------------------------------------------------------------------------


# What kopf's watches last showed, kept in memory by kopf (trimmed and packed: see `_kept`): the
# first pass of a reconcile reads these instead of GETting the objects again.
@kopf.index(*api.TRAININGJOBS)
async def trainingjobs_seen(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], bytes]:
    return {(namespace, name): _kept(body)}


@kopf.index(*api.RAYJOBS, labels={names.LABEL_TRAININGJOB: kopf.PRESENT})
async def rayjobs_seen(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], bytes]:
    return {(namespace, name): _kept(body, drop_spec=("rayClusterSpec",))}


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
_terminating: dict[str, kopf.Index[str, bool]] = {}  # "namespaces": kopf's live index, set by the first event
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
    if not _watched or (obj := _one(_watched["trainingjobs"], (namespace, name))) is None:
        return None
    return Seen(obj, _one(_watched["rayjobs"], (namespace, names.rayjob_name(name))))


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
    _terminating.update(namespaces=namespaces_terminating)
    ns = _namespaced(namespace)
    if type == "DELETED":
        _trainingjobs.discard((ns, name))
        _reconciled.pop((ns, name), None)
        _written.pop((TRAINING.kind, ns, name), None)
        if uid:
            _forget(uid)
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


def _kept(body: Mapping[str, Any], drop_spec: tuple[str, ...] = ()) -> bytes:
    """A watched object as the operator keeps it for as long as it exists (kopf's indexes, own status
    writes): `_trimmed`, packed as compact JSON, one allocation; `_unpacked` reads it back (~6 us for
    a TrainingJob). Kept as dicts, each object was a tree of small objects that also held on to the
    strings of kopf's decoded event: 12.7 KB a TrainingJob with its RayJob, 4.6 KB packed (tracemalloc,
    1000 of each)."""
    return _packed(_trimmed(body, drop_spec))


def _packed(value: Mapping[str, Any]) -> bytes:
    """What the operator keeps in memory per object (`_kept`, kopf's diffbase): compact JSON."""
    return json.dumps(value, separators=(",", ":")).encode()


def _unpacked(kept: bytes) -> dict[str, Any]:
    """A packed object (`_packed`) as plain dicts: a fresh copy, the caller's own."""
    return cast(dict[str, Any], json.loads(kept))


def _trimmed(body: Mapping[str, Any], drop_spec: tuple[str, ...] = ()) -> dict[str, Any]:
    """A watched object as plain dicts, without what no reconcile reads and memory would hold for
    every object: managedFields, kopf's copy of the last handled spec, and `drop_spec` fields."""
    kept: dict[str, Any] = {k: _plain(v) for k, v in body.items() if k not in ("metadata", "spec")}
    meta = {k: _plain(v) for k, v in body.get("metadata", {}).items() if k != "managedFields"}
    if annotations := meta.get("annotations"):
        meta["annotations"] = {k: v for k, v in annotations.items() if k != names.KOPF_DIFFBASE_ANNOTATION}
    kept["metadata"] = meta
    if "spec" in body:
        kept["spec"] = {k: _plain(v) for k, v in body["spec"].items() if k not in drop_spec}
    return kept


def _plain(value: Any) -> Any:
    """A value of a watched object as plain dicts and lists. (Not a closure in `_trimmed`: a nested
    function that calls itself is a reference cycle, garbage for the cyclic collector at every event.)"""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _one(index: kopf.Index[Any, bytes], key: Any) -> dict[str, Any] | None:
    kept = next(iter(index.get(key, [])), None)
    return None if kept is None else _unpacked(kept)


@kopf.on.event(*api.MODELSERVICES)  # type: ignore[arg-type]  # kopf's WatchingFn does not model index kwargs
async def modelservice_gone(
    *, type: str | None, uid: str | None, namespaces_terminating: kopf.Index[str, bool], **_: Any
) -> None:
    _terminating.update(namespaces=namespaces_terminating)
    if type == "DELETED" and uid:
        _forget(uid)


def _forget(uid: str) -> None:
    """Drop kopf's in-memory bookkeeping of a deleted object."""
    PROGRESS.forget(uid)
    DIFFBASE.forget(uid)


def _namespaced(namespace: str | None) -> str:
    if namespace is None:  # every kind rayship watches is namespaced
        raise kopf.PermanentError("rayship resources are namespaced; got a cluster-scoped object")
    return namespace


# --- the reconcile loop --------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """The resource and its child as kopf's watches last showed them (None: no child seen)."""

    obj: dict[str, Any]
    child: dict[str, Any] | None


# A reconcile that works from the watches remembers its last status write, (kind, namespace, name) ->
# (the resourceVersion it wrote over, the object the API server returned, `_kept`), until a reconcile
# sees a newer version (`_with_own_write`; the resync reconciles every object, so an entry lasts at
# most about two resync intervals). Under load the watch lags behind the operator's own writes: a
# reconcile right after one (e.g. of the RayJob KubeRay just updated) would write at the older
# version, get a 409 and read both objects again (a 100-job burst: 62 of 169 status writes). Not
# forgotten when the watch shows the write: kopf stores an event in its index only after the index
# handler returns, and a reconcile reading the index meanwhile still sees the older version.
_written: dict[tuple[str, str, str], tuple[str, bytes]] = {}


def _with_own_write(kind: str, namespace: str, name: str, seen: Seen) -> Seen:
    """`seen`, its resource replaced by our own later write when the watch has not shown that yet.
    A write the watch has moved past is forgotten here too: its own event may have come before the
    write was remembered, and no later event may come (the resync still passes by)."""
    mine = _written.get((kind, namespace, name))
    if mine is None:
        return seen
    if seen.obj["metadata"].get("resourceVersion") == mine[0]:
        return replace(seen, obj=_unpacked(mine[1]))
    _written.pop((kind, namespace, name), None)
    return seen


# One reconcile of an object at a time, as a controller's work queue guarantees: otherwise a job's
# create pass and its RayJob's first event, run at once, can both write its status at the same
# resourceVersion, and one loses (409: both objects read again, the status written again). The one
# that waited starts from the other's write (`_with_own_write`). Locks by stripe: bounded memory;
# with 32 workers, two objects seldom share one. (Reconciles never nest, so a stripe is never
# taken twice by one thread.) TrainingJobs have their work queue, which guarantees this too; the
# locks serve the ModelServices (their handlers, timers and RayService events run in kopf's pool).
_OBJECT_LOCKS = tuple(threading.Lock() for _ in range(256))


def object_lock(kind: str, namespace: str, name: str) -> threading.Lock:
    return _OBJECT_LOCKS[hash((kind, namespace, name)) % len(_OBJECT_LOCKS)]


def reconcile(
    ctl: Controller, namespace: str, name: str, config: OperatorConfig, seen: Seen | None = None
) -> None:
    """Bring the child in line with the resource, then mirror the child's state into the resource's
    status (written only when it changed, at the resourceVersion it was derived from); idempotent.
    Never runs twice at once for one object (`object_lock`).

    With `seen`, the first pass works from what the watches showed; a status write that finds the
    resource changed since (409) reads both from the API server and plans again."""
    metrics.RECONCILES.labels(ctl.kind).inc()
    with object_lock(ctl.kind, namespace, name):
        _running[threading.get_ident()] = (f"{ctl.kind} {namespace}/{name}", time.monotonic())
        try:
            with metrics.RECONCILE_ERRORS.labels(ctl.kind).count_exceptions():
                for attempt in range(CONFLICT_RETRIES):
                    first = seen if attempt == 0 else None
                    if _reconcile_once(ctl, namespace, name, config, first, watched=seen is not None):
                        return
                raise kopf.TemporaryError(f"{ctl.kind} {namespace}/{name} kept changing; retrying", delay=2)
        finally:
            _running.pop(threading.get_ident(), None)


def _reconcile_once(
    ctl: Controller,
    namespace: str,
    name: str,
    config: OperatorConfig,
    seen: Seen | None = None,
    watched: bool = False,
) -> bool:
    """One read-plan-act-write pass; False when the status write lost a race (read again).
    `watched`: the reconcile works from the watches, so its status write is remembered (`_written`).
    Nothing at all in a namespace being deleted."""
    if namespace in _terminating.get("namespaces", {}):
        return True
    if seen is not None:
        seen = _with_own_write(ctl.kind, namespace, name, seen)
    obj = seen.obj if seen else k8s.get(ctl.resource, namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return True  # gone or going: its children follow by garbage collection
    child = seen.child if seen else k8s.get(ctl.child, namespace, ctl.child_name(name))
    related = [found for ref in ctl.related(obj) if (found := k8s.get(ref[0], namespace, ref[1])) is not None]
    todo = ctl.plan(obj, child, related, config)
    if seen and child is None and todo.create is None:
        # No child in memory, and the plan acts on its absence (e.g. a launched child gone): the
        # watch may lag behind a child just made, so ask the API server before acting on it.
        child = k8s.get(ctl.child, namespace, ctl.child_name(name))
        todo = ctl.plan(obj, child, related, config)
    owner = kopf.Body(cast(kopf.RawBody, obj))  # a raw object as read from the API
    try:
        child = _carry_out(ctl, owner, obj, child, todo)
    except k8s.Rejected as refused:
        todo = replace(todo, rejected=(refused.phase, refused.reason, refused.message))
    except k8s.Busy as busy:
        raise kopf.TemporaryError(str(busy), delay=5) from None
    except k8s.Terminating:
        return True  # the namespace is being deleted: nothing new can be made there, nor is needed
    if (probe := ctl.probe(todo, child, config)) is not None:
        todo = ctl.heard(todo, *k8s.proxy_get(namespace, probe))
    current = obj.get("status") or {}
    selector = ctl.pods(child)
    pods = k8s.list_pods(namespace, selector) if selector else []
    desired = ctl.status(obj, child, todo, pods, datetime.now(UTC))
    changes = owned_changes(current, desired)
    if not changes:
        return True
    if _child_going(child, todo) and k8s.namespace_terminating(namespace):
        # The namespace watch has not told yet (or no event has handed its index over): asked, as
        # the status would say that a job or service failed moments before it goes too.
        return True
    written_over = obj["metadata"]["resourceVersion"]
    try:
        stored = k8s.patch_status(ctl.resource, namespace, name, changes, written_over)
    except k8s.Conflict:
        return False
    if watched:
        _written[(ctl.kind, namespace, name)] = (written_over, _kept(stored))
    if desired.get("phase") != current.get("phase"):
        metrics.PHASE_TRANSITIONS.labels(ctl.kind, str(desired.get("phase"))).inc()
    for event in ctl.announce(current, desired):
        _post(owner, event)
    return True


def _child_going(child: Mapping[str, Any] | None, todo: Plan) -> bool:
    """The status to write reacts to the child being deleted or gone (not to one about to be made)."""
    if child is None:
        return todo.create is None
    return bool(child["metadata"].get("deletionTimestamp"))


def _carry_out(
    ctl: Controller, owner: kopf.Body, obj: Mapping[str, Any], child: dict[str, Any] | None, todo: Plan
) -> dict[str, Any] | None:
    """Create (prerequisites first, each adopted) or patch the child; the child as stored after."""
    namespace = obj["metadata"]["namespace"]
    if todo.create is not None or todo.patch is not None:
        for prerequisite in todo.prerequisites:
            kopf.adopt(prerequisite, owner=owner)
            k8s.ensure(prerequisite, obj)
    if todo.create is not None:
        kopf.adopt(todo.create, owner=owner)
        child = k8s.create(ctl.child, todo.create)
        if (how := ownership(child, obj)) != "owned":  # created meanwhile by someone else: not ours
            if how == "previous":
                raise k8s.Busy(describe_foreign(child, ctl.child[2], how))
            raise k8s.Rejected("Failed", "NameTaken", describe_foreign(child, ctl.child[2], how))
        _post(owner, todo.on_create)
        for warning in todo.warnings:
            _post(owner, warning)
    if todo.patch is not None and child is not None:
        child = k8s.patch(ctl.child, namespace, todo.child_name, todo.patch)
        _post(owner, todo.on_patch)
    return child


def _post(owner: kopf.Body, event: Event | None) -> None:
    """Our own Events, posted explicitly (kopf.info() would obey posting.level and drop them)."""
    if event is not None:
        kopf.event(owner, type=event.type, reason=event.reason, message=event.message)
