"""Prometheus metrics of the operator (served on RAYSHIP_METRICS_PORT; the chart's metrics Service)."""

from __future__ import annotations

import prometheus_client

# Our own registry (not the process-global one): importing this module twice never collides.
REGISTRY = prometheus_client.CollectorRegistry()

RECONCILES = prometheus_client.Counter(
    "rayship_reconciles_total", "Reconciliations of a custom resource.", ["kind"], registry=REGISTRY
)
RECONCILE_ERRORS = prometheus_client.Counter(
    "rayship_reconcile_errors_total",
    "Reconciliations that raised and will be retried.",
    ["kind"],
    registry=REGISTRY,
)
PHASE_TRANSITIONS = prometheus_client.Counter(
    "rayship_phase_transitions_total",
    "Status phase changes written by the operator.",
    ["kind", "phase"],
    registry=REGISTRY,
)

QUEUE_DEPTH = prometheus_client.Gauge(
    "rayship_queue_depth",
    "Objects waiting in the work queue for a reconcile (a backlog: the operator is behind its events).",
    ["kind"],
    registry=REGISTRY,
)


def serve(port: int) -> None:
    if port:
        prometheus_client.start_http_server(port, registry=REGISTRY)
