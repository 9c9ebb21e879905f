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
                    (text models, e.g. causal-lm: the completion only; greedy unless "temperature" > 0;
                    also Hugging Face's "max_length" (prompt + completion), "top_p", "stop", "seed")
    POST /v1/completions, POST /v1/chat/completions, GET /v1/models
                    text models, OpenAI-compatible (`llm`): max_tokens, temperature, top_p, stop, seed,
                    and "stream": true for server-sent events (`data: {...}` chunks, then `data: [DONE]`)
    GET  /healthz                                            -> {"status": "ok", "recipe": ..., "model_uri": ...}
    GET  /stats     diagnostics: {"batch_sizes": [...], "batches": n, "batched_requests": n, "model_loads": {...}},
                    the number of requests in each of the replica's last STATS_WINDOW batches, how many
                    batches and requests it has run since it started, and its model loads (per replica:
                    with several replicas, one replica answers)

Several models (`models: {name: uri}`) are served with Serve's model multiplexing: a request names its
model in the `serve_multiplexed_model_id` header (Serve routes it to a replica that has it loaded; the
OpenAI routes also take the body's "model"), each replica keeps the `modelCacheSize` most recently used.

A malformed request is answered with HTTP 400 and {"error": "<what is wrong>"} (on /v1 routes OpenAI's
{"error": {"message": ..., "type": ..., "param": ...}}), an unknown model with 404; a request over the limits
(`maxRequestBytes` of body, default 8 MiB; `maxRowsPerRequest` rows in one /predict, default 4096) with
HTTP 413 and the limit's arg in the message. The body size is checked before it is read (Content-Length)
and while it is read (chunked bodies are cut at the limit), so an oversized body is never held whole; a
body that takes longer than BODY_TIMEOUT_S to come is answered 408;
the row count is checked before any row is converted. What a model serves
comes from its recipe (`recipes.Recipe.load`): `/predict` rows of numbers, or text (`ROUTES`).
"""

# No `from __future__ import annotations`: FastAPI reads the route methods' annotations (`request: Request`)
# after Serve rebinds them, and string annotations are not resolved there (the body becomes a query param).
import asyncio
import collections
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve import Application
from ray.serve.deployment import Deployment

from rayship.api import DEFAULT_MAX_ROWS_PER_REQUEST, names
from rayship.api.serveargs import ServeArgs
from rayship_workloads import llm, models, recipes
from rayship_workloads.llm import RequestError

APP_NAME = "rayship"
DEPLOYMENT_NAME = names.SERVE_DEPLOYMENT
STATS_WINDOW = 1024  # batch sizes kept per replica for GET /stats
MULTIPLEXED_MODEL_HEADER = "serve_multiplexed_model_id"  # what Serve's proxy routes on

# The routes each kind of model has (`recipes.Recipe.data_kind`), besides GET /healthz and /stats.
ROUTES: dict[str, tuple[str, ...]] = {
    "tabular": ("POST /predict",),
    "text": ("POST /generate", "POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models"),
}


class BadRequest(RequestError):
    """A malformed request: answered with HTTP 400 and {"error": message}."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=400)


class TooLarge(RequestError):
    """A request over a configured limit: answered with HTTP 413 and {"error": message}."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=413)


class TooSlow(RequestError):
    """A body that did not come in time: answered with HTTP 408 and {"error": message}."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=408)


# How long a request's body may take to come in. HAProxy cuts a client off whose headers take longer
# than 10 s (rayship_workloads.haproxy_launcher); the body it passes on as it comes (buffering it
# would answer an oversized Content-Length only once the body was in, not at once with 413), so its
# time is bounded here: a client trickling its body holds a connection, never a thread, and not for
# longer than this. 30 s: a whole 8 MiB body (maxRequestBytes' default) over a slow link.
BODY_TIMEOUT_S = 30.0


class _BatchSettings(Protocol):
    """The setters `@serve.batch` adds to the method it wraps (Ray documents them; its type hints do not
    declare them)."""

    def set_max_batch_size(self, new_max_batch_size: int) -> None: ...
    def set_batch_wait_timeout_s(self, new_batch_wait_timeout_s: float) -> None: ...


def _too_many_bytes(limit: int) -> TooLarge:
    return TooLarge(
        f"request body is over {limit} bytes (maxRequestBytes); send fewer rows per request "
        "or raise maxRequestBytes (a ModelService's spec.requestLimits, or the application's args)"
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
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_many_bytes(limit)
                chunks.append(chunk)
    except TimeoutError:
        raise TooSlow(
            f"request body not received within {BODY_TIMEOUT_S:.0f} s ({size} bytes came); send it at once"
        ) from None
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


def _plain_numbers(row: Any, n_features: int) -> list[float] | None:
    """The row as floats when it plainly is `n_features` finite JSON numbers; None for anything else,
    which the checks below then name. One pass in C over the row instead of five Python steps per
    value: 11 us instead of 49 us for a row of 256 (the replica spends ~1.5 ms per request in all)."""
    if type(row) is not list or len(row) != n_features or not set(map(type, row)) <= {float, int}:
        return None  # bool is not int here: type(True) is bool
    try:
        values = list(map(float, row))
    except OverflowError:  # an int too large for a float
        return None
    # NaN or an infinity (json.loads reads NaN and Infinity) makes the sum non-finite, and so does a
    # sum of finite values past the float range: the checks below then look value by value
    return values if math.isfinite(sum(values)) else None


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
            "split the request or raise maxRowsPerRequest (a ModelService's spec.requestLimits, or the "
            "application's args)"
        )
    rows: list[list[float]] = []
    for i, row in enumerate(instances):
        if (fast := _plain_numbers(row, n_features)) is not None:
            rows.append(fast)
            continue
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


@dataclass(frozen=True)
class Loaded:
    """One model ready on this replica: tabular (`inputs` numbers per row) or text (`engine`)."""

    name: str
    uri: str
    recipe: str
    model: torch.nn.Module
    dtype: torch.dtype
    inputs: int | None = None
    engine: llm.TextEngine | None = None


def load(name: str, uri: str, device: torch.device) -> Loaded:
    servable, manifest = models.load(uri)
    model = servable.model.to(device)
    engine = llm.TextEngine(model, servable.generator) if servable.generator is not None else None
    dtype = next(model.parameters()).dtype
    return Loaded(name, uri, manifest["recipe"], model, dtype, servable.inputs, engine)


def routes(kinds: set[str]) -> list[str]:
    """The routes served for models of these data kinds, then the diagnostics."""
    return [route for kind in sorted(kinds) for route in ROUTES[kind]] + ["GET /healthz"]


def _is_openai_route(request: Request) -> bool:
    route = request.scope.get("route")
    return str(getattr(route, "path", "")).startswith("/v1/")


api = FastAPI(title="rayship model server", docs_url=None, redoc_url=None)


@api.exception_handler(RequestError)
async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
    if _is_openai_route(request):
        return JSONResponse(llm.error_body(str(exc), exc.param, exc.status), status_code=exc.status)
    return JSONResponse({"error": str(exc)}, status_code=exc.status)


@serve.ingress(api)
class ModelServer:
    """One replica: its model(s), /predict requests batched into one forward pass, text generated one
    sequence at a time. With `models`, each is loaded on first use (Serve's model multiplexing)."""

    def __init__(self, args: ServeArgs) -> None:
        self.args = args
        use_cuda = args.num_gpus > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self.single: Loaded | None = None
        self.model_loads: collections.Counter[str] = collections.Counter()  # with `models`: loads per model
        self.multiplexed: Callable[[str], Awaitable[Loaded]] | None = None
        if args.model_uri is not None:
            self.single = load(args.model_name, args.model_uri, self.device)
        else:
            uris = args.model_uris

            async def load_model(model_id: str) -> Loaded:
                self.model_loads[model_id] += 1
                return await asyncio.to_thread(load, model_id, uris[model_id], self.device)

            # Wired here, not on the class, so that the cache size comes from the args.
            self.multiplexed = serve.multiplexed(max_num_models_per_replica=args.model_cache_size)(load_model)
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=STATS_WINDOW)
        self.batches = self.batched_requests = 0  # since start: what the window cannot say once full
        batching = cast(_BatchSettings, self._forward)
        batching.set_max_batch_size(args.max_batch_size)
        batching.set_batch_wait_timeout_s(args.batch_wait_timeout_s)

    async def model(self, requested: str | None = None) -> Loaded:
        """The request's model: the one served, or with `models` the one named by the
        serve_multiplexed_model_id header (or `requested`, the body's "model")."""
        known = sorted(self.args.model_uris)
        if self.single is not None:
            if requested is not None and requested != self.single.name:
                raise RequestError(
                    f"model {requested!r} is not served here; models: {self.single.name}",
                    param="model",
                    status=404,
                )
            return self.single
        header = serve.get_multiplexed_model_id()
        if header and requested and header != requested:
            raise BadRequest(
                f"the {MULTIPLEXED_MODEL_HEADER} header says {header!r} but the body's model is {requested!r}"
            )
        name = header or requested
        if not name:
            raise BadRequest(
                f"this service serves several models ({', '.join(known)}): name one in the {MULTIPLEXED_MODEL_HEADER} header"
            )
        if name not in self.args.model_uris:
            raise RequestError(
                f"model {name!r} is not served here; models: {', '.join(known)}", param="model", status=404
            )
        assert self.multiplexed is not None
        return await self.multiplexed(name)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)  # set from ServeArgs in __init__
    async def _forward(self, items: list[tuple[Loaded, list[list[float]]]]) -> list[list[list[float]] | str]:
        """All waiting requests' rows in one forward pass per model (Serve splits batches by multiplexed
        model; one pass for all with a single model); each request gets its own rows back, or why not.
        The rows become one tensor, are checked and come back as lists once per batch, not per request:
        with small requests, those torch calls per request were a tenth of the replica's time."""
        self.batch_sizes.append(len(items))
        self.batches += 1
        self.batched_requests += len(items)
        outputs: list[list[list[float]] | str] = [""] * len(items)
        with torch.no_grad():
            for loaded in {id(m): m for m, _ in items}.values():
                mine = [i for i, (m, _) in enumerate(items) if m is loaded]
                inputs = torch.tensor([row for i in mine for row in items[i][1]], dtype=loaded.dtype)
                finite_in = torch.isfinite(inputs).all(dim=1)
                inputs[~finite_in] = 0  # a request's values out of range for the dtype: refused below
                result = loaded.model(inputs.to(self.device)).cpu()
                finite_out = torch.isfinite(result).all(dim=1).tolist()
                finite_in_rows, values = finite_in.tolist(), result.tolist()
                start = 0
                for i in mine:
                    end = start + len(items[i][1])
                    if not all(finite_in_rows[start:end]):
                        outputs[i] = f"instances hold values out of range for {loaded.dtype}"
                    elif not all(finite_out[start:end]):
                        outputs[i] = "the instances overflow the model: non-finite outputs"
                    else:
                        outputs[i] = values[start:end]
                    start = end
        return outputs

    @api.post("/predict")
    async def predict(self, request: Request) -> dict[str, list[list[float]]]:
        loaded = await self.model()
        if loaded.inputs is None:
            raise BadRequest(
                f"/predict needs a tabular model; this model's recipe is {loaded.recipe!r}: use /generate"
            )
        body = await _json_object(request, self.args.max_request_bytes)
        rows = parse_instances(body, loaded.inputs, self.args.max_rows_per_request)
        outputs = await self._forward((loaded, rows))
        if isinstance(outputs, str):
            raise BadRequest(outputs)
        return {"predictions": outputs}

    async def _text_model(self, route: str, requested: str | None = None) -> tuple[Loaded, llm.TextEngine]:
        loaded = await self.model(requested)
        if loaded.engine is None:
            text_recipes = ", ".join(recipes.names("text"))
            raise BadRequest(
                f"{route} needs a text model ({text_recipes}); this model's recipe is {loaded.recipe!r}: use /predict"
            )
        return loaded, loaded.engine

    @api.post("/generate")
    async def generate(self, request: Request) -> dict[str, str]:
        _, engine = await self._text_model("/generate")
        body = llm.parse(llm.GenerateRequest, await _read_body(request, self.args.max_request_bytes))
        ids = engine.encode(body.prompt, "prompt")
        max_new_tokens = body.new_tokens(len(ids))
        engine.check_room(len(ids), max_new_tokens, "max_length" if body.max_length else "max_new_tokens")
        return {"text": (await engine.complete(ids, max_new_tokens, body)).text}

    async def _openai(self, request: Request, chat: bool) -> Any:
        raw = await _read_body(request, self.args.max_request_bytes)
        body: llm.CompletionRequest | llm.ChatRequest = (
            llm.parse(llm.ChatRequest, raw) if chat else llm.parse(llm.CompletionRequest, raw)
        )
        loaded, engine = await self._text_model(request.url.path, body.model)
        if isinstance(body, llm.ChatRequest):
            ids = engine.encode(llm.chat_prompt(body.messages), "messages")
            param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
            max_new_tokens = body.max_completion_tokens or body.max_tokens or engine.room(len(ids))
        else:
            ids = engine.encode(body.prompt, "prompt")
            param, max_new_tokens = "max_tokens", body.max_tokens or llm.COMPLETIONS_DEFAULT_MAX_TOKENS
        engine.check_room(len(ids), max(1, max_new_tokens), param)
        reply = llm.Reply(chat=chat, model=loaded.name, prompt_tokens=len(ids))
        if not body.stream:
            return reply.whole(await engine.complete(ids, max_new_tokens, body))
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        events = reply.events(engine.stream(ids, max_new_tokens, body), include_usage)
        return StreamingResponse(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Any:
        return await self._openai(request, chat=False)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Any:
        return await self._openai(request, chat=True)

    @api.get("/v1/models")
    async def list_models(self) -> dict[str, Any]:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "rayship"}
            for name in sorted(self.args.model_uris)
        ]
        return {"object": "list", "data": data}

    @api.get("/healthz")
    async def healthz(self) -> dict[str, Any]:
        if self.single is None:
            return {"status": "ok", "models": self.args.model_uris}
        return {"status": "ok", "recipe": self.single.recipe, "model_uri": self.single.uri}

    @api.get("/stats")
    async def stats(self) -> dict[str, Any]:
        """Diagnostics: requests per batch for this replica's last STATS_WINDOW batches, and its batches
        and their requests since it started; with `models`, how often each model was loaded on this
        replica (again after the cache evicted it)."""
        return {
            "batch_sizes": list(self.batch_sizes),
            "batches": self.batches,
            "batched_requests": self.batched_requests,
            "model_loads": dict(self.model_loads),
        }


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


def start_http(host: str, port: int) -> None:
    """Start Serve (its controller and HTTP proxy) on the connected Ray, listening on host:port; if
    Serve runs already, it is left as it is."""
    serve.start(http_options={"host": host, "port": port})


def serve_locally(
    model_uri: str, *, host: str = "127.0.0.1", port: int = 8000, route_prefix: str = "/", **args: Any
) -> str:
    """Serve `model_uri` on the connected Ray cluster as application "rayship"; return the base URL.

    `args` are further `ServeArgs` fields. The caller owns `ray.init` and `serve.shutdown`; Serve's HTTP
    options are cluster-wide, so host/port only take effect if Serve is not running yet."""
    app = app_builder({"model_uri": model_uri, "route_prefix": route_prefix, **args})
    start_http(host, port)
    serve.run(app, name=APP_NAME, route_prefix=route_prefix)
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"http://{netloc}{route_prefix.rstrip('/')}"
