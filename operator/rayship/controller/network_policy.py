"""The NetworkPolicy of a Ray cluster (issue 33 item 3). Pure: no I/O.

Without one, any pod of the namespace reaches the Ray pods' every port: the GCS, the raylets, the
object managers, the workers and the dashboard's job API (arbitrary code in the cluster, were the token
ever known). The policy selects every Ray pod made for one TrainingJob or ModelService by the label
rayship puts on them (`names.owner_label`: the same on a RayService's next cluster during an upgrade)
and lets in:

- the other Ray pods of the same resource, on every port (Ray's ports are many, and partly dynamic);
- the dashboard port, from KubeRay's operator pods (it reaches the dashboard directly unless run with
  --use-kubernetes-proxy) and from the API server's addresses (`network_policy_api_server_cidrs`):
  its service proxy is how rayship reads Serve's state and how KubeRay with that flag submits jobs;
- a ModelService's Serve port, from what its spec.serveFrom names (anyone when empty);
- the chart's extra rules (e.g. Prometheus on Ray's metrics port).

Egress stays open (data and checkpoints live where the user says). Labels are what NetworkPolicy
selects on: a pod that can be labelled like a Ray pod is let in like one, which is why the other
controls (the Ray token, the spec Secret) stay. A policy does nothing without a policy engine in the
cluster; the chart turns it off there (`networkPolicy.enabled`).
"""

from __future__ import annotations

from typing import Any

from rayship import api
from rayship.api import names
from rayship.config import OperatorConfig
from rayship.controller import pods


def _dashboard_peers(config: OperatorConfig) -> list[dict[str, Any]]:
    kuberay: dict[str, Any] = {"podSelector": {"matchLabels": dict(config.network_policy_kuberay_pods)}}
    namespace = config.network_policy_kuberay_namespace
    kuberay["namespaceSelector"] = (
        {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if namespace else {}
    )
    return [kuberay, *({"ipBlock": {"cidr": cidr}} for cidr in config.network_policy_api_server_cidrs)]


def _tcp(port: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port}]


def build_network_policy(
    config: OperatorConfig,
    meta: api.ObjectMeta,
    kind: str,
    child: str,
    serve_from: list[api.NetworkPeer] | None = None,
) -> list[dict[str, Any]]:
    """The NetworkPolicy of the Ray pods of `kind/meta.name` (whose RayJob or RayService is `child`):
    one, or none when the config turns policies off. `serve_from` is a ModelService's (None: no Serve
    port)."""
    if not config.network_policy:
        return []

    def own() -> dict[str, Any]:  # a new dict each time: a YAML dump would otherwise alias them
        return {"matchLabels": {names.owner_label(kind): meta.name}}

    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": own()}]},
        {"from": _dashboard_peers(config), "ports": _tcp(names.DASHBOARD_PORT_NUMBER)},
    ]
    if serve_from is not None:
        serve: dict[str, Any] = {"ports": _tcp(names.SERVE_PORT_NUMBER)}
        if serve_from:  # no `from`: from anywhere
            serve["from"] = [peer.wire() for peer in serve_from]
        ingress.append(serve)
    ingress.extend(config.network_policy_extra_ingress)
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": pods.object_meta(
            meta, names.network_policy(kind, child), names.labels(kind, meta.name, "network")
        ),
        "spec": {"podSelector": own(), "policyTypes": ["Ingress"], "ingress": ingress},
    }
    return [policy]
