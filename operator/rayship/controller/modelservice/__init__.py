"""ModelService: resolve the model, render the RayService, plan a reconcile, derive the status.
Pure: no I/O, no clock.

- The model comes from `spec.model.uri`, or from a TrainingJob's exported model once it Succeeded.
  A missing or failed TrainingJob is a condition, never a crash; a service that already resolved
  a model keeps serving it when its TrainingJob is deleted.
- The model URI is the only thing that changes when a new model rolls out, and it lives only in
  `serveConfigV2`: KubeRay applies such a change in place (a Serve rollout on the same cluster).
  Anything in `rayClusterConfig` changing means a new cluster, per `upgradeStrategy`.
- Status: one table maps the Serve application's state (and the RayService's Ready condition) to
  our phase.
"""

from __future__ import annotations

from rayship.controller.modelservice.context import ServeState, ServiceContext
from rayship.controller.modelservice.engines import (
    ENGINES,
    IMPORT_PATH,
    REMOTE_MODEL_SCHEMES,
    VLLM_IMPORT_PATH,
    Engine,
    Model,
    deployed_model_uri,
    engine_of,
    model_args,
    serve_args,
    serve_config,
    vllm_args,
)
from rayship.controller.modelservice.phase import (
    ANY,
    NO_MODELS_STATUS,
    SERVING_DEFAULT_MESSAGE,
    SERVING_TABLE,
    WARNING_PHASES,
    announce,
    application_status,
    rolling_out,
    serving_phase,
    starting_pods,
    status,
)
from rayship.controller.modelservice.planner import (
    missing_related,
    plan,
    served_models,
    with_existing,
)
from rayship.controller.modelservice.rayservice import (
    ModelVolumes,
    build_rayservice,
    cluster_hash,
    describe,
    desired_rayservice,
    env_secret,
    model_annotation,
    model_volumes,
    network_policy,
    ray_cluster_config,
    service_url,
)
from rayship.controller.modelservice.serve_probe import (
    SERVE_APPLICATIONS,
    heard,
    ray_token,
    serve_probe,
    serve_state,
    token_secret,
    token_secret_name,
)
from rayship.controller.modelservice.source import (
    KEPT_REASONS,
    ONE,
    Resolution,
    Resolved,
    referenced_schedules,
    referenced_trainingjobs,
    resolve,
    resolve_model,
    resolve_source,
    trainingjob_not_found,
)

__all__ = [
    "ENGINES",
    "Engine",
    "engine_of",
    "ServeState",
    "ServiceContext",
    "Resolution",
    "resolve_source",
    "resolve_model",
    "ONE",
    "KEPT_REASONS",
    "Resolved",
    "resolve",
    "referenced_schedules",
    "referenced_trainingjobs",
    "IMPORT_PATH",
    "VLLM_IMPORT_PATH",
    "REMOTE_MODEL_SCHEMES",
    "Model",
    "model_args",
    "serve_args",
    "vllm_args",
    "deployed_model_uri",
    "serve_config",
    "ModelVolumes",
    "model_volumes",
    "ray_cluster_config",
    "build_rayservice",
    "service_url",
    "cluster_hash",
    "model_annotation",
    "describe",
    "desired_rayservice",
    "env_secret",
    "network_policy",
    "ray_token",
    "token_secret",
    "token_secret_name",
    "ServeState",
    "SERVE_APPLICATIONS",
    "serve_probe",
    "serve_state",
    "heard",
    "ServiceContext",
    "served_models",
    "plan",
    "missing_related",
    "with_existing",
    "trainingjob_not_found",
    "ANY",
    "SERVING_TABLE",
    "SERVING_DEFAULT_MESSAGE",
    "application_status",
    "serving_phase",
    "starting_pods",
    "status",
    "NO_MODELS_STATUS",
    "rolling_out",
    "WARNING_PHASES",
    "announce",
]
