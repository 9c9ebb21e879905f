"""The only module that talks to the Kubernetes API (through the official client)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, cast

import kubernetes
import kubernetes.utils
from kubernetes.client.exceptions import ApiException

from rayship.api import Resource


class Conflict(Exception):
    """The object changed since it was read (HTTP 409): read it again and retry."""


def configure() -> None:
    """In a pod: the service account; elsewhere: the current kubeconfig context."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    _client.cache_clear()
    _custom.cache_clear()


@functools.cache
def _client() -> kubernetes.client.ApiClient:
    """One API client (one connection pool) for every request."""
    return kubernetes.client.ApiClient()


@functools.cache
def _custom() -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(_client())


def get(resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
    group, version, plural = resource
    try:
        found = _custom().get_namespaced_custom_object(group, version, namespace, plural, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return cast(dict[str, Any], found)


def create(resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
    """Create a custom object; if it already exists (a concurrent reconcile won), return the stored one."""
    group, version, plural = resource
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        created = _custom().create_namespaced_custom_object(group, version, namespace, plural, dict(body))
        return cast(dict[str, Any], created)
    except ApiException as err:
        if err.status != 409:
            raise
    existing = get(resource, namespace, name)
    if existing is None:
        raise Conflict(f"{plural} {namespace}/{name} was reported to exist but is gone")
    return existing


def ensure(body: Mapping[str, Any]) -> None:
    """Create a core/RBAC object (ServiceAccount, Role, RoleBinding...) unless it already exists."""
    try:
        kubernetes.utils.create_from_dict(_client(), dict(body))
    except kubernetes.utils.FailToCreateError as err:
        if any(e.status != 409 for e in err.api_exceptions):
            raise


def patch(resource: Resource, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
    group, version, plural = resource
    patched = _custom().patch_namespaced_custom_object(group, version, namespace, plural, name, dict(body))
    return cast(dict[str, Any], patched)


def patch_status(
    resource: Resource, namespace: str, name: str, status: Mapping[str, Any], resource_version: str
) -> None:
    """Merge-patch the status subresource, only if the object is still at `resource_version`."""
    group, version, plural = resource
    body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status)}
    try:
        _custom().patch_namespaced_custom_object_status(group, version, namespace, plural, name, body)
    except ApiException as err:
        if err.status == 409:
            raise Conflict(f"{plural} {namespace}/{name} changed while its status was computed") from None
        raise
