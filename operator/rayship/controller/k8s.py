"""The only module that talks to the Kubernetes API (through the official client).

Every request has a timeout; refusals that retrying cannot fix become `Rejected` (for the owner's
status), objects of the same name that belong to someone else are never used.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any, cast

import kubernetes
import kubernetes.utils
import urllib3
from kubernetes.client.exceptions import ApiException

from rayship.api import Resource, names
from rayship.controller.conditions import Probe, describe_foreign, ownership

log = logging.getLogger("rayship")

# (connect, read) seconds on every request: a hung API server call never stalls a reconcile for good.
TIMEOUT = (5, 30)


class Conflict(Exception):
    """The object changed since it was read (HTTP 409): read it again and retry."""


class Rejected(Exception):
    """The API server refused a request for good (400/422: the object is invalid), or the name is
    taken by an object that is not ours: retrying the same request cannot succeed.
    `phase`/`reason`/`message` go to the owner's status."""

    def __init__(self, phase: str, reason: str, message: str):
        super().__init__(message)
        self.phase, self.reason, self.message = phase, reason, message


class Busy(Exception):
    """Not now, retry in seconds: an object of that name belongs to an earlier owner of the same name,
    which is being garbage-collected, or the API server does not know a kind it was just given yet."""


class Terminating(Exception):
    """The namespace is being deleted (the API server refuses anything new in it, 403): whatever the
    reconcile meant to make goes away with the namespace."""


def configure(connections: int | None = None) -> None:
    """In a pod: the service account; elsewhere: the current kubeconfig context. `connections`: the
    most requests made at once (the client keeps 5 per CPU; one more is a new TLS connection each)."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    if connections is not None:
        config = kubernetes.client.Configuration.get_default_copy()
        config.connection_pool_maxsize = max(config.connection_pool_maxsize, connections)
        kubernetes.client.Configuration.set_default(config)
    _client.cache_clear()
    _custom.cache_clear()


@functools.cache
def _client() -> kubernetes.client.ApiClient:
    """One API client (one connection pool) for every request."""
    return kubernetes.client.ApiClient()


@functools.cache
def _custom() -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(_client())


def _classified(err: ApiException) -> Rejected | Busy | Terminating | None:
    """What a refusal means for the reconcile: a 400/422 is `Rejected`, with the API server's own
    message (it names the field); a 403 because the API server cannot map the owner's kind yet (a CRD
    installed moments ago: the OwnerReferencesPermissionEnforcement admission checks ownerReferences
    against discovery, which lags) is `Busy`, retried in seconds rather than after kopf's minute; a
    403 because the namespace is being deleted is `Terminating`; anything else is None (raised as it
    is)."""
    try:
        message = json.loads(err.body or "{}").get("message") or str(err.reason)
    except ValueError:
        message = str(err.body or err.reason)
    if err.status in (400, 422):
        return Rejected("Invalid", "RejectedByAPIServer", message)
    if err.status == 403 and "cannot find RESTMapping" in message:
        return Busy(f"the API server does not know the owner's kind yet: {message}")
    if err.status == 403 and "because it is being terminated" in message:
        return Terminating(message)
    return None


def namespace_terminating(namespace: str) -> bool:
    """Whether the namespace is being deleted (or is gone): its objects, and their status, go with it."""
    try:
        found = kubernetes.client.CoreV1Api(_client()).read_namespace(namespace, _request_timeout=TIMEOUT)
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    return found.status is not None and found.status.phase == "Terminating"  # set with its deletionTimestamp


def get(resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
    group, version, plural = resource
    try:
        if not group:  # a core object: the client's typed reader, its answer as the API's JSON
            read = _CORE_READERS[plural]
            typed = read(kubernetes.client.CoreV1Api(_client()), name, namespace, _request_timeout=TIMEOUT)
            return cast(dict[str, Any], _client().sanitize_for_serialization(typed))
        found = _custom().get_namespaced_custom_object(
            group, version, namespace, plural, name, _request_timeout=TIMEOUT
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return cast(dict[str, Any], found)


# The core resources `get` reads (RBAC grants the operator `get` on exactly these).
_CORE_READERS: dict[str, Callable[..., Any]] = {
    "persistentvolumeclaims": kubernetes.client.CoreV1Api.read_namespaced_persistent_volume_claim,
}


def list_objects(resource: Resource, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The custom objects of a namespace matching a label selector."""
    group, version, plural = resource
    found = cast(
        dict[str, Any],
        _custom().list_namespaced_custom_object(
            group, version, namespace, plural, label_selector=selector, _request_timeout=TIMEOUT
        ),
    )
    return cast(list[dict[str, Any]], found.get("items") or [])


def delete(resource: Resource, namespace: str, name: str, uid: str) -> None:
    """Delete a custom object, only the one with `uid` (a namesake made since is not touched); its own
    children go by the garbage collector. One already gone, or replaced, is left as it is."""
    group, version, plural = resource
    body = kubernetes.client.V1DeleteOptions(
        preconditions=kubernetes.client.V1Preconditions(uid=uid), propagation_policy="Background"
    )
    try:
        _custom().delete_namespaced_custom_object(
            group, version, namespace, plural, name, body=body, _request_timeout=TIMEOUT
        )
    except ApiException as err:
        if err.status not in (404, 409):  # 409: the uid precondition failed (a namesake)
            raise


def list_pods(namespace: str, selector: str) -> list[dict[str, Any]]:
    """The pods matching a label selector, as plain dicts (for their scheduling and container state)."""
    found = kubernetes.client.CoreV1Api(_client()).list_namespaced_pod(
        namespace, label_selector=selector, _request_timeout=TIMEOUT
    )
    return [cast(dict[str, Any], _client().sanitize_for_serialization(pod)) for pod in found.items]


def create(resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
    """Create a custom object; if it already exists (a concurrent reconcile won, or someone else's),
    return the stored one: the caller checks whose it is."""
    group, version, plural = resource
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        created = _custom().create_namespaced_custom_object(
            group, version, namespace, plural, dict(body), field_validation="Strict", _request_timeout=TIMEOUT
        )
        return cast(dict[str, Any], created)
    except ApiException as err:
        if (refused := _classified(err)) is not None:
            raise refused from None
        if err.status != 409:
            raise
    existing = get(resource, namespace, name)
    if existing is None:
        raise Conflict(f"{plural} {namespace}/{name} was reported to exist but is gone")
    return existing


def ensure(body: Mapping[str, Any], owner: Mapping[str, Any]) -> None:
    """Create a core/RBAC/networking object (ServiceAccount, RoleBinding, Secret, NetworkPolicy) owned by
    `owner`, unless `owner` already owns one of that name (one with a spec, a NetworkPolicy, then has
    it brought to `body`'s). One that exists and is not `owner`'s is never used: `Busy` if it
    belongs to an earlier namesake being garbage-collected, `Rejected` otherwise."""
    try:
        kubernetes.utils.create_from_dict(_client(), dict(body), _request_timeout=TIMEOUT)
        return
    except kubernetes.utils.FailToCreateError as err:
        for refused in map(_classified, err.api_exceptions):
            if refused is not None:
                raise refused from None
        if any(e.status != 409 for e in err.api_exceptions):
            raise
    if body["kind"] == "Secret":
        _claim_secret(body, owner)
        return
    read, patch = _core_api(body["kind"])
    meta = body["metadata"]
    existing = cast(dict[str, Any], _client().sanitize_for_serialization(
        read(meta["name"], meta["namespace"], _request_timeout=TIMEOUT)
    ))  # fmt: skip
    how = ownership(existing, owner)
    if how == "owned":
        if "spec" in body and existing.get("spec") != body["spec"]:
            # What it should be changed since it was made (a NetworkPolicy: a ModelService's serveFrom,
            # the chart's settings): the whole spec replaced (a merge patch keeps removed rules).
            replace = [{"op": "replace", "path": "/spec", "value": body["spec"]}]
            patch(meta["name"], meta["namespace"], replace, _request_timeout=TIMEOUT)
        return
    message = describe_foreign(existing, str(body["kind"]), how)
    if how == "previous":
        raise Busy(message)
    raise Rejected("Failed", "WorkloadIdentityTaken", message)


def _claim_secret(body: Mapping[str, Any], owner: Mapping[str, Any]) -> None:
    """A Secret of `body`'s name exists. Its name can be seen in the RayJob or RayService, so whoever may
    create Secrets in the namespace could have planted one there (after deleting ours, or before a
    namesake is re-created), holding a token or a spec they know. It is never read (the operator reads
    no Secret): one JSON patch makes it hold exactly `body`'s data, and the API server applies it only if
    its tests pass first: the Secret's ownerReferences are `body`'s (the owner's UID) and its type too.
    Anyone else's fails them (422) and is not used: SecretNameTaken, and nothing starts."""
    meta = body["metadata"]
    data = {**(body.get("data") or {}), **{
        k: base64.b64encode(str(v).encode()).decode() for k, v in (body.get("stringData") or {}).items()
    }}  # fmt: skip
    claim = [
        {"op": "test", "path": "/metadata/ownerReferences", "value": meta["ownerReferences"]},
        {"op": "test", "path": "/type", "value": body.get("type", "Opaque")},
        {"op": "replace", "path": "/data", "value": data},
    ]
    core = kubernetes.client.CoreV1Api(_client())
    try:
        core.patch_namespaced_secret(meta["name"], meta["namespace"], claim, _request_timeout=TIMEOUT)
    except kubernetes.client.ApiException as err:
        if err.status != 422:
            raise
        owner_meta = owner.get("metadata", {})
        raise Rejected(
            "Failed",
            "SecretNameTaken",
            f"Secret {meta['name']} already exists and was not made by rayship for {owner.get('kind')} "
            f"{owner_meta.get('name')}: it is never used (what it holds would reach the Ray pods); delete "
            "it, or rename this object",
        ) from None


def _core_api(kind: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(read, patch) of the namespaced objects `ensure` makes (a Secret is never read; only an object
    with a spec is ever patched, and RBAC grants patch only for those)."""
    core = kubernetes.client.CoreV1Api(_client())
    rbac = kubernetes.client.RbacAuthorizationV1Api(_client())
    networking = kubernetes.client.NetworkingV1Api(_client())
    return {
        "ServiceAccount": (core.read_namespaced_service_account, core.patch_namespaced_service_account),
        "RoleBinding": (rbac.read_namespaced_role_binding, rbac.patch_namespaced_role_binding),
        "NetworkPolicy": (
            networking.read_namespaced_network_policy,
            networking.patch_namespaced_network_policy,
        ),
    }[kind]


def token_key(namespace: str) -> str:
    """The key Ray tokens are derived from: Secret rayship-ray-token-key in the operator's namespace,
    made on first start (its Role may get that one Secret by name, and create Secrets there)."""
    if not namespace:
        log.warning(
            "RAYSHIP_NAMESPACE is not set: the Ray token key lives only in this process, so after a "
            "restart model rollouts of existing ModelServices cannot be confirmed from Serve"
        )
        return secrets.token_hex(32)
    core = kubernetes.client.CoreV1Api(_client())
    for _attempt in range(3):
        try:
            found = core.read_namespaced_secret(names.TOKEN_KEY_SECRET, namespace, _request_timeout=TIMEOUT)
            return base64.b64decode((found.data or {})["key"]).decode()
        except ApiException as err:
            if err.status != 404:
                raise
        body = kubernetes.client.V1Secret(
            metadata=kubernetes.client.V1ObjectMeta(name=names.TOKEN_KEY_SECRET, namespace=namespace),
            type="Opaque",
            string_data={"key": secrets.token_hex(32)},
        )
        try:
            core.create_namespaced_secret(namespace, body, _request_timeout=TIMEOUT)
        except ApiException as err:
            if err.status != 409:  # made meanwhile by another operator process: read it
                raise
    raise RuntimeError(f"Secret {namespace}/{names.TOKEN_KEY_SECRET} could neither be read nor created")


def proxy_get(namespace: str, probe: Probe) -> tuple[int, str]:
    """GET through the API server's service proxy (as KubeRay reaches the Ray dashboard):
    (HTTP code, body); a code of 0 when the API server could not be reached."""
    headers = {"x-ray-authorization": f"Bearer {probe.token}"} if probe.token else {}
    core = kubernetes.client.CoreV1Api(_client())
    try:
        # raw: the client would otherwise turn a JSON body into a Python object's repr
        raw = core.connect_get_namespaced_service_proxy_with_path(
            probe.service,
            namespace,
            probe.path,
            _headers=headers,
            _request_timeout=TIMEOUT,
            _preload_content=False,
        )
    except ApiException as err:
        return int(err.status or 0), str(err.body or err.reason or "")
    except (OSError, urllib3.exceptions.HTTPError) as err:  # not reached: said in the status
        return 0, str(err)
    response = cast(Any, raw)
    return int(response.status), bytes(response.data).decode("utf-8", errors="replace")


def patch(resource: Resource, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
    group, version, plural = resource
    try:
        patched = _custom().patch_namespaced_custom_object(
            group,
            version,
            namespace,
            plural,
            name,
            dict(body),
            field_validation="Strict",
            _request_timeout=TIMEOUT,
        )
    except ApiException as err:
        if (refused := _classified(err)) is not None:
            raise refused from None
        raise
    return cast(dict[str, Any], patched)


def patch_status(
    resource: Resource, namespace: str, name: str, status: Mapping[str, Any], resource_version: str
) -> dict[str, Any]:
    """Merge-patch the status subresource, only if the object is still at `resource_version`; the
    object as stored after."""
    group, version, plural = resource
    body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status)}
    try:
        return cast(
            dict[str, Any],
            _custom().patch_namespaced_custom_object_status(
                group, version, namespace, plural, name, body, _request_timeout=TIMEOUT
            ),
        )
    except ApiException as err:
        if err.status == 409:
            raise Conflict(f"{plural} {namespace}/{name} changed while its status was computed") from None
        raise
