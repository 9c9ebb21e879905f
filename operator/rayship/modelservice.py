"""ModelService, pure: resolve the model, plan the RayService, derive the status. No I/O.

- The model comes from `spec.model.uri`, or from a TrainingJob's exported model once it Succeeded.
  A missing or failed TrainingJob is a condition, never a crash; a service that already resolved
  a model keeps serving it when its TrainingJob is deleted.
- A new model changes only `serveConfigV2` (an in-place Serve rollout); a changed cluster config
  is patched too and KubeRay rolls it out per `upgradeStrategy`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rayship import api, names, render, render_service
from rayship.config import OperatorConfig
from rayship.status import condition
from rayship.validation import SpecError, parse

ANNOTATION_CLUSTER_HASH = f"{api.GROUP}/cluster-config-hash"
ANNOTATION_MODEL = f"{api.GROUP}/model-uri"


@dataclass(frozen=True)
class Resolution:
    uri: str | None  # the model to serve (None: nothing to serve yet)
    reason: str  # condition reason for ModelAvailable
    message: str


def resolve_model(
    ms: api.ModelService, trainingjob: Mapping[str, Any] | None, current: Mapping[str, Any]
) -> Resolution:
    source = ms.spec.model
    if source.uri:
        return Resolution(source.uri, "ModelURI", f"serving {source.uri}")
    ref = source.from_training_job
    assert ref is not None  # the API guarantees exactly one source
    served = current.get("modelURI")
    if trainingjob is None:
        if served:
            return Resolution(
                served, "TrainingJobDeleted", f"TrainingJob {ref.name} was deleted; still serving {served}"
            )
        return Resolution(None, "TrainingJobNotFound", f"TrainingJob {ref.name} does not exist (yet)")
    tj_status = trainingjob.get("status") or {}
    phase = tj_status.get("phase") or "Pending"
    if phase != "Succeeded":
        reason = "TrainingJobFailed" if phase in ("Failed", "Invalid") else "TrainingJobNotSucceeded"
        if served:
            return Resolution(served, reason, f"TrainingJob {ref.name} is {phase}; still serving {served}")
        return Resolution(None, reason, f"waiting for TrainingJob {ref.name} to succeed (it is {phase})")
    key = "model" if ref.checkpoint == "latest" else "bestModel"
    uri = (tj_status.get("checkpoint") or {}).get(key)
    if not uri:
        return Resolution(
            None,
            "NoExportedModel",
            f"TrainingJob {ref.name} succeeded but reports no status.checkpoint.{key}",
        )
    return Resolution(
        uri, "FromTrainingJob", f"serving the {ref.checkpoint} model of TrainingJob {ref.name}: {uri}"
    )


def cluster_hash(rayservice_spec: Mapping[str, Any]) -> str:
    """Hash of what needs a new cluster when it changes (everything but serveConfigV2)."""
    relevant = {k: v for k, v in rayservice_spec.items() if k != "serveConfigV2"}
    return hashlib.sha256(render.canonical_json(relevant).encode()).hexdigest()[:16]


def desired_rayservice(ms: api.ModelService, config: OperatorConfig, uri: str) -> dict[str, Any]:
    rayservice = render_service.build_rayservice(ms, config, uri)
    rayservice["metadata"]["annotations"] = {
        ANNOTATION_CLUSTER_HASH: cluster_hash(rayservice["spec"]),
        ANNOTATION_MODEL: uri,
    }
    return rayservice


@dataclass(frozen=True)
class ServicePlan:
    rayservice_name: str
    create: dict[str, Any] | None
    patch: dict[str, Any] | None
    resolution: Resolution | None
    invalid: str | None
    url: str | None
    desired_uri: str | None


def plan(
    modelservice: Mapping[str, Any],
    rayservice: Mapping[str, Any] | None,
    trainingjob: Mapping[str, Any] | None,
    config: OperatorConfig,
) -> ServicePlan:
    name = names.rayservice_name(modelservice["metadata"]["name"])
    current = modelservice.get("status") or {}
    try:
        ms = parse(modelservice)
    except SpecError as err:
        return ServicePlan(name, None, None, None, "; ".join(err.problems), None, None)
    assert isinstance(ms, api.ModelService)
    resolution = resolve_model(ms, trainingjob, current)
    url = render_service.service_url(ms)
    if resolution.uri is None:
        return ServicePlan(name, None, None, resolution, None, url, None)
    desired = desired_rayservice(ms, config, resolution.uri)
    if rayservice is None:
        return ServicePlan(name, desired, None, resolution, None, url, resolution.uri)
    applied = rayservice.get("metadata", {}).get("annotations") or {}
    patch: dict[str, Any] = {}
    if rayservice.get("spec", {}).get("serveConfigV2") != desired["spec"]["serveConfigV2"]:
        patch.setdefault("spec", {})["serveConfigV2"] = desired["spec"]["serveConfigV2"]
        patch.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_MODEL] = resolution.uri
    if applied.get(ANNOTATION_CLUSTER_HASH) != desired["metadata"]["annotations"][ANNOTATION_CLUSTER_HASH]:
        patch.setdefault("spec", {}).update(
            {k: v for k, v in desired["spec"].items() if k != "serveConfigV2"}
        )
        patch.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_CLUSTER_HASH] = desired[
            "metadata"
        ]["annotations"][ANNOTATION_CLUSTER_HASH]
    return ServicePlan(name, None, patch or None, resolution, None, url, resolution.uri)


# --- status ------------------------------------------------------------------------------------


def _k8s_condition(rayservice: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    conditions = (rayservice.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), {})


def serving_phase(rayservice: Mapping[str, Any], app: str) -> tuple[str, str, str]:
    """(phase, reason, message) from a RayService's conditions and its application's status."""
    st = rayservice.get("status") or {}
    ready = _k8s_condition(rayservice, "Ready").get("status") == "True"
    apps = (st.get("activeServiceStatus") or {}).get("applicationStatuses") or {}
    app_status = (apps.get(app) or {}).get("status", "")
    app_message = (apps.get(app) or {}).get("message", "")
    if app_status == "DEPLOY_FAILED":
        return "Failed", "DeployFailed", app_message or "the Serve application failed to deploy"
    if app_status == "UNHEALTHY":
        return "Degraded", "Unhealthy", app_message or "the Serve application is unhealthy"
    if ready and app_status == "RUNNING":
        return "Ready", "Ready", "the Serve application is running"
    reason = _k8s_condition(rayservice, "Ready").get("reason") or "Deploying"
    return "Deploying", reason, f"the Serve application is {app_status or 'starting'}"


def derive(
    modelservice: Mapping[str, Any], rayservice: Mapping[str, Any] | None, plan_: ServicePlan, now: datetime
) -> dict[str, Any]:
    current = modelservice.get("status") or {}
    generation = modelservice["metadata"].get("generation", 0)
    app = modelservice["metadata"]["name"]
    cond = lambda *a: condition(current, *a, generation, now)  # noqa: E731
    if plan_.invalid is not None and rayservice is None:
        return {
            "phase": "Invalid",
            "observedGeneration": generation,
            "conditions": [cond("Valid", False, "InvalidSpec", plan_.invalid)],
        }
    conditions = [
        cond(
            "Valid",
            plan_.invalid is None,
            "InvalidSpec" if plan_.invalid else "SpecValid",
            plan_.invalid or "the spec is valid",
        )
    ]
    res = plan_.resolution
    if res is not None:
        conditions.append(cond("ModelAvailable", res.uri is not None, res.reason, res.message))
    out: dict[str, Any] = {"observedGeneration": generation, "rayServiceName": plan_.rayservice_name}
    if rayservice is None:
        phase = "WaitingForModel" if plan_.desired_uri is None else "Deploying"
        reason = res.reason if res else "Waiting"
        conditions.append(cond("Ready", False, reason, res.message if res else ""))
        out.update(phase=phase, conditions=conditions, readyReplicas=0)
        return out
    phase, reason, message = serving_phase(rayservice, app)
    st = rayservice.get("status") or {}
    up_to_date = st.get("observedGeneration") == rayservice.get("metadata", {}).get("generation")
    deployed_uri = (rayservice.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_MODEL)
    served = current.get("modelURI")
    if phase == "Ready" and up_to_date:
        served = deployed_uri  # the Serve rollout of the latest serveConfigV2 completed
    elif served is None and phase == "Ready":
        served = deployed_uri
    target = plan_.desired_uri if plan_.desired_uri and plan_.desired_uri != served else None
    upgrading = _k8s_condition(rayservice, "UpgradeInProgress").get("status") == "True" or target is not None
    conditions.append(cond("Ready", phase == "Ready", reason, message))
    conditions.append(
        cond(
            "Upgrading",
            upgrading,
            "ModelRollout" if target else ("UpgradeInProgress" if upgrading else "UpToDate"),
            f"rolling out {target} (serving {served})"
            if target
            else ("a new Ray cluster is being rolled out" if upgrading else "no rollout in progress"),
        )
    )
    out.update(
        phase=phase,
        conditions=conditions,
        readyReplicas=int(st.get("numServeEndpoints") or 0),
        modelURI=served,
        targetModelURI=target,
        url=plan_.url if phase in ("Ready", "Degraded") else current.get("url"),
    )
    return out
