"""The ModelService engines, one entry each: what serves the model and how its Serve application is
rendered. A new engine is an entry here, its spec in `api/modelservice.py` (with the CEL rules of the
fields it allows), and, if `rayship serve` cannot run it on a laptop, the reason."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rayship import api
from rayship.api import names

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


@dataclass(frozen=True)
class Engine:
    # The application's fields besides its name and route prefix: import_path, args, deployments, ...
    application: Callable[[api.ModelService, Model], dict[str, Any]]
    not_local: str | None = None  # why `rayship serve -f` cannot run it on this machine, or None


def _builtin(ms: api.ModelService, model: Model) -> dict[str, Any]:
    """rayship's own model server (`rayship_workloads.serve:app_builder`), its replicas autoscaled."""
    spec, replicas = ms.spec, ms.spec.replicas
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
    return {
        "import_path": IMPORT_PATH,
        "args": serve_args(ms, model),
        "deployments": [_deployment(names.SERVE_DEPLOYMENT, base, settings)],
    }


def _own(ms: api.ModelService, model: Model) -> dict[str, Any]:
    """The ModelService's own `application`, given the model's URI as args.modelUri (with spec.models,
    the models as args.models, name -> URI)."""
    own = ms.spec.application
    assert own is not None, "engine_of picks the own application only when there is one"
    app: dict[str, Any] = {"import_path": own.import_path, "args": {**own.args, **model_args(ms, model)}}
    if own.runtime_env is not None and (runtime_env := own.runtime_env.as_ray()):
        app["runtime_env"] = runtime_env
    if ms.spec.deployments:
        app["deployments"] = [_deployment(name, {}, s) for name, s in sorted(ms.spec.deployments.items())]
    return app


def _vllm(ms: api.ModelService, model: Model) -> dict[str, Any]:
    """Ray Serve LLM's OpenAI-compatible application on vLLM: one model (spec.model)."""
    if not isinstance(model, str):  # the API refuses engine vllm with spec.models
        raise ValueError("engine vllm serves one model (spec.model)")
    return {"import_path": VLLM_IMPORT_PATH, "args": vllm_args(ms, model)}


ENGINES: dict[str, Engine] = {
    "builtin": Engine(_builtin),
    "own": Engine(_own),
    "vllm": Engine(
        _vllm,
        not_local="spec.engine: vllm needs vLLM and GPUs, which rayship serve does not run locally; set "
        "engine: rayship to serve the model here (its /v1 routes are OpenAI-compatible), or see the "
        "cluster objects with rayship render -f",
    ),
}


def engine_of(ms: api.ModelService) -> Engine:
    """The engine a ModelService asks for: vLLM (`engine: vllm`), its own application, or the built-in server."""
    if ms.spec.engine == "vllm":
        return ENGINES["vllm"]
    return ENGINES["own"] if ms.spec.application is not None else ENGINES["builtin"]


def serve_config(ms: api.ModelService, model: Model) -> dict[str, Any]:
    """serveConfigV2 (Ray's ServeDeploySchema) with one application, as the service's engine renders it."""
    app: dict[str, Any] = {"name": ms.metadata.name, "route_prefix": ms.spec.route_prefix}
    app.update(engine_of(ms).application(ms, model))
    return {"applications": [app]}
