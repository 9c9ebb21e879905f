"""kopf wiring: one reconcile loop, parameterised per kind; the kinds' pure plan/status/announce live
in `rayship.trainingjob` and `rayship.modelservice`, all I/O goes through `rayship.k8s`.

Run with `rayship operator` or `kopf run --standalone -m rayship.handlers`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from pydantic import SecretStr

from rayship import api, k8s, metrics, modelservice, names, trainingjob
from rayship.conditions import Event, Plan, Probe, describe_foreign, owned_changes, ownership
from rayship.config import OperatorConfig

CONFLICT_RETRIES = 5
# Timers are declared at import: the resync interval comes from the same RAYSHIP_* environment.
RESYNC_SECONDS = OperatorConfig().resync_seconds

log = logging.getLogger("rayship")
_running: dict[int, tuple[str, float]] = {}  # thread -> (what, monotonic start) of running reconciles


@dataclass(frozen=True)
class Controller:
    """Everything the reconcile loop needs to know about one kind."""

    kind: str
    resource: api.Resource
    child: api.Resource  # the KubeRay object it owns
    child_name: Callable[[str], str]
    # The one other object (same namespace) its plan depends on, e.g. a ModelService's TrainingJob.
    related: Callable[[Mapping[str, Any]], tuple[api.Resource, str] | None]
    plan: Callable[
        [Mapping[str, Any], Mapping[str, Any] | None, Mapping[str, Any] | None, OperatorConfig], Plan
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


def served_trainingjob(ms: Mapping[str, Any]) -> str | None:
    """The TrainingJob whose model a ModelService serves (`model.fromTrainingJob.name`), if any."""
    source = (ms.get("spec", {}).get("model") or {}).get("fromTrainingJob") or {}
    name = source.get("name")
    return name if isinstance(name, str) else None


def _modelservice_related(ms: Mapping[str, Any]) -> tuple[api.Resource, str] | None:
    name = served_trainingjob(ms)
    return (api.TRAININGJOBS, name) if name else None


TRAINING = Controller(
    kind=api.TRAINING_JOB.kind,
    resource=api.TRAININGJOBS,
    child=api.RAYJOBS,
    child_name=names.rayjob_name,
    related=lambda _: None,
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


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations, out of the status users read.
    prefix = names.KOPF_ANNOTATION_PREFIX
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=prefix, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # our own Events say what happened; no handler chatter
    settings.watching.server_timeout = 270
    # No CRD or namespace scanning: the resources are known (the chart installs our CRDs, KubeRay its),
    # so the operator needs no cluster-wide read access to CustomResourceDefinitions.
    settings.scanning.disabled = True
    config = OperatorConfig()
    k8s.configure()
    if config.ray_token_key is None:
        config = config.model_copy(update={"ray_token_key": SecretStr(k8s.token_key(config.namespace))})
    memo.config = config
    logging.getLogger("rayship").setLevel(memo.config.log_level.upper())
    metrics.serve(memo.config.metrics_port)


@kopf.on.probe(id="reconciles")
def reconciles_not_wedged(memo: kopf.Memo, **_: Any) -> int:
    """Liveness: fails (kopf answers 500) while one reconcile has run longer than `wedged_seconds`."""
    now = time.monotonic()
    for what, started in list(_running.values()):
        if now - started > memo.config.wedged_seconds:
            raise RuntimeError(f"reconcile of {what} has been running for {now - started:.0f} s")
    return len(_running)


# --- TrainingJob ---------------------------------------------------------------------------------


@kopf.on.resume(*api.TRAININGJOBS, id="resume")
@kopf.on.create(*api.TRAININGJOBS, id="create")
@kopf.on.update(*api.TRAININGJOBS, id="update")
def trainingjob_changed(*, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    reconcile(TRAINING, _namespaced(namespace), name, memo.config)


@kopf.timer(*api.TRAININGJOBS, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS, id="resync")
def trainingjob_resync(*, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Converge even if an event, or the reconcile it triggered, was lost (kopf retries a timer that
    raised; event handlers are never retried)."""
    reconcile(TRAINING, _namespaced(namespace), name, memo.config)


@kopf.on.event(*api.RAYJOBS, labels={names.LABEL_TRAININGJOB: kopf.PRESENT})
def rayjob_changed(*, namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    reconcile(TRAINING, _namespaced(namespace), labels[names.LABEL_TRAININGJOB], memo.config)


# --- ModelService --------------------------------------------------------------------------------


@kopf.on.resume(*api.MODELSERVICES, id="resume")
@kopf.on.create(*api.MODELSERVICES, id="create")
@kopf.on.update(*api.MODELSERVICES, id="update")
def modelservice_changed(*, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    reconcile(SERVING, _namespaced(namespace), name, memo.config)


@kopf.timer(*api.MODELSERVICES, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS, id="resync")
def modelservice_resync(*, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    reconcile(SERVING, _namespaced(namespace), name, memo.config)


@kopf.timer(
    *api.MODELSERVICES,
    interval=ROLLOUT_CHECK_SECONDS,
    id="rollout",
    when=lambda status, **_: bool(status.get("targetModelURI")),
)
def modelservice_rollout(*, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """A model rollout in flight: ask Serve again until it runs the new model."""
    reconcile(SERVING, _namespaced(namespace), name, memo.config)


@kopf.on.event(*api.RAYSERVICES, labels={names.LABEL_MODELSERVICE: kopf.PRESENT})
def rayservice_changed(
    *, namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any
) -> None:
    reconcile(SERVING, _namespaced(namespace), labels[names.LABEL_MODELSERVICE], memo.config)


@kopf.index(*api.MODELSERVICES)
def services_by_trainingjob(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], str] | None:
    """(namespace, TrainingJob name) -> the ModelServices serving its model (kept in memory by kopf)."""
    served = served_trainingjob(body)
    return {(namespace, served): name} if served else None


# kopf injects an index by its name; its handler protocol cannot express that keyword.
@kopf.on.event(*api.TRAININGJOBS)  # type: ignore[arg-type]
def trainingjob_for_services(
    *,
    namespace: str | None,
    name: str,
    services_by_trainingjob: kopf.Index[tuple[str | None, str], str],
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """A TrainingJob changed (or went away): the ModelServices that serve it re-resolve their model."""
    for service in services_by_trainingjob.get((namespace, name), []):
        reconcile(SERVING, _namespaced(namespace), service, memo.config)


def _namespaced(namespace: str | None) -> str:
    if namespace is None:  # every kind rayship watches is namespaced
        raise kopf.PermanentError("rayship resources are namespaced; got a cluster-scoped object")
    return namespace


# --- the reconcile loop --------------------------------------------------------------------------


def reconcile(ctl: Controller, namespace: str, name: str, config: OperatorConfig) -> None:
    """Bring the child in line with the resource, then mirror the child's state into the resource's
    status (written only when it changed, at the resourceVersion it was derived from); idempotent."""
    metrics.RECONCILES.labels(ctl.kind).inc()
    _running[threading.get_ident()] = (f"{ctl.kind} {namespace}/{name}", time.monotonic())
    try:
        with metrics.RECONCILE_ERRORS.labels(ctl.kind).count_exceptions():
            for _attempt in range(CONFLICT_RETRIES):
                if _reconcile_once(ctl, namespace, name, config):
                    return
            raise kopf.TemporaryError(f"{ctl.kind} {namespace}/{name} kept changing; retrying", delay=2)
    finally:
        _running.pop(threading.get_ident(), None)


def _reconcile_once(ctl: Controller, namespace: str, name: str, config: OperatorConfig) -> bool:
    """One read-plan-act-write pass; False when the status write lost a race (read again)."""
    obj = k8s.get(ctl.resource, namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return True  # gone or going: its children follow by garbage collection
    child = k8s.get(ctl.child, namespace, ctl.child_name(name))
    ref = ctl.related(obj)
    related = k8s.get(ref[0], namespace, ref[1]) if ref else None
    todo = ctl.plan(obj, child, related, config)
    owner = kopf.Body(cast(kopf.RawBody, obj))  # a raw object as read from the API
    try:
        child = _carry_out(ctl, owner, obj, child, todo)
    except k8s.Rejected as refused:
        todo = replace(todo, rejected=(refused.phase, refused.reason, refused.message))
    except k8s.Busy as busy:
        raise kopf.TemporaryError(str(busy), delay=5) from None
    if (probe := ctl.probe(todo, child, config)) is not None:
        todo = ctl.heard(todo, *k8s.proxy_get(namespace, probe))
    current = obj.get("status") or {}
    selector = ctl.pods(child)
    pods = k8s.list_pods(namespace, selector) if selector else []
    desired = ctl.status(obj, child, todo, pods, datetime.now(UTC))
    changes = owned_changes(current, desired)
    if not changes:
        return True
    try:
        k8s.patch_status(ctl.resource, namespace, name, changes, obj["metadata"]["resourceVersion"])
    except k8s.Conflict:
        return False
    if desired.get("phase") != current.get("phase"):
        metrics.PHASE_TRANSITIONS.labels(ctl.kind, str(desired.get("phase"))).inc()
    for event in ctl.announce(current, desired):
        _post(owner, event)
    return True


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
