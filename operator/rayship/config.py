"""Operator configuration: cluster-wide defaults, read from `RAYSHIP_*` environment variables.

The Helm chart sets these on the operator Deployment; `rayship render` reads the same variables, so
an offline render matches what the operator would create. `from_environment()` reads them.
"""

from __future__ import annotations

import functools
import os
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from rayship import __version__
from rayship.api import names

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

ENV_PREFIX = "RAYSHIP_"


class ConfigError(ValueError):
    """A `RAYSHIP_*` variable that does not hold a valid value: one line per variable, naming it."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class OperatorConfig(BaseModel):
    """Defaults the renderer applies where a spec leaves a field unset."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    default_image: str = Field(
        f"rayship/rayship-workloads:{__version__}-gpu",
        description="Workload image for spec.image (must contain rayship_workloads).",
    )
    default_ray_version: str = Field("2.60.0", description="Ray version in that image (spec.rayVersion).")
    gpu_resource: str = Field("nvidia.com/gpu", description="Extended resource name of a GPU.")
    gpu_product_label: str = Field(
        "nvidia.com/gpu.product", description="Node label that names the GPU model (GPU feature discovery)."
    )
    gpu_tolerations: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        description="Tolerations added to GPU pods (JSON list in the environment).",
    )
    gpu_node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels every GPU pod must match (JSON object)."
    )
    cpu_limits: bool = Field(
        True,
        description="Ray pods get a CPU limit equal to their request (Guaranteed QoS: a pod never runs "
        "on CPU another pod asked for). false: CPU is requested, not capped (Burstable QoS): a pod may "
        "use CPU the node leaves idle, as a Ray head starting up or a worker importing torch does. "
        "Memory and GPU limits stay either way.",
    )
    run_as_user: int = Field(1000, ge=1, description="Non-root UID of the Ray containers (ray image: 1000).")
    network_policy: bool = Field(
        True,
        description="A NetworkPolicy per Ray cluster: its pods take connections from one another only, "
        "but for the dashboard port (from KubeRay's pods and network_policy_api_server_cidrs), a "
        "ModelService's Serve port (from spec.serveFrom, else anyone) and network_policy_extra_ingress. "
        "false: none (clusters without a policy engine, where it would do nothing).",
    )
    network_policy_api_server_cidrs: list[str] = Field(
        default_factory=list,
        description="Addresses the API server's service proxy reaches pods from (its nodes; JSON list of "
        "CIDRs): the rayship operator reads Serve's state, and KubeRay with --use-kubernetes-proxy "
        "submits jobs, through that proxy to the Ray dashboard.",
    )
    network_policy_kuberay_pods: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "kuberay-operator"},
        description="Labels of the KubeRay operator's pods, which reach the Ray dashboard directly (JSON "
        "object).",
    )
    network_policy_kuberay_namespace: str = Field(
        "", description="The KubeRay operator's namespace; empty: its pods' labels in any namespace."
    )
    network_policy_extra_ingress: list[dict[str, Any]] = Field(
        default_factory=list,
        description="More ingress rules for every Ray pod (NetworkPolicyIngressRule objects, JSON list), "
        "e.g. Prometheus scraping Ray's metrics port.",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535, description="Prometheus metrics port of the operator (0: off)."
    )
    log_level: str = Field("info", pattern="^(debug|info|warning)$", description="Operator log verbosity.")
    resync_seconds: float = Field(
        120,
        ge=5,
        description="Every object is reconciled at least this often, so the state converges even when "
        "an event or an API call was lost.",
    )
    starting_seconds: float = Field(
        15,
        ge=1,
        description="A TrainingJob whose Ray pods are starting is looked at again this often, so a pod "
        "that cannot start (image not pulled, OOMKilled, unschedulable) is named in its status within "
        "about this long. (At most 20 such looks a second in all: at 1000 jobs, each every 50 s.)",
    )
    namespace: str = Field(
        "",
        description="Namespace the operator runs in (the chart sets it): the key its per-ModelService "
        "Ray tokens are derived from is kept there, in the Secret rayship-ray-token-key.",
    )
    ray_token_key: SecretStr | None = Field(
        None,
        description="Key the Ray auth token of each ModelService's clusters is derived from. The "
        "operator reads (or makes) it at startup from the Secret rayship-ray-token-key in its namespace; "
        "set this only to manage the key yourself.",
    )
    workload_role: str = Field(
        names.WORKLOAD_ROLE,
        min_length=1,
        description="The ClusterRole each TrainingJob's Ray pods are bound to (patch TrainingJob "
        "status, narrowed to their own by the chart's admission policy): the chart release's own, "
        "`<release full name>-workload`, which the chart sets, so two releases never share one.",
    )
    workers: int = Field(
        32,
        ge=1,
        le=256,
        description="Reconciles run at once (threads; each mostly waits on the API server). Measured "
        "with 1000 TrainingJobs at once on a 2-core control plane: 32 finish them 1.8x sooner than 6, "
        "kopf's default there.",
    )
    wedged_seconds: float = Field(
        300, ge=30, description="Liveness fails when one reconcile has been running longer than this."
    )


def variable(field: str) -> str:
    """The environment variable a field is read from: `RAYSHIP_` and its name in capitals."""
    return f"{ENV_PREFIX}{field.upper()}"


@functools.cache
def _settings() -> type[BaseSettings]:
    from pydantic_settings import BaseSettings, SettingsConfigDict

    class FromEnvironment(BaseSettings, OperatorConfig):
        model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    return FromEnvironment


def from_environment() -> OperatorConfig:
    """The configuration the `RAYSHIP_*` environment variables give (lists and objects as JSON),
    with each unset field at its default; `ConfigError` names each variable that is not valid.

    pydantic-settings reads the variables, imported only when one of them is set: its import alone
    takes ~50 ms, a fifth of `rayship render` (bench/render.py), where none is usually set.
    """
    names = {variable(field) for field in OperatorConfig.model_fields}
    if not any(key.upper() in names for key in os.environ):  # read case-insensitively, as below
        return OperatorConfig()
    from pydantic_settings import SettingsError

    try:
        return OperatorConfig(**dict(_settings()()))
    except ValidationError as err:
        raise ConfigError(
            [
                f"{variable(str(e['loc'][0]))}: {e['msg'][0].lower()}{e['msg'][1:]} (got {e.get('input')!r})"
                for e in err.errors(include_url=False)
            ]
        ) from None
    except SettingsError as err:
        found = re.search(r'field "(\w+)"', str(err))
        name = variable(found.group(1)) if found else f"{ENV_PREFIX}*"
        raise ConfigError([f"{name}: not valid JSON ({err.__cause__ or err})"]) from None
