"""Render the RayService: its Serve application (`serveConfigV2`, from the service's engine: the only
place the model URI lives, so a new model rolls out in place) and `rayClusterConfig` (a change there
means a new cluster, per `upgradeStrategy`)."""

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
from rayship.controller.modelservice.engines import Model, serve_config
from rayship.controller.modelservice.serve_probe import token_secret, token_secret_name
from rayship.controller.network_policy import build_network_policy

# HAProxy in front of the replicas, not Serve's Python proxy: ~3x the requests per second on the same
# model, a third of the replica's CPU per request; and Serve's throughput settings with it, another
# ~1.2x (bench/serve_throughput). spec.env can set either to "0". HAProxy is started through rayship's
# launcher: slow clients cut off (408), the stats page on loopback (names.SERVE_HAPROXY_LAUNCHER).
SERVE_ENV = {
    names.ENV_SERVE_HAPROXY: "1",
    names.ENV_SERVE_THROUGHPUT: "1",
    names.ENV_SERVE_LOG_BUFFER: "1",
    names.ENV_SERVE_HAPROXY_BINARY: names.SERVE_HAPROXY_LAUNCHER,
}

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
    # The token lives in a Secret the operator makes (not KubeRay's own), under a name nobody else can
    # know: the operator derives the same token to read Serve's state from the dashboard, and never
    # needs to read a Secret.
    auth = {"mode": "token", "secretName": token_secret_name(ms, config)}

    env = functools.partial(_pod_env, ms, ref, env_secret(ms, config))

    selector, tolerations = pods.gpu_placement(
        config, res.gpus, res.gpu_product, res.node_selector, res.tolerations
    )
    return {
        "rayVersion": spec.ray_version or config.default_ray_version,
        "enableInTreeAutoscaling": True,  # Serve autoscaling adds and removes GPU worker pods
        # the autoscaler's container, KubeRay's default 500m unless set: a small cluster must fit it
        "autoscalerOptions": {
            "resources": pods.container_resources(config, spec.autoscaler.cpus, spec.autoscaler.memory)
        },
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
    rayservice = names.rayservice_name(ms.metadata.name)
    return f"http://{rayservice}-serve-svc.{namespace}.svc:{names.SERVE_PORT_NUMBER}{prefix}"


def cluster_hash(rayservice_spec: Mapping[str, Any]) -> str:
    """Hash of what needs a new cluster when it changes (everything but serveConfigV2)."""
    return _digest({k: v for k, v in rayservice_spec.items() if k != "serveConfigV2"})


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


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


def network_policy(ms: api.ModelService, config: OperatorConfig) -> list[dict[str, Any]]:
    """The NetworkPolicy of the service's Ray pods (every cluster it has, during an upgrade too)."""
    rayservice = names.rayservice_name(ms.metadata.name)
    return build_network_policy(config, ms.metadata, "ModelService", rayservice, ms.spec.serve_from)


def network_policy_hash(policies: list[dict[str, Any]]) -> str:
    """What the RayService records of its policy: a digest of its spec, "off" for none."""
    return _digest(policies[0]["spec"]) if policies else "off"


def _pod_env(
    ms: api.ModelService, ref: str, secret: dict[str, Any] | None, gpus: int
) -> list[dict[str, Any]]:
    """rayship's env, the Serve settings spec.env does not name (the user's wins), then spec.env, every
    plain value by reference to the env Secret."""
    named = {e.name for e in ms.spec.env}
    env = pods.container_env(
        ref, gpus, [], names.ENV_MODELSERVICE, {k: v for k, v in SERVE_ENV.items() if k not in named}
    )
    return env + [
        {"name": e.name, "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": e.name}}}
        if secret is not None and e.value is not None
        else e.wire()
        for e in ms.spec.env
    ]


def env_secret(ms: api.ModelService, config: OperatorConfig) -> dict[str, Any] | None:
    """The Secret the pods' env reads spec.env's plain values from (None without any): in the RayService's
    pod templates they were readable by whoever may get rayservices, and on Ray's dashboard. Named by
    its content (an edit makes a new Secret, and the pods that read it), owned by the ModelService."""
    values = {e.name: e.value for e in ms.spec.env if e.value is not None}
    if not values:
        return None
    tag = pods.secret_tag(config, "modelservice-env", ms.metadata, canonical_json(values))
    metadata: dict[str, Any] = {
        "name": names.modelservice_env_secret(names.rayservice_name(ms.metadata.name), tag),
        "namespace": ms.metadata.namespace or "default",
        "labels": names.labels("ModelService", ms.metadata.name, "serving"),
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "stringData": values,
    }


def cluster_secrets(ms: api.ModelService, config: OperatorConfig) -> tuple[dict[str, Any], ...]:
    """The Secrets a serving cluster's pods read, made before the RayService that names them: the Ray
    token, and the env values if any."""
    env = env_secret(ms, config)
    return (token_secret(ms, config), *([env] if env is not None else []))


def desired_rayservice(
    ms: api.ModelService, config: OperatorConfig, model: Model, volume: ModelVolumes = None
) -> dict[str, Any]:
    rayservice = build_rayservice(ms, config, model, volume)
    key, value = model_annotation(model)
    rayservice["metadata"]["annotations"] = {
        names.ANNOTATION_CLUSTER_HASH: cluster_hash(rayservice["spec"]),
        key: value,
        names.ANNOTATION_NETWORK_POLICY: network_policy_hash(network_policy(ms, config)),
    }
    return rayservice
