"""Render the RayService: the Serve application (`serveConfigV2`: the only place the model URI lives, so a
new model rolls out in place) and `rayClusterConfig` (a change there means a new cluster, per
`upgradeStrategy`)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any

import yaml

from rayship import api
from rayship.api import names
from rayship.api.yamlio import canonical_json
from rayship.config import OperatorConfig
from rayship.controller import pods

IMPORT_PATH = "rayship_workloads.serve:app_builder"
VLLM_IMPORT_PATH = "ray.serve.llm:build_openai_app"  # Ray Serve LLM's OpenAI-compatible application
REMOTE_MODEL_SCHEMES = ("s3://", "gs://", "abfss://", "azure://")  # what Ray Serve LLM mirrors itself


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
    labels = names.labels("ModelService", ms.metadata.name, "serving")
    ref = pods.object_ref(ms.metadata)
    # what the head's and the workers' pods share
    template = functools.partial(
        pods.pod_template, config, image=spec.image or config.default_image, labels=labels,
        volumes=model_volumes(volume),
    )  # fmt: skip
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
            "template": template(
                container=names.HEAD_CONTAINER,
                cpus=spec.head.cpus,
                memory=spec.head.memory,
                gpus=0,
                env=env(0),
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
                "template": template(
                    container=names.WORKER_CONTAINER,
                    cpus=res.cpus,
                    memory=res.memory,
                    gpus=res.gpus,
                    env=env(res.gpus),
                    node_selector=selector,
                    tolerations=tolerations,
                ),  # fmt: skip
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
