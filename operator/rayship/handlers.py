"""kopf wiring: thin handlers over the pure planner (`reconcile`), status (`status`) and I/O (`k8s`).

Run with `rayship operator` or `kopf run --standalone -m rayship.handlers`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import kopf

from rayship import k8s, metrics, modelservice, names, status
from rayship.config import OperatorConfig
from rayship.reconcile import plan

TRAININGJOBS = k8s.TRAININGJOBS
RAYJOBS = k8s.RAYJOBS
MODELSERVICES = k8s.MODELSERVICES
RAYSERVICES = k8s.RAYSERVICES
CONFLICT_RETRIES = 5

log = logging.getLogger("rayship")


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations, out of the status users read.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="rayship.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="rayship.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # our own Events say what happened; no handler chatter
    settings.watching.server_timeout = 270
    memo.config = OperatorConfig()
    logging.getLogger("rayship").setLevel(memo.config.log_level.upper())
    k8s.configure()
    metrics.serve(memo.config.metrics_port)


@kopf.on.resume(*TRAININGJOBS, id="resume")
@kopf.on.create(*TRAININGJOBS, id="create")
@kopf.on.update(*TRAININGJOBS, id="update")
def trainingjob_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    sync(namespace, name, memo.config)


@kopf.on.event(*RAYJOBS, labels={names.LABEL_TRAININGJOB: kopf.PRESENT})
def rayjob_changed(namespace: str, labels: dict[str, str], memo: kopf.Memo, **_: Any) -> None:
    sync(namespace, labels[names.LABEL_TRAININGJOB], memo.config)


@kopf.on.resume(*MODELSERVICES, id="resume")
@kopf.on.create(*MODELSERVICES, id="create")
@kopf.on.update(*MODELSERVICES, id="update")
def modelservice_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    sync_modelservice(namespace, name, memo.config)


@kopf.on.event(*RAYSERVICES, labels={names.LABEL_MODELSERVICE: kopf.PRESENT})
def rayservice_changed(namespace: str, labels: dict[str, str], memo: kopf.Memo, **_: Any) -> None:
    sync_modelservice(namespace, labels[names.LABEL_MODELSERVICE], memo.config)


@kopf.on.event(*TRAININGJOBS)
def trainingjob_for_services(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """A TrainingJob changed (or went away): the ModelServices that serve it re-resolve their model."""
    for ms in k8s.list_namespaced(MODELSERVICES, namespace):
        source = (ms.get("spec", {}).get("model") or {}).get("fromTrainingJob") or {}
        if source.get("name") == name:
            sync_modelservice(namespace, ms["metadata"]["name"], memo.config)


Sync = Callable[[str, str, OperatorConfig], None]


def counted(kind: str) -> Callable[[Sync], Sync]:
    """Count a reconciler's runs and the runs that raised (to be retried), per kind."""

    def wrap(reconcile: Sync) -> Sync:
        @functools.wraps(reconcile)
        def run(namespace: str, name: str, config: OperatorConfig) -> None:
            metrics.RECONCILES.labels(kind).inc()
            with metrics.RECONCILE_ERRORS.labels(kind).count_exceptions():
                reconcile(namespace, name, config)

        return run

    return wrap


@counted("ModelService")
def sync_modelservice(namespace: str, name: str, config: OperatorConfig) -> None:
    """Resolve the model, bring the RayService in line, mirror its state; idempotent."""
    for _attempt in range(CONFLICT_RETRIES):
        ms = k8s.get(MODELSERVICES, namespace, name)
        if ms is None or ms["metadata"].get("deletionTimestamp"):
            return
        source = (ms.get("spec", {}).get("model") or {}).get("fromTrainingJob") or {}
        trainingjob = k8s.get(TRAININGJOBS, namespace, source["name"]) if source.get("name") else None
        rayservice = k8s.get(RAYSERVICES, namespace, names.rayservice_name(name))
        todo = modelservice.plan(ms, rayservice, trainingjob, config)
        if todo.create is not None:
            kopf.adopt(todo.create, owner=ms)
            rayservice = k8s.create(RAYSERVICES, todo.create)
            kopf.event(
                ms,
                type="Normal",
                reason="RayServiceCreated",
                message=f"created RayService {todo.rayservice_name} serving {todo.desired_uri}",
            )
        if todo.patch is not None and rayservice is not None:
            rayservice = k8s.patch(RAYSERVICES, namespace, todo.rayservice_name, todo.patch)
            what = (
                "new model (in-place Serve rollout)"
                if "rayClusterConfig" not in todo.patch.get("spec", {})
                else "new cluster config"
            )
            kopf.event(ms, type="Normal", reason="RayServiceUpdated", message=f"{what}: {todo.desired_uri}")
        current = ms.get("status") or {}
        desired = modelservice.derive(ms, rayservice, todo, datetime.now(UTC))
        patch = status.owned_changes(current, desired)
        if not patch:
            return
        try:
            k8s.patch_status(MODELSERVICES, namespace, name, patch, ms["metadata"]["resourceVersion"])
        except k8s.Conflict:
            continue
        if desired.get("phase") != current.get("phase"):
            metrics.PHASE_TRANSITIONS.labels("ModelService", str(desired["phase"])).inc()
            kind = "Warning" if desired["phase"] in ("Failed", "Invalid", "Degraded") else "Normal"
            kopf.event(ms, type=kind, reason=str(desired["phase"]), message=_summary(desired))
        return
    raise kopf.TemporaryError(f"ModelService {namespace}/{name} kept changing; retrying", delay=2)


def _summary(st: dict[str, Any]) -> str:
    notes = [f"{c['type']}={c['status']} ({c['reason']}: {c['message']})" for c in st.get("conditions") or []]
    return f"{st.get('phase')}: " + "; ".join(notes)


@counted("TrainingJob")
def sync(namespace: str, name: str, config: OperatorConfig) -> None:
    """Bring the RayJob and the TrainingJob status in line with the spec; idempotent."""
    for _attempt in range(CONFLICT_RETRIES):
        trainingjob = k8s.get_trainingjob(namespace, name)
        if trainingjob is None or trainingjob["metadata"].get("deletionTimestamp"):
            return  # gone or going: the RayJob follows by garbage collection
        rayjob = k8s.get_rayjob(namespace, names.rayjob_name(name))
        todo = plan(trainingjob, rayjob, config)
        if todo.create is not None:
            for prerequisite in todo.prerequisites:
                kopf.adopt(prerequisite, owner=trainingjob)
                k8s.ensure(prerequisite)
            kopf.adopt(todo.create, owner=trainingjob)
            rayjob = k8s.create_rayjob(todo.create)
            kopf.event(
                trainingjob,
                type="Normal",
                reason="RayJobCreated",
                message=f"created RayJob {todo.rayjob_name}",
            )
        if todo.rayjob_patch is not None:
            rayjob = k8s.patch_rayjob(namespace, todo.rayjob_name, todo.rayjob_patch)
            kopf.event(
                trainingjob,
                type="Normal",
                reason="RayJobUpdated",
                message=f"applied {sorted(todo.rayjob_patch['spec'])}",
            )
        current = trainingjob.get("status") or {}
        desired = status.derive(replace(todo.observation, rayjob=rayjob), datetime.now(UTC))
        patch = status.owned_changes(current, desired)
        if not patch:
            return
        try:
            k8s.patch_trainingjob_status(namespace, name, patch, trainingjob["metadata"]["resourceVersion"])
        except k8s.Conflict:
            continue
        _announce(trainingjob, current, desired)
        return
    raise kopf.TemporaryError(f"TrainingJob {namespace}/{name} kept changing; retrying", delay=2)


def _announce(trainingjob: dict[str, Any], current: dict[str, Any], desired: dict[str, Any]) -> None:
    """A Kubernetes Event for each phase transition and each new spec-edit report."""
    phase = desired.get("phase")
    if phase != current.get("phase"):
        metrics.PHASE_TRANSITIONS.labels("TrainingJob", str(phase)).inc()
        # Every phase condition carries the phase's reason and message; Invalid has only "Valid".
        cond = _condition(desired, "Valid" if phase == "Invalid" else "Running")
        kind = "Warning" if phase in ("Failed", "Invalid") else "Normal"
        kopf.event(
            trainingjob,
            type=kind,
            reason=cond.get("reason", phase),
            message=f"{phase}: {cond.get('message', '')}",
        )
    before = _condition(current, "SpecApplied")
    after = _condition(desired, "SpecApplied")
    if after.get("status") == "False" and after.get("message") != before.get("message"):
        kopf.event(trainingjob, type="Warning", reason=after["reason"], message=after["message"])


def _condition(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c.get("type") == type_), {})
