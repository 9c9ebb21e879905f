"""
A Kubernetes API emulator for tests: kopf and the official client run against it over HTTP.

It is kmock's :class:`kmock.KubernetesEmulator` (the HTTP server, API discovery, ``Status``
error bodies, the object store with history) plus the API-server behaviour that kopf relies on
and plain kmock lacks: server-set metadata (uid, resourceVersion, generation), 201/409 on create,
the status subresource, optimistic concurrency, merge and JSON patches, label/field selectors,
watches resumable from a resourceVersion, finalizers, ownerReference garbage collection,
and a record of every request by its RBAC verb.

Tests use :func:`running_emulator`, which serves it from a background thread and hands out
an :class:`EmulatorHandle` with synchronous helpers. Everything the helpers change goes through
the same code as HTTP requests do, so watchers (kopf) see exactly the same events.

Known simplifications: no admission/validation, no namespace cascade on namespace deletion,
no periodic BOOKMARKs, no 410 Gone (the whole event history is kept), a watch filters events
by the object's state in the event (no synthetic ADDED/DELETED when an object starts/stops
matching a selector), strategic-merge patches are treated as merge patches, and a PUT
without ``metadata.resourceVersion`` is an unconditional update.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import datetime
import functools
import json
import logging
import re
import shutil
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import aiohttp.test_utils
import aiohttp.web
import attrs
import kmock

logger = logging.getLogger(__name__)

Body = dict[str, Any]
T = TypeVar("T")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@dataclass(frozen=True)
class Resource:
    """A resource kind served by the emulator, e.g. ``Resource("ray.io", "v1", "rayjobs", "RayJob")``."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = True

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` of the objects: ``group/version``, or just ``version`` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version


NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False, status_subresource=False)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", status_subresource=False)
EVENTS = Resource("", "v1", "events", "Event", status_subresource=False)
K8S_EVENTS = Resource("events.k8s.io", "v1", "events", "Event", status_subresource=False)
BUILTIN_RESOURCES = (NAMESPACES, CONFIGMAPS, EVENTS, K8S_EVENTS)


class ApiRequest(NamedTuple):
    """One resource request as RBAC sees it; ``subresource``/``namespace`` are None when absent."""

    verb: str
    group: str
    version: str
    resource: str
    subresource: str | None
    namespace: str | None


class _Route(NamedTuple):
    request: ApiRequest
    name: str | None


class _WatchEvent(NamedTuple):
    rv: int
    resource: Resource
    type: str
    object: Body


# /api/v1/... or /apis/group/version/... with something after the version (else: discovery).
_API_PATH = re.compile(
    r"^/(?:api/(?P<core_version>[^/]+)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))/(?P<rest>.+?)/?$"
)
_VERB_OF_METHOD = {"POST": "create", "PUT": "update", "PATCH": "patch"}
_SERVER_OWNED_METADATA = (
    "name namespace uid creationTimestamp deletionTimestamp generation resourceVersion".split()
)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _qualified(res: Resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else res.plural


def _error(
    status: int, reason: str, message: str, res: Resource | None = None, name: str | None = None
) -> kmock.KubernetesError:
    """An API refusal, rendered by kmock as a ``Status`` body with this code and reason."""
    details = {"name": name or "", "group": res.group if res else "", "kind": res.plural if res else ""}
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details)


def _spec_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """What changes metadata.generation: everything except metadata and status."""
    return {
        key: value for key, value in body.items() if key not in ("metadata", "status", "apiVersion", "kind")
    }


# --- patches -------------------------------------------------------------------------------------


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, ``None`` removes a key, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"not a JSON pointer: {path!r}")
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _index(token: str, bound: int) -> int:
    index = int(token)
    if not 0 <= index < bound:
        raise IndexError(f"index {index} is out of range")
    return index


def _resolve(document: Any, tokens: list[str]) -> Any:
    for token in tokens:
        document = document[_index(token, len(document))] if isinstance(document, list) else document[token]
    return document


def _add(document: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent, last = _resolve(document, tokens[:-1]), tokens[-1]
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else _index(last, len(parent) + 1), value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise TypeError(f"cannot add {last!r} to a {type(parent).__name__}")
    return document


def _remove(document: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise ValueError("cannot remove the whole document")
    parent, last = _resolve(document, tokens[:-1]), tokens[-1]
    if isinstance(parent, list):
        del parent[_index(last, len(parent))]
    else:
        del parent[last]
    return document


def _json_patch(document: Body, operations: Any) -> Body:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); any failure is a 422."""
    if not isinstance(operations, list):
        raise _error(400, "BadRequest", "a JSON patch must be a list of operations")
    result = copy.deepcopy(document)
    for operation in operations:
        try:
            kind, path = operation["op"], _pointer(operation["path"])
            if kind == "test":
                if _resolve(result, path) != operation["value"]:
                    raise ValueError(f"the value at {operation['path']!r} is not {operation['value']!r}")
                continue
            if kind in ("move", "copy"):
                source = _pointer(operation["from"])
                value = copy.deepcopy(_resolve(result, source))
                if kind == "move":
                    result = _remove(result, source)
            elif kind in ("add", "replace"):
                value = copy.deepcopy(operation["value"])
            elif kind != "remove":
                raise ValueError(f"unknown operation {kind!r}")
            if kind in ("remove", "replace"):
                result = _remove(result, path)
            if kind != "remove":
                result = _add(result, path, value)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise _error(422, "Invalid", f"the JSON patch operation {operation!r} failed: {e!r}") from e
    return result


# --- selectors -----------------------------------------------------------------------------------

_LABEL_REQUIREMENT = re.compile(
    r"^(?P<absent>!)?\s*(?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)"
    r"(?:\s*(?P<op>==|=|!=)\s*(?P<value>[-A-Za-z0-9_.]*)|\s+(?P<set_op>in|notin)\s*\((?P<values>[^()]*)\))?\s*$"
)
_FIELD_REQUIREMENT = re.compile(
    r"^\s*(?P<field>metadata\.name|metadata\.namespace)\s*(?P<op>==|=|!=)\s*(?P<value>.*?)\s*$"
)


def _label_ok(
    labels: Mapping[str, str], *, absent: bool, key: str, op: str | None, values: frozenset[str]
) -> bool:
    if absent:
        return key not in labels
    if op is None:
        return key in labels
    if op in ("=", "==", "in"):
        return labels.get(key) in values
    return labels.get(key) not in values  # "!=" and "notin" also match objects without the label


def _label_matcher(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """Parse a label selector: ``key``, ``!key``, ``key=v``, ``key==v``, ``key!=v``, ``key in (a,b)``, ``key notin (a,b)``."""
    checks = []
    for term in re.split(r",(?![^()]*\))", selector):
        if not term.strip():
            continue
        match = _LABEL_REQUIREMENT.match(term.strip())
        if match is None or (match["absent"] and (match["op"] or match["set_op"])):
            raise _error(400, "BadRequest", f"unable to parse the label selector requirement {term!r}")
        values = match["values"].split(",") if match["set_op"] else [match["value"] or ""]
        checks.append(
            functools.partial(
                _label_ok,
                absent=bool(match["absent"]),
                key=match["key"],
                op=match["op"] or match["set_op"],
                values=frozenset(value.strip() for value in values),
            )
        )
    return lambda labels: all(check(labels) for check in checks)


def _field_matcher(selector: str) -> Callable[[Body], bool]:
    """Parse a field selector over ``metadata.name`` and ``metadata.namespace`` (``=``, ``==``, ``!=``)."""
    checks: list[tuple[str, bool, str]] = []
    for term in selector.split(","):
        if not term.strip():
            continue
        match = _FIELD_REQUIREMENT.match(term)
        if match is None:
            raise _error(
                400, "BadRequest", f"unsupported field selector {term!r}: only metadata.name/namespace"
            )
        checks.append((match["field"].split(".")[1], match["op"] != "!=", match["value"]))
    return lambda body: all(
        ((body["metadata"].get(field) or "") == value) == equal for field, equal, value in checks
    )


# --- the emulator --------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """
    kmock's Kubernetes emulator with the API-server semantics kopf needs (see the module docstring).

    Requests for registered resources are served here; everything else (discovery, ``/version``)
    goes to kmock as is. The public methods (``create``, ``replace``, ``patch``, ``delete``, ``find``,
    ``list_objects``) are the single code path for HTTP and for tests, and must run in the server's
    event loop: from other threads, use :class:`EmulatorHandle`. Read kmock's ``objects`` (with their
    history) freely, but never write them directly: that would bypass resourceVersions and watch events.
    """

    api_requests: list[ApiRequest] = attrs.field(factory=list, init=False)
    _registered: dict[tuple[str, str, str], Resource] = attrs.field(factory=dict, init=False)
    _last_rv: int = attrs.field(default=0, init=False)
    _history: list[_WatchEvent] = attrs.field(factory=list, init=False)
    _changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _closing: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for res in BUILTIN_RESOURCES:
            self.register(res)

    def register(self, res: Resource) -> None:
        """Serve this resource and announce it in the API discovery."""
        self._registered[res.group, res.version, res.plural] = res
        self.resources[kmock.resource(res.group, res.version, res.plural)] = kmock.ResourceInfo(
            kind=res.kind,
            singular=res.kind.lower(),
            namespaced=res.namespaced,
            verbs=set(VERBS),
            subresources={"status"} if res.status_subresource else set(),
        )

    def close_watches(self) -> None:
        """End all watch streams (and refuse new ones) so that the server can stop at once."""
        self._closing = True
        self._changed.set()

    # --- HTTP ------------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        route = self._route(raw_request.method, raw_request.path, raw_request.query)
        if route is None:  # discovery, /version, non-API paths: kmock serves them
            if raw_request.path.endswith("/") and raw_request.path != "/":  # e.g. /api/ (the official client)
                raw_request = raw_request.clone(
                    rel_url=raw_request.rel_url.with_path(raw_request.path.rstrip("/"))
                )
            return await super().__call__(raw_request)
        self.api_requests.append(route.request)
        try:
            if route.request.verb == "watch":
                return await self._serve_watch(route, raw_request)
            payload = await raw_request.read()
            status, body = self._serve(route, raw_request.query, raw_request.content_type, payload)
            return aiohttp.web.json_response(body, status=status)
        except kmock.KubernetesError as e:  # an API refusal (404, 409, 422, ...), not a server failure
            return await self._render_error(e)
        except Exception as e:
            # An emulator bug: answer 500 with the traceback, and fail the test in running_emulator().
            logger.exception("The emulator failed on %s %s", raw_request.method, raw_request.path_qs)
            self.errors.append(e)
            return await self._render_error(e)

    def _route(self, method: str, path: str, query: Mapping[str, str]) -> _Route | None:
        match = _API_PATH.match(path)
        if match is None:
            return None
        group, version = match["group"] or "", match["version"] or match["core_version"]
        segments, namespace = match["rest"].split("/"), None
        namespace_subresource = group == "" and len(segments) == 3 and segments[2] in ("status", "finalize")
        if len(segments) >= 3 and segments[0] == "namespaces" and not namespace_subresource:
            namespace, segments = segments[1], segments[2:]
        plural, name, subresource = segments[0], (segments[1:] or [None])[0], "/".join(segments[2:]) or None
        if method == "GET":
            verb = "watch" if query.get("watch", "").lower() in ("true", "1") else "get" if name else "list"
        elif method == "DELETE":
            verb = "delete" if name else "deletecollection"
        else:
            verb = _VERB_OF_METHOD.get(method, method.lower())
        return _Route(ApiRequest(verb, group, version, plural, subresource, namespace), name)

    def _resource_of(self, route: _Route) -> Resource:
        """The registered resource addressed by a request, or a 404 for what the real API would not serve."""
        req = route.request
        res = self._registered.get((req.group, req.version, req.resource))
        if res is None:
            raise _error(404, "NotFound", "the server could not find the requested resource")
        problem = (
            f"have no {req.subresource!r} subresource"
            if req.subresource not in (None, "status") or (req.subresource and not res.status_subresource)
            else "are namespaced: the URL needs a namespace"
            if res.namespaced
            and req.namespace is None
            and req.verb not in ("list", "watch", "deletecollection")
            else "are cluster-scoped: the URL has a namespace"
            if not res.namespaced and req.namespace is not None
            else None
        )
        if problem is not None:
            raise _error(404, "NotFound", f"{_qualified(res)} {problem}", res, route.name)
        return res

    def _serve(
        self, route: _Route, query: Mapping[str, str], content_type: str, payload: bytes
    ) -> tuple[int, Any]:
        res, req, name = self._resource_of(route), route.request, route.name or ""
        body: Any = None
        if req.verb in ("create", "update", "patch"):
            try:
                body = json.loads(payload or b"null")
            except ValueError as e:
                raise _error(400, "BadRequest", f"the request body is not JSON: {e}") from e
            if not isinstance(body, dict) and not (req.verb == "patch" and isinstance(body, list)):
                raise _error(400, "BadRequest", "the request body must be a JSON object")
        matches = self._matcher(res, req.namespace, None, query)
        match req.verb:
            case "get":
                return 200, self._existing(res, req.namespace, name)
            case "list":
                items = [obj for obj in self._live(res) if matches(obj)]
                list_meta = {"resourceVersion": str(self._last_rv)}
                return 200, {
                    "apiVersion": res.api_version,
                    "kind": f"{res.kind}List",
                    "metadata": list_meta,
                    "items": items,
                }
            case "create":
                return 201, self.create(res, body, namespace=req.namespace)
            case "update":
                return 200, self.replace(res, req.namespace, name, body, subresource=req.subresource)
            case "patch":
                return 200, self.patch(
                    res, req.namespace, name, body, content_type=content_type, subresource=req.subresource
                )
            case "delete":
                last = self.delete(res, req.namespace, name)
                if self.find(res, req.namespace, name) is not None:  # held by finalizers
                    return 200, last
                details = {
                    "name": name,
                    "group": res.group,
                    "kind": res.plural,
                    "uid": last["metadata"]["uid"],
                }
                return 200, {"apiVersion": "v1", "kind": "Status", "status": "Success", "details": details}
            case "deletecollection":
                deleted = []
                for obj in self._live(res):
                    namespace, name = obj["metadata"].get("namespace"), obj["metadata"]["name"]
                    if matches(obj) and self.find(res, namespace, name) is not None:  # not gone by a cascade
                        deleted.append(self.delete(res, namespace, name))
                return 200, {"apiVersion": res.api_version, "kind": f"{res.kind}List", "items": deleted}
            case _:
                raise _error(
                    405, "MethodNotAllowed", f"{req.verb!r} is not supported on {_qualified(res)}", res, name
                )

    async def _serve_watch(
        self, route: _Route, raw_request: aiohttp.web.BaseRequest
    ) -> aiohttp.web.StreamResponse:
        res, query = self._resource_of(route), raw_request.query
        matches = self._matcher(res, route.request.namespace, route.name, query)
        initial = query.get("sendInitialEvents", "").lower() == "true"
        try:
            since = (
                None
                if initial or query.get("resourceVersion", "0") in ("", "0")
                else int(query["resourceVersion"])
            )
            timeout = float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
        except ValueError as e:
            raise _error(400, "BadRequest", f"invalid resourceVersion or timeoutSeconds: {e}") from e
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw_request)
        try:
            async for event in self._watch(res, matches, since=since, timeout=timeout, bookmark=initial):
                await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
        except ConnectionResetError:
            logger.debug("A watcher of %s disconnected.", _qualified(res))  # clients stop watching at will
        except Exception as e:
            logger.exception("The emulator failed in a watch-stream of %s", _qualified(res))
            self.errors.append(e)
            status = {
                "apiVersion": "v1",
                "kind": "Status",
                "code": 500,
                "status": "Failure",
                "message": repr(e),
            }
            await response.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
        return response

    async def _watch(
        self,
        res: Resource,
        matches: Callable[[Body], bool],
        *,
        since: int | None,
        timeout: float | None,
        bookmark: bool,
    ) -> AsyncIterator[Body]:
        """Yield watch events: the current objects (if ``since`` is None) or the history after ``since``, then live ones."""
        initial: list[Body] = []
        if since is None:
            initial = [{"type": "ADDED", "object": obj} for obj in self._live(res) if matches(obj)]
            cursor = len(self._history)
        else:
            cursor = bisect.bisect_right(self._history, since, key=lambda event: event.rv)
        if bookmark:  # the end of the initial events, as requested by sendInitialEvents=true
            marker = {
                "resourceVersion": str(self._last_rv),
                "annotations": {"k8s.io/initial-events-end": "true"},
            }
            initial.append(
                {
                    "type": "BOOKMARK",
                    "object": {"apiVersion": res.api_version, "kind": res.kind, "metadata": marker},
                }
            )
        for event in initial:
            yield event

        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._closing:
            changed = self._changed  # taken before draining, so no change between the two is missed
            while cursor < len(self._history):
                change, cursor = self._history[cursor], cursor + 1
                if change.resource == res and matches(change.object):
                    yield {"type": change.type, "object": change.object}
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return  # timeoutSeconds is over: the server ends the stream, the client re-watches

    def _matcher(
        self, res: Resource, namespace: str | None, name: str | None, query: Mapping[str, str]
    ) -> Callable[[Body], bool]:
        labels_ok = _label_matcher(query.get("labelSelector", ""))
        fields_ok = _field_matcher(query.get("fieldSelector", ""))

        def matches(body: Body) -> bool:
            meta = body["metadata"]
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and (name is None or meta["name"] == name)
                and labels_ok(meta.get("labels") or {})
                and fields_ok(body)
            )

        return matches

    async def _serve_version(self, request: kmock.Request) -> Any:
        payload = await super()._serve_version(request)
        payload["groupVersion"] = payload["groupVersion"].lstrip("/")  # kmock says "/v1" for the core group
        return payload

    async def _serve_api(self, request: kmock.Request) -> Any:
        payload = await super()._serve_api(request)  # kmock omits a field that the official client requires:
        return {
            **payload,
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": request.url.authority}
            ],
        }

    # --- the API semantics (the single code path for HTTP and for tests) ------------------------

    def find(self, res: Resource, namespace: str | None, name: str) -> Body | None:
        """The object's current state (a copy), or None if it does not exist."""
        key = self._key(res, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def list_objects(
        self, res: Resource, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> list[Body]:
        """The current objects of a resource (copies), optionally in one namespace and filtered by selectors."""
        matches = self._matcher(
            res, namespace, None, {"labelSelector": label_selector, "fieldSelector": field_selector}
        )
        return [obj for obj in self._live(res) if matches(obj)]

    def create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None) -> Body:
        """Create an object as the API server does: 409 on duplicates, server-set metadata, no status."""
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _error(400, "BadRequest", "metadata must be an object", res)
        if res.namespaced:
            if namespace and meta.get("namespace", namespace) != namespace:
                raise _error(400, "BadRequest", "the object's namespace does not match the URL's", res)
            namespace = namespace or meta.get("namespace")
            if not namespace:
                raise _error(422, "Invalid", "metadata.namespace is required", res)
            if self.find(NAMESPACES, None, namespace) is None:
                raise _error(404, "NotFound", f'namespaces "{namespace}" not found', NAMESPACES, namespace)
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise _error(422, "Invalid", "metadata.name or metadata.generateName is required", res)
        if self.find(res, namespace, name) is not None:
            raise _error(409, "AlreadyExists", f'{_qualified(res)} "{name}" already exists', res, name)
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=_now())
        obj = {
            "apiVersion": res.api_version,
            "kind": res.kind,
            **{k: v for k, v in obj.items() if k not in ("apiVersion", "kind")},
        }
        if res.status_subresource:
            obj.pop("status", None)  # only the status subresource writes the status
        return self._store(res, obj, "ADDED")

    def replace(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        subresource: str | None = None,
    ) -> Body:
        """PUT: replace the object (or only its status with ``subresource="status"``); 409 on a stale resourceVersion."""
        old = self._existing(res, namespace, name)
        new = copy.deepcopy(dict(body))
        if not isinstance(new.get("metadata"), dict):
            new["metadata"] = {}
        meta = new["metadata"]
        if meta.get("name", name) != name:
            raise _error(400, "BadRequest", "the object's name does not match the URL's", res, name)
        self._check_version(res, old, meta.get("resourceVersion"))
        return self._commit(res, old, self._scoped(res, old, new, subresource))

    def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        content_type: str = MERGE_PATCH,
        subresource: str | None = None,
    ) -> Body:
        """PATCH with a merge (or strategic-merge, treated alike) or JSON patch; 409 on a stale resourceVersion."""
        old = self._existing(res, namespace, name)
        media_type = content_type.split(";")[0].strip().lower()
        if media_type == JSON_PATCH:
            patched = _json_patch(old, patch)
        elif media_type in (MERGE_PATCH, STRATEGIC_MERGE_PATCH) and isinstance(patch, dict):
            patched = _merge_patch(old, patch)
        elif media_type in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
            raise _error(400, "BadRequest", "a merge patch must be a JSON object", res, name)
        else:
            raise _error(415, "UnsupportedMediaType", f"unsupported patch type {content_type!r}", res, name)
        if not isinstance(patched.get("metadata"), dict):
            patched["metadata"] = {}
        self._check_version(res, old, patched["metadata"].get("resourceVersion"))
        return self._commit(res, old, self._scoped(res, old, patched, subresource))

    def delete(self, res: Resource, namespace: str | None, name: str) -> Body:
        """Delete the object, or only mark it if finalizers hold it; returns its last state."""
        old = self._existing(res, namespace, name)
        if not old["metadata"].get("finalizers"):
            return self._store(res, old, "DELETED")
        if old["metadata"].get("deletionTimestamp"):
            return old
        old["metadata"]["deletionTimestamp"] = _now()
        return self._store(res, old, "MODIFIED")

    # --- internals -------------------------------------------------------------------------------

    def _key(self, res: Resource, namespace: str | None, name: str) -> tuple[kmock.resource, str | None, str]:
        return kmock.resource(res.group, res.version, res.plural), namespace if res.namespaced else None, name

    def _existing(self, res: Resource, namespace: str | None, name: str) -> Body:
        obj = self.find(res, namespace, name)
        if obj is None:
            raise _error(404, "NotFound", f'{_qualified(res)} "{name}" not found', res, name)
        return obj

    def _live(self, res: Resource | None = None) -> list[Body]:
        """Copies of all existing objects (of one resource, or of all), sorted by namespace and name."""
        found = []
        for (kind, namespace, name), obj in self.objects.items():
            known = self._registered.get((kind.group or "", kind.version or "", kind.plural or ""))
            if known is not None and (res is None or known == res) and not obj.deleted:
                found.append(((namespace or "", name), copy.deepcopy(obj.raw)))
        return [obj for _, obj in sorted(found, key=lambda item: item[0])]

    def _check_version(self, res: Resource, old: Body, version: str | None) -> None:
        if version and version != old["metadata"]["resourceVersion"]:
            name = old["metadata"]["name"]
            message = (
                f'Operation cannot be fulfilled on {_qualified(res)} "{name}": the object has been modified'
            )
            raise _error(409, "Conflict", message, res, name)

    def _scoped(self, res: Resource, old: Body, new: Body, subresource: str | None) -> Body:
        """Keep only what the written endpoint may change: the status via ``/status``, the rest otherwise."""
        if subresource == "status":
            result = copy.deepcopy(old)
            result.pop("status", None)
            if new.get("status") is not None:
                result["status"] = new["status"]
            return result
        if res.status_subresource:
            new.pop("status", None)
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
        return new

    def _commit(self, res: Resource, old: Body, new: Body) -> Body:
        """Store a client's change of an existing object: server-owned fields kept, generation, finalization."""
        meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        for field in _SERVER_OWNED_METADATA:
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
        if _spec_of(new) != _spec_of(old):
            meta["generation"] = old_meta["generation"] + 1
        if new == old:
            return old  # a no-op write: like the API server, no new resourceVersion and no event
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._store(res, new, "DELETED")  # the last finalizer is gone: delete for real
        return self._store(res, new, "MODIFIED")

    def _store(self, res: Resource, body: Body, event_type: str) -> Body:
        """Persist a new state with a new resourceVersion, notify the watchers, collect garbage on deletion."""
        self._last_rv += 1
        body["metadata"]["resourceVersion"] = str(self._last_rv)
        key = self._key(res, body["metadata"].get("namespace"), body["metadata"]["name"])
        if key in self.objects:
            self.objects[key].history.append(copy.deepcopy(body))
        else:
            self.objects[key] = copy.deepcopy(body)
        if event_type == "DELETED":
            self.objects[key].delete()  # kmock's soft deletion: the history stays for assertions
        self._history.append(_WatchEvent(self._last_rv, res, event_type, copy.deepcopy(body)))
        self._changed.set()
        self._changed = asyncio.Event()
        if event_type == "DELETED":
            self._collect_garbage(body["metadata"]["uid"])
        return body

    def _collect_garbage(self, owner_uid: str) -> None:
        """Delete (cascading) the objects owned by a deleted owner, unless another owner of theirs still exists."""
        existing = [(res, obj) for res in self._registered.values() for obj in self._live(res)]
        existing_uids = {obj["metadata"]["uid"] for _, obj in existing}
        for res, obj in existing:
            namespace, name = obj["metadata"].get("namespace"), obj["metadata"]["name"]
            owners = {ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or []}
            orphaned = owner_uid in owners and not owners & existing_uids
            if orphaned and self.find(res, namespace, name) is not None:  # not yet deleted by a cascade
                self.delete(res, namespace, name)


# --- running it in tests -------------------------------------------------------------------------


async def _invoke(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return fn(*args, **kwargs)


class EmulatorHandle:
    """A running emulator: its URL, a kubeconfig for it, and synchronous, thread-safe helpers for tests."""

    def __init__(
        self, emulator: KubeEmulator, loop: asyncio.AbstractEventLoop, url: str, kubeconfig_path: Path
    ) -> None:
        self.emulator = emulator  #: touch it only via :meth:`call`: it lives in another thread
        self.url = url  #: e.g. ``http://127.0.0.1:41234``
        self.kubeconfig_path = kubeconfig_path  #: a kubeconfig file for ``url``, with no auth
        self._loop = loop

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` in the emulator's event loop and return its result (or raise its error)."""
        return asyncio.run_coroutine_threadsafe(_invoke(fn, *args, **kwargs), self._loop).result(timeout=30)

    def get(self, res: Resource, namespace: str | None, name: str) -> Body | None:
        """The object, or None if it does not exist."""
        return self.call(self.emulator.find, res, namespace, name)

    def create(self, res: Resource, body: Mapping[str, Any]) -> Body:
        """Create an object (in ``metadata.namespace``, "default" if absent); raises ``kmock.KubernetesError``."""
        namespace = body.get("metadata", {}).get("namespace") or ("default" if res.namespaced else None)
        return self.call(self.emulator.create, res, body, namespace)

    def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        merge_patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> Body:
        """Merge-patch an object (or its ``"status"`` subresource); raises ``kmock.KubernetesError``."""
        return self.call(
            self.emulator.patch, res, namespace, name, dict(merge_patch), MERGE_PATCH, subresource
        )

    def delete(self, res: Resource, namespace: str | None, name: str) -> None:
        """Delete an object (finalizers and garbage collection apply); raises ``kmock.KubernetesError``."""
        self.call(self.emulator.delete, res, namespace, name)

    @property
    def requests(self) -> list[ApiRequest]:
        """All resource requests served so far over HTTP, in order."""
        return self.call(list, self.emulator.api_requests)

    def wait_for(self, fn: Callable[[], T], timeout: float = 20.0, interval: float = 0.05) -> T:
        """Poll ``fn()`` until it returns something truthy and return that; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        while not (value := fn()):
            if time.monotonic() >= deadline:
                raise AssertionError(f"Not satisfied within {timeout}s; the last value: {value!r}")
            time.sleep(interval)
        return value

    def list(self, res: Resource, namespace: str | None = None) -> list[Body]:
        """The objects of a resource, in one namespace or in all (None)."""
        return self.call(self.emulator.list_objects, res, namespace)


def _write_kubeconfig(path: Path, url: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": "default"},
            }
        ],
    }
    path.write_text(json.dumps(config, indent=2))
    return path


class _QuietTestServer(aiohttp.test_utils.RawTestServer):
    """aiohttp's test server without a log line per request (they would drown kopf's log)."""

    async def _make_runner(self, debug: bool = True, **kwargs: Any) -> aiohttp.web.ServerRunner:
        return await super()._make_runner(debug=debug, access_log=None, **kwargs)


async def _start(
    resources: Sequence[Resource], namespaces: Sequence[str]
) -> tuple[KubeEmulator, contextlib.AsyncExitStack, str]:
    emulator = KubeEmulator()
    for res in resources:
        emulator.register(res)
    for namespace in namespaces:
        emulator.create(NAMESPACES, {"metadata": {"name": namespace}, "status": {"phase": "Active"}})
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(emulator)
        server = await stack.enter_async_context(kmock.Server(emulator, server_cls=_QuietTestServer))
        return emulator, stack.pop_all(), str(server.url).rstrip("/")


async def _stop(emulator: KubeEmulator, stack: contextlib.AsyncExitStack) -> list[Exception]:
    emulator.close_watches()
    failures = list(emulator.errors)
    await stack.aclose()
    return failures


@contextlib.contextmanager
def running_emulator(
    resources: Sequence[Resource], namespaces: Sequence[str] = ("default",)
) -> Iterator[EmulatorHandle]:
    """
    Serve a fresh emulator on 127.0.0.1 (a free port) from a background thread with its own event loop.

    The built-in resources (namespaces, configmaps, core and events.k8s.io events) are always served;
    ``resources`` adds more, ``namespaces`` are created upfront. On exit, it fails if the emulator
    crashed on any request (answered 500), so that emulator bugs never pass silently.
    """
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="kube-emulator", daemon=True)
    thread.start()
    tmpdir = Path(tempfile.mkdtemp(prefix="kube-emulator-"))
    try:
        emulator, stack, url = asyncio.run_coroutine_threadsafe(_start(resources, namespaces), loop).result(
            timeout=30
        )
        try:
            yield EmulatorHandle(emulator, loop, url, _write_kubeconfig(tmpdir / "kubeconfig", url))
        finally:
            failures = asyncio.run_coroutine_threadsafe(_stop(emulator, stack), loop).result(timeout=30)
        if failures:
            tracebacks = "\n".join("".join(traceback.format_exception(failure)) for failure in failures)
            raise AssertionError(f"The emulator failed on {len(failures)} request(s):\n{tracebacks}")
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
        shutil.rmtree(tmpdir, ignore_errors=True)
