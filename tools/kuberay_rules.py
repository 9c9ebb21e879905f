"""The KubeRay v1.7 admission rules (ray-operator/controllers/ray/utils/validation.go) that a
rendered RayJob could break, ported as a test oracle. KubeRay marks a RayJob that breaks them
`ValidationFailed` at run time, long after `kubectl apply` said yes; we catch it in CI instead."""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_RAYJOB_NAME = 47
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _groups(cluster: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [("Head", cluster["headGroupSpec"])] + [
        (g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])
    ]


def _name_violations(name: str) -> list[str]:
    found = []
    if len(name) > MAX_RAYJOB_NAME:  # RayService: 53 - 6 = 47 as well
        found.append(f"name longer than {MAX_RAYJOB_NAME}")
    if not DNS1035.match(name):
        found.append("name is not a DNS-1035 label")
    return found


def rayservice_violations(rayservice: dict[str, Any]) -> list[str]:
    found = _name_violations(rayservice["metadata"]["name"])
    spec = rayservice["spec"]
    found += cluster_violations(spec["rayClusterConfig"])
    upgrade = spec.get("upgradeStrategy") or {}
    if upgrade.get("type") not in (None, "None", "NewCluster", "NewClusterWithIncrementalUpgrade"):
        found.append(f"invalid upgradeStrategy {upgrade.get('type')}")
    if upgrade.get("type") == "NewClusterWithIncrementalUpgrade":
        options = upgrade.get("clusterUpgradeOptions")
        if not spec["rayClusterConfig"].get("enableInTreeAutoscaling"):
            found.append("incremental upgrade needs the autoscaler")
        if not options or not options.get("gatewayClassName") or not options.get("intervalSeconds"):
            found.append("incremental upgrade needs clusterUpgradeOptions")
        elif (
            not 0 <= options.get("stepSizePercent", -1) <= 100
            or not 0 <= options.get("maxSurgePercent", 100) <= 100
        ):
            found.append("percentages out of range")
    head_svc = spec["rayClusterConfig"]["headGroupSpec"].get("headService") or {}
    if (head_svc.get("metadata") or {}).get("name"):
        found.append("headService name must not be set")
    return found


def rayjob_violations(rayjob: dict[str, Any]) -> list[str]:
    found = _name_violations(rayjob["metadata"]["name"])
    spec = rayjob["spec"]
    shutdown = spec.get("shutdownAfterJobFinishes", False)
    if spec.get("suspend") and not shutdown:
        found.append("suspend needs shutdownAfterJobFinishes")
    if spec.get("ttlSecondsAfterFinished", 0) < 0:
        found.append("negative ttlSecondsAfterFinished")
    if not shutdown and spec.get("ttlSecondsAfterFinished", 0) > 0:
        found.append("ttlSecondsAfterFinished without shutdownAfterJobFinishes")
    if spec.get("activeDeadlineSeconds") is not None and spec["activeDeadlineSeconds"] <= 0:
        found.append("activeDeadlineSeconds must be positive")
    if spec.get("backoffLimit") is not None and spec["backoffLimit"] < 0:
        found.append("negative backoffLimit")
    if spec.get("runtimeEnvYAML"):
        try:
            yaml.safe_load(spec["runtimeEnvYAML"])
        except yaml.YAMLError:
            found.append("runtimeEnvYAML is not YAML")
    cluster = spec.get("rayClusterSpec")
    if cluster is None and not spec.get("clusterSelector"):
        found.append("neither rayClusterSpec nor clusterSelector")
        return found
    return found + cluster_violations(cluster)


def cluster_violations(cluster: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for group, g in _groups(cluster):
        params = g.get("rayStartParams", {})
        if not g["template"]["spec"].get("containers"):
            found.append(f"{group}: no containers")
        if any(params.get(k) for k in RESOURCE_PARAMS) and g.get("resources"):
            found.append(f"{group}: resources in both rayStartParams and resources")
        if "labels" in params:
            found.append(f"{group}: rayStartParams['labels'] is not supported")
        if group != "Head" and g.get("suspend") and cluster.get("enableInTreeAutoscaling"):
            found.append(f"{group}: suspended worker group with autoscaling")
    head_env = {
        e["name"]: e.get("value")
        for e in cluster["headGroupSpec"]["template"]["spec"]["containers"][0].get("env", [])
    }
    if not cluster.get("enableInTreeAutoscaling") and head_env.get("RAY_enable_autoscaler_v2") in (
        "1",
        "true",
    ):
        found.append("autoscaler v2 env without enableInTreeAutoscaling")
    if "RAY_REDIS_ADDRESS" in head_env and not cluster.get("gcsFaultToleranceOptions"):
        found.append("RAY_REDIS_ADDRESS without gcsFaultToleranceOptions")
    if (cluster.get("authOptions") or {}).get("mode") == "token":
        version = cluster.get("rayVersion")
        if not version or _version(version) < (2, 52, 0):
            found.append("token auth needs rayVersion >= 2.52.0")
    return found
