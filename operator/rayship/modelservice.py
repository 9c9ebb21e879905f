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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, cast

import yaml

from rayship import api, pods
from rayship.api import names
from rayship.api.validation import SpecError, parse
from rayship.api.yamlio import canonical_json
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


def resolve_source(
    source: api.ModelSource,
    trainingjob: Mapping[str, Any] | None,
    served: str | None,
    served_volume: api.PvcStorage | None,
    storage: api.PvcStorage | None,
    *,
    engine: str = "rayship",
) -> Resolution:
    """One model: its `uri` (read from `storage`, if any), or its TrainingJob's export; `served` (and
    `served_volume`) is the URI Serve was last confirmed to serve for it, kept while the job cannot
    give one. `engine` vllm takes only language models."""
    if source.uri:
        return Resolution(source.uri, "ModelURI", f"serving {source.uri}", storage)
    ref = source.from_training_job
    assert ref is not None  # the API guarantees exactly one source
    if trainingjob is None:
        if served:
            return Resolution(
                served,
                "TrainingJobDeleted",
                f"TrainingJob {ref.name} was deleted; still serving {served}",
                served_volume,
            )
        return Resolution(None, "TrainingJobNotFound", f"TrainingJob {ref.name} does not exist (yet)")
    tj_status = trainingjob.get("status") or {}
    phase = tj_status.get("phase") or "Pending"
    if phase != "Succeeded":
        reason = "TrainingJobFailed" if phase in ("Failed", "Invalid") else "TrainingJobNotSucceeded"
        if served:
            message = f"TrainingJob {ref.name} is {phase}; still serving {served}"
            return Resolution(served, reason, message, served_volume)
        return Resolution(None, reason, f"waiting for TrainingJob {ref.name} to succeed (it is {phase})")
    recipe = ((trainingjob.get("spec") or {}).get("trainer") or {}).get("recipe")
    if engine == "vllm" and recipe == "mlp":
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


def resolve_model(
    ms: api.ModelService, trainingjob: Mapping[str, Any] | None, current: Mapping[str, Any]
) -> Resolution:
    """`spec.model`, given the TrainingJob it names (if any) and the status as read."""
    assert ms.spec.model is not None
    storage = ms.spec.storage.pvc if ms.spec.storage else None
    return resolve_source(
        ms.spec.model,
        trainingjob,
        current.get("modelURI"),
        _stored_volume(current),
        storage,
        engine=ms.spec.engine,
    )


ONE = ""  # the key of spec.model's URI among a service's models (spec.models names are never empty)
KEPT_REASONS = ("ModelURI", "FromTrainingJob")  # a model resolved with nothing to report


@dataclass(frozen=True)
class Resolved:
    """Every model of a service (`spec.model` as ONE, or each of `spec.models` by name) resolved, or
    why not. The service deploys only when all are (one model still waiting holds the whole config)."""

    each: dict[str, Resolution]
    clash: str | None = None  # two models' PVCs cannot be mounted together

    @property
    def models(self) -> dict[str, str] | None:
        """name -> URI of every model, or None while any is not resolved."""
        if self.clash is not None or any(r.uri is None for r in self.each.values()):
            return None
        return {name: cast(str, r.uri) for name, r in sorted(self.each.items())}

    @property
    def volumes(self) -> tuple[api.PvcStorage, ...]:
        """The models' PVCs, each once, in a stable order (mounted read-only on every Ray pod)."""
        found = {(v.claim_name, v.mount_path): v for r in self.each.values() if (v := r.volume) is not None}
        return tuple(found[key] for key in sorted(found))

    @property
    def reason(self) -> str:
        if self.clash is not None:
            return "ModelVolumesClash"
        if ONE in self.each:
            return self.each[ONE].reason
        waiting = [r for _, r in sorted(self.each.items()) if r.uri is None]
        if waiting:
            return waiting[0].reason
        noted = [r.reason for _, r in sorted(self.each.items()) if r.reason not in KEPT_REASONS]
        return noted[0] if noted else "ModelsResolved"

    @property
    def message(self) -> str:
        if self.clash is not None:
            return self.clash
        if ONE in self.each:
            return self.each[ONE].message
        items = sorted(self.each.items())
        said = "; ".join(f"model {name}: {r.message}" for name, r in items)
        waiting = [name for name, r in items if r.uri is None]
        if waiting:
            return f"waiting for {', '.join(waiting)} (nothing changes until every model resolves): {said}"
        return said


def _volume_clash(each: Mapping[str, Resolution]) -> str | None:
    """Two models read from different PVCs mounted at the same path cannot be served together."""
    at: dict[str, tuple[str, str]] = {}
    for name, r in sorted(each.items()):
        if r.volume is None:
            continue
        seen = at.setdefault(r.volume.mount_path, (name, r.volume.claim_name))
        if seen[1] != r.volume.claim_name:
            return (
                f"models {seen[0]} and {name} are on PVCs {seen[1]} and {r.volume.claim_name}, both mounted "
                f"at {r.volume.mount_path}: give their TrainingJobs different checkpoint.storage.pvc.mountPath"
            )
    return None


def _served_models(current: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """status.models as read, by name."""
    entries = current.get("models") or []
    return {e["name"]: e for e in entries if isinstance(e, Mapping) and isinstance(e.get("name"), str)}


def resolve(
    ms: api.ModelService, trainingjobs: Mapping[str, Mapping[str, Any]], current: Mapping[str, Any]
) -> Resolved:
    """Every model of the service; `trainingjobs` are the TrainingJobs it names that exist, by name."""

    def job(source: api.ModelSource) -> Mapping[str, Any] | None:
        ref = source.from_training_job
        return trainingjobs.get(ref.name) if ref is not None else None

    if ms.spec.models is None:
        assert ms.spec.model is not None  # the API guarantees exactly one of model and models
        return Resolved({ONE: resolve_model(ms, job(ms.spec.model), current)})
    storage = ms.spec.storage.pvc if ms.spec.storage else None
    served = _served_models(current)
    each: dict[str, Resolution] = {}
    for name, source in sorted(ms.spec.models.items()):
        entry = served.get(name) or {}
        volume = api.PvcStorage.model_validate(entry["volume"]) if entry.get("volume") else None
        each[name] = resolve_source(source, job(source), entry.get("uri"), volume, storage)
    return Resolved(each, _volume_clash(each))


def referenced_trainingjobs(ms: Mapping[str, Any]) -> list[str]:
    """The TrainingJobs (same namespace) whose models a ModelService document serves, sorted: from
    `spec.model.fromTrainingJob` or each `spec.models.<name>.fromTrainingJob`."""
    spec = ms.get("spec") or {}
    sources = [spec.get("model")] + list((spec.get("models") or {}).values())
    found = {
        ref.get("name")
        for source in sources
        if isinstance(source, Mapping) and isinstance(ref := source.get("fromTrainingJob"), Mapping)
    }
    return sorted(n for n in found if isinstance(n, str))


# --- render ------------------------------------------------------------------------------------


Model = str | Mapping[str, str]  # what a service serves: one URI (spec.model), or name -> URI (spec.models)


def model_args(ms: api.ModelService, model: Model) -> dict[str, Any]:
    """The resolved model(s) as the application gets them: `modelUri`, or `models` (name -> URI)."""
    if ms.spec.models is None:
        if not isinstance(model, str):
            raise TypeError("a spec.model service serves one model URI")
        return {api.APPLICATION_MODEL_ARG: model}
    if isinstance(model, str) or set(model) != set(ms.spec.models):
        raise TypeError(f"a spec.models service serves a URI for each of {sorted(ms.spec.models)}")
    return {api.APPLICATION_MODELS_ARG: dict(sorted(model.items()))}


def serve_args(ms: api.ModelService, model: Model) -> dict[str, Any]:
    """The application's `args`, built through the contract's `ServeArgs` that the server reads them with."""
    spec = ms.spec
    multiplexing = (
        {"modelCacheSize": spec.model_cache_size or api.DEFAULT_MODEL_CACHE_SIZE}
        if spec.models
        else {"modelName": ms.metadata.name}  # the one model's name in OpenAI requests and /v1/models
    )
    args = api.ServeArgs.model_validate(
        {
            **model_args(ms, model),
            **multiplexing,
            "routePrefix": spec.route_prefix,
            "maxBatchSize": spec.batching.max_batch_size,
            "batchWaitTimeoutS": spec.batching.batch_wait_timeout_ms / 1000,
            "minReplicas": spec.replicas.min,
            "maxReplicas": spec.replicas.max,
            "targetOngoingRequests": spec.replicas.target_ongoing_requests,
            "numCpus": spec.resources.cpus,
            "numGpus": spec.resources.gpus,
            "maxRequestBytes": spec.request_limits.max_request_bytes,
            "maxRowsPerRequest": spec.request_limits.max_rows_per_request,
        }
    )
    return args.model_dump(by_alias=True, exclude_unset=True)


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


def serve_config(ms: api.ModelService, model: Model) -> dict[str, Any]:
    """serveConfigV2 (Ray's ServeDeploySchema) with one application: the built-in model server, Ray Serve
    LLM's OpenAI app (engine: vllm, one model), or the ModelService's own `application` (given the
    model's URI as args.modelUri; with spec.models, the models as args.models, name -> URI)."""
    spec = ms.spec
    app: dict[str, Any] = {"name": ms.metadata.name, "route_prefix": spec.route_prefix}
    if spec.engine == "vllm":
        if not isinstance(model, str):  # the API refuses engine vllm with spec.models
            raise ValueError("engine vllm serves one model (spec.model)")
        app.update(import_path=VLLM_IMPORT_PATH, args=vllm_args(ms, model))
        return {"applications": [app]}
    own = spec.application
    if own is None:
        replicas = spec.replicas
        base = {
            "autoscaling_config": _autoscaling(
                replicas.min, replicas.max, replicas.target_ongoing_requests, replicas.initial
            ),
            "ray_actor_options": {"num_cpus": spec.resources.cpus, "num_gpus": spec.resources.gpus},
            "max_ongoing_requests": api.max_ongoing_requests(
                spec.batching.max_batch_size, replicas.target_ongoing_requests
            ),
        }
        settings = spec.deployments.get(names.SERVE_DEPLOYMENT)
        app.update(
            import_path=IMPORT_PATH,
            args=serve_args(ms, model),
            deployments=[_deployment(names.SERVE_DEPLOYMENT, base, settings)],
        )
        return {"applications": [app]}
    app.update(import_path=own.import_path, args={**own.args, **model_args(ms, model)})
    if own.runtime_env is not None and (runtime_env := own.runtime_env.as_ray()):
        app["runtime_env"] = runtime_env
    if spec.deployments:
        app["deployments"] = [_deployment(name, {}, s) for name, s in sorted(spec.deployments.items())]
    return {"applications": [app]}


ModelVolumes = api.PvcStorage | tuple[api.PvcStorage, ...] | None  # the models' PVCs


def model_volumes(volume: ModelVolumes) -> pods.Volumes:
    """The models' PVCs as read-only volumes: `model`, then `model-1`, `model-2`... (spec.models)."""
    given = (volume,) if isinstance(volume, api.PvcStorage) else (volume or ())
    out: pods.Volumes = ([], [])
    for i, pvc in enumerate(given):
        found = pods.pvc_volume(
            names.MODEL_VOLUME if i == 0 else f"{names.MODEL_VOLUME}-{i}", pvc, read_only=True
        )
        out[0].extend(found[0])
        out[1].extend(found[1])
    return out


def ray_cluster_config(
    ms: api.ModelService, config: OperatorConfig, volume: ModelVolumes = None
) -> dict[str, Any]:
    """The serving cluster; `volume` (the models' PVCs) is mounted read-only on every Ray pod."""
    spec, res = ms.spec, ms.spec.resources
    volumes = model_volumes(volume)
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
                cpus=spec.head.cpus,
                memory=spec.head.memory,
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
    ms: api.ModelService, config: OperatorConfig, model: Model, volume: ModelVolumes = None
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
            "serveConfigV2": yaml.safe_dump(serve_config(ms, model), sort_keys=True),
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


def model_annotation(model: Model) -> tuple[str, str]:
    """The RayService annotation naming what its serveConfigV2 serves (read back for the first
    deployment's status)."""
    if isinstance(model, str):
        return names.ANNOTATION_MODEL, model
    return names.ANNOTATION_MODELS, canonical_json(dict(sorted(model.items())))


def describe(model: Model | None) -> str:
    """A model, or models as `name=URI, ...`, in a message."""
    if model is None or isinstance(model, str):
        return str(model)
    return ", ".join(f"{name}={uri}" for name, uri in sorted(model.items())) or "no model"


def desired_rayservice(
    ms: api.ModelService, config: OperatorConfig, model: Model, volume: ModelVolumes = None
) -> dict[str, Any]:
    rayservice = build_rayservice(ms, config, model, volume)
    key, value = model_annotation(model)
    rayservice["metadata"]["annotations"] = {
        names.ANNOTATION_CLUSTER_HASH: cluster_hash(rayservice["spec"]),
        key: value,
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
    models: dict[str, str] | None = None  # `args.models` (name -> URI) of the config Serve deploys

    @property
    def deployed(self) -> dict[str, str] | None:
        """What the config Serve deploys serves, as a service's models (`ONE` for modelUri)."""
        if self.models is not None:
            return self.models
        return {ONE: self.model_uri} if self.model_uri else None


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


# --- plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceContext:
    """What `status()` needs from the plan (the `context` of a ModelService `Plan`)."""

    resolution: Resolved | None
    invalid: str | None
    url: str | None
    desired: dict[str, str] | None  # the models to serve (ONE: spec.model), None while any is unresolved
    blocked: str | None = None  # a RayService of that name exists and is not ours
    rayservice: str = ""
    incremental: bool = False  # NewClusterWithIncrementalUpgrade: no `<rayservice>-serve-svc`
    application: str = ""  # the Serve application's name
    # status.modelURI (as {ONE: uri}) or status.models[].uri as read: what Serve was last confirmed to serve
    served: dict[str, str] = field(default_factory=dict)
    serve: ServeState | None = None  # Serve's own answer, when it was asked (`serve_probe`)
    multi: bool = False  # spec.models (status.models) rather than spec.model (status.modelURI)

    @property
    def desired_uri(self) -> str | None:
        """spec.model's resolved URI."""
        return (self.desired or {}).get(ONE)


def served_models(current: Mapping[str, Any], multi: bool) -> dict[str, str]:
    """What the status as read says Serve serves: {ONE: modelURI}, or status.models' URIs by name."""
    if not multi:
        uri = current.get("modelURI")
        return {ONE: uri} if isinstance(uri, str) and uri else {}
    return {n: e["uri"] for n, e in _served_models(current).items() if isinstance(e.get("uri"), str)}


def plan(
    modelservice: Mapping[str, Any],
    rayservice: Mapping[str, Any] | None,
    trainingjobs: Sequence[Mapping[str, Any]],
    config: OperatorConfig,
) -> Plan:
    """The reconcile's plan; `trainingjobs` are those of the TrainingJobs the service names
    (`referenced_trainingjobs`) that exist."""
    name = names.rayservice_name(modelservice["metadata"]["name"])
    current = modelservice.get("status") or {}
    try:
        ms = parse(modelservice, admitted=True)  # read from the API server
    except SpecError as err:
        return Plan(name, context=ServiceContext(None, "; ".join(err.problems), None, None))
    assert isinstance(ms, api.ModelService)
    by_name = {str(tj.get("metadata", {}).get("name")): tj for tj in trainingjobs}
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
        key, value = model_annotation(model)
        annotations[key] = value
    if applied.get(names.ANNOTATION_CLUSTER_HASH) != wanted_hash:
        spec.update({k: v for k, v in desired["spec"].items() if k != "serveConfigV2"})
        annotations[names.ANNOTATION_CLUSTER_HASH] = wanted_hash
    if not spec:
        return Plan(name, context=context)
    new_cluster = "rayClusterConfig" in spec
    what = "new cluster config" if new_cluster else ("new models" if multi else "new model")
    what += "" if new_cluster else " (in-place Serve rollout)"
    return Plan(
        name,
        patch={"metadata": {"annotations": annotations}, "spec": spec},
        # a new cluster needs its token Secret (a RayService made before there was one, too)
        prerequisites=(token_secret(ms, config),) if new_cluster else (),
        on_patch=Event("Normal", "RayServiceUpdated", f"{what}: {describe(model)}"),
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
        conditions.append(cond("ModelAvailable", res.models is not None, res.reason, res.message))
    out: dict[str, Any] = {"observedGeneration": generation, "rayServiceName": plan_.child_name}
    if not ctx.multi:
        single = res.each.get(ONE) if res else None
        volume = single.volume.wire() if single and single.volume else current.get("modelVolume")
        if volume:
            out["modelVolume"] = volume
    if rayservice is None:
        phase = "WaitingForModel" if ctx.desired is None else "Deploying"
        reason, message = (res.reason, res.message) if res else ("Waiting", "")
        if plan_.rejected is not None:
            phase, reason, message = plan_.rejected
        elif ctx.blocked is not None:
            reason, message = "RayServiceNameTaken", ctx.blocked
        conditions.append(cond("Ready", False, reason, message))
        out.update(phase=phase, conditions=conditions, serveEndpoints=0)
        out.update(_models_status(ctx, current, ctx.served, None) if ctx.multi else NO_MODELS_STATUS)
        return out
    phase, reason, message = serving_phase(rayservice, app)
    stuck = pod_problem(pods)
    if phase == "Deploying" and stuck is not None:
        reason, message = stuck[0], f"{message}: {stuck[1]}"
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
    target = ctx.desired if ctx.desired is not None and ctx.desired != served else None
    upgrading = find(st, "UpgradeInProgress").get("status") == "True" or target is not None
    conditions.append(cond("Ready", phase == "Ready", reason, message))
    conditions.append(
        cond(
            "Upgrading",
            upgrading,
            "ModelRollout" if target else ("UpgradeInProgress" if upgrading else "UpToDate"),
            _rollout_message(target, served, serve, ctx.multi)
            if target
            else ("a new Ray cluster is being rolled out" if upgrading else "no rollout in progress"),
        )
    )
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


NO_MODELS_STATUS: Mapping[str, None] = {"models": None, "modelCount": None}  # spec.model: none of spec.models


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
    stored = _served_models(current)
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
