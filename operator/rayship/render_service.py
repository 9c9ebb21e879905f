"""Pure renderer: a validated ModelService and the model URI it serves in, a `ray.io/v1` RayService out.

The model URI is the only thing that changes when a new model rolls out, and it lives only in
`serveConfigV2`: KubeRay applies such a change in place (a Serve rollout on the same cluster).
Anything in `rayClusterConfig` changing means a new cluster, per `upgradeStrategy`.
"""

from __future__ import annotations

from typing import Any

import yaml

from rayship import api, names, render
from rayship.config import OperatorConfig

IMPORT_PATH = "rayship_workloads.serve:app_builder"
DEPLOYMENT = "RayshipModel"  # @serve.deployment(name=...) in rayship_workloads.serve
SERVE_CONTAINER_HEAD = "ray-head"
SERVE_CONTAINER_WORKER = "ray-worker"
WORKER_GROUP = "serve-workers"
ENV_MODELSERVICE = "RAYSHIP_MODELSERVICE"


def serve_args(ms: api.ModelService, model_uri: str) -> dict[str, Any]:
    """The application's `args`: exactly what `rayship_workloads.serve.ServeArgs` accepts."""
    spec = ms.spec
    return {
        "modelUri": model_uri,
        "routePrefix": spec.route_prefix,
        "maxBatchSize": spec.batching.max_batch_size,
        "batchWaitTimeoutS": spec.batching.batch_wait_timeout_ms / 1000,
        "minReplicas": spec.replicas.min,
        "maxReplicas": spec.replicas.max,
        "targetOngoingRequests": spec.replicas.target_ongoing_requests,
        "numCpus": spec.resources.cpus,
        "numGpus": spec.resources.gpus,
    }


def serve_config(ms: api.ModelService, model_uri: str) -> dict[str, Any]:
    """serveConfigV2 (Ray's ServeDeploySchema) with one application."""
    spec = ms.spec
    return {
        "applications": [
            {
                "name": ms.metadata.name,
                "import_path": IMPORT_PATH,
                "route_prefix": spec.route_prefix,
                "args": serve_args(ms, model_uri),
                "deployments": [
                    {
                        "name": DEPLOYMENT,
                        "autoscaling_config": {
                            "min_replicas": spec.replicas.min,
                            "max_replicas": spec.replicas.max,
                            "target_ongoing_requests": spec.replicas.target_ongoing_requests,
                        },
                        "ray_actor_options": {
                            "num_cpus": spec.resources.cpus,
                            "num_gpus": spec.resources.gpus,
                        },
                    }
                ],
            }
        ]
    }


def ray_cluster_config(ms: api.ModelService, config: OperatorConfig) -> dict[str, Any]:
    spec, res = ms.spec, ms.spec.resources
    image = spec.image or config.default_image
    labels = names.labels("ModelService", ms.metadata.name, "serving")
    ref = render.object_ref(ms.metadata)

    def env(gpus: int) -> list[dict[str, Any]]:
        return render.container_env(ref, gpus, spec.env, ENV_MODELSERVICE)

    selector, tolerations = render.gpu_placement(
        config, res.gpus, res.gpu_product, res.node_selector, res.tolerations
    )
    return {
        "rayVersion": spec.ray_version or config.default_ray_version,
        "enableInTreeAutoscaling": True,  # Serve autoscaling adds and removes GPU worker pods
        "authOptions": {"mode": "token"},
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0"},  # no replicas on the head: it runs the Serve controller
            "template": render.pod_template(
                config,
                image=image,
                container=SERVE_CONTAINER_HEAD,
                cpus=2,
                memory="8Gi",
                gpus=0,
                labels=labels,
                env=env(0),
            ),
        },
        "workerGroupSpecs": [
            {
                "groupName": WORKER_GROUP,
                # one replica per pod: the pod count covers replicas.min..max (x resources.gpus GPUs)
                "replicas": spec.replicas.min,
                "minReplicas": spec.replicas.min,
                "maxReplicas": spec.replicas.max,
                "rayStartParams": {},
                "template": render.pod_template(
                    config,
                    image=image,
                    container=SERVE_CONTAINER_WORKER,
                    cpus=res.cpus,
                    memory=res.memory,
                    gpus=res.gpus,
                    labels=labels,
                    env=env(res.gpus),
                    node_selector=selector,
                    tolerations=tolerations,
                ),
            }
        ],
    }


def build_rayservice(ms: api.ModelService, config: OperatorConfig, model_uri: str) -> dict[str, Any]:
    spec = ms.spec
    metadata: dict[str, Any] = {"name": names.rayservice_name(ms.metadata.name)}
    if ms.metadata.namespace:
        metadata["namespace"] = ms.metadata.namespace
    metadata["labels"] = names.labels("ModelService", ms.metadata.name, "serving")
    upgrade: dict[str, Any] = {"type": spec.upgrade_strategy}
    if spec.upgrade_options is not None:
        upgrade["clusterUpgradeOptions"] = spec.upgrade_options.wire()
    return {
        "apiVersion": render.RAY_API_VERSION,
        "kind": "RayService",
        "metadata": metadata,
        "spec": {
            "upgradeStrategy": upgrade,
            "serveConfigV2": yaml.safe_dump(serve_config(ms, model_uri), sort_keys=True),
            "rayClusterConfig": ray_cluster_config(ms, config),
        },
    }


def service_url(ms: api.ModelService) -> str:
    """Where the service answers inside the cluster (KubeRay's `<rayservice>-serve-svc`, port 8000)."""
    namespace = ms.metadata.namespace or "default"
    prefix = "" if ms.spec.route_prefix == "/" else ms.spec.route_prefix
    return f"http://{names.rayservice_name(ms.metadata.name)}-serve-svc.{namespace}.svc:8000{prefix}"
