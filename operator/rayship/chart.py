"""The Helm chart's values, as a model: it generates `values.schema.json` (unknown or mistyped values
are rejected by helm) and the values table in the chart's README. `values.yaml` itself is written by
hand, with a comment on every value, and a test checks it equals these defaults."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rayship import __version__
from rayship.config import OperatorConfig


class Values(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# A Kubernetes resource quantity as helm hands it over: `--set resources.limits.cpu=1` (and `cpu: 1` or
# `cpu: 0.5` in a values file) is a number, `500m` or `1Gi` a string; the API server takes both.
# The string form is Kubernetes' own (apimachinery's resource.Quantity, as controller-gen writes it).
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
Quantity = Annotated[float, Field(ge=0)] | Annotated[str, Field(pattern=QUANTITY_PATTERN)]


class Image(Values):
    registry: str = Field(
        "",
        description="Registry the repository is pulled from (e.g. registry.example:5000; a trailing / "
        "is optional); empty: the repository as it is.",
    )
    repository: str = Field("rayship/rayship-operator", description="Operator image repository.")
    tag: str = Field("", description="Image tag; empty means the chart's appVersion.")
    pullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy."
    )


class Crds(Values):
    install: bool = Field(True, description="Install the TrainingJob and ModelService CRDs with the chart.")
    keep: bool = Field(
        True, description="Keep the CRDs (and so every TrainingJob/ModelService) on helm uninstall."
    )


class Defaults(Values):
    workloadImage: str = Field(
        OperatorConfig.model_fields["default_image"].default,
        description="Default spec.image (must contain rayship_workloads).",
    )
    rayVersion: str = Field(
        OperatorConfig.model_fields["default_ray_version"].default,
        description="Ray version of that image (spec.rayVersion).",
    )
    gpuResource: str = Field("nvidia.com/gpu", description="Extended resource name of a GPU.")
    gpuProductLabel: str = Field("nvidia.com/gpu.product", description="Node label naming the GPU model.")
    gpuTolerations: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        description="Tolerations added to every GPU pod.",
    )
    gpuNodeSelector: dict[str, str] = Field(
        default_factory=dict, description="Node labels every GPU pod must match."
    )
    cpuLimits: bool = Field(
        OperatorConfig.model_fields["cpu_limits"].default,
        description="Ray pods' CPU limit equals their request (Guaranteed QoS); false: requested, not "
        "capped (Burstable: idle CPU of the node may be used). Memory and GPU limits stay.",
    )


class KubeRayPods(Values):
    podLabels: dict[str, str] = Field(
        default_factory=lambda: dict(
            OperatorConfig.model_fields["network_policy_kuberay_pods"].get_default(call_default_factory=True)
        ),
        description="Labels of the KubeRay operator's pods (they reach the Ray dashboard directly).",
    )
    namespace: str = Field("", description="Their namespace; empty: any namespace.")


class NetworkPolicy(Values):
    enabled: bool = Field(
        OperatorConfig.model_fields["network_policy"].default,
        description="A NetworkPolicy per Ray cluster: its pods take connections from one another, the "
        "dashboard port from KubeRay and the API server, a ModelService's Serve port from its "
        "spec.serveFrom (anyone when empty). false where no policy engine runs (policies made before "
        "stay: kubectl delete networkpolicy -l app.kubernetes.io/component=network).",
    )
    apiServerCIDRs: list[str] = Field(
        default_factory=list,
        description="Where the API server's service proxy reaches pods from (e.g. the control-plane "
        "nodes' addresses): rayship reads Serve's state through it, KubeRay with "
        "--use-kubernetes-proxy submits jobs through it. Set it wherever that proxy is not let in "
        "by the policy engine otherwise.",
    )
    kuberay: KubeRayPods = Field(default_factory=KubeRayPods, description="The KubeRay operator's pods.")
    extraIngress: list[dict[str, Any]] = Field(
        default_factory=list,
        description="More ingress rules for every Ray pod (NetworkPolicyIngressRule), e.g. Prometheus "
        "on Ray's metrics port 8080.",
    )


class ServiceMonitor(Values):
    enabled: bool = Field(False, description="Create a Prometheus Operator ServiceMonitor.")
    interval: str = Field("30s", description="Scrape interval.")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra labels (to match your Prometheus)."
    )


class Metrics(Values):
    enabled: bool = Field(True, description="Serve Prometheus metrics and create the metrics Service.")
    port: int = Field(9090, ge=1, le=65535, description="Metrics port.")
    serviceMonitor: ServiceMonitor = Field(
        default_factory=ServiceMonitor, description="ServiceMonitor settings."
    )


class ServiceAccount(Values):
    create: bool = Field(True, description="Create the operator's ServiceAccount.")
    name: str = Field("", description="Its name; empty means the release's full name.")


def _quantities(**given: Quantity) -> dict[str, Quantity]:
    return given


class Resources(Values):
    requests: dict[str, Quantity] = Field(
        default_factory=lambda: _quantities(cpu="100m", memory="256Mi"),
        description="Requests (quantities: 0.5, 1, 500m, 256Mi).",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=lambda: _quantities(memory="1Gi"),
        description="Limits. The operator's memory follows the burst it catches up on: TrainingJobs "
        "created together, or while it was down, took it to 220-280 MB for 1000 and 440 MB for 2000 "
        "(measured, 32 workers; with 6, 665 MB for 2000); raise the limit for larger bursts.",
    )


class EnvVar(Values):
    """A container's environment variable (Kubernetes' EnvVar)."""

    name: str = Field(min_length=1, description="Its name.")
    value: str | None = Field(None, description="Its value (a string: quote numbers).")
    valueFrom: dict[str, Any] | None = Field(
        None, description="Where its value comes from (a Secret's or ConfigMap's key, a field)."
    )


class ChartValues(Values):
    nameOverride: str = Field(
        "", description="Replaces the chart's name (rayship) in the release's full name and labels."
    )
    fullnameOverride: str = Field(
        "",
        description="The release's full name (default: the release name, followed by -rayship unless "
        "it contains rayship): every object's name, cluster-wide ones included.",
    )
    image: Image = Field(default_factory=Image, description="Operator image.")
    imagePullSecrets: list[dict[str, str]] = Field(
        default_factory=list, description="Pull secrets, e.g. [{name: regcred}]."
    )
    watchNamespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to watch; empty watches all (ClusterRole), else namespaced Roles.",
    )
    crds: Crds = Field(default_factory=Crds, description="CRD installation.")
    defaults: Defaults = Field(
        default_factory=Defaults, description="Cluster-wide defaults the operator applies to specs."
    )
    networkPolicy: NetworkPolicy = Field(
        default_factory=NetworkPolicy, description="The NetworkPolicy of each Ray cluster."
    )
    metrics: Metrics = Field(default_factory=Metrics, description="Prometheus metrics.")
    serviceAccount: ServiceAccount = Field(
        default_factory=ServiceAccount, description="Operator ServiceAccount."
    )
    resources: Resources = Field(default_factory=Resources, description="Operator container resources.")
    logLevel: Literal["debug", "info", "warning"] = Field("info", description="Operator log verbosity.")
    workers: int = Field(
        OperatorConfig.model_fields["workers"].default,
        ge=1,
        le=256,
        description="Reconciles the operator runs at once (threads, each mostly waiting on the API server).",
    )
    extraEnv: list[EnvVar] = Field(
        default_factory=list,
        description="More environment variables of the operator container, after the chart's own "
        "(e.g. HTTPS_PROXY, with the API server's address in NO_PROXY).",
    )
    podSecurityContext: dict[str, Any] = Field(
        default_factory=lambda: {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        description="The operator pod's securityContext. No runAsUser: the image runs as its numeric "
        "USER 10001, and OpenShift's restricted SCC assigns its own UID. A key set to null is removed.",
    )
    securityContext: dict[str, Any] = Field(
        default_factory=lambda: {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        description="The operator container's securityContext.",
    )
    priorityClassName: str = Field("", description="The operator pod's PriorityClass; empty: none.")
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Operator pod node selector.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Operator pod tolerations.")
    affinity: dict[str, Any] = Field(default_factory=dict, description="Operator pod affinity.")
    podLabels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra operator pod labels (the chart's selector labels cannot be replaced).",
    )
    podAnnotations: dict[str, str] = Field(
        default_factory=dict, description="Extra operator pod annotations."
    )


def values_schema() -> dict[str, Any]:
    schema = ChartValues.model_json_schema()
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    schema["title"] = f"rayship {__version__} chart values"
    return schema


def values_table() -> str:
    rows = ["| value | default | description |", "|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        defaults = model().model_dump()
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name}.")
                continue
            rows.append(f"| `{prefix}{name}` | `{json.dumps(defaults[name])}` | {field.description} |")

    walk(ChartValues, "")
    return "\n".join(rows)
