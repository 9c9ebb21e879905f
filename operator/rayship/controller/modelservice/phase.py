"""The ModelService's status: one table maps the Serve application's state (and the RayService's Ready
condition) to our phase; rollouts, per-model status, the URL, and the Events a change announces."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

from rayship import api
from rayship.api import names
from rayship.controller.conditions import (
    Event,
    Plan,
    condition,
    find,
    pod_problem,
)
from rayship.controller.modelservice.context import ServeState, ServiceContext
from rayship.controller.modelservice.rayservice import describe
from rayship.controller.modelservice.source import ONE, model_status_by_name

ANY = "*"

# (Serve application status, RayService Ready status, Ready reason) -> (phase, reason, message);
# the first matching row wins. KubeRay v1.7: Ready is True while any Serve proxy pod serves (so it
# stays True during an in-place rollout, and old replicas keep answering); a first deployment's
# application status is in pendingServiceStatus; ValidationFailed and InitializingTimeout are final.
# A reason of None keeps KubeRay's Ready reason; a message of None takes the application's own
# message, else KubeRay's Ready message, else SERVING_DEFAULT_MESSAGE.
SERVING_TABLE: tuple[tuple[tuple[str, str, str], tuple[str, str | None, str | None]], ...] = (
    (("DEPLOY_FAILED", ANY, ANY), ("Failed", "DeployFailed", None)),
    ((ANY, ANY, "ValidationFailed"), ("Failed", "RayServiceValidationFailed", None)),
    ((ANY, ANY, "InitializingTimeout"), ("Failed", "InitializingTimeout", None)),
    (("UNHEALTHY", ANY, ANY), ("Degraded", "Unhealthy", None)),
    (("RUNNING", "True", ANY), ("Ready", "Ready", "the Serve application is running")),
    (("DEPLOYING", "True", ANY), ("Ready", "Ready", "a new version is rolling out; the current one serves")),
    (("", "True", ANY), ("Ready", "Ready", "serving while a new Ray cluster is prepared")),
    ((ANY, ANY, ANY), ("Deploying", None, "the Serve application is {app}")),
)
SERVING_DEFAULT_MESSAGE = {
    "DEPLOY_FAILED": "the Serve application failed to deploy",
    "UNHEALTHY": "the Serve application is unhealthy",
}


def application_status(rayservice: Mapping[str, Any], app: str) -> Mapping[str, Any]:
    """Serve's status of `app`: on the active cluster, else (a first deployment) the pending one."""
    st = rayservice.get("status") or {}
    for side in ("activeServiceStatus", "pendingServiceStatus"):
        found = ((st.get(side) or {}).get("applicationStatuses") or {}).get(app)
        if found:
            return cast(Mapping[str, Any], found)
    return {}


def _deployment_cause(app_status: Mapping[str, Any]) -> str:
    """The last line of the first unhealthy deployment's message (e.g. the exception a replica raised)."""
    for name, deployment in sorted((app_status.get("serveDeploymentStatuses") or {}).items()):
        if deployment.get("status") in ("UNHEALTHY", "DEPLOY_FAILED") and deployment.get("message"):
            lines = [line for line in str(deployment["message"]).strip().splitlines() if line.strip()]
            return f"deployment {name}: {lines[-1].strip()}" if lines else ""
    return ""


def serving_phase(rayservice: Mapping[str, Any], app: str) -> tuple[str, str, str]:
    """(phase, reason, message) from a RayService's Ready condition and its application's status,
    through SERVING_TABLE."""
    found = application_status(rayservice, app)
    app_status, app_message = str(found.get("status", "")), str(found.get("message", ""))
    ready_condition = find(rayservice.get("status"), "Ready")
    ready = "True" if ready_condition.get("status") == "True" else "False"
    key = (app_status, ready, str(ready_condition.get("reason", "")))
    phase, reason, message = next(
        outcome
        for want, outcome in SERVING_TABLE
        if all(w in (ANY, k) for w, k in zip(want, key, strict=True))
    )  # the last row matches anything
    if message is None:
        message = app_message or str(
            ready_condition.get("message") or SERVING_DEFAULT_MESSAGE.get(app_status, "")
        )
        cause = _deployment_cause(found)
        if cause and cause not in message:
            message = f"{message}: {cause}"  # Serve's application message rarely says why
    else:
        message = message.format(app=app_status or "starting")  # a table template, never Serve's text
    return phase, reason or str(ready_condition.get("reason") or "Deploying"), message


def starting_pods(rayservice: Mapping[str, Any] | None) -> str | None:
    """The label selector of the Ray pods of a cluster being prepared (first deployment or upgrade)."""
    st = (rayservice or {}).get("status") or {}
    cluster = (st.get("pendingServiceStatus") or {}).get("rayClusterName")
    return f"ray.io/cluster={cluster}" if cluster else None


# `Controller.status` of this kind: the same signature as the other kind's (an intended parallel).
def status(
    modelservice: Mapping[str, Any],
    rayservice: Mapping[str, Any] | None,
    plan_: Plan,
    pods: list[dict[str, Any]] | None,
    now: datetime,
) -> dict[str, Any]:
    """The operator-owned status, once the plan was carried out and `rayservice` is what the server
    holds; `pods` are the Ray pods of a cluster being prepared (why one cannot start is said; None:
    not looked at)."""
    ctx: ServiceContext = plan_.context
    current = modelservice.get("status") or {}
    generation = modelservice["metadata"].get("generation", 0)
    app = modelservice["metadata"]["name"]

    def cond(type_: api.ModelServiceConditionType, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return condition(current, type_, ok, reason, message, generation, now)

    invalid = ctx.invalid
    if plan_.rejected is not None and plan_.rejected[0] == "Invalid":
        invalid = f"{plan_.rejected[1]}: {plan_.rejected[2]}"
    if invalid is not None and rayservice is None:
        valid = cond("Valid", False, "InvalidSpec", invalid)
        return {"phase": "Invalid", "observedGeneration": generation, "conditions": [valid]}
    if ctx.blocked is not None:
        rayservice = None  # not ours: its state says nothing about this ModelService
    conditions = [cond("Valid", ctx.invalid is None, *_validity(ctx.invalid))]
    if (res := ctx.resolution) is not None:
        conditions.append(cond("ModelAvailable", res.models is not None, res.reason, res.message))
    out: dict[str, Any] = {"observedGeneration": generation, "rayServiceName": plan_.child_name}
    if not ctx.multi and (volume := _model_volume(ctx, current)):
        out["modelVolume"] = volume
    if rayservice is None:
        phase, reason, message = _before_the_cluster(plan_, ctx)
        conditions.append(cond("Ready", False, reason, message))
        out.update(phase=phase, conditions=conditions, serveEndpoints=0)
        out.update(_models_status(ctx, current, ctx.served, None) if ctx.multi else NO_MODELS_STATUS)
        return out
    phase, reason, message = serving_phase(rayservice, app)
    stuck = pod_problem(pods or [])
    if phase == "Deploying" and stuck is not None:
        reason, message = stuck[0], f"{message}: {stuck[1]}"
    st = rayservice.get("status") or {}
    served = _served(ctx, rayservice, phase)
    target = ctx.desired if ctx.desired is not None and ctx.desired != served else None
    upgrading = find(st, "UpgradeInProgress").get("status") == "True" or target is not None
    conditions.append(cond("Ready", phase == "Ready", reason, message))
    conditions.append(cond("Upgrading", *_upgrading(plan_, target, served, ctx, upgrading)))
    out.update(
        phase=phase,
        conditions=conditions,
        # KubeRay counts Ray pods whose Serve proxy is ready; it reports no replica count.
        serveEndpoints=int(st.get("numServeEndpoints") or 0),
        url=_url(ctx, st) if phase in ("Ready", "Degraded") else current.get("url"),
    )
    if ctx.multi:
        out.update(_models_status(ctx, current, served, target))
    else:
        out.update(NO_MODELS_STATUS, modelURI=served.get(ONE), targetModelURI=(target or {}).get(ONE))
    return out


def _upgrading(
    plan_: Plan, target: dict[str, str] | None, served: dict[str, str], ctx: ServiceContext, upgrading: bool
) -> tuple[bool, str, str]:
    """The Upgrading condition: a change refused for good (a planted Secret) is said, and the cluster
    serves on; else the rollout, if any."""
    if plan_.rejected is not None:
        _, refused, why = plan_.rejected
        return False, refused, f"the change is not made: {why}"
    return (upgrading, *_upgrade(target, served, ctx, upgrading))


NO_MODELS_STATUS: Mapping[str, None] = {"models": None, "modelCount": None}  # spec.model: none of spec.models


def _validity(invalid: str | None) -> tuple[str, str]:
    """The Valid condition's (reason, message)."""
    return ("InvalidSpec", invalid) if invalid else ("SpecValid", "the spec is valid")


def _model_volume(ctx: ServiceContext, current: Mapping[str, Any]) -> Any:
    """spec.model's volume: as resolved now, else as the status last said."""
    res = ctx.resolution
    single = res.each.get(ONE) if res else None
    return single.volume.wire() if single and single.volume else current.get("modelVolume")


def _before_the_cluster(plan_: Plan, ctx: ServiceContext) -> tuple[str, str, str]:
    """(phase, reason, message) while there is no RayService of ours to read."""
    res = ctx.resolution
    phase = "WaitingForModel" if ctx.desired is None else "Deploying"
    reason, message = (res.reason, res.message) if res else ("Waiting", "")
    if plan_.rejected is not None:
        return plan_.rejected
    if ctx.blocked is not None:
        return phase, "RayServiceNameTaken", ctx.blocked
    return phase, reason, message


def _served(ctx: ServiceContext, rayservice: Mapping[str, Any], phase: str) -> dict[str, str]:
    """What Serve is confirmed to serve: as the status last said, moved only by Serve's own word
    while a rollout is in flight, or, for the first config, what the active cluster was made with."""
    st = rayservice.get("status") or {}
    up_to_date = st.get("observedGeneration") == rayservice.get("metadata", {}).get("generation")
    served = dict(ctx.served)
    serve = ctx.serve
    if serve is not None:  # a rollout in flight: only Serve's own word moves what status says it serves
        deployed = serve.deployed
        same_kind = deployed is not None and (ONE in deployed) != ctx.multi  # modelUri vs models
        if serve.problem is None and serve.status == "RUNNING" and deployed is not None and same_kind:
            served = deployed
    elif not served and phase == "Ready" and up_to_date:
        # the first config: KubeRay makes a cluster active once Serve runs it
        served = _annotated(rayservice, ctx.multi)
    return served


def _upgrade(
    target: dict[str, str] | None, served: dict[str, str], ctx: ServiceContext, upgrading: bool
) -> tuple[str, str]:
    """The Upgrading condition's (reason, message)."""
    if target:
        return "ModelRollout", _rollout_message(target, served, ctx.serve, ctx.multi)
    if upgrading:
        return "UpgradeInProgress", "a new Ray cluster is being rolled out"
    return "UpToDate", "no rollout in progress"


def _annotated(rayservice: Mapping[str, Any], multi: bool) -> dict[str, str]:
    """What the RayService's serveConfigV2 serves, from the annotation rayship put beside it."""
    annotations = rayservice.get("metadata", {}).get("annotations") or {}
    if not multi:
        uri = annotations.get(names.ANNOTATION_MODEL)
        return {ONE: uri} if isinstance(uri, str) and uri else {}
    try:
        models = json.loads(annotations.get(names.ANNOTATION_MODELS) or "{}")
    except ValueError:
        return {}  # not rayship's writing: nothing is confirmed by it
    return {str(k): v for k, v in models.items() if isinstance(v, str)} if isinstance(models, dict) else {}


def _models_status(
    ctx: ServiceContext, current: Mapping[str, Any], served: dict[str, str], target: dict[str, str] | None
) -> dict[str, Any]:
    """status.models (every model named in the spec or still served, sorted by name: the URI Serve
    serves, the one rolling out, its PVC), modelCount, and no single-model fields."""
    stored = model_status_by_name(current)
    res = ctx.resolution
    wanted = set(res.each) if res else set()
    entries: list[dict[str, Any]] = []
    for name in sorted(wanted | set(served)):
        entry: dict[str, Any] = {"name": name}
        if name in served:
            entry["uri"] = served[name]
        if target is not None and name in target and target[name] != served.get(name):
            entry["targetURI"] = target[name]
        resolution = res.each.get(name) if res else None
        volume = (
            resolution.volume.wire()
            if resolution and resolution.volume
            else stored.get(name, {}).get("volume")
        )
        if volume:
            entry["volume"] = volume
        entries.append(entry)
    return {
        "models": entries,
        "modelCount": len(served),
        "modelURI": None,
        "targetModelURI": None,
        "modelVolume": None,
    }


def rolling_out(status: Mapping[str, Any]) -> bool:
    """Whether a status shows a model rollout in flight (the operator then asks Serve until it ends)."""
    if status.get("targetModelURI"):
        return True
    return any(isinstance(e, Mapping) and e.get("targetURI") for e in status.get("models") or [])


def _rollout_message(
    target: dict[str, str], served: dict[str, str], serve: ServeState | None, multi: bool
) -> str:
    def said(models: dict[str, str]) -> str:
        return describe(models if multi else models.get(ONE))

    message = f"rolling out {said(target)} (serving {said(served)})"
    if serve is None:
        return message
    if serve.problem is not None:
        return f"{message}; not confirmed by Serve yet: {serve.problem}"
    if serve.deployed == target:
        return f"{message}; Serve's application with it is {serve.status or 'starting'}"
    return f"{message}; Serve has not received it yet"


def _url(ctx: ServiceContext, rayservice_status: Mapping[str, Any]) -> str | None:
    """`<rayservice>-serve-svc`; under NewClusterWithIncrementalUpgrade KubeRay makes no such Service
    (traffic goes through `<rayservice>-gateway`), so the active cluster's own serve Service."""
    if ctx.url is None or not ctx.incremental:
        return ctx.url
    active = (rayservice_status.get("activeServiceStatus") or {}).get("rayClusterName")
    return ctx.url.replace(f"//{ctx.rayservice}-serve-svc.", f"//{active}-serve-svc.") if active else None


WARNING_PHASES = frozenset({"Failed", "Invalid", "Degraded"})


# Reasons a change was refused for good (an object of the name is someone else's): a Warning when said,
# whatever the phase does (a serving cluster serves on).
REFUSED_REASONS = frozenset({"SecretNameTaken", "WorkloadIdentityTaken", "NameTaken"})


def announce(current: Mapping[str, Any], desired: Mapping[str, Any]) -> list[Event]:
    """A Kubernetes Event for each phase transition, summarising every condition, and a Warning for a
    condition newly saying a change was refused."""
    before = {c.get("type"): (c.get("reason"), c.get("message")) for c in current.get("conditions") or []}
    refused = [
        Event("Warning", str(c["reason"]), str(c["message"]))
        for c in desired.get("conditions") or []
        if c.get("reason") in REFUSED_REASONS and before.get(c.get("type")) != (c["reason"], c["message"])
    ]
    phase = desired.get("phase")
    if phase == current.get("phase"):
        return refused
    notes = [
        f"{c['type']}={c['status']} ({c['reason']}: {c['message']})" for c in desired.get("conditions") or []
    ]
    return refused + [
        Event(
            "Warning" if phase in WARNING_PHASES else "Normal",
            str(phase),
            f"{phase}: " + "; ".join(notes),
        )
    ]
