"""Ray Serve application for an exported rayship model (see `models` for the serving layout).

KubeRay's RayService deploys it with Ray's application-builder pattern, e.g. in `serveConfigV2`:

    applications:
      - name: rayship
        import_path: rayship_workloads.serve:app_builder
        route_prefix: /
        args: {modelUri: "s3://bucket/models/run-1", maxBatchSize: 32, maxReplicas: 4}

HTTP contract (paths relative to the application's route prefix; every body is JSON):

    POST /predict   {"instances": [[f1, ..., fn], ...]}      -> {"predictions": [[y1, ...], ...]}
                    (tabular models, e.g. mlp; requests are batched across clients into one forward pass)
    POST /generate  {"prompt": "...", "max_new_tokens": 16}  -> {"text": "..."}
                    (text models, e.g. causal-lm; greedy decoding, the completion only)
    GET  /healthz                                            -> {"status": "ok", "recipe": ..., "model_uri": ...}
    GET  /stats     diagnostics: {"batch_sizes": [...]}, the number of requests in each of the replica's
                    last STATS_WINDOW batches (per replica: with several replicas, one replica answers)

A malformed request is answered with HTTP 400 and {"error": "<what is wrong>"}; a request over the limits
(`maxRequestBytes` of body, default 8 MiB; `maxRowsPerRequest` rows in one /predict, default 4096) with
HTTP 413 and the limit's arg in the message. The body size is checked before it is read (Content-Length)
and while it is read (chunked bodies are cut at the limit), so an oversized body is never held whole;
the row count is checked before any row is converted. What a model serves
comes from its recipe (`recipes.Recipe.load`): `/predict` rows of numbers, or `/generate` text.
"""

# No `from __future__ import annotations`: FastAPI reads the route methods' annotations (`request: Request`)
# after Serve rebinds them, and string annotations are not resolved there (the body becomes a query param).
import asyncio
import collections
import json
import math
from typing import Any, Protocol, Self, cast

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from ray import serve
from ray.serve import Application
from ray.serve.deployment import Deployment

from rayship import names
from rayship_workloads import models, recipes

APP_NAME = "rayship"
DEPLOYMENT_NAME = names.SERVE_DEPLOYMENT
STATS_WINDOW = 1024  # batch sizes kept per replica for GET /stats
MAX_NEW_TOKENS = 1024
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_ROWS_PER_REQUEST = 4096


class ServeArgs(BaseModel):
    """Arguments of `app_builder`: snake_case names or their camelCase aliases (`modelUri`, `maxBatchSize`,
    `batchWaitTimeoutS`, `minReplicas`, `maxReplicas`, `targetOngoingRequests`, `numCpus`, `numGpus`,
    `routePrefix`, `maxRequestBytes`, `maxRowsPerRequest`), as they come from a RayService `serveConfigV2`
    application's `args`."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, allow_inf_nan=False, frozen=True
    )

    model_uri: str = Field(
        min_length=1, description="Exported model directory: a path, PVC path or s3:// URI."
    )
    route_prefix: str = Field(
        "/",
        description="Where the application is mounted. `serve_locally` passes it to serve.run; in serveConfigV2 "
        "the application's own `route_prefix` field is what Ray uses, so keep the two equal.",
    )
    max_batch_size: int = Field(32, ge=1, le=1024, description="Most requests per forward pass.")
    batch_wait_timeout_s: float = Field(0.01, ge=0, le=10, description="Longest wait for a batch to fill.")
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    target_ongoing_requests: float = Field(5, gt=0, description="Autoscaling target per replica.")
    num_cpus: float = Field(1, ge=0, description="CPUs reserved per replica.")
    num_gpus: float = Field(0, ge=0, description="GPUs reserved per replica (the model runs on CUDA if > 0).")
    max_request_bytes: int = Field(
        DEFAULT_MAX_REQUEST_BYTES,
        ge=1,
        le=1024**3,
        description="Largest request body in bytes; a larger one is answered with HTTP 413 before it is read whole.",
    )
    max_rows_per_request: int = Field(
        DEFAULT_MAX_ROWS_PER_REQUEST,
        ge=1,
        description="Most rows (instances) in one /predict request; more are answered with HTTP 413.",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("expected a number or string, not a boolean")
        return value

    @field_validator("route_prefix")
    @classmethod
    def _route_prefix(cls, value: str) -> str:
        if not value.startswith("/") or (value != "/" and value.endswith("/")):
            raise ValueError(f"{value!r}: must start with '/' and not end with '/' (or be '/')")
        return value

    @model_validator(mode="after")
    def _replica_range(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})")
        return self

    @property
    def max_ongoing_requests(self) -> int:
        """Per-replica concurrency: room for a full batch in flight and the next one filling, and headroom
        over the autoscaling target. (At Ray's default of 5, excess requests back off in the proxy: unbatched,
        16 clients got 56 req/s at 5 vs 282 req/s at 32 on a 2-core machine.)"""
        return max(2 * self.max_batch_size, 2 * math.ceil(self.target_ongoing_requests))


class BadRequest(Exception):
    """A malformed request: answered with HTTP 400 and {"error": message}."""


class TooLarge(Exception):
    """A request over a configured limit: answered with HTTP 413 and {"error": message}."""


class _BatchSettings(Protocol):
    """The setters `@serve.batch` adds to the method it wraps (Ray documents them; its type hints do not
    declare them)."""

    def set_max_batch_size(self, new_max_batch_size: int) -> None: ...
    def set_batch_wait_timeout_s(self, new_batch_wait_timeout_s: float) -> None: ...


def _too_many_bytes(limit: int) -> TooLarge:
    return TooLarge(
        f"request body is over {limit} bytes (maxRequestBytes); send fewer rows per request "
        "or raise maxRequestBytes in the application's args"
    )


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, at most `limit` bytes: refused from its Content-Length before reading, and
    while reading (a chunked body, or one longer than it said) as soon as it passes the limit."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError as exc:
            raise BadRequest(f"invalid Content-Length header: {declared[:40]!r}") from exc
        if length > limit:
            raise _too_many_bytes(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_many_bytes(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    raw = await _read_body(request, max_bytes)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, absurd nesting
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _check_fields(body: dict[str, Any], required: set[str], allowed: set[str], example: str) -> None:
    missing = sorted(required - body.keys())
    if missing:
        raise BadRequest(f"missing field {missing[0]!r}: expected {example}")
    unknown = sorted(body.keys() - allowed)
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}: expected {example}")


def parse_instances(
    body: dict[str, Any], n_features: int, max_rows: int = DEFAULT_MAX_ROWS_PER_REQUEST
) -> list[list[float]]:
    """The rows of a /predict body, checked: a non-empty list of at most `max_rows` rows (more is
    `TooLarge`) of `n_features` finite numbers."""
    _check_fields(body, {"instances"}, {"instances"}, '{"instances": [[f1, ..., fn], ...]}')
    instances = body["instances"]
    if not isinstance(instances, list) or not instances:
        raise BadRequest('"instances" must be a non-empty list of rows')
    if len(instances) > max_rows:
        raise TooLarge(
            f"{len(instances)} instances is over {max_rows} rows per request (maxRowsPerRequest); "
            "split the request or raise maxRowsPerRequest in the application's args"
        )
    rows: list[list[float]] = []
    for i, row in enumerate(instances):
        if not isinstance(row, list):
            raise BadRequest(
                f"instances[{i}] must be a list of {n_features} numbers, got {type(row).__name__}"
            )
        if len(row) != n_features:
            raise BadRequest(f"instances[{i}] has {len(row)} features; the model expects {n_features}")
        values: list[float] = []
        for j, value in enumerate(row):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRequest(f"instances[{i}][{j}] is not a number: {json.dumps(value)[:40]}")
            try:
                number = float(value)
            except OverflowError as exc:
                raise BadRequest(f"instances[{i}][{j}] is out of range") from exc
            if not math.isfinite(number):
                raise BadRequest(f"instances[{i}][{j}] is not finite: {number}")
            values.append(number)
        rows.append(values)
    return rows


def parse_generate(body: dict[str, Any]) -> tuple[str, int]:
    """(prompt, max_new_tokens) of a /generate body, checked."""
    _check_fields(body, {"prompt"}, {"prompt", "max_new_tokens"}, '{"prompt": "...", "max_new_tokens": 16}')
    prompt, max_new_tokens = body["prompt"], body.get("max_new_tokens", 16)
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest('"prompt" must be a non-empty string')
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise BadRequest(f'"max_new_tokens" must be an integer, got {json.dumps(max_new_tokens)[:40]}')
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise BadRequest(f'"max_new_tokens" must be in 1..{MAX_NEW_TOKENS}, got {max_new_tokens}')
    return prompt, max_new_tokens


api = FastAPI(title="rayship model server", docs_url=None, redoc_url=None)


@api.exception_handler(BadRequest)
async def _bad_request(request: Request, exc: BadRequest) -> JSONResponse:
    return JSONResponse({"error": str(exc)}, status_code=400)


@api.exception_handler(TooLarge)
async def _too_large(request: Request, exc: TooLarge) -> JSONResponse:
    return JSONResponse({"error": str(exc)}, status_code=413)


@serve.ingress(api)
class ModelServer:
    """One replica: the model loaded once, /predict requests batched into one forward pass."""

    def __init__(self, args: ServeArgs) -> None:
        self.args = args
        use_cuda = args.num_gpus > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_cuda else "cpu")
        servable, manifest = models.load(args.model_uri)
        self.model = servable.model.to(self.device)
        self.inputs, self.generator = servable.inputs, servable.generator
        self.recipe: str = manifest["recipe"]
        self.dtype = next(self.model.parameters()).dtype
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=STATS_WINDOW)
        batching = cast(_BatchSettings, self._forward)
        batching.set_max_batch_size(args.max_batch_size)
        batching.set_batch_wait_timeout_s(args.batch_wait_timeout_s)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)  # set from ServeArgs in __init__
    async def _forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """All waiting requests' rows in one forward pass; each request gets its own rows back."""
        self.batch_sizes.append(len(inputs))
        with torch.no_grad():
            outputs = self.model(torch.cat(inputs).to(self.device)).cpu()
        return list(torch.split(outputs, [len(x) for x in inputs]))

    @api.post("/predict")
    async def predict(self, request: Request) -> dict[str, list[list[float]]]:
        if self.inputs is None:
            raise BadRequest(
                f"/predict needs a tabular model; this model's recipe is {self.recipe!r}: use /generate"
            )
        body = await _json_object(request, self.args.max_request_bytes)
        rows = parse_instances(body, self.inputs, self.args.max_rows_per_request)
        inputs = torch.tensor(rows, dtype=self.dtype)
        if not torch.isfinite(inputs).all():
            raise BadRequest(f"instances hold values out of range for {self.dtype}")
        outputs = await self._forward(inputs)
        if not torch.isfinite(outputs).all():
            raise BadRequest("the instances overflow the model: non-finite outputs")
        return {"predictions": outputs.tolist()}

    @api.post("/generate")
    async def generate(self, request: Request) -> dict[str, str]:
        generator = self.generator
        if generator is None:
            text_recipes = ", ".join(recipes.names("text"))
            raise BadRequest(
                f"/generate needs a text model ({text_recipes}); this model's recipe is {self.recipe!r}: use /predict"
            )
        prompt, max_new_tokens = parse_generate(await _json_object(request, self.args.max_request_bytes))
        ids = generator.encode(prompt)
        if not ids:
            raise BadRequest('"prompt" encodes to no tokens')
        limit = generator.max_positions
        if limit is not None and len(ids) + max_new_tokens > limit:
            raise BadRequest(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's {limit} positions"
            )
        new_ids = await asyncio.to_thread(generator.greedy, ids, max_new_tokens)  # keeps the event loop free
        return {"text": generator.decode(new_ids)}

    @api.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok", "recipe": self.recipe, "model_uri": self.args.model_uri}

    @api.get("/stats")
    async def stats(self) -> dict[str, list[int]]:
        """Diagnostics: requests per batch for this replica's last STATS_WINDOW batches."""
        return {"batch_sizes": list(self.batch_sizes)}


# The Serve deployment of ModelServer (what `app_builder` binds; its name is the one KubeRay's
# serveConfigV2 lists under `deployments`).
model_deployment: Deployment = serve.deployment(name=DEPLOYMENT_NAME)(ModelServer)


def app_builder(args: dict[str, Any] | ServeArgs) -> Application:
    """Ray Serve application builder (`import_path: rayship_workloads.serve:app_builder`).

    `args` is the serveConfigV2 application's `args` (camelCase or snake_case keys) or a `ServeArgs`;
    invalid args raise `pydantic.ValidationError`. Replica resources, autoscaling and per-replica
    concurrency come from the args."""
    config = args if isinstance(args, ServeArgs) else ServeArgs.model_validate(args)
    deployment = model_deployment.options(
        autoscaling_config={
            "min_replicas": config.min_replicas,
            "max_replicas": config.max_replicas,
            "target_ongoing_requests": config.target_ongoing_requests,
        },
        ray_actor_options={"num_cpus": config.num_cpus, "num_gpus": config.num_gpus},
        max_ongoing_requests=config.max_ongoing_requests,
    )
    return deployment.bind(config)


def serve_locally(
    model_uri: str, *, host: str = "127.0.0.1", port: int = 8000, route_prefix: str = "/", **args: Any
) -> str:
    """Serve `model_uri` on the connected Ray cluster as application "rayship"; return the base URL.

    `args` are further `ServeArgs` fields. The caller owns `ray.init` and `serve.shutdown`; Serve's HTTP
    options are cluster-wide, so host/port only take effect if Serve is not running yet."""
    app = app_builder({"model_uri": model_uri, "route_prefix": route_prefix, **args})
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=APP_NAME, route_prefix=route_prefix)
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"http://{netloc}{route_prefix.rstrip('/')}"
