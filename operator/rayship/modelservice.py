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

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast

import yaml

from rayship import api, names, pods
from rayship.conditions import (
    Event,
    Plan,
    Probe,
    condition,
    describe_foreign,
    find,
    ownership,
    pod_problem,
)
from rayship.config import OperatorConfig
from rayship.validation import SpecError, parse
from rayship.yamlio import canonical_json

IMPORT_PATH = "rayship_workloads.serve:app_builder"
VLLM_IMPORT_PATH = "ray.serve.llm:build_openai_app"  # Ray Serve LLM's OpenAI-compatible application
REMOTE_MODEL_SCHEMES = ("s3://", "gs://", "abfss://", "azure://")  # what Ray Serve LLM mirrors itself

# --- resolve -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolution:
    uri: str | None  # the model to serve (None: nothing to serve yet)
    reason: str  # condition reason for ModelAvailable
    message: str
    volume: api.PvcStorage | None = None  # the PVC the model is read from (mounted read-only)


def _job_volume(trainingjob: Mapping[str, Any]) -> api.PvcStorage | None:
    """The checkpoint PVC of a TrainingJob, where its exported model lives."""
    pvc = ((trainingjob.get("spec") or {}).get("checkpoint") or {}).get("storage", {}).get("pvc")
    return api.PvcStorage.model_validate(pvc) if pvc else None


def _stored_volume(current: Mapping[str, Any]) -> api.PvcStorage | None:
    stored = current.get("modelVolume")
    return api.PvcStorage.model_validate(stored) if stored else None


def resolve_model(
    ms: api.ModelService, trainingjob: Mapping[str, Any] | None, current: Mapping[str, Any]
) -> Resolution:
    source = ms.spec.model
    if source.uri:
        volume = ms.spec.storage.pvc if ms.spec.storage else None
        return Resolution(source.uri, "ModelURI", f"serving {source.uri}", volume)
    ref = source.from_training_job
    assert ref is not None  # the API guarantees exactly one source
    served = current.get("modelURI")
    if trainingjob is None:
        if served:
            return Resolution(
                served,
                "TrainingJobDeleted",
                f"TrainingJob {ref.name} was deleted; still serving {served}",
                _stored_volume(current),
            )
        return Resolution(None, "TrainingJobNotFound", f"TrainingJob {ref.name} does not exist (yet)")
    tj_status = trainingjob.get("status") or {}
    phase = tj_status.get("phase") or "Pending"
    if phase != "Succeeded":
        reason = "TrainingJobFailed" if phase in ("Failed", "Invalid") else "TrainingJobNotSucceeded"
        if served:
            message = f"TrainingJob {ref.name} is {phase}; still serving {served}"
            return Resolution(served, reason, message, _stored_volume(current))
        return Resolution(None, reason, f"waiting for TrainingJob {ref.name} to succeed (it is {phase})")
    recipe = ((trainingjob.get("spec") or {}).get("trainer") or {}).get("recipe")
    if ms.spec.engine == "vllm" and recipe == "mlp":
        return Resolution(
            None,
            "NotALanguageModel",
            f"engine vllm serves causal language models; TrainingJob {ref.name} trains recipe mlp "
            "(serve it with engine: rayship)",
        )
    key = "model" if ref.checkpoint == "latest" else "bestModel"
    uri = (tj_status.get("checkpoint") or {}).get(key)
    if not uri:
        return Resolution(
            None,
            "NoExportedModel",
            f"TrainingJob {ref.name} succeeded but reports no status.checkpoint.{key}",
        )
    return Resolution(
        uri,
        "FromTrainingJob",
        f"serving the {ref.checkpoint} model of TrainingJob {ref.name}: {uri}",
        _job_volume(trainingjob),
    )


# --- render ------------------------------------------------------------------------------------


def serve_args(ms: api.ModelService, model_uri: str) -> dict[str, Any]:
    """The application's `args`: exactly what `rayship_workloads.serve.ServeArgs` accepts."""
    spec = ms.spec
    return {
        "modelUri": model_uri,
        "routePrefix": spec.route_prefix,
        "maxBatchSize": spec.batching.max_batch_size,
        "batchWaitTimeoutS": spec.batching.batch_wait_timeout_ms / 1000,
        "minReplicas": spec.replicas.min,
        "maxReplicas": spec.replicas.max,
        "targetOngoingRequests": spec.replicas.target_ongoing_requests,
        "numCpus": spec.resources.cpus,
        "numGpus": spec.resources.gpus,
    }


def max_ongoing_requests(max_batch_size: int, target_ongoing_requests: float) -> int:
    """Per-replica concurrency of the built-in server: room for a full batch in flight and the next one
    filling, and headroom over the autoscaling target. (At Ray's default of 5, excess requests back off
    in the proxy: unbatched, 16 clients got 56 req/s at 5 vs 282 req/s at 32 on a 2-core machine.)"""
    return max(2 * max_batch_size, 2 * math.ceil(target_ongoing_requests))


def _autoscaling(min_: int, max_: int, target: float, initial: int | None) -> dict[str, Any]:
    config: dict[str, Any] = {"min_replicas": min_, "max_replicas": max_, "target_ongoing_requests": target}
    if initial is not None:
        config["initial_replicas"] = initial
    return config


def _deployment(name: str, base: dict[str, Any], settings: api.DeploymentSettings | None) -> dict[str, Any]:
    """One serveConfigV2 `deployments[]` entry: `base`, then the ModelService's settings for it."""
    out: dict[str, Any] = {"name": name, **base}
    if settings is None:
        return out
    if settings.replicas is not None:
        out.pop("autoscaling_config", None)
        out["num_replicas"] = settings.replicas
    if (auto := settings.autoscaling) is not None:
        out["autoscaling_config"] = _autoscaling(
            auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests, auto.initial_replicas
        )
    if (actor := settings.ray_actor_options) is not None:
        given = {"num_cpus": actor.num_cpus, "num_gpus": actor.num_gpus}
        out["ray_actor_options"] = {
            **out.get("ray_actor_options", {}),
            **{k: v for k, v in given.items() if v is not None},
        }
    if settings.max_ongoing_requests is not None:
        out["max_ongoing_requests"] = settings.max_ongoing_requests
    return out


def vllm_args(ms: api.ModelService, model_uri: str) -> dict[str, Any]:
    """`build_openai_app`'s args (Ray's LLMServingArgs): one LLMConfig serving the model on vLLM, sized by
    spec.replicas and spec.resources. A cloud URI is mirrored by Ray Serve LLM itself (`bucket_uri`); a
    path is read where it is mounted."""
    spec = ms.spec
    vllm = spec.vllm or api.VllmSpec()
    engine: dict[str, Any] = {
        **vllm.engine_args,
        "tensor_parallel_size": vllm.tensor_parallel_size or spec.resources.gpus,
    }
    named = {"max_model_len": vllm.max_model_len, "gpu_memory_utilization": vllm.gpu_memory_utilization}
    engine.update({key: value for key, value in {**named, "dtype": vllm.dtype}.items() if value is not None})
    source: str | dict[str, str] = (
        {"bucket_uri": model_uri} if model_uri.startswith(REMOTE_MODEL_SCHEMES) else model_uri
    )
    replicas = spec.replicas
    llm_config = {
        "model_loading_config": {"model_id": vllm.model_id or ms.metadata.name, "model_source": source},
        "engine_kwargs": engine,
        "deployment_config": {
            "autoscaling_config": _autoscaling(
                replicas.min, replicas.max, replicas.target_ongoing_requests, replicas.initial
            )
        },
    }
    return {"llm_configs": [llm_config]}


def deployed_model_uri(args: Mapping[str, Any]) -> str | None:
    """The model URI in an application's deployed `args` (as `serve_config` wrote them), or None."""
    uri = args.get(api.APPLICATION_MODEL_ARG)
    if uri is None and isinstance(configs := args.get("llm_configs"), list) and configs:
        first = configs[0] if isinstance(configs[0], Mapping) else {}
        uri = (first.get("model_loading_config") or {}).get("model_source")
        if isinstance(uri, Mapping):
            uri = uri.get("bucket_uri")
    return uri if isinstance(uri, str) else None


def serve_config(ms: api.ModelService, model_uri: str) -> dict[str, Any]:
    """serveConfigV2 (Ray's ServeDeploySchema) with one application: the built-in model server, Ray Serve
    LLM's OpenAI app (engine: vllm), or the ModelService's own `application` (given the model's URI as
    args.modelUri)."""
    spec = ms.spec
    app: dict[str, Any] = {"name": ms.metadata.name, "route_prefix": spec.route_prefix}
    if spec.engine == "vllm":
        app.update(import_path=VLLM_IMPORT_PATH, args=vllm_args(ms, model_uri))
        return {"applications": [app]}
    own = spec.application
    if own is None:
        replicas = spec.replicas
        base = {
            "autoscaling_config": _autoscaling(
                replicas.min, replicas.max, replicas.target_ongoing_requests, replicas.initial
            ),
            "ray_actor_options": {"num_cpus": spec.resources.cpus, "num_gpus": spec.resources.gpus},
            "max_ongoing_requests": max_ongoing_requests(
                spec.batching.max_batch_size, replicas.target_ongoing_requests
            ),
        }
        settings = spec.deployments.get(names.SERVE_DEPLOYMENT)
        app.update(
            import_path=IMPORT_PATH,
            args=serve_args(ms, model_uri),
            deployments=[_deployment(names.SERVE_DEPLOYMENT, base, settings)],
        )
        return {"applications": [app]}
    app.update(import_path=own.import_path, args={**own.args, api.APPLICATION_MODEL_ARG: model_uri})
    if own.runtime_env is not None and (runtime_env := own.runtime_env.as_ray()):
        app["runtime_env"] = runtime_env
    if spec.deployments:
        app["deployments"] = [_deployment(name, {}, s) for name, s in sorted(spec.deployments.items())]
    return {"applications": [app]}


def ray_cluster_config(
    ms: api.ModelService, config: OperatorConfig, volume: api.PvcStorage | None = None
) -> dict[str, Any]:
    """The serving cluster; `volume` (the model's PVC) is mounted read-only on every Ray pod."""
    spec, res = ms.spec, ms.spec.resources
    volumes = pods.pvc_volume(names.MODEL_VOLUME, volume, read_only=True) if volume else ([], [])
    image = spec.image or config.default_image
    labels = names.labels("ModelService", ms.metadata.name, "serving")
    ref = pods.object_ref(ms.metadata)
    # The token lives in a Secret the operator makes (not KubeRay's own): the operator derives the same
    # token to read Serve's state from the dashboard, and never needs to read a Secret.
    auth = {"mode": "token", "secretName": names.ray_token_secret(names.rayservice_name(ms.metadata.name))}

    def env(gpus: int) -> list[dict[str, Any]]:
        return pods.container_env(ref, gpus, spec.env, names.ENV_MODELSERVICE)

    selector, tolerations = pods.gpu_placement(
        config, res.gpus, res.gpu_product, res.node_selector, res.tolerations
    )
    return {
        "rayVersion": spec.ray_version or config.default_ray_version,
        "enableInTreeAutoscaling": True,  # Serve autoscaling adds and removes GPU worker pods
        "authOptions": auth,
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0"},  # no replicas on the head: it runs the Serve controller
            "template": pods.pod_template(
                config,
                image=image,
                container=names.HEAD_CONTAINER,
                cpus=2,
                memory="8Gi",
                gpus=0,
                labels=labels,
                env=env(0),
                volumes=volumes,
            ),
        },
        "workerGroupSpecs": [
            {
                "groupName": names.SERVE_WORKER_GROUP,
                # one replica per pod: the pod count covers replicas.min..max (x resources.gpus GPUs)
                "replicas": spec.replicas.initial if spec.replicas.initial is not None else spec.replicas.min,
                "minReplicas": spec.replicas.min,
                "maxReplicas": spec.replicas.max,
                "rayStartParams": {},
                "template": pods.pod_template(
                    config,
                    image=image,
                    container=names.WORKER_CONTAINER,
                    cpus=res.cpus,
                    memory=res.memory,
                    gpus=res.gpus,
                    labels=labels,
                    env=env(res.gpus),
                    volumes=volumes,
                    node_selector=selector,
                    tolerations=tolerations,
                ),
            }
        ],
    }


def build_rayservice(
    ms: api.ModelService, config: OperatorConfig, model_uri: str, volume: api.PvcStorage | None = None
) -> dict[str, Any]:
    spec = ms.spec
    metadata: dict[str, Any] = {"name": names.rayservice_name(ms.metadata.name)}
    if ms.metadata.namespace:
        metadata["namespace"] = ms.metadata.namespace
    metadata["labels"] = names.labels("ModelService", ms.metadata.name, "serving")
    upgrade: dict[str, Any] = {"type": spec.upgrade_strategy}
    if spec.upgrade_options is not None:
        upgrade["clusterUpgradeOptions"] = spec.upgrade_options.wire()
    return {
        "apiVersion": pods.RAY_API_VERSION,
        "kind": "RayService",
        "metadata": metadata,
        "spec": {
            "upgradeStrategy": upgrade,
            "serveConfigV2": yaml.safe_dump(serve_config(ms, model_uri), sort_keys=True),
            "rayClusterConfig": ray_cluster_config(ms, config, volume),
        },
    }


def service_url(ms: api.ModelService) -> str:
    """Where the service answers inside the cluster (KubeRay's `<rayservice>-serve-svc`, port 8000)."""
    namespace = ms.metadata.namespace or "default"
    prefix = "" if ms.spec.route_prefix == "/" else ms.spec.route_prefix
    return f"http://{names.rayservice_name(ms.metadata.name)}-serve-svc.{namespace}.svc:8000{prefix}"


def cluster_hash(rayservice_spec: Mapping[str, Any]) -> str:
    """Hash of what needs a new cluster when it changes (everything but serveConfigV2)."""
    relevant = {k: v for k, v in rayservice_spec.items() if k != "serveConfigV2"}
    return hashlib.sha256(canonical_json(relevant).encode()).hexdigest()[:16]


def desired_rayservice(
    ms: api.ModelService, config: OperatorConfig, uri: str, volume: api.PvcStorage | None = None
) -> dict[str, Any]:
    rayservice = build_rayservice(ms, config, uri, volume)
    rayservice["metadata"]["annotations"] = {
        names.ANNOTATION_CLUSTER_HASH: cluster_hash(rayservice["spec"]),
        names.ANNOTATION_MODEL: uri,
    }
    return rayservice


# --- the Ray token: Serve's own state is read from the dashboard with it ------------------------


def ray_token(config: OperatorConfig, namespace: str, rayservice: str) -> str:
    """The Ray auth token of a RayService's clusters, derived from the operator's key (so the operator
    knows it again after a restart without reading any Secret)."""
    if config.ray_token_key is None:
        raise RuntimeError(
            "the operator has no Ray token key: it loads one at startup (RAYSHIP_RAY_TOKEN_KEY)"
        )
    key = config.ray_token_key.get_secret_value().encode()
    return hmac.new(key, f"ray-token/{namespace}/{rayservice}".encode(), hashlib.sha256).hexdigest()


def token_secret(ms: api.ModelService, config: OperatorConfig) -> dict[str, Any]:
    """The Secret `authOptions.secretName` names: KubeRay hands its token to every Ray pod."""
    namespace = ms.metadata.namespace or "default"
    rayservice = names.rayservice_name(ms.metadata.name)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": names.ray_token_secret(rayservice),
            "namespace": namespace,
            "labels": names.labels("ModelService", ms.metadata.name, "serving"),
        },
        "type": "Opaque",
        "stringData": {names.RAY_TOKEN_KEY: ray_token(config, namespace, rayservice)},
    }


@dataclass(frozen=True)
class ServeState:
    """Serve's own view of the application (from the dashboard's /api/serve/applications/)."""

    status: str = ""  # RUNNING, DEPLOYING, DEPLOY_FAILED, ...
    model_uri: str | None = None  # the model in the args Serve deploys (`deployed_model_uri`)
    problem: str | None = None  # why it could not be read


SERVE_APPLICATIONS = "api/serve/applications/"


def serve_probe(plan_: Plan, rayservice: Mapping[str, Any] | None, config: OperatorConfig) -> Probe | None:
    """Ask Serve itself while a model rollout is in flight (KubeRay's status cannot say which
    serveConfigV2 a RUNNING application runs: it reads the status before it submits a new one).
    None otherwise: no request at all in the steady state."""
    ctx = plan_.context
    if not isinstance(ctx, ServiceContext) or rayservice is None or ctx.blocked is not None:
        return None
    if ctx.desired_uri is None or ctx.desired_uri == ctx.served:
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
    return ServeState(str(found.get("status") or ""), uri)


def heard(plan_: Plan, code: int, body: str) -> Plan:
    """The plan with Serve's answer to `serve_probe` in its context (for `status`)."""
    ctx: ServiceContext = plan_.context
    app = ctx.application
    return replace(plan_, context=replace(ctx, serve=serve_state(app, code, body)))


# --- plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceContext:
    """What `status()` needs from the plan (the `context` of a ModelService `Plan`)."""

    resolution: Resolution | None
    invalid: str | None
    url: str | None
    desired_uri: str | None
    blocked: str | None = None  # a RayService of that name exists and is not ours
    rayservice: str = ""
    incremental: bool = False  # NewClusterWithIncrementalUpgrade: no `<rayservice>-serve-svc`
    application: str = ""  # the Serve application's name
    served: str | None = None  # status.modelURI as read (the model Serve was last confirmed to serve)
    serve: ServeState | None = None  # Serve's own answer, when it was asked (`serve_probe`)


def plan(
    modelservice: Mapping[str, Any],
    rayservice: Mapping[str, Any] | None,
    trainingjob: Mapping[str, Any] | None,
    config: OperatorConfig,
) -> Plan:
    """The reconcile's plan; `trainingjob` is the one `model.fromTrainingJob` names, if any."""
    name = names.rayservice_name(modelservice["metadata"]["name"])
    current = modelservice.get("status") or {}
    try:
        ms = parse(modelservice, admitted=True)  # read from the API server
    except SpecError as err:
        return Plan(name, context=ServiceContext(None, "; ".join(err.problems), None, None))
    assert isinstance(ms, api.ModelService)
    resolution = resolve_model(ms, trainingjob, current)
    url = service_url(ms)
    incremental = ms.spec.upgrade_strategy == "NewClusterWithIncrementalUpgrade"
    context = ServiceContext(
        resolution,
        None,
        url,
        resolution.uri,
        None,
        name,
        incremental,
        ms.metadata.name,
        current.get("modelURI"),
    )
    if resolution.uri is None:
        return Plan(name, context=context)
    desired = desired_rayservice(ms, config, resolution.uri, resolution.volume)
    if rayservice is not None and (how := ownership(rayservice, modelservice)) != "owned":
        blocked = describe_foreign(rayservice, "RayService", how)
        return Plan(name, context=replace(context, blocked=blocked))
    if rayservice is None:
        created = Event("Normal", "RayServiceCreated", f"created RayService {name} serving {resolution.uri}")
        return Plan(
            name,
            create=desired,
            prerequisites=(token_secret(ms, config),),
            on_create=created,
            context=context,
        )
    applied = rayservice.get("metadata", {}).get("annotations") or {}
    wanted_hash = desired["metadata"]["annotations"][names.ANNOTATION_CLUSTER_HASH]
    spec: dict[str, Any] = {}
    annotations: dict[str, str] = {}
    if rayservice.get("spec", {}).get("serveConfigV2") != desired["spec"]["serveConfigV2"]:
        spec["serveConfigV2"] = desired["spec"]["serveConfigV2"]
        annotations[names.ANNOTATION_MODEL] = resolution.uri
    if applied.get(names.ANNOTATION_CLUSTER_HASH) != wanted_hash:
        spec.update({k: v for k, v in desired["spec"].items() if k != "serveConfigV2"})
        annotations[names.ANNOTATION_CLUSTER_HASH] = wanted_hash
    if not spec:
        return Plan(name, context=context)
    new_cluster = "rayClusterConfig" in spec
    what = "new cluster config" if new_cluster else "new model (in-place Serve rollout)"
    return Plan(
        name,
        patch={"metadata": {"annotations": annotations}, "spec": spec},
        # a new cluster needs its token Secret (a RayService made before there was one, too)
        prerequisites=(token_secret(ms, config),) if new_cluster else (),
        on_patch=Event("Normal", "RayServiceUpdated", f"{what}: {resolution.uri}"),
        context=context,
    )


# --- status ------------------------------------------------------------------------------------

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


def status(
    modelservice: Mapping[str, Any],
    rayservice: Mapping[str, Any] | None,
    plan_: Plan,
    pods: list[dict[str, Any]],
    now: datetime,
) -> dict[str, Any]:
    """The operator-owned status, once the plan was carried out and `rayservice` is what the server
    holds; `pods` are the Ray pods of a cluster being prepared (why one cannot start is said)."""
    ctx: ServiceContext = plan_.context
    current = modelservice.get("status") or {}
    generation = modelservice["metadata"].get("generation", 0)
    app = modelservice["metadata"]["name"]

    def cond(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return condition(current, type_, ok, reason, message, generation, now)

    invalid = ctx.invalid
    if plan_.rejected is not None and plan_.rejected[0] == "Invalid":
        invalid = f"{plan_.rejected[1]}: {plan_.rejected[2]}"
    if invalid is not None and rayservice is None:
        return {
            "phase": "Invalid",
            "observedGeneration": generation,
            "conditions": [cond("Valid", False, "InvalidSpec", invalid)],
        }
    if ctx.blocked is not None:
        rayservice = None  # not ours: its state says nothing about this ModelService
    conditions = [
        cond(
            "Valid",
            ctx.invalid is None,
            "InvalidSpec" if ctx.invalid else "SpecValid",
            ctx.invalid or "the spec is valid",
        )
    ]
    res = ctx.resolution
    if res is not None:
        conditions.append(cond("ModelAvailable", res.uri is not None, res.reason, res.message))
    out: dict[str, Any] = {"observedGeneration": generation, "rayServiceName": plan_.child_name}
    volume = res.volume.wire() if res and res.volume else current.get("modelVolume")
    if volume:
        out["modelVolume"] = volume
    if rayservice is None:
        phase = "WaitingForModel" if ctx.desired_uri is None else "Deploying"
        reason, message = (res.reason, res.message) if res else ("Waiting", "")
        if plan_.rejected is not None:
            phase, reason, message = plan_.rejected
        elif ctx.blocked is not None:
            reason, message = "RayServiceNameTaken", ctx.blocked
        conditions.append(cond("Ready", False, reason, message))
        out.update(phase=phase, conditions=conditions, serveEndpoints=0)
        return out
    phase, reason, message = serving_phase(rayservice, app)
    stuck = pod_problem(pods)
    if phase == "Deploying" and stuck is not None:
        reason, message = stuck[0], f"{message}: {stuck[1]}"
    st = rayservice.get("status") or {}
    up_to_date = st.get("observedGeneration") == rayservice.get("metadata", {}).get("generation")
    deployed_uri = (rayservice.get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_MODEL)
    served = current.get("modelURI")
    serve = ctx.serve
    if serve is not None:  # a rollout in flight: only Serve's own word moves modelURI
        if serve.problem is None and serve.status == "RUNNING" and serve.model_uri:
            served = serve.model_uri
    elif served is None and phase == "Ready" and up_to_date:
        served = deployed_uri  # the first config: KubeRay makes a cluster active once Serve runs it
    target = ctx.desired_uri if ctx.desired_uri and ctx.desired_uri != served else None
    upgrading = find(st, "UpgradeInProgress").get("status") == "True" or target is not None
    conditions.append(cond("Ready", phase == "Ready", reason, message))
    conditions.append(
        cond(
            "Upgrading",
            upgrading,
            "ModelRollout" if target else ("UpgradeInProgress" if upgrading else "UpToDate"),
            _rollout_message(target, served, serve)
            if target
            else ("a new Ray cluster is being rolled out" if upgrading else "no rollout in progress"),
        )
    )
    out.update(
        phase=phase,
        conditions=conditions,
        # KubeRay counts Ray pods whose Serve proxy is ready; it reports no replica count.
        serveEndpoints=int(st.get("numServeEndpoints") or 0),
        modelURI=served,
        targetModelURI=target,
        url=_url(ctx, st) if phase in ("Ready", "Degraded") else current.get("url"),
    )
    return out


def _rollout_message(target: str, served: str | None, serve: ServeState | None) -> str:
    message = f"rolling out {target} (serving {served})"
    if serve is None:
        return message
    if serve.problem is not None:
        return f"{message}; not confirmed by Serve yet: {serve.problem}"
    if serve.model_uri == target:
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


def announce(current: Mapping[str, Any], desired: Mapping[str, Any]) -> list[Event]:
    """A Kubernetes Event for each phase transition, summarising every condition."""
    phase = desired.get("phase")
    if phase == current.get("phase"):
        return []
    notes = [
        f"{c['type']}={c['status']} ({c['reason']}: {c['message']})" for c in desired.get("conditions") or []
    ]
    return [
        Event(
            "Warning" if phase in WARNING_PHASES else "Normal",
            str(phase),
            f"{phase}: " + "; ".join(notes),
        )
    ]
