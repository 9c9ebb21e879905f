"""kopf wiring of ModelServices: kopf's create/update/resume handlers, a rollout timer, the resync
timer (`register_resync`, at start-up: its interval is configuration), their RayServices' events, and
the index of the services each TrainingJob feeds. Every handler reconciles through the process's loop."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import kopf

from rayship import api
from rayship.api import names
from rayship.controller import modelservice
from rayship.controller.process import Index, in_thread, namespaced, of
from rayship.controller.reconcile import Controller, Reconciler

# While a model rolls out, Serve is asked this often whether it runs the new model (KubeRay's status
# may not change when the rollout ends, so no event would tell).
ROLLOUT_CHECK_SECONDS = 3.0


def _modelservice_related(ms: Mapping[str, Any]) -> list[tuple[api.Resource, str]]:
    return [(api.TRAININGJOBS, name) for name in modelservice.referenced_trainingjobs(ms)] + [
        (api.TRAININGSCHEDULES, name) for name in modelservice.referenced_schedules(ms)
    ]


SERVING = Controller(
    kind=api.MODEL_SERVICE.kind,
    resource=api.MODELSERVICES,
    child=api.RAYSERVICES,
    child_name=names.rayservice_name,
    related=_modelservice_related,
    plan=modelservice.plan,
    pods=lambda _service, rayservice, _now: modelservice.starting_pods(rayservice),
    status=modelservice.status,
    announce=modelservice.announce,
    probe=modelservice.serve_probe,
    heard=modelservice.heard,
    missing=modelservice.missing_related,
    existing=modelservice.with_existing,
)


def _serving(memo: kopf.Memo, trainingjobs_seen: Index | None) -> Reconciler:
    """The process's reconciler, handed kopf's index of TrainingJobs: a service waiting for one that
    does not exist says those of its namespace from it, with no API call."""
    reconciler = of(memo).reconciler
    if trainingjobs_seen is not None:
        reconciler.listed[api.TRAININGJOBS[2]] = trainingjobs_seen
    return reconciler


@kopf.on.resume(*api.MODELSERVICES, id="resume")
@kopf.on.create(*api.MODELSERVICES, id="create")
@kopf.on.update(*api.MODELSERVICES, id="update")
@in_thread
def modelservice_changed(
    *, namespace: str | None, name: str, memo: kopf.Memo, trainingjobs_seen: Index | None = None, **_: Any
) -> None:
    _serving(memo, trainingjobs_seen).reconcile(SERVING, namespaced(namespace), name)


@in_thread
def modelservice_resync(
    *, namespace: str | None, name: str, memo: kopf.Memo, trainingjobs_seen: Index | None = None, **_: Any
) -> None:
    _serving(memo, trainingjobs_seen).reconcile(SERVING, namespaced(namespace), name)


def register_resync(interval: float) -> None:
    """The resync timer of every ModelService, at the configured interval (registered once, at start-up)."""
    kopf.timer(*api.MODELSERVICES, interval=interval, initial_delay=interval, id="resync")(
        modelservice_resync
    )


@kopf.timer(
    *api.MODELSERVICES,
    interval=ROLLOUT_CHECK_SECONDS,
    id="rollout",
    when=lambda status, **_: modelservice.rolling_out(status),
)
@in_thread
def modelservice_rollout(*, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """A model rollout in flight: ask Serve again until it runs the new model."""
    of(memo).reconciler.reconcile(SERVING, namespaced(namespace), name)


@kopf.on.event(*api.RAYSERVICES, labels={names.LABEL_MODELSERVICE: kopf.PRESENT})
@in_thread
def rayservice_changed(
    *, namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any
) -> None:
    process = of(memo)
    ns, service = namespaced(namespace), labels[names.LABEL_MODELSERVICE]
    process.retried(
        f"ModelService {ns}/{service}", lambda: process.reconciler.reconcile(SERVING, ns, service)
    )


@kopf.index(*api.MODELSERVICES)
def services_by_trainingjob(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], str] | None:
    """(namespace, TrainingJob name) -> the ModelServices serving its model(s) (kept in memory by kopf)."""
    served = modelservice.referenced_trainingjobs(body)
    return {(namespace, trainingjob): name for trainingjob in served} or None


@kopf.index(*api.MODELSERVICES)
def services_by_trainingschedule(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], str] | None:
    """(namespace, TrainingSchedule name) -> the ModelServices serving its promoted run."""
    return {(namespace, schedule): name for schedule in modelservice.referenced_schedules(body)} or None


@in_thread
def reconcile_services(*, namespace: str, services: list[str], memo: kopf.Memo) -> None:
    """The ModelServices a TrainingJob's event concerns (they re-resolve its model)."""
    process = of(memo)
    for service in services:
        process.retried(
            f"ModelService {namespace}/{service}",
            functools.partial(process.reconciler.reconcile, SERVING, namespace, service),
        )


@kopf.on.event(*api.MODELSERVICES)
async def modelservice_gone(
    *,
    type: str | None,
    uid: str | None,
    memo: kopf.Memo,
    namespaces_terminating: kopf.Index[str, bool] | None = None,  # cluster-wide only (handlers.run)
    **_: Any,
) -> None:
    process = of(memo)
    if namespaces_terminating is not None:
        process.reconciler.terminating.update(namespaces=namespaces_terminating)
    if type == "DELETED" and uid:
        process.forget(uid)
