"""Small helpers for the operator tier: objects on the real API server, waiting, Events."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes
import yaml
from kubernetes.client.exceptions import ApiException

from rayship import api
from tests.conftest import SAMPLES

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 60, interval: float = 0.5, what: str = "") -> T:
    """Poll `check` until it returns something truthy; fail with `what` (and the last value) otherwise."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what or check}: last {value!r}"
            )
        time.sleep(interval)
        value = check()
    return value


class Kube:
    """The objects of one test namespace, as the cluster admin."""

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str):
        self.namespace = namespace
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.core = kubernetes.client.CoreV1Api(client)
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(client)
        self.client = client

    def create(self, resource: api.Resource, body: dict[str, Any]) -> dict[str, Any]:
        group, version, plural = resource
        body = copy.deepcopy(body)
        body["metadata"]["namespace"] = self.namespace
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            group, version, self.namespace, plural, body, field_validation="Strict"
        )
        return created

    def get(self, resource: api.Resource, name: str) -> dict[str, Any] | None:
        group, version, plural = resource
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                group, version, self.namespace, plural, name
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return found

    def list(self, resource: api.Resource, selector: str = "") -> list[dict[str, Any]]:
        group, version, plural = resource
        found = self.custom.list_namespaced_custom_object(
            group, version, self.namespace, plural, label_selector=selector
        )
        return list(found["items"])

    def patch(self, resource: api.Resource, name: str, body: dict[str, Any]) -> dict[str, Any]:
        group, version, plural = resource
        patched: dict[str, Any] = self.custom.patch_namespaced_custom_object(
            group, version, self.namespace, plural, name, body
        )
        return patched

    def delete(self, resource: api.Resource, name: str) -> None:
        group, version, plural = resource
        try:
            self.custom.delete_namespaced_custom_object(group, version, self.namespace, plural, name)
        except ApiException as err:
            if err.status != 404:
                raise

    def status(self, resource: api.Resource, name: str) -> dict[str, Any]:
        return (self.get(resource, name) or {}).get("status") or {}

    def condition(self, resource: api.Resource, name: str, type_: str) -> dict[str, Any]:
        conditions = self.status(resource, name).get("conditions") or []
        return next((c for c in conditions if c.get("type") == type_), {})

    def events(self, name: str) -> list[tuple[str, str, str]]:
        """(type, reason, message) of the Events on object `name`, oldest first."""
        found = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}")
        items = sorted(found.items, key=lambda e: e.metadata.creation_timestamp)
        return [(e.type, e.reason, e.message) for e in items]

    def pods(self, selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def pvc(self, name: str = "rayship-checkpoints", size: str = "1Gi") -> None:
        """An ordinary PersistentVolumeClaim of the default StorageClass."""
        self.core.create_namespaced_persistent_volume_claim(
            self.namespace,
            {
                "metadata": {"name": name},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
            },
        )


def sample(name: str, file: str = "kind-trainingjob-cpu.yaml", **spec: Any) -> dict[str, Any]:
    """A sample document named `name`, with top-level spec fields replaced by `spec`."""
    doc: dict[str, Any] = yaml.safe_load((SAMPLES / file).read_text())
    doc["metadata"]["name"] = name
    doc["spec"].update(spec)
    return doc
