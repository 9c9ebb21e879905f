"""The arguments of the built-in model server's `app_builder` (`rayship_workloads.serve`), as a
RayService `serveConfigV2` application passes them: the renderer builds them, the Serve replica reads
them, both through this one model."""

from __future__ import annotations

import math
from typing import Any, Self, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from rayship.api.modelservice import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_ROWS_PER_REQUEST,
    DEFAULT_MODEL_CACHE_SIZE,
)

DEFAULT_MODEL_NAME = "model"


def max_ongoing_requests(max_batch_size: int, target_ongoing_requests: float) -> int:
    """Per-replica concurrency of the built-in server: room for a full batch in flight and the next one
    filling, and headroom over the autoscaling target. (At Ray's default of 5, excess requests back off
    in the proxy: unbatched, 16 clients got 56 req/s at 5 vs 282 req/s at 32 on a 2-core machine.)"""
    return max(2 * max_batch_size, 2 * math.ceil(target_ongoing_requests))


class ServeArgs(BaseModel):
    """Arguments of `app_builder`: snake_case names or their camelCase aliases (`modelUri`, `models`,
    `modelName`, `modelCacheSize`, `maxBatchSize`, `batchWaitTimeoutS`, `minReplicas`, `maxReplicas`,
    `targetOngoingRequests`, `numCpus`, `numGpus`, `routePrefix`, `maxRequestBytes`, `maxRowsPerRequest`),
    as they come from a RayService `serveConfigV2` application's `args`."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, allow_inf_nan=False, frozen=True
    )

    model_uri: str | None = Field(
        None, min_length=1, description="Exported model directory: a path, PVC path or s3:// URI."
    )
    models: dict[str, str] | None = Field(
        None,
        min_length=1,
        description="Several models, name -> URI, served with Serve's model multiplexing (instead of modelUri).",
    )
    model_name: str = Field(
        DEFAULT_MODEL_NAME,
        min_length=1,
        description="The name of modelUri's model in OpenAI requests and /v1/models (`models` are named by their keys).",
    )
    model_cache_size: int = Field(
        DEFAULT_MODEL_CACHE_SIZE, ge=1, description="With `models`: most models loaded per replica (LRU)."
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
    num_gpus: int | float = Field(
        0, ge=0, description="GPUs reserved per replica (the model runs on CUDA if > 0)."
    )
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

    @field_validator("models")
    @classmethod
    def _model_uris(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, uri in (value or {}).items():
            if not name or not uri:
                raise ValueError(f"model {name!r}: names and URIs must be non-empty")
        return value

    @model_validator(mode="after")
    def _checks(self) -> Self:
        if (self.model_uri is None) == (self.models is None):
            raise ValueError(
                "give modelUri (one model) or models (several, multiplexed), exactly one of them"
            )
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})")
        return self

    @property
    def model_uris(self) -> dict[str, str]:
        """Every served model, name -> URI."""
        return dict(self.models) if self.models is not None else {self.model_name: cast(str, self.model_uri)}

    @property
    def max_ongoing_requests(self) -> int:
        """Per-replica concurrency (what a ModelService renders in its deployment too)."""
        return max_ongoing_requests(self.max_batch_size, self.target_ongoing_requests)
