"""Plan one reconcile of a ModelService: resolve, render, and decide what to create, patch or wait for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rayship import api
from rayship.api import names
from rayship.api.validation import SpecError, parse
from rayship.config import OperatorConfig
from rayship.controller.conditions import (
    Event,
    Plan,
    describe_foreign,
    ownership,
)
from rayship.controller.modelservice.context import ServiceContext
from rayship.controller.modelservice.rayservice import (
    Model,
    cluster_secrets,
    describe,
    desired_rayservice,
    model_annotation,
    network_policy,
    service_url,
)
from rayship.controller.modelservice.source import ONE, model_status_by_name, resolve, trainingjob_not_found


def served_models(current: Mapping[str, Any], multi: bool) -> dict[str, str]:
    """What the status as read says Serve serves: {ONE: modelURI}, or status.models' URIs by name."""
    if not multi:
        uri = current.get("modelURI")
        return {ONE: uri} if isinstance(uri, str) and uri else {}
    return {n: e["uri"] for n, e in model_status_by_name(current).items() if isinstance(e.get("uri"), str)}


# `Controller.plan` of this kind: the same signature as the other kind's (an intended parallel).
def plan(
    modelservice: Mapping[str, Any],
    rayservice: Mapping[str, Any] | None,
    trainingjobs: Sequence[Mapping[str, Any]],
    config: OperatorConfig,
) -> Plan:
    """The reconcile's plan; `trainingjobs` are those of the TrainingJobs and TrainingSchedules the
    service names (`referenced_trainingjobs`, `referenced_schedules`) that exist."""
    name = names.rayservice_name(modelservice["metadata"]["name"])
    current = modelservice.get("status") or {}
    try:
        ms = parse(modelservice, admitted=True)  # read from the API server
    except SpecError as err:
        return Plan(name, context=ServiceContext(None, "; ".join(err.problems), None, None))
    assert isinstance(ms, api.ModelService)
    by_name = {
        (str(obj.get("kind") or api.TRAINING_JOB.kind), str(obj.get("metadata", {}).get("name"))): obj
        for obj in trainingjobs
    }
    resolved = resolve(ms, by_name, current)
    desired_models = resolved.models
    multi = ms.spec.models is not None
    context = ServiceContext(
        resolved,
        None,
        service_url(ms),
        desired_models,
        rayservice=name,
        incremental=ms.spec.upgrade_strategy == "NewClusterWithIncrementalUpgrade",
        application=ms.metadata.name,
        served=served_models(current, multi),
        multi=multi,
        namespace=ms.metadata.namespace or "",
    )
    if desired_models is None:
        return Plan(name, context=context)
    model: Model = desired_models if multi else desired_models[ONE]
    desired = desired_rayservice(ms, config, model, resolved.volumes)
    if rayservice is not None and (how := ownership(rayservice, modelservice)) != "owned":
        blocked = describe_foreign(rayservice, "RayService", how)
        return Plan(name, context=replace(context, blocked=blocked))
    if rayservice is None:
        created = Event("Normal", "RayServiceCreated", f"created RayService {name} serving {describe(model)}")
        return Plan(
            name,
            create=desired,
            prerequisites=(*cluster_secrets(ms, config), *network_policy(ms, config)),
            on_create=created,
            context=context,
        )
    return _update(ms, rayservice, desired, model, context, config)


def missing_related(todo: Plan) -> api.Resource | None:
    """`Controller.missing`: TrainingJobs, when a TrainingJob the service names does not exist (the
    reconcile then tells `with_existing` those of the namespace)."""
    ctx = todo.context
    if isinstance(ctx, ServiceContext) and ctx.resolution is not None:
        if any(r.missing for r in ctx.resolution.each.values()):
            return api.TRAININGJOBS
    return None


def with_existing(todo: Plan, existing: Sequence[str]) -> Plan:
    """`Controller.existing`: the plan whose missing TrainingJobs are said with those that do exist in
    the namespace (`existing`), and the closest name."""
    ctx = todo.context
    if missing_related(todo) is None:
        return todo
    resolved = ctx.resolution
    each = {
        name: replace(r, message=trainingjob_not_found(r.missing, ctx.namespace, existing))
        if r.missing
        else r
        for name, r in resolved.each.items()
    }
    return replace(todo, context=replace(ctx, resolution=replace(resolved, each=each)))


def _update(
    ms: api.ModelService,
    rayservice: Mapping[str, Any],
    desired: dict[str, Any],
    model: Model,
    context: ServiceContext,
    config: OperatorConfig,
) -> Plan:
    """The plan for a RayService of ours: the model's serveConfigV2 patched in place (a Serve
    rollout), or, when the cluster config changed, the whole spec (a new cluster, per upgradeStrategy)."""
    name, multi = context.rayservice, context.multi
    applied = rayservice.get("metadata", {}).get("annotations") or {}
    wanted_hash = desired["metadata"]["annotations"][names.ANNOTATION_CLUSTER_HASH]
    spec: dict[str, Any] = {}
    annotations: dict[str, str] = {}
    if rayservice.get("spec", {}).get("serveConfigV2") != desired["spec"]["serveConfigV2"]:
        spec["serveConfigV2"] = desired["spec"]["serveConfigV2"]
        key, value = model_annotation(model)
        annotations[key] = value
    if applied.get(names.ANNOTATION_CLUSTER_HASH) != wanted_hash:
        spec.update({k: v for k, v in desired["spec"].items() if k != "serveConfigV2"})
        annotations[names.ANNOTATION_CLUSTER_HASH] = wanted_hash
    wanted_policy = desired["metadata"]["annotations"][names.ANNOTATION_NETWORK_POLICY]
    # Turned off (the chart's networkPolicy.enabled): policies already made are left as they are.
    policy_changed = wanted_policy != "off" and applied.get(names.ANNOTATION_NETWORK_POLICY) != wanted_policy
    if not spec and not policy_changed:
        return Plan(name, context=context)
    new_cluster = "rayClusterConfig" in spec
    prerequisites: tuple[dict[str, Any], ...] = ()
    if new_cluster:  # a new cluster needs its Secrets (a RayService made before there was one, too)
        prerequisites += cluster_secrets(ms, config)
    if policy_changed:  # made, or brought to the spec (k8s.ensure), before the patch records it
        annotations[names.ANNOTATION_NETWORK_POLICY] = wanted_policy
        prerequisites += tuple(network_policy(ms, config))
    if spec:
        what = "new cluster config" if new_cluster else ("new models" if multi else "new model")
        what += "" if new_cluster else " (in-place Serve rollout)"
        event = Event("Normal", "RayServiceUpdated", f"{what}: {describe(model)}")
    else:
        event = Event("Normal", "NetworkPolicyUpdated", "the Ray pods' NetworkPolicy brought to the spec")
    return Plan(
        name,
        patch={"metadata": {"annotations": annotations}, "spec": spec},
        prerequisites=prerequisites,
        on_patch=event,
        context=context,
    )
