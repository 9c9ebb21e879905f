"""Serve's own state, read from the head's dashboard with the cluster's Ray token: the token Secret rayship
owns, the probe a plan asks for, and what an answer means."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from rayship import api
from rayship.api import names
from rayship.config import OperatorConfig
from rayship.controller import pods
from rayship.controller.conditions import (
    Plan,
    Probe,
)
from rayship.controller.modelservice.context import ServeState, ServiceContext
from rayship.controller.modelservice.engines import deployed_model_uri


def ray_token(config: OperatorConfig, namespace: str, rayservice: str) -> str:
    """The Ray auth token of a RayService's clusters, derived from the operator's key (so the operator
    knows it again after a restart without reading any Secret)."""
    if config.ray_token_key is None:
        raise RuntimeError(
            "the operator has no Ray token key: it loads one at startup (RAYSHIP_RAY_TOKEN_KEY)"
        )
    key = config.ray_token_key.get_secret_value().encode()
    return hmac.new(key, f"ray-token/{namespace}/{rayservice}".encode(), hashlib.sha256).hexdigest()


def token_secret_name(ms: api.ModelService, config: OperatorConfig) -> str:
    """The name of the token Secret: `<rayservice>-ray-token-<tag>`, the tag derived from the operator's
    key and the ModelService's UID. Nobody can make a Secret of that name before the operator does, and
    one planted once the name shows in the RayService is never claimed (k8s.ensure): it would have handed
    its token, known to whoever planted it, to every Ray pod and so the dashboard's job API (arbitrary
    code in the cluster)."""
    tag = pods.secret_tag(config, "ray-token-secret", ms.metadata)
    return names.ray_token_secret(names.rayservice_name(ms.metadata.name), tag)


def token_secret(ms: api.ModelService, config: OperatorConfig) -> dict[str, Any]:
    """The Secret `authOptions.secretName` names: KubeRay hands its token to every Ray pod."""
    namespace = ms.metadata.namespace or "default"
    rayservice = names.rayservice_name(ms.metadata.name)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": token_secret_name(ms, config),
            "namespace": namespace,
            "labels": names.labels("ModelService", ms.metadata.name, "serving"),
        },
        "type": "Opaque",
        "stringData": {names.RAY_TOKEN_KEY: ray_token(config, namespace, rayservice)},
    }


SERVE_APPLICATIONS = "api/serve/applications/"


def serve_probe(plan_: Plan, rayservice: Mapping[str, Any] | None, config: OperatorConfig) -> Probe | None:
    """Ask Serve itself while a model rollout is in flight (KubeRay's status cannot say which
    serveConfigV2 a RUNNING application runs: it reads the status before it submits a new one).
    None otherwise: no request at all in the steady state."""
    ctx = plan_.context
    if not isinstance(ctx, ServiceContext) or rayservice is None or ctx.blocked is not None:
        return None
    if ctx.desired is None or ctx.desired == ctx.served:
        return None
    active = ((rayservice.get("status") or {}).get("activeServiceStatus") or {}).get("rayClusterName")
    if not active:  # a first deployment: KubeRay makes the cluster active once Serve runs its config
        return None
    namespace = rayservice.get("metadata", {}).get("namespace") or "default"
    return Probe(
        f"{plan_.child_name}-head-svc:{names.DASHBOARD_PORT}",
        SERVE_APPLICATIONS,
        ray_token(config, namespace, plan_.child_name),
    )


def serve_state(app: str, code: int, body: str) -> ServeState:
    """Parse the dashboard's answer (HTTP `code`, `body`) for application `app`."""
    if code in (401, 403):
        return ServeState(
            problem=f"the Ray dashboard refused the operator's token (HTTP {code}): was the Secret in "
            "authOptions.secretName made by someone else?"
        )
    if code != 200:
        first = (body.strip().splitlines() or [""])[0][:200]
        return ServeState(problem=f"the Ray dashboard could not be asked (HTTP {code}): {first}")
    try:
        found = (json.loads(body).get("applications") or {}).get(app)
    except (ValueError, AttributeError) as err:
        return ServeState(problem=f"the Ray dashboard answered something else than Serve's state: {err}")
    if not isinstance(found, dict):
        return ServeState(problem=f"Serve has no application {app}")
    args = (found.get("deployed_app_config") or {}).get("args") or {}
    uri = deployed_model_uri(args) if isinstance(args, Mapping) else None
    given = args.get(api.APPLICATION_MODELS_ARG) if isinstance(args, Mapping) else None
    models = {str(k): v for k, v in given.items() if isinstance(v, str)} if isinstance(given, dict) else None
    return ServeState(str(found.get("status") or ""), uri, models=models)


def heard(plan_: Plan, code: int, body: str) -> Plan:
    """The plan with Serve's answer to `serve_probe` in its context (for `status`)."""
    ctx: ServiceContext = plan_.context
    app = ctx.application
    return replace(plan_, context=replace(ctx, serve=serve_state(app, code, body)))
